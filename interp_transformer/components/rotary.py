"""Rotary positions (RoPE): each head's queries and keys are rotated by an angle proportional to their position.

The first ``rotary_dim`` dimensions of a head are taken as ``rotary_dim / 2`` pairs;
pair ``i`` at position ``p`` is rotated by the angle ``p * inv_freq[i]``, with
``inv_freq[i] = base^(-2i / rotary_dim)`` (then rescaled by ``scaling``, if any). A
query at ``p`` and a key at ``p'`` rotated this way have a dot product that depends on
their positions only through ``p - p'``. The remaining ``d_head - rotary_dim`` dimensions
(partial rotary) pass unchanged.

Two conventions pair the dimensions differently; both are the same rotation of a
differently ordered vector:

===============  ==========================================================  =====================
``interleaved``  pairs                                                       used by
===============  ==========================================================  =====================
False            ``(i, i + rotary_dim/2)``: the two halves ("rotate_half")  Llama, Mistral, Qwen, GPT-NeoX
True             ``(2i, 2i + 1)``: adjacent dimensions ("rotate every two")  GPT-J, llama.cpp
===============  ==========================================================  =====================

For each pair ``(a, b)`` with angle ``t``: ``(a, b) -> (a cos t - b sin t, b cos t + a sin t)``.

Precision. The angles and their cos/sin are computed in float32 whatever the model's
dtype, in the same operations as Hugging Face's rotary embedding, and only then cast to
the activations' dtype: this is what the checkpoints were trained and are run with, so
a float64 copy of the model still matches Hugging Face's float64 run to float64 rounding.
The frequencies are therefore a plain float32 tensor, not a buffer: casting the model or
building it on the meta device must not touch them.
"""

import math
from dataclasses import dataclass
from typing import Optional

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from ..models.shape_checks import shape_checked

ROPE_SCALING_TYPES = ("linear", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    """How the rotary frequencies are stretched for contexts longer than the pretraining one.

    ``"linear"`` (position interpolation): every frequency divided by ``factor``.
    ``"llama3"`` (Llama 3.1): wavelengths shorter than ``original_max_position_embeddings
    / high_freq_factor`` kept, longer than ``original_max_position_embeddings /
    low_freq_factor`` divided by ``factor``, and smoothly interpolated in between.
    """

    kind: str  # "linear" or "llama3"
    factor: float  # how many times longer the context is than in pretraining
    low_freq_factor: float = 1.0  # llama3 only: wavelengths above original / low_freq_factor are fully scaled
    high_freq_factor: float = 4.0  # llama3 only: wavelengths below original / high_freq_factor are kept
    original_max_position_embeddings: int = 8192  # llama3 only: the pretraining context

    def __post_init__(self) -> None:
        if self.kind not in ROPE_SCALING_TYPES:
            raise ValueError(f"rope scaling kind must be one of {ROPE_SCALING_TYPES}, got {self.kind!r}")
        for field in ("factor", "low_freq_factor", "high_freq_factor"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"rope scaling {field} must be a number > 0, got {value!r}")
        if self.kind == "llama3" and not self.high_freq_factor > self.low_freq_factor:
            raise ValueError(
                "llama3 rope scaling needs high_freq_factor > low_freq_factor, got "
                f"high_freq_factor={self.high_freq_factor} "
                f"and low_freq_factor={self.low_freq_factor}"
            )
        value = self.original_max_position_embeddings
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"rope scaling original_max_position_embeddings must be a positive int, got {value!r}")


def rotary_frequencies(rotary_dim: int, base: float, scaling: Optional[RopeScaling] = None) -> Float[Tensor, "half"]:
    """``inv_freq [rotary_dim / 2]`` in float32: ``base^(-2i / rotary_dim)``, rescaled by ``scaling``.

    Written in the same float32 operations as Hugging Face's ``compute_default_rope_parameters``
    and ``_compute_llama3_parameters``, so the frequencies agree bit for bit.
    """
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64, device="cpu").float() / rotary_dim
    inv_freq = 1.0 / (base**exponents)
    if scaling is None:
        return inv_freq
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    old_context = scaling.original_max_position_embeddings
    low_freq_wavelength = old_context / scaling.low_freq_factor
    high_freq_wavelength = old_context / scaling.high_freq_factor
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > low_freq_wavelength, inv_freq / scaling.factor, inv_freq)
    smooth = (old_context / wavelength - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = ~(wavelength < high_freq_wavelength) * ~(wavelength > low_freq_wavelength)
    return torch.where(is_medium, smoothed, scaled)


class Rotary(nn.Module):
    """Rotates the first ``rotary_dim`` dimensions of every head by its position (see the module docstring).

    ``forward(x, positions)`` takes queries or keys ``[batch, pos, head_index, d_head]`` and
    their position ids ``[batch, pos]`` (an attention reads them from its ``TokenLayout``, so
    a key/value cache offset and left padding are accounted for) and returns them rotated.
    No parameters and no hooks: the attention that holds it hooks the rotated q and k.
    """

    def __init__(
        self,
        d_head: int,
        rotary_dim: Optional[int] = None,
        base: float = 10000.0,
        interleaved: bool = False,
        scaling: Optional[RopeScaling] = None,
    ):
        super().__init__()
        rotary_dim = d_head if rotary_dim is None else rotary_dim
        if (
            isinstance(rotary_dim, bool)
            or not isinstance(rotary_dim, int)
            or not 0 < rotary_dim <= d_head
            or rotary_dim % 2
        ):
            raise ValueError(f"rotary_dim must be an even int in [2, d_head={d_head}], got {rotary_dim!r}")
        if isinstance(base, bool) or not isinstance(base, (int, float)) or not base > 1:
            raise ValueError(f"rotary base must be a number > 1, got {base!r}")
        if scaling is not None and not isinstance(scaling, RopeScaling):
            raise TypeError(f"scaling must be a RopeScaling or None, got {type(scaling).__name__}")
        self.d_head, self.rotary_dim, self.base = d_head, rotary_dim, float(base)
        self.interleaved, self.scaling = bool(interleaved), scaling
        self.inv_freq = rotary_frequencies(rotary_dim, self.base, scaling)  # float32, not a buffer (module docstring)

    def cos_sin(self, positions: Int[Tensor, "batch pos"], dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """``cos`` and ``sin`` of every angle, ``[batch, pos, rotary_dim]`` in ``dtype``, laid out like the pairs.

        Entry ``j`` holds the angle of the pair dimension ``j`` belongs to: pair ``j mod
        rotary_dim/2`` for the half split, pair ``j // 2`` when interleaved.
        """
        angles = positions[..., None].float() * self.inv_freq.to(positions.device)
        if self.interleaved:
            angles = einops.repeat(angles, "batch pos pair -> batch pos (pair two)", two=2)
        else:
            angles = torch.cat((angles, angles), dim=-1)  # [first half | second half]
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def rotate_pairs(self, x: Float[Tensor, "... rotary_dim"]) -> Float[Tensor, "... rotary_dim"]:
        """``(a, b) -> (-b, a)`` for every pair: what ``sin`` multiplies in ``x cos + rotate_pairs(x) sin``."""
        if self.interleaved:
            pairs = einops.rearrange(x, "... (pair two) -> ... pair two", two=2)
            rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1)
            return einops.rearrange(rotated, "... pair two -> ... (pair two)")
        first, second = x.chunk(2, dim=-1)
        return torch.cat((-second, first), dim=-1)

    @shape_checked
    def forward(
        self, x: Float[Tensor, "batch pos head_index d_head"], positions: Int[Tensor, "batch pos"]
    ) -> Float[Tensor, "batch pos head_index d_head"]:
        cos, sin = (
            einops.rearrange(t, "batch pos rotary_dim -> batch pos 1 rotary_dim")
            for t in self.cos_sin(positions, x.dtype)
        )
        rotated, passed = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        rotated = rotated * cos + self.rotate_pairs(rotated) * sin
        return torch.cat((rotated, passed), dim=-1) if passed.shape[-1] else rotated

    def extra_repr(self) -> str:
        scaling = f", scaling={self.scaling}" if self.scaling is not None else ""
        dims = f"rotary_dim={self.rotary_dim}, d_head={self.d_head}"
        return f"{dims}, base={self.base}, interleaved={self.interleaved}{scaling}"


__all__ = ["ROPE_SCALING_TYPES", "RopeScaling", "Rotary", "rotary_frequencies"]
