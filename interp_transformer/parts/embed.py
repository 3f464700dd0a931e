import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from interp_transformer.core.shape_checks import shape_checked


class Embed(nn.Module):
    """Token embedding: ``embed = W_E[tokens]``."""

    def __init__(self, cfg):
        super().__init__()
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))

    def output_weights(self) -> list[Tensor]:
        """``W_E``: what this part writes to the residual stream (``d_model`` last)."""
        return [self.W_E]

    def writes(self) -> Float[Tensor, "d_vocab d_model"]:
        """What each token writes into the residual stream, one row per token: here ``W_E`` itself."""
        return self.W_E

    @shape_checked
    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        return self.W_E[tokens]
