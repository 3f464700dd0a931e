import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from ..config import TransformerConfig
from ..shape_checks import shape_checked


class PosEmbed(nn.Module):
    """Learned absolute positions: ``pos_embed = W_pos[offset : offset + pos]`` for every batch row.

    ``offset`` is the number of positions already processed (non-zero only when
    generating with a key/value cache).
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model))

    @shape_checked
    def forward(self, tokens: Int[Tensor, "batch pos"], offset: int = 0) -> Float[Tensor, "batch pos d_model"]:
        batch, pos = tokens.shape
        return einops.repeat(self.W_pos[offset : offset + pos], "pos d_model -> batch pos d_model", batch=batch)
