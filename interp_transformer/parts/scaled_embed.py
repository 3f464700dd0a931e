"""The token embedding multiplied by a constant: ``embed = W_E[tokens] * scale``.

``scale = sqrt(d_model)`` by default: the original Transformer, Marian and BART's
``scale_embedding`` (embeddings initialised small are then not drowned by unit-sized
positions), and Gemma. ``W_E`` is the table as stored, so a tied read-out is ``W_E^T`` as in
the checkpoint; what a token writes to the stream (``hook_embed``) is ``W_E[token] * scale``.

Rounding. With ``round_scale=True`` the factor is rounded to the model's dtype before the
product, as Gemma's checkpoints run (Hugging Face rounds ``sqrt(3072) = 55.43`` to
bfloat16's ``55.5`` for a bfloat16 model): float32 for float32, float64 for float64, and
float32-then-half for half precision. Otherwise the product is torch's tensor-times-number,
as Hugging Face's Marian and BART compute it; the two differ only in half precision.
"""

import math

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.parts.embed import Embed


def embedding_scale(scale: float, dtype: torch.dtype, device=None) -> Tensor:
    """``scale`` as a 0-d tensor of ``dtype``, rounded the way Gemma's checkpoints round it."""
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    return torch.tensor(scale, dtype=wide, device=device).to(dtype)


class ScaledEmbed(Embed):
    """``embed = W_E[tokens] * scale``, ``sqrt(d_model)`` by default (see the module docstring)."""

    def __init__(self, cfg, scale: float | None = None, round_scale: bool = False):
        super().__init__(cfg)
        if scale is not None and (
            isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale)
        ):
            raise ValueError(f"scale must be a finite number or None (sqrt(d_model)), got {scale!r}")
        self.scale = math.sqrt(cfg.d_model) if scale is None else float(scale)
        self.round_scale = bool(round_scale)

    def writes(self) -> Float[Tensor, "d_vocab d_model"]:
        """What each token writes into the residual stream: ``W_E * scale``, not the stored ``W_E``."""
        return self.forward(torch.arange(self.W_E.shape[0], device=self.W_E.device)[None])[0]

    @shape_checked
    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        if self.round_scale:
            return self.W_E[tokens] * embedding_scale(self.scale, self.W_E.dtype, self.W_E.device)
        return self.W_E[tokens] * self.scale

    def extra_repr(self) -> str:
        return f"scale={self.scale:g}, round_scale={self.round_scale}"


__all__ = ["ScaledEmbed", "embedding_scale"]
