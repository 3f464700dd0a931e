"""Learning-rate schedules: the rate of optimizer step ``step = 1, 2, ..., steps``.

``inverse_sqrt`` is the original Transformer's ("Attention Is All You Need", section 5.3),
with a factor in front::

    lr(step) = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)

It rises linearly for ``warmup`` steps, peaks at ``scale * (d_model * warmup)^-0.5`` and then
falls as ``1 / sqrt(step)``. ``cosine`` rises linearly to ``peak`` over ``warmup`` steps, then
follows half a cosine from ``peak`` down to ``floor`` at the last step::

    lr(step) = peak * step / warmup                                                step <= warmup
    lr(step) = floor + (peak - floor) * (1 + cos(pi * (step - warmup) / (steps - warmup))) / 2

Both are pure functions of the step, so a resumed run needs nothing but the step to continue
on the same curve.

>>> round(inverse_sqrt(4000, d_model=512, warmup=4000), 7)  # the peak of the paper's base model
0.0006988
>>> [round(cosine(step, peak=1.0, warmup=2, steps=6), 3) for step in range(1, 7)]
[0.5, 1.0, 0.854, 0.5, 0.146, 0.0]
"""

import math
from collections.abc import Callable

from interp_transformer.training.settings import TrainSettings


def _check_step(step: int) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"step counts from 1, got {step!r}")


def inverse_sqrt(step: int, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """``scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)`` (see the module docstring)."""
    _check_step(step)
    if warmup < 1:
        raise ValueError(f"warmup must be >= 1, got {warmup}")
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def cosine(step: int, peak: float, warmup: int, steps: int, floor: float = 0.0) -> float:
    """Linear warmup to ``peak``, then half a cosine down to ``floor`` at ``steps`` (see the module docstring)."""
    _check_step(step)
    if warmup < 1:
        raise ValueError(f"warmup must be >= 1, got {warmup}")
    if step <= warmup:
        return peak * step / warmup
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def learning_rate(settings: TrainSettings, d_model: int) -> Callable[[int], float]:
    """The rate of each step (from 1) under ``settings``' schedule, for a model of width ``d_model``."""
    if settings.schedule == "inverse_sqrt":
        return lambda step: inverse_sqrt(step, d_model, settings.warmup_steps, settings.lr_scale)
    peak = settings.lr
    if peak is None:  # TrainSettings refuses this already
        raise ValueError("schedule 'cosine' needs lr, a finite number > 0, got lr=None")
    floor = peak * settings.min_lr_ratio
    return lambda step: cosine(step, peak, settings.warmup_steps, settings.steps, floor)


__all__ = ["cosine", "inverse_sqrt", "learning_rate"]
