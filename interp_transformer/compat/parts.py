"""The parts TransformerLens-compatible models add to ours: shortformer positions, and TransformerLens' call of
the positional embedding.

TransformerLens' attention (split inputs, ``hook_result``), read-out (``unembed.hook_in``/``hook_out``)
and block input hooks (``hook_attn_in``, ``hook_q_input``/``k_input``/``v_input``, ``hook_mlp_in``,
shortformer positions) are options of the core's ``Attention``, ``Unembed`` and ``PreNormBlock``
(``parts.split_inputs``, ``Unembed(in_out_hooks=True)``, ``parts.input_hooks``). Each only *adds*
hook points whose values equal what the core computes (DESIGN section 3).
"""

from dataclasses import dataclass

from torch import Tensor

from interp_transformer.compat.errors import CompatValueError
from interp_transformer.compat.utils_tensors import get_offset_position_ids
from interp_transformer.parts import PosEmbed, TokenLayout


@dataclass(frozen=True)
class ShortformerLayout(TokenLayout):
    """A ``TokenLayout`` carrying the positional embedding ``[batch, pos, d_model]`` that shortformer blocks add
    to their query and key inputs (the residual stream never holds it)."""

    pos_embed: Tensor | None = None


class PositionalEmbedding(PosEmbed):
    """``PosEmbed`` that also takes TransformerLens' call ``pos_embed(tokens, offset, attention_mask=mask)``.

    With ``attention_mask`` (``[batch, offset + pos]``, 1 real, 0 padding; the cached
    positions' entries first) each real token's position counts from its row's first real
    token and padding gets zeros, as in TransformerLens. In the model's own forward the
    positions come from the layout (padding then repeats its last real position, which no
    real token reads).
    """

    def forward(
        self,
        tokens: Tensor,
        offset: int = 0,
        positions: Tensor | None = None,
        *,
        attention_mask: Tensor | None = None,
    ) -> Tensor:
        if attention_mask is None:
            return super().forward(tokens, offset, positions)
        if positions is not None:
            raise CompatValueError("pass positions or attention_mask, not both")
        if attention_mask.shape != (tokens.shape[0], offset + tokens.shape[1]):
            raise CompatValueError(
                "attention_mask must be [batch, offset + pos] = "
                f"{[tokens.shape[0], offset + tokens.shape[1]]}, "
                f"got {list(attention_mask.shape)}"
            )
        mask = attention_mask.to(self.W_pos.device)
        positions = get_offset_position_ids(offset, mask)
        return self.W_pos[positions] * mask[:, offset:, None].to(self.W_pos.dtype)


__all__ = [
    "PositionalEmbedding",
    "ShortformerLayout",
]
