import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from interp_transformer.core.shape_checks import check_positions_fit, shape_checked


class PosEmbed(nn.Module):
    """Learned absolute positions: ``pos_embed[b, p] = W_pos[positions[b, p]]``.

    ``positions`` defaults to ``offset, offset + 1, ...`` in every row, where ``offset`` is
    the number of positions already processed (non-zero only when generating with a
    key/value cache). The result is a new tensor, never a view of ``W_pos``, so a hook
    that edits it in place cannot write into the weights. ``first_row``: the row position 0
    reads (``W_pos`` then has ``n_ctx + first_row`` rows; BART's ``OffsetPosEmbed``).
    """

    def __init__(self, cfg, first_row: int = 0):
        super().__init__()
        self.first_row = first_row
        self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx + first_row, cfg.d_model))

    def output_weights(self) -> list[Tensor]:
        """``W_pos``: what this part writes to the residual stream (``d_model`` last)."""
        return [self.W_pos]

    @shape_checked
    def forward(
        self, tokens: Int[Tensor, "batch pos"], offset: int = 0, positions: Int[Tensor, "batch pos"] | None = None
    ) -> Float[Tensor, "batch pos d_model"]:
        if positions is None:
            check_positions_fit(self, "tokens", tokens.shape[-1], offset, self.W_pos.shape[0] - self.first_row)
            positions = torch.arange(offset, offset + tokens.shape[1], device=self.W_pos.device).expand(tokens.shape)
        return self.W_pos[positions + self.first_row if self.first_row else positions]
