"""Checks every model config shares: positive sizes, ``d_model = n_heads * d_head``, a known activation, eps and
init."""

import math

from interp_transformer.parts.activations import ACTIVATIONS

ACTIVATION_FUNCTIONS = tuple(ACTIVATIONS)  # the names components.activations computes


def validate_common_fields(cfg, positive_int_fields: tuple[str, ...]) -> None:
    """Checks every model config shares: sizes, ``d_model = n_heads * d_head``, act_fn, eps, init."""
    for field in positive_int_fields:
        value = getattr(cfg, field)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{field} must be a positive int, got {value!r}")
    if cfg.d_model != cfg.n_heads * cfg.d_head:
        raise ValueError(
            f"d_model={cfg.d_model} must equal n_heads*d_head={cfg.n_heads}*{cfg.d_head}={cfg.n_heads * cfg.d_head}"
        )
    if cfg.act_fn not in ACTIVATION_FUNCTIONS:
        raise ValueError(f"act_fn must be one of {ACTIVATION_FUNCTIONS}, got {cfg.act_fn!r}")
    for field in ("layer_norm_eps", "init_range"):
        value = getattr(cfg, field)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or not value > 0:
            raise ValueError(f"{field} must be > 0 and finite, got {value!r}")


def check_optional_positive_int(cfg, field: str) -> None:
    """``ValueError`` unless ``cfg.<field>`` is None or a positive int."""
    value = getattr(cfg, field)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ValueError(f"{field} must be a positive int or None, got {value!r}")


def check_positive_int(name: str, value) -> None:
    """``ValueError`` naming ``name`` unless ``value`` is an int > 0 (a bool is not an int here)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def check_positive_number(name: str, value, above: float = 0.0) -> None:
    """``ValueError`` naming ``name`` unless ``value`` is a finite number > ``above``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not value > above:
        raise ValueError(f"{name} must be a finite number > {above:g}, got {value!r}")


def check_bools(cfg, fields: tuple[str, ...]) -> None:
    """``TypeError`` naming the field unless each of ``fields`` of ``cfg`` is a bool."""
    for field in fields:
        if not isinstance(getattr(cfg, field), bool):
            raise TypeError(f"{field} must be a bool, got {getattr(cfg, field)!r}")


__all__ = [
    "ACTIVATION_FUNCTIONS",
    "check_bools",
    "check_optional_positive_int",
    "check_positive_int",
    "check_positive_number",
    "validate_common_fields",
]
