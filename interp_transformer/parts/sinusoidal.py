"""Fixed sinusoidal positions, and token embeddings multiplied by a constant (the original Transformer's pair).

The original Transformer adds to each token embedding sines and cosines of its position
at geometrically spaced frequencies, ``i = 0 .. d_model/2 - 1``::

    angle[p, i] = p * base^(-2i / d_model)
    interleaved:  pos_embed[p] = [sin(angle[p, 0]), cos(angle[p, 0]), sin(angle[p, 1]), cos(angle[p, 1]), ...]
    halves:       pos_embed[p] = [sin(angle[p, 0]), ..., sin(angle[p, -1]), cos(angle[p, 0]), ..., cos(angle[p, -1])]

Both layouts hold the same numbers in another order along ``d_model``: the paper, the
Annotated Transformer and tensor2tensor interleave (``interleaved=True``); fairseq and
Marian put the sines first (``interleaved=False``). An odd ``d_model`` (halves only) gets
one sine more than cosines.

The table is computed in float64 and rounded to float32 (the precision positional tables
are stored in), then cast to the model's dtype. ``SinusoidalPosEmbed`` has no parameter
and no buffer: ``W_pos`` is the table of positions ``0 .. n_ctx - 1``, computed when asked,
and the part follows the model's dtype through ``.to(...)``. It writes to the residual
stream, but nothing there can be centred (``output_weights()`` is empty).

``ScaledEmbed`` (``components.scaled_embed``, importable from here too) is the token embedding
times a constant, ``embed = W_E[tokens] * scale``, ``scale = sqrt(d_model)`` by default.
"""

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from interp_transformer.core.shape_checks import shape_checked

# the original Transformer's pair, importable from here
from interp_transformer.parts.scaled_embed import ScaledEmbed  # noqa: F401


def sinusoidal_table(
    positions: Int[Tensor, "..."], d_model: int, base: float = 10000.0, interleaved: bool = False
) -> Float[Tensor, "... d_model"]:
    """The sinusoidal embedding of every position in ``positions``, float32 (see the module docstring)."""
    if isinstance(d_model, bool) or not isinstance(d_model, int) or d_model < 1:
        raise ValueError(f"d_model must be a positive int, got {d_model!r}")
    if interleaved and d_model % 2:
        raise ValueError(f"interleaved sines and cosines need an even d_model, got {d_model}")
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not base > 1:
        raise ValueError(f"base must be a number > 1, got {base!r}")
    n_sines = (d_model + 1) // 2
    frequencies = float(base) ** (-2 * torch.arange(n_sines, dtype=torch.float64, device=positions.device) / d_model)
    angles = positions.to(torch.float64)[..., None] * frequencies  # [..., n_sines]
    sines, cosines = angles.sin(), angles[..., : d_model // 2].cos()
    if interleaved:
        table = einops.rearrange(torch.stack([sines, cosines], dim=-1), "... pair sin_cos -> ... (pair sin_cos)")
    else:
        table = torch.cat([sines, cosines], dim=-1)
    return table.to(torch.float32)


class SinusoidalPosEmbed(nn.Module):
    """Fixed positions: ``pos_embed[b, p] = table[positions[b, p]]`` (see the module docstring).

    Called like ``PosEmbed``: ``positions`` default to ``offset, offset + 1, ...`` in every row.
    """

    def __init__(self, cfg, base: float = 10000.0, interleaved: bool = False):
        super().__init__()
        self.d_model, self.n_ctx = cfg.d_model, cfg.n_ctx
        self.base, self.interleaved = float(base), bool(interleaved)
        # check
        sinusoidal_table(torch.zeros(1, dtype=torch.long, device="cpu"), self.d_model, self.base, self.interleaved)
        self.dtype = torch.float32  # the model's dtype, followed through .to(...): there is no parameter to carry it

    def output_weights(self) -> list[Tensor]:
        """Nothing: fixed positions have no weight to centre."""
        return []

    @property
    def W_pos(self) -> Float[Tensor, "n_ctx d_model"]:
        """The table of positions ``0 .. n_ctx - 1`` in the model's dtype (computed, not stored)."""
        return sinusoidal_table(torch.arange(self.n_ctx, device="cpu"), self.d_model, self.base, self.interleaved).to(
            self.dtype
        )

    def _apply(self, fn, recurse=True):
        self.dtype = fn(torch.empty(0, dtype=self.dtype, device="cpu")).dtype  # the dtype .to()/.double() ask for
        return super()._apply(fn, recurse)

    @shape_checked
    def forward(
        self, tokens: Int[Tensor, "batch pos"], offset: int = 0, positions: Int[Tensor, "batch pos"] | None = None
    ) -> Float[Tensor, "batch pos d_model"]:
        if positions is None:
            positions = torch.arange(offset, offset + tokens.shape[1], device=tokens.device).expand(tokens.shape)
        return sinusoidal_table(positions, self.d_model, self.base, self.interleaved).to(self.dtype)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, base={self.base:g}, interleaved={self.interleaved}"


__all__ = ["ScaledEmbed", "SinusoidalPosEmbed", "sinusoidal_table"]
