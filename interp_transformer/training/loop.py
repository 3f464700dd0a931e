"""The training loop: one optimizer step at a time, in one process or in ``torchrun``'s several.

Each step ``s = 1 .. steps``:

1. the task draws the global batch of ``settings.batch`` sequences from the data generator
   (seeded ``seed + 1``; every process draws the same batch and keeps its own rows: rank ``r``
   of ``W`` the ``r``-th slice of ``batch / W``);
2. the process's rows run in ``micro_batches`` forward and backward passes (under autocast
   when ``precision`` asks). With ``accumulation_mean="tokens"`` each adds
   ``token_loss(micro-batch) / n_targets`` to the gradients, ``n_targets`` counting the
   labelled positions of the whole global batch: the summed gradient is that of the global
   batch's mean loss per labelled position, however the batch is cut. With
   ``"micro_batches"`` each adds ``token_loss(micro-batch) / (n_micro x micro-batch's n_targets)``,
   ``n_micro = micro_batches x processes``: the gradient of the mean of the micro-batches'
   mean losses (a micro-batch that labels no position is refused);
3. with several processes, the gradients are summed across them (one ``all_reduce``, the
   engine ``harvest`` runs on: ``harvest.distributed``, gloo on CPUs, NCCL on GPUs), so
   every process holds the global batch's gradient, as one process would;
4. the gradient's global norm is clipped to ``max_grad_norm`` (if set), and AdamW steps at
   ``lr(s)`` with the decay groups of ``param_groups``.

Every ``log_every`` steps (and at the last) the curve records the loss, the rate, the tokens
per second and the task's measures of the model (``task.evaluate``, on held-out data seeded
``seed + 2``). With a checkpoint folder, a checkpoint is written every ``checkpoint_every``
steps and at the end, and a run that finds one there continues from it (``checkpoint``).
Process 0 alone shows the progress bar, evaluates and writes.
"""

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from interp_transformer.core.shape_checks import shape_checking
from interp_transformer.harvest.distributed import DistContext, init_distributed
from interp_transformer.training.checkpoint import check_same_run, config_record, load_checkpoint, save_checkpoint
from interp_transformer.training.param_groups import parameter_groups
from interp_transformer.training.schedules import learning_rate
from interp_transformer.training.settings import TrainSettings
from interp_transformer.training.tasks import Batch, check_task, task_settings, token_loss


@dataclass
class TrainingRun:
    """A finished (or stopped) run: the trained model, the last step taken, its curve and the task's measures.

    ``curve`` holds columns: ``steps``, ``loss`` (the global batch's mean), ``lr``,
    ``tokens_per_second``, and one per measure of the task (``repeated_half_loss``, ...);
    ``metrics`` the task's measures after the last step (process 0 only; empty elsewhere).
    """

    model: torch.nn.Module
    settings: TrainSettings
    task: object
    step: int
    curve: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)


def _rows_per_process(settings: TrainSettings, world_size: int) -> int:
    if settings.batch % (world_size * settings.micro_batches):
        raise ValueError(
            f"batch={settings.batch} must be a multiple of processes x micro_batches = {world_size} x "
            f"{settings.micro_batches}: every process runs micro-batches of the same size"
        )
    return settings.batch // world_size


def _autocast(device: torch.device, settings: TrainSettings):
    dtype = settings.autocast_dtype
    return torch.autocast(device_type=device.type, dtype=dtype, enabled=dtype is not None)


def _check_precision(settings: TrainSettings, device: torch.device, model: torch.nn.Module) -> None:
    if settings.precision == "float16" and device.type != "cuda":
        raise ValueError(
            f"precision 'float16' needs a GPU (a gradient scaler guards its small range); this run is on "
            f"{device.type}: use 'bfloat16' there"
        )
    dtypes = sorted({str(p.dtype) for p in model.parameters()})
    if settings.autocast_dtype is not None and dtypes != ["torch.float32"]:
        raise ValueError(f"precision {settings.precision!r} autocasts a float32 model; its weights are {dtypes}")


def _same_weights_everywhere(parameters: list, context: DistContext) -> None:
    """Process 0's weights on every process (they are seeded alike; this makes sure)."""
    flat = torch.cat([p.detach().reshape(-1) for p in parameters])
    dist.broadcast(flat, src=0)
    with torch.no_grad():
        offset = 0
        for p in parameters:
            p.copy_(flat[offset : offset + p.numel()].view(p.shape))
            offset += p.numel()


def _sum_across_processes(parameters: list, loss_sum: torch.Tensor) -> torch.Tensor:
    """Sum every gradient and the loss over the processes (one ``all_reduce``); returns the summed loss.

    A parameter without a gradient on one process (an expert no token of its rows chose) counts as zero
    there, and keeps no gradient only where no process has one, as in one process.
    """
    has_grad = torch.tensor([float(p.grad is not None) for p in parameters], device=loss_sum.device)
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in parameters])
    flat = torch.cat([flat, loss_sum.reshape(1).to(flat.dtype)])
    dist.all_reduce(has_grad)
    dist.all_reduce(flat)
    offset = 0
    for p, present in zip(parameters, has_grad.tolist(), strict=True):
        if present:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad.copy_(flat[offset : offset + p.numel()].view(p.grad.shape))
        offset += p.numel()
    return flat[-1]


class _Run:
    """The state of one run between steps; ``train`` drives it."""

    def __init__(self, model, task, settings: TrainSettings, context: DistContext, checkpoint_dir: Path | None):
        self.model, self.task, self.settings, self.context = model, task, settings, context
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            parameter_groups(model, settings.weight_decay),
            lr=0.0,
            betas=settings.betas,
            eps=settings.adam_eps,
            weight_decay=0.0,
        )
        self.scaler = torch.amp.GradScaler(context.device.type, enabled=settings.precision == "float16")
        self.generator = torch.Generator().manual_seed(settings.seed + 1)
        self.lr = learning_rate(settings, model.cfg.d_model)
        self.step = 0
        self.curve: dict[str, list] = {}
        self.rows = _rows_per_process(settings, context.world_size)
        self.record: dict[str, Any] = dict(
            settings=settings.to_dict(), task=task_settings(task), config=config_record(model.cfg)
        )

    def resume(self) -> None:
        folder = self.checkpoint_dir
        state = load_checkpoint(folder)
        if state is None or folder is None:  # no folder: no checkpoint
            return
        check_same_run(state, folder, **self.record)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        self.generator.set_state(state["generator"])
        self.step, self.curve = int(state["step"]), {key: list(values) for key, values in state["curve"].items()}

    def save(self, folder: Path) -> None:
        if self.context.is_rank0:
            state = dict(
                step=self.step,
                model=self.model.state_dict(),
                optimizer=self.optimizer.state_dict(),
                scaler=self.scaler.state_dict(),
                generator=self.generator.get_state(),
                curve=self.curve,
                **self.record,
            )
            save_checkpoint(folder, state)
        self.context.barrier()

    def take_step(self) -> tuple[float, int]:
        """One optimizer step; returns the global batch's mean loss and how many tokens it read."""
        self.step += 1
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr(self.step)
        whole = self.task.batch(self.model, self.settings.batch, self.generator)
        n_targets = whole.n_targets
        if n_targets == 0:
            raise ValueError(f"step {self.step}: the task's batch labels no position, so there is no loss to train on")
        rank = self.context.rank
        mine = whole.rows(rank * self.rows, (rank + 1) * self.rows).to(self.context.device)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        losses = []
        settings = self.settings
        size = self.rows // settings.micro_batches
        n_micro = settings.micro_batches * self.context.world_size
        for index, start in enumerate(range(0, self.rows, size)):
            micro: Batch = mine.rows(start, start + size)
            if settings.accumulation_mean == "tokens":
                divisor = n_targets
            else:
                divisor = n_micro * micro.n_targets
                if micro.n_targets == 0:
                    raise ValueError(
                        f"step {self.step}: micro-batch {index} of process {rank} labels no position, so it has no "
                        "mean loss to average; use accumulation_mean='tokens' (the mean over the batch's labelled "
                        "positions) or fewer micro-batches"
                    )
            with _autocast(self.context.device, settings):
                logits = self.model(*micro.inputs, **micro.options)
            loss = token_loss(logits, micro.labels, settings.label_smoothing, settings.label_smoothing_over) / divisor
            self.scaler.scale(loss).backward()
            losses.append(loss.detach())
        mean_loss = torch.stack(losses).sum()
        if self.context.world_size > 1:
            mean_loss = _sum_across_processes(self.parameters, mean_loss)
        if settings.max_grad_norm is not None:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.parameters, settings.max_grad_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return mean_loss.item(), whole.n_tokens

    def evaluate(self) -> dict:
        self.model.eval()
        return self.task.evaluate(self.model, self.settings.seed + 2) if self.context.is_rank0 else {}

    def log(self, loss: float, tokens_per_second: float) -> None:
        entry = {"steps": self.step, "loss": round(loss, 4), "lr": self.lr(self.step)}
        entry |= {"tokens_per_second": round(tokens_per_second, 1), **self.evaluate()}
        for key, value in entry.items():
            self.curve.setdefault(key, []).append(value)


def train(
    model: torch.nn.Module,
    task,
    settings: TrainSettings,
    *,
    checkpoint_dir: Path | None = None,
    until: int | None = None,
    progress: bool = True,
    context: DistContext | None = None,
) -> TrainingRun:
    """Train ``model`` on ``task`` under ``settings`` (see the module docstring); returns the ``TrainingRun``.

    ``checkpoint_dir``: where checkpoints go, and where a stopped run is resumed from. ``until``:
    stop after that step (the schedule still spans ``settings.steps``), as an interrupted run
    would. ``context``: the process group (``harvest.distributed.init_distributed()`` by
    default: one process, or ``torchrun``'s). The model moves to the context's device. With ``settings.threads``
    torch computes on that many CPU threads while training, and on as many as before afterwards.
    """
    check_task(task)
    task.check_model(model)
    last = settings.steps if until is None else until
    if isinstance(last, bool) or not isinstance(last, int) or not 1 <= last <= settings.steps:
        raise ValueError(f"until must be an int in [1, steps={settings.steps}], got {until!r}")
    own_context = context is None
    context = init_distributed() if context is None else context  # own_context
    threads = torch.get_num_threads()
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    try:
        model.to(context.device)
        _check_precision(settings, context.device, model)
        run = _Run(model, task, settings, context, checkpoint_dir)
        if context.world_size > 1:
            _same_weights_everywhere(run.parameters, context)
        run.resume()
        _steps(run, last, settings, progress)
    finally:
        torch.set_num_threads(threads)
        if own_context:
            context.close()
    model.eval()
    return TrainingRun(model, settings, task, run.step, run.curve, run.evaluate())


def _steps(run: _Run, last: int, settings: TrainSettings, progress: bool) -> None:
    name = getattr(run.model.cfg, "name", "model")
    bar = tqdm(
        total=settings.steps,
        initial=run.step,
        desc=f"training {name}",
        unit="step",
        disable=not (progress and run.context.is_rank0),
    )
    tokens, started = 0, time.perf_counter()
    with shape_checking(False), bar:
        while run.step < last:
            loss, n_tokens = run.take_step()
            tokens += n_tokens
            tokens_per_second = tokens / max(time.perf_counter() - started, 1e-9)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", tokens_per_s=f"{tokens_per_second:,.0f}", refresh=False)
            if run.step % settings.log_every == 0 or run.step == settings.steps:
                run.log(loss, tokens_per_second)
            every = settings.checkpoint_every
            if run.checkpoint_dir is not None and ((every and run.step % every == 0) or run.step == last):
                run.save(run.checkpoint_dir)


__all__ = ["TrainingRun", "train"]
