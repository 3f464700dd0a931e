"""Gemma's token embedding: ``W_E[tokens]`` multiplied by ``sqrt(d_model)``.

The factor is rounded to the model's dtype before the product, as Gemma's checkpoints
run (Hugging Face rounds ``sqrt(3072) = 55.43`` to bfloat16's ``55.5`` for a bfloat16
model): float32 for float32, float64 for float64, and float32-then-half for half precision.
``W_E`` is the checkpoint's embedding, unscaled, so a tied read-out is ``W_E^T`` as in the
checkpoint; ``hook_embed`` holds the scaled rows, which are what enters the residual stream.
"""

import math

import torch
from jaxtyping import Float, Int
from torch import Tensor

from ..shape_checks import shape_checked
from .embed import Embed


def embedding_scale(d_model: int, dtype: torch.dtype, device=None) -> Tensor:
    """``sqrt(d_model)`` as a 0-d tensor of ``dtype``, rounded the way Gemma's checkpoints round it."""
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    return torch.tensor(math.sqrt(d_model), dtype=wide, device=device).to(dtype)


class ScaledEmbed(Embed):
    """``embed = W_E[tokens] * sqrt(d_model)`` (see the module docstring)."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.d_model = cfg.d_model

    @shape_checked
    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        return self.W_E[tokens] * embedding_scale(self.d_model, self.W_E.dtype, self.W_E.device)

    def extra_repr(self) -> str:
        return f"scale=sqrt({self.d_model})"


__all__ = ["ScaledEmbed", "embedding_scale"]
