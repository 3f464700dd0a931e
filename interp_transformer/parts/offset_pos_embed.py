"""Learned positions read at an offset: BART's ``W_pos[positions + 2]``.

BART (inherited from fairseq, where rows ``0 .. padding_idx`` of the position table were
reserved for padding) stores ``n_ctx + 2`` rows and reads position ``p`` from row ``p + 2``:
the first two rows are never read. The table is kept whole, as the checkpoint has it,
so that ``W_pos`` is the checkpoint's tensor and the offset stays visible.
"""

from interp_transformer.parts.pos_embed import PosEmbed


class OffsetPosEmbed(PosEmbed):
    """``pos_embed[b, p] = W_pos[positions[b, p] + offset]``, ``W_pos [n_ctx + offset, d_model]``."""

    def __init__(self, cfg, offset: int = 2):
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be an int >= 0, got {offset!r}")
        super().__init__(cfg, first_row=offset)

    @property
    def offset(self) -> int:
        """The rows before position 0's (``first_row``)."""
        return self.first_row

    def extra_repr(self) -> str:
        return f"offset={self.offset}"
