"""YaRN rotary frequencies (gpt-oss): low frequencies interpolated, high ones kept, a ramp between.

For a head of ``rotary_dim`` dimensions, base ``b`` and a context ``factor`` times the
pretraining one (``original_max_position_embeddings``, ``L``)::

    extrapolated[i] = b^(-2i / rotary_dim)                      (the unscaled frequency)
    interpolated[i] = extrapolated[i] / factor
    dim(r)          = rotary_dim * ln(L / (2 pi r)) / (2 ln b)   (the pair that turns r times over L)
    low, high       = dim(beta_fast), dim(beta_slow)             (floored and ceiled when truncate),
                      clipped to [0, rotary_dim - 1]
    ramp[i]         = clamp((i - low) / (high - low), 0, 1)
    inv_freq[i]     = interpolated[i] * ramp[i] + extrapolated[i] * (1 - ramp[i])

and cos and sin are both multiplied by the attention factor, ``0.1 ln(factor) + 1`` unless
given (1 for ``factor <= 1``), so every score grows by its square. Computed in float32 in
the operations of Hugging Face's ``_compute_yarn_parameters``, so the frequencies agree bit
for bit.
"""

import math

import torch
from jaxtyping import Float
from torch import Tensor


def yarn_attention_factor(factor: float, attention_factor=None) -> float:
    """What cos and sin are multiplied by: ``attention_factor`` if given, else ``0.1 ln(factor) + 1`` (1 for
    ``factor <= 1``)."""
    if attention_factor is not None:
        return float(attention_factor)
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


def _correction_dim(rotations: float, rotary_dim: int, base: float, old_context: int) -> float:
    """The (fractional) pair index whose wavelength fits ``rotations`` times in the pretraining context."""
    return (rotary_dim * math.log(old_context / (rotations * 2 * math.pi))) / (2 * math.log(base))


def yarn_frequencies(rotary_dim: int, base: float, scaling) -> Float[Tensor, "half"]:
    """``inv_freq [rotary_dim / 2]`` of a ``RopeScaling("yarn", ...)`` (see the module docstring), float32 on the
    CPU."""
    low = _correction_dim(scaling.beta_fast, rotary_dim, base, scaling.original_max_position_embeddings)
    high = _correction_dim(scaling.beta_slow, rotary_dim, base, scaling.original_max_position_embeddings)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # a zero-width ramp would divide by zero
    pos_freqs = base ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64, device="cpu").float() / rotary_dim)
    extrapolated = 1.0 / pos_freqs
    interpolated = 1.0 / (scaling.factor * pos_freqs)
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)
    kept = 1 - ramp  # the share of each frequency left unscaled
    return interpolated * (1 - kept) + extrapolated * kept


__all__ = ["yarn_attention_factor", "yarn_frequencies"]
