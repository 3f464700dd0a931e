"""TransformerLens' weight inits: fan in/out of our weight layouts, Xavier and Kaiming (exported by ``utils``).

Our weights act on the right (``x @ W``), so a ``[d_in, d_out]`` matrix has ``fan_in =
d_in``; a per-head ``[head_index, d_model, d_head]`` weight has ``fan_in = d_model`` and
``fan_out = head_index * d_head``; a bias ``[n]`` has ``fan_in = 1``.

>>> import torch
>>> calc_fan_in_and_fan_out(torch.empty(12, 768, 64))
(768, 768)
"""

import math

import torch
from torch import Tensor, nn

from interp_transformer.compat.errors import CompatValueError


def calc_fan_in_and_fan_out(tensor: Tensor) -> tuple[int, int]:
    """``(fan_in, fan_out)`` of a bias, a ``[d_in, d_out]`` matrix or a ``[head_index, d_in, d_head]`` weight."""
    shape = tensor.shape
    if len(shape) == 0:
        raise CompatValueError("Fan in and fan out can not be computed for scalars.")
    if len(shape) == 1:
        return 1, shape[0]
    if len(shape) == 2:
        return shape[0], shape[1]
    if len(shape) == 3:
        return shape[1], shape[0] * shape[2]
    raise CompatValueError(f"Fan in and fan out can not be computed for shape {tuple(shape)} tensors.")


def init_xavier_uniform_(param: Tensor, gain: float = 1.0) -> Tensor:
    """``U(-a, a)`` with ``a = gain * sqrt(6 / (fan_in + fan_out))``, in place."""
    fan_in, fan_out = calc_fan_in_and_fan_out(param)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return nn.init.uniform_(param, -bound, bound)


def init_xavier_normal_(param: Tensor, gain: float = 1.0) -> Tensor:
    """``N(0, std^2)`` with ``std = gain * sqrt(2 / (fan_in + fan_out))``, in place."""
    fan_in, fan_out = calc_fan_in_and_fan_out(param)
    return nn.init.normal_(param, mean=0.0, std=gain * math.sqrt(2.0 / (fan_in + fan_out)))


def _kaiming_std(param: Tensor, a: float, nonlinearity: str, gain: float, mode: str) -> float:
    if mode not in ("fan_in", "fan_out"):
        raise CompatValueError(f"mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = calc_fan_in_and_fan_out(param)
    fan = fan_in if mode == "fan_in" else fan_out
    # any name: torch refuses an unknown one with a ValueError naming it (its stub lists them as a Literal)
    return gain * nn.init.calculate_gain(nonlinearity, a) / math.sqrt(fan)  # type: ignore[arg-type]


def init_kaiming_uniform_(
    param: Tensor, a: float = 0, nonlinearity: str = "relu", gain: float = 1.0, mode: str = "fan_in"
) -> Tensor:
    """Uniform with standard deviation ``gain * calculate_gain(nonlinearity) / sqrt(fan)``, in place."""
    bound = math.sqrt(3.0) * _kaiming_std(param, a, nonlinearity, gain, mode)
    return nn.init.uniform_(param, -bound, bound)


def init_kaiming_normal_(
    param: Tensor, a: float = 0, nonlinearity: str = "relu", gain: float = 1.0, mode: str = "fan_in"
) -> Tensor:
    """``N(0, std^2)`` with ``std = gain * calculate_gain(nonlinearity) / sqrt(fan)``, in place."""
    return nn.init.normal_(param, mean=0.0, std=_kaiming_std(param, a, nonlinearity, gain, mode))


@torch.no_grad()
def init_model_weights(model: nn.Module, init_mode: str, gain: float) -> None:
    """TransformerLens' non-GPT-2 inits: weight matrices (``W_*``) by ``init_mode``, biases 0, norm weights 1."""
    inits = {
        "xavier_uniform": lambda p: init_xavier_uniform_(p, gain=gain),
        "xavier_normal": lambda p: init_xavier_normal_(p, gain=gain),
        "kaiming_uniform": lambda p: init_kaiming_uniform_(p, gain=gain, nonlinearity="relu", mode="fan_in"),
        "kaiming_normal": lambda p: init_kaiming_normal_(p, gain=gain, nonlinearity="relu", mode="fan_in"),
    }
    if init_mode not in inits:
        raise CompatValueError(f"init_mode must be one of {['gpt2', *inits]}, got {init_mode!r}")
    for name, param in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf.startswith("W_"):
            inits[init_mode](param)
        elif leaf == "w":
            param.fill_(1.0)
        else:
            param.zero_()


__all__ = [
    "calc_fan_in_and_fan_out",
    "init_kaiming_normal_",
    "init_kaiming_uniform_",
    "init_model_weights",
    "init_xavier_normal_",
    "init_xavier_uniform_",
]
