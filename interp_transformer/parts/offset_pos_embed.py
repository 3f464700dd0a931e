"""Learned positions read at an offset: BART's ``W_pos[positions + 2]``.

BART (inherited from fairseq, where rows ``0 .. padding_idx`` of the position table were
reserved for padding) stores ``n_ctx + 2`` rows and reads position ``p`` from row ``p + 2``:
the first two rows are never read. The table is kept whole, as the checkpoint has it,
so that ``W_pos`` is the checkpoint's tensor and the offset stays visible.
"""

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from interp_transformer.core.shape_checks import shape_checked


class OffsetPosEmbed(nn.Module):
    """``pos_embed[b, p] = W_pos[positions[b, p] + offset]``, ``W_pos [n_ctx + offset, d_model]``."""

    def __init__(self, cfg, offset: int = 2):
        super().__init__()
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be an int >= 0, got {offset!r}")
        self.offset = offset
        self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx + offset, cfg.d_model))

    def output_weights(self) -> list[Tensor]:
        """``W_pos``: what this part writes to the residual stream (``d_model`` last)."""
        return [self.W_pos]

    @shape_checked
    def forward(
        self, tokens: Int[Tensor, "batch pos"], offset: int = 0, positions: Int[Tensor, "batch pos"] | None = None
    ) -> Float[Tensor, "batch pos d_model"]:
        if positions is None:
            positions = torch.arange(offset, offset + tokens.shape[1], device=self.W_pos.device).expand(tokens.shape)
        return self.W_pos[positions + self.offset]

    def extra_repr(self) -> str:
        return f"offset={self.offset}"


__all__ = ["OffsetPosEmbed"]
