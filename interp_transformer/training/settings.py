"""How a model is trained: one frozen dataclass, validated when it is made.

``TrainSettings`` holds every number the trainer reads. ``batch`` is the global batch (sequences
per optimizer step, over all processes together); ``micro_batches`` splits each process's share
into that many forward and backward passes whose gradients add up to the whole batch's
(gradient accumulation). ``accumulation_mean`` says which mean the step's loss is:

- ``"tokens"`` (the default): the mean over every labelled position of the global batch; each
  micro-batch adds its summed loss divided by the global batch's count of labelled positions,
  so any cut into micro-batches and processes gives the gradient of one undivided batch;
- ``"micro_batches"``: the mean of the micro-batches' own means (each micro-batch's summed loss
  divided by its own labelled positions, then by ``micro_batches x processes``), as a
  data-parallel loop that averages per-micro-batch mean losses does; it weighs a micro-batch
  with few labelled positions as much as a full one.

Label smoothing ``label_smoothing = e`` over ``V = d_vocab`` tokens sets each labelled position's
target distribution to, with ``label_smoothing_over``:

- ``"vocab"`` (the default; PyTorch's ``cross_entropy(label_smoothing=e)``, Szegedy et al. 2016):
  ``e / V`` on every token, the label included, so the label gets ``1 - e + e / V``;
- ``"others"`` (the original Transformer's, as tensor2tensor computes it): ``1 - e`` on the label
  and ``e / (V - 1)`` on each other token.

The same number means a little less smoothing under ``"vocab"``. AdamW's ``adam_eps`` (added to
the denominator's square root) defaults to PyTorch's 1e-8; many recipes use 1e-9.

Schedules are those of ``schedules``: ``"cosine"`` (linear warmup to ``lr``, cosine decay to
``min_lr_ratio * lr``) and ``"inverse_sqrt"`` (the original Transformer's,
``lr_scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)``, which sets the rate
from ``d_model`` and so takes no ``lr``).

>>> TrainSettings(steps=10, batch=8, lr=1e-3).micro_batches
1
>>> TrainSettings(steps=10, batch=8, lr=1e-3, schedule="linear")
Traceback (most recent call last):
...
ValueError: schedule must be one of ('cosine', 'inverse_sqrt'), got 'linear'
"""

import dataclasses
import difflib
import math
from dataclasses import dataclass

import torch

SCHEDULES = ("cosine", "inverse_sqrt")
SMOOTHING_OVER = ("vocab", "others")  # label smoothing's e spread over every token, or over all but the label
ACCUMULATION_MEANS = ("tokens", "micro_batches")  # the mean a step's loss takes (module docstring)
PRECISIONS = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}  # None: autocast off


def unknown_key_message(where: str, unknown: list, known: list) -> str:
    """``"where: unknown key 'warmup' (did you mean 'warmup_steps'?); known keys: [...]"``."""
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(str(key), known, n=1)
        hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(hints)}; known keys: {list(known)}"


def check_choice(name: str, value, choices: tuple) -> None:
    """Refuse ``value`` unless it is one of ``choices``, naming the closest."""
    if value not in choices:
        close = difflib.get_close_matches(str(value), choices, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"{name} must be one of {choices}, got {value!r}{hint}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class TrainSettings:
    """The trainer's settings (see the module docstring)."""

    steps: int  # optimizer steps
    batch: int  # sequences per optimizer step, all processes together
    micro_batches: int = 1  # forward/backward passes per step on each process (gradient accumulation)
    schedule: str = "cosine"  # "cosine" or "inverse_sqrt"
    lr: float | None = None  # peak learning rate of "cosine"; "inverse_sqrt" computes its own
    warmup_steps: int = 100  # steps of the linear warmup (both schedules)
    min_lr_ratio: float = 0.0  # "cosine" ends at min_lr_ratio * lr
    lr_scale: float = 1.0  # "inverse_sqrt": the factor in front of d_model^-0.5 * min(...)
    weight_decay: float = 0.01  # AdamW's, on weight matrices only (parameter_groups)
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW's; the original Transformer used (0.9, 0.98)
    adam_eps: float = 1e-8  # AdamW's eps (PyTorch's default); the original Transformer used 1e-9
    max_grad_norm: float | None = None  # clip the global gradient norm to this; None: no clipping
    label_smoothing: float = 0.0  # 0: cross-entropy; the original Transformer used 0.1 (with "others")
    label_smoothing_over: str = "vocab"  # "vocab": e/V on every token (PyTorch's); "others": e/(V-1) off the label
    accumulation_mean: str = "tokens"  # "tokens": per labelled position of the batch; "micro_batches": of their means
    precision: str = "float32"  # "float32", or autocast to "bfloat16" (CPU, GPU) or "float16" (GPU)
    seed: int = 0  # the weights' (seed) and the data's (seed + 1)
    log_every: int = 25  # steps between entries of the training curve
    checkpoint_every: int | None = None  # steps between checkpoints; None: only at the end
    threads: int | None = None  # CPU threads while training (1: the same result on any machine); None: torch's

    def __post_init__(self) -> None:
        for name in ("steps", "batch", "micro_batches", "log_every"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not _is_int(self.warmup_steps) or self.warmup_steps < 1:
            raise ValueError(f"warmup_steps must be an int >= 1, got {self.warmup_steps!r}")
        for name in ("checkpoint_every", "threads"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 1):
                raise ValueError(f"{name} must be an int >= 1 or None, got {value!r}")
        if not _is_int(self.seed):
            raise ValueError(f"seed must be an int, got {self.seed!r}")
        if self.batch % self.micro_batches:
            raise ValueError(
                f"batch={self.batch} must be a multiple of micro_batches={self.micro_batches}: each micro-batch "
                "holds the same number of sequences"
            )
        self._check_schedule()
        self._check_optimizer()
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {tuple(PRECISIONS)}, got {self.precision!r}")

    def _check_schedule(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.schedule == "cosine":
            if self.lr is None or not _is_number(self.lr) or self.lr <= 0:
                raise ValueError(f"schedule 'cosine' needs lr, a finite number > 0, got lr={self.lr!r}")
            if self.lr_scale != 1.0:
                raise ValueError(f"lr_scale is read by schedule 'inverse_sqrt' only, got lr_scale={self.lr_scale!r}")
            if not _is_number(self.min_lr_ratio) or not 0 <= self.min_lr_ratio <= 1:
                raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio!r}")
        else:
            if self.lr is not None:
                raise ValueError(
                    "schedule 'inverse_sqrt' sets the rate from d_model (lr_scale * d_model^-0.5 * min(step^-0.5, "
                    f"step * warmup_steps^-1.5)): give lr_scale instead of lr, got lr={self.lr!r}"
                )
            if not _is_number(self.lr_scale) or self.lr_scale <= 0:
                raise ValueError(f"lr_scale must be a finite number > 0, got {self.lr_scale!r}")
            if self.min_lr_ratio != 0.0:
                raise ValueError(f"min_lr_ratio is read by schedule 'cosine' only, got {self.min_lr_ratio!r}")

    def _check_optimizer(self) -> None:
        if not _is_number(self.weight_decay) or self.weight_decay < 0:
            raise ValueError(f"weight_decay must be a finite number >= 0, got {self.weight_decay!r}")
        betas = tuple(self.betas) if isinstance(self.betas, (tuple, list)) else None
        if betas is None or len(betas) != 2 or not all(_is_number(beta) and 0 <= beta < 1 for beta in betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        object.__setattr__(self, "betas", betas)  # a list read from a file becomes the tuple AdamW records
        if self.max_grad_norm is not None and (not _is_number(self.max_grad_norm) or self.max_grad_norm <= 0):
            raise ValueError(f"max_grad_norm must be a finite number > 0 or None, got {self.max_grad_norm!r}")
        if not _is_number(self.adam_eps) or self.adam_eps <= 0:
            raise ValueError(f"adam_eps must be a finite number > 0, got {self.adam_eps!r}")
        if not _is_number(self.label_smoothing) or not 0 <= self.label_smoothing < 1:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing!r}")
        check_choice("label_smoothing_over", self.label_smoothing_over, SMOOTHING_OVER)
        check_choice("accumulation_mean", self.accumulation_mean, ACCUMULATION_MEANS)

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The dtype autocast runs the forward pass in, or None (float32 throughout)."""
        return PRECISIONS[self.precision]

    def to_dict(self) -> dict:
        """The settings as plain values (what checkpoints and model cards record)."""
        return {**dataclasses.asdict(self), "betas": list(self.betas)}

    @classmethod
    def from_dict(cls, values: dict, where: str = "training settings") -> "TrainSettings":
        """Settings from a mapping; a key that is no setting raises ``KeyError`` naming the known ones."""
        known = [field.name for field in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise KeyError(unknown_key_message(where, unknown, known))
        missing = [name for name in ("steps", "batch") if name not in values]
        if missing:
            raise KeyError(f"{where}: missing {missing}; every run names its steps and its batch")
        return cls(**values)


__all__ = [
    "ACCUMULATION_MEANS",
    "PRECISIONS",
    "SCHEDULES",
    "SMOOTHING_OVER",
    "TrainSettings",
    "check_choice",
    "unknown_key_message",
]
