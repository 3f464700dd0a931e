import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from ..config import TransformerConfig
from ..shape_checks import shape_checked


class Embed(nn.Module):
    """Token embedding: ``embed = W_E[tokens]``."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))

    @shape_checked
    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        return self.W_E[tokens]
