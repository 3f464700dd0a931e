"""Train a tuned lens: each layer's translator minimises KL(final distribution || lens distribution) on a corpus.

``train_tuned_lens(model, corpus, config)``:

1. cuts the corpus into contexts (``data.lens_contexts``, the harvest's convention) and holds out every
   ``held_out_every``-th context (``data.split_contexts``);
2. starts every translator at zero (the lens is then the logit lens, exactly);
3. per step, runs the model on ``batch_size`` contexts (no gradient), reads the residual entering every block and
   the model's own distribution, and takes one Adam step on the sum over layers of the mean KL (each layer's
   translator sees only its own term). The BOS position, the same in every context, is left out. The learning
   rate decays linearly to zero over the run; a bias's rate is scaled by its layer's residual norm (root mean
   square, measured on the first batch), so a layer whose residual is a hundred times larger moves its bias a
   hundred times further: every layer moves at the same speed relative to what it reads. Contexts are visited in
   an order drawn from ``seed``; nothing else is random, so a run is reproducible;
4. evaluates the trained lens beside the logit lens on the held-out contexts (``evaluate.evaluate_lens``).

The cost is the read-out: each token and layer multiplies by ``W_U`` twice (``[d_model, d_vocab]``: for
SmolLM2-135M 28M multiply-adds each, 30 layers), far more than the model's own forward pass.
``matmul_dtype="bfloat16"`` runs those two products in bfloat16 (``objective.ReadOutKL``).
"""

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .. import _checks
from .data import LensContexts, lens_contexts, split_contexts
from .evaluate import LensEvaluation, evaluate_lens, residuals_and_final
from .objective import read_out_kl
from .translators import TunedLens

MATMUL_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}
TRAINING_FILE = "training.json"


@dataclass
class LensTrainingConfig:
    """How a lens is trained (module docstring); validated on construction."""

    context_length: int | None = None  # tokens per context, the BOS included (default: min(n_ctx, 128))
    batch_size: int = 4  # contexts per step
    epochs: int = 1
    max_steps: int | None = None  # stop after this many steps, whatever the epochs
    lr: float = 1e-3  # Adam's peak learning rate (decays linearly to 0)
    weight_decay: float = 0.0  # AdamW's decay of the translators, towards the identity map
    held_out_every: int = 5  # hold out every N-th context
    max_contexts: int | None = None  # read at most this many contexts from the corpus (before the split)
    seed: int = 0
    bias: bool = True
    matmul_dtype: str = "float32"  # the two products with W_U during training: "float32" or "bfloat16"
    chunk_tokens: int = 512  # tokens whose [token, d_vocab] block is held at once

    def __post_init__(self) -> None:
        for name in ("batch_size", "epochs", "chunk_tokens"):
            _checks.count(getattr(self, name), name, minimum=1)
        _checks.count(self.held_out_every, "held_out_every", minimum=2)
        for name in ("max_steps", "max_contexts"):
            if getattr(self, name) is not None:
                _checks.count(getattr(self, name), name, minimum=1)
        if self.context_length is not None:
            _checks.count(self.context_length, "context_length", minimum=2)
        for name in ("lr", "weight_decay"):
            value = getattr(self, name)
            low_ok = value > 0 if name == "lr" else value >= 0
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not low_ok:
                raise ValueError(f"{name} must be a finite number {'> 0' if name == 'lr' else '>= 0'}, got {value!r}")
        if self.matmul_dtype not in MATMUL_DTYPES:
            raise ValueError(f"matmul_dtype must be one of {sorted(MATMUL_DTYPES)}, got {self.matmul_dtype!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int, got {self.seed!r}")


@dataclass
class LensTraining:
    """A trained lens, how it was trained, its loss per step (mean KL over layers, nats) and its held-out scores."""

    lens: TunedLens
    config: LensTrainingConfig
    losses: list[float]
    held_out: LensEvaluation
    n_train_tokens: int
    seconds: float
    corpus: str
    notes: dict = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        """Training tokens (times epochs) per second of training, evaluation excluded."""
        return self.notes.get("tokens_per_second", float("nan"))

    def save(self, path: str | Path) -> Path:
        """The lens (``params.pt``, ``config.json``) and ``training.json`` (settings, losses, held-out scores)."""
        folder = self.lens.save(path)
        record = {
            "config": asdict(self.config),
            "corpus": self.corpus,
            "n_train_tokens": self.n_train_tokens,
            "seconds": self.seconds,
            "losses": self.losses,
            "held_out": self.held_out.to_dict(),
            **self.notes,
        }
        (folder / TRAINING_FILE).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        return folder


def train_tuned_lens(
    model,
    corpus,
    config: LensTrainingConfig | None = None,
    *,
    lens: TunedLens | None = None,
    bos_token_id: int | None = None,
    text_field: str = "text",
    base_model_name_or_path: str | None = None,
    progress: bool = True,
) -> LensTraining:
    """Train a lens on ``corpus`` (anything ``harvest`` reads, or a ``[context, pos]`` tensor of ids) and judge it
    on the held-out contexts (module docstring). ``lens``: continue training that lens instead of a new one."""
    config = config or LensTrainingConfig()
    if lens is None:
        lens = TunedLens.for_model(model, bias=config.bias, base_model_name_or_path=base_model_name_or_path)
    lens.check_model(model)
    contexts = lens_contexts(
        model,
        corpus,
        config.context_length,
        bos_token_id=bos_token_id,
        text_field=text_field,
        max_contexts=config.max_contexts,
        progress=progress,
    )
    train, held_out = split_contexts(contexts, config.held_out_every)
    start = time.perf_counter()
    losses, n_seen = fit_translators(model, lens, train, config, progress)
    seconds = time.perf_counter() - start
    n_seen_tokens = n_seen * (train.tokens.shape[1] - train.first_position)
    evaluation = evaluate_lens(
        model, lens, held_out, batch_size=config.batch_size, chunk_tokens=config.chunk_tokens, progress=progress
    )
    notes = {
        "tokens_per_second": n_seen_tokens / seconds if seconds > 0 else float("nan"),
        "n_held_out_tokens": held_out.n_tokens,
        "model_processing": sorted(getattr(model, "processing", []) or []),
    }
    return LensTraining(lens, config, losses, evaluation, train.n_tokens, seconds, contexts.description, notes)


def fit_translators(model, lens: TunedLens, train: LensContexts, config: LensTrainingConfig, progress: bool):
    """``(losses per step, contexts seen)``."""
    generator = torch.Generator().manual_seed(config.seed)
    per_epoch = math.ceil(len(train) / config.batch_size)
    n_steps = (
        config.epochs * per_epoch if config.max_steps is None else min(config.max_steps, config.epochs * per_epoch)
    )
    W_U = model.W_U.detach().to(MATMUL_DTYPES[config.matmul_dtype])
    optimizer, scheduler, losses, n_seen = None, None, [], 0
    bar = tqdm(total=n_steps, desc="training the tuned lens", unit="step", disable=not progress)
    try:
        for step in range(n_steps):
            if step % per_epoch == 0:
                order = torch.randperm(len(train), generator=generator)
            rows = order[(step % per_epoch) * config.batch_size :][: config.batch_size]
            resid, final = residuals_and_final(model, train.tokens[rows], train.first_position)
            if optimizer is None:
                optimizer, scheduler = _optimizer(lens, resid, config, n_steps)
            loss = _accumulate_gradients(model, lens, resid, final, W_U, config.chunk_tokens)
            if not math.isfinite(loss):
                raise ValueError(f"training diverged at step {step}: the mean KL is {loss}; lower lr (now {config.lr})")
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss)
            n_seen += len(rows)
            bar.update(1)
            bar.set_postfix(kl=f"{loss:.3f}")
    finally:
        bar.close()
    return losses, n_seen


def _optimizer(lens: TunedLens, resid: list, config: LensTrainingConfig, n_steps: int):
    groups = []
    for translator, h in zip(lens.layer_translators, resid):
        groups.append({"params": [translator.weight], "lr": config.lr})
        if translator.bias is not None:
            scale = float(h.float().square().mean().sqrt()) or 1.0
            groups.append({"params": [translator.bias], "lr": config.lr * scale, "weight_decay": 0.0})
    optimizer = torch.optim.AdamW(groups, weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / n_steps)
    return optimizer, scheduler


def _accumulate_gradients(model, lens: TunedLens, resid: list, final, W_U, chunk_tokens: int) -> float:
    """Each translator's gradient of its layer's mean KL, into ``.grad``; returns the mean KL over layers."""
    n_tokens, total = final.top1.shape[0], 0.0
    for translator, h_layer in zip(lens.layer_translators, resid):
        parameters = list(translator.parameters())
        for start in range(0, n_tokens, chunk_tokens):
            rows = slice(start, start + chunk_tokens)
            h = h_layer[rows]
            z = model.final_norm.normalize(h + translator(h))
            loss = read_out_kl(model, z, final[rows], W_U).sum() / n_tokens
            # only the translator's gradient: the model's parameters take none
            grads = torch.autograd.grad(loss, parameters)
            for parameter, grad in zip(parameters, grads):
                parameter.grad = grad if parameter.grad is None else parameter.grad + grad
            total += float(loss.detach())
    return total / len(lens)


__all__ = [
    "LensTraining",
    "LensTrainingConfig",
    "MATMUL_DTYPES",
    "TRAINING_FILE",
    "fit_translators",
    "train_tuned_lens",
]
