"""Sinusoidal positions (fixed, not learned) and token embeddings scaled by a constant.

The original Transformer adds to each token embedding a vector of sines and cosines of
its position, at geometrically spaced frequencies::

    angle[p, i] = p * base^(-2i / d_model)                       i = 0 .. d_model/2 - 1
    pos_embed[p] = [sin(angle[p, 0]), cos(angle[p, 0]), sin(angle[p, 1]), ...]   interleaved
    pos_embed[p] = [sin(angle[p, :]), cos(angle[p, :])]                            halves

Both layouts hold the same numbers in a different order of ``d_model``: Vaswani et al. and
tensor2tensor interleave (``interleaved=True``); Marian, fairseq and Hugging Face's
``MarianSinusoidalPositionalEmbedding`` put every sine first (``interleaved=False``). An odd
``d_model`` gets one more sine than cosines, as in Hugging Face's table.

Precision. The table is computed in float64 and rounded to float32, then cast to the
activations' dtype: this is how Marian checkpoints were trained and how Hugging Face
builds its table (NumPy float64 rounded to a float32 tensor), so a float64 copy of a
model matches Hugging Face's float64 run to float64 rounding. There are no weights: the
part holds no parameter or buffer (building on the meta device or casting the model
leaves it as it is) and ``W_pos`` is the table of the first ``n_ctx`` positions,
computed when asked.

``ScaledEmbed`` is the token embedding multiplied by a constant, ``embed = W_E[tokens] *
scale``, with ``scale = sqrt(d_model)`` in the original Transformer and Marian (so that the
embeddings, initialised small, are not drowned by the unit-sized positions).
"""

import math
from typing import Optional

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from ..shape_checks import shape_checked
from .embed import Embed


def sinusoidal_table(
    positions: Int[Tensor, "..."], d_model: int, base: float = 10000.0, interleaved: bool = False
) -> Float[Tensor, "... d_model"]:
    """The sinusoidal embedding of every position in ``positions`` (float32; see the module docstring)."""
    if isinstance(d_model, bool) or not isinstance(d_model, int) or d_model < 1:
        raise ValueError(f"d_model must be a positive int, got {d_model!r}")
    n_sin = (d_model + 1) // 2
    exponents = 2 * torch.arange(n_sin, dtype=torch.float64, device=positions.device) / d_model
    angles = positions.to(torch.float64)[..., None] / torch.pow(torch.tensor(float(base), dtype=torch.float64), exponents)
    sines, cosines = angles.sin(), angles[..., : d_model // 2].cos()
    if interleaved:
        if d_model % 2:
            raise ValueError(f"an interleaved sinusoidal table needs an even d_model, got {d_model}")
        table = einops.rearrange(torch.stack([sines, cosines], dim=-1), "... half pair -> ... (half pair)")
    else:
        table = torch.cat([sines, cosines], dim=-1)
    return table.to(torch.float32)


class SinusoidalPosEmbed(nn.Module):
    """Fixed sinusoidal positions: ``pos_embed[b, p] = table[positions[b, p]]`` (see the module docstring).

    Same call as ``PosEmbed``: ``positions`` defaults to ``offset, offset + 1, ...`` in every
    row. The result has the dtype of ``like`` (the model's), or float32.
    """

    def __init__(self, cfg, base: float = 10000.0, interleaved: bool = False):
        super().__init__()
        self.d_model, self.n_ctx = cfg.d_model, cfg.n_ctx
        self.base, self.interleaved = float(base), bool(interleaved)
        if self.interleaved and self.d_model % 2:
            raise ValueError(f"an interleaved sinusoidal table needs an even d_model, got {self.d_model}")
        self.dtype = torch.float32  # follows the model through .to(dtype): there is no parameter to carry it

    def output_weights(self) -> list[Tensor]:
        """Nothing: fixed positions have no weights to centre or fold."""
        return []

    @property
    def W_pos(self) -> Float[Tensor, "n_ctx d_model"]:
        """The table of positions ``0 .. n_ctx - 1`` (computed, not stored)."""
        return sinusoidal_table(torch.arange(self.n_ctx), self.d_model, self.base, self.interleaved).to(self.dtype)

    def _apply(self, fn, recurse=True):
        # record the dtype a .to()/.double() asks for, by applying it to a probe
        self.dtype = fn(torch.empty(0, dtype=self.dtype)).dtype
        return super()._apply(fn, recurse)

    @shape_checked
    def forward(
        self, tokens: Int[Tensor, "batch pos"], offset: int = 0, positions: Optional[Int[Tensor, "batch pos"]] = None
    ) -> Float[Tensor, "batch pos d_model"]:
        if positions is None:
            positions = torch.arange(offset, offset + tokens.shape[1], device=tokens.device).expand(tokens.shape)
        return sinusoidal_table(positions, self.d_model, self.base, self.interleaved).to(self.dtype)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, base={self.base:g}, interleaved={self.interleaved}"


class ScaledEmbed(Embed):
    """Token embedding times a constant: ``embed = W_E[tokens] * scale`` (``sqrt(d_model)`` by default)."""

    def __init__(self, cfg, scale: Optional[float] = None):
        super().__init__(cfg)
        self.scale = math.sqrt(cfg.d_model) if scale is None else float(scale)

    @shape_checked
    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        return self.W_E[tokens] * self.scale

    def extra_repr(self) -> str:
        return f"scale={self.scale:g}"


__all__ = ["ScaledEmbed", "SinusoidalPosEmbed", "sinusoidal_table"]
