"""A learned relative-position bias clipped at ``max_distance``: one learned number per head and clipped offset.

The textbook relative-position variant (Shaw et al., 2018, as a scalar bias per head): each
head adds to its scores a learned value for the key's offset from the query, the offset
clipped linearly to ``[-max_distance, max_distance]``::

    offset[q, k]          = clip(position[k] - position[q], -max_distance, max_distance)
    score_bias[b, h, q, k] = W_rel[offset[q, k] + max_distance, h]
    attn_scores            = q . k * scale + score_bias             (-inf where masked)

``W_rel`` is ``[2 max_distance + 1, head_index]``: row ``max_distance`` is the query's own
position, the rows below it the keys before it. A causal model only reads those rows and
the one of its own position. (T5's bias, ``relative_position_bias``, buckets offsets on a
log scale instead.)

Positions count real tokens only, as ALiBi's do (``alibi.key_positions``): a padded row gets
the bias it gets alone, and a key/value cache's keys keep their positions.

``ClippedRelativeBias`` is a score-bias part of ``Attention``
(``Attention(cfg, score_bias=ClippedRelativeBias(n_heads, max_distance))``), hooked as
``score_bias.hook_bias`` (``[batch, head_index, query_pos, key_pos]``).
"""

import torch
from jaxtyping import Float
from torch import Tensor, nn

from interp_transformer.hooks import HookPoint
from interp_transformer.parts.alibi import key_positions
from interp_transformer.parts.layout import TokenLayout


class ClippedRelativeBias(nn.Module):
    """``score_bias[b, h, q, k] = W_rel[clip(k - q, -M, M) + M, h]`` (see the module docstring)."""

    def __init__(self, n_heads: int, max_distance: int):
        super().__init__()
        for name, value in (("n_heads", n_heads), ("max_distance", max_distance)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ClippedRelativeBias needs {name} a positive int, got {value!r}")
        self.n_heads, self.max_distance = n_heads, max_distance
        self.W_rel = nn.Parameter(torch.zeros(2 * max_distance + 1, n_heads))
        self.hook_bias = HookPoint()

    def forward(self, layout: TokenLayout, dtype: torch.dtype) -> Float[Tensor, "batch head_index query_pos key_pos"]:
        queries = layout.positions  # [batch, query_pos]
        keys = key_positions(layout).to(queries.device)  # [batch or 1, key_pos]
        offset = (keys[:, None, :] - queries[:, :, None]).clamp(-self.max_distance, self.max_distance)
        bias = self.W_rel[offset + self.max_distance]  # [batch, query_pos, key_pos, head_index]
        bias = bias.permute(0, 3, 1, 2).to(dtype)
        return self.hook_bias(bias.expand(queries.shape[0], -1, -1, -1))

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, max_distance={self.max_distance}"


__all__ = ["ClippedRelativeBias"]
