import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from interp_transformer.core.shape_checks import shape_checked


class TokenTypeEmbed(nn.Module):
    """Segment embedding: ``token_type_embed = W_token_type[token_type_ids]``."""

    def __init__(self, cfg):
        super().__init__()
        self.W_token_type = nn.Parameter(torch.empty(cfg.n_token_types, cfg.d_model))

    def output_weights(self) -> list[Tensor]:
        """``W_token_type``: what this part writes to the residual stream (``d_model`` last)."""
        return [self.W_token_type]

    @shape_checked
    def forward(self, token_type_ids: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        return self.W_token_type[token_type_ids]
