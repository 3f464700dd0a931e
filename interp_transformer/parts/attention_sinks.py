"""Attention sinks (gpt-oss): a learned logit per head that joins every query's softmax, then is dropped.

Each head ``h`` has one more score than it has keys, ``logits[h]``, the same for every query::

    pattern[q, k] = exp(attn_scores[q, k]) / (sum_k' exp(attn_scores[q, k']) + exp(logits[h]))

so a query may give part of its attention to nothing: its pattern sums to less than 1, and
``1 - pattern.sum(-1)`` is what went to the sink. The sink has no value, so ``z`` is the
pattern-weighted values as usual. ``hook_attn_scores`` holds the scores of the keys only;
the sink's column is hooked on its own, ``hook_logits`` (``[batch, head_index, query_pos,
1]``, ``logits[h]`` on every row), where editing it changes what the softmax sees.

``AttentionSinks`` is a part of ``Attention`` (``Attention(cfg, ..., sinks=AttentionSinks(n_heads))``,
hooked as ``blocks.L.attn.sinks.hook_logits``). The explicit path takes the softmax over the
scores and the sink's column and drops that column (``softmax``); the fused kernel has no
such column, so it is given one more key, a zero key with a zero value whose score is the
sink's logit through the additive mask (``with_sink_key``): the same formula.
"""

import torch
from jaxtyping import Float
from torch import Tensor, nn

from interp_transformer.hooks import HookPoint


class AttentionSinks(nn.Module):
    """``logits [head_index]``: each head's sink, one more logit in every query's softmax (see the module
    docstring)."""

    def __init__(self, n_heads: int):
        super().__init__()
        if isinstance(n_heads, bool) or not isinstance(n_heads, int) or n_heads < 1:
            raise ValueError(f"n_heads must be a positive int, got {n_heads!r}")
        self.n_heads = n_heads
        self.logits = nn.Parameter(torch.zeros(n_heads))
        self.hook_logits = HookPoint()

    def forward(self, batch: int, query_pos: int, dtype: torch.dtype) -> Float[Tensor, "batch head_index query_pos 1"]:
        """The sink's column of the scores, ``logits[h]`` on every query's row (hooked)."""
        column = self.logits.to(dtype)[None, :, None, None].expand(batch, -1, query_pos, 1)
        return self.hook_logits(column)

    @staticmethod
    def softmax(
        attn_scores: Float[Tensor, "batch head_index query_pos key_pos"],
        sink: Float[Tensor, "batch head_index query_pos 1"],
    ) -> Float[Tensor, "batch head_index query_pos key_pos"]:
        """``softmax([attn_scores, sink])`` over ``key_pos`` and the sink, the sink's column dropped."""
        with_sink = torch.cat([attn_scores, sink.to(attn_scores.dtype)], dim=-1)
        return with_sink.softmax(dim=-1)[..., :-1]

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}"


def with_sink_key(
    k: Float[Tensor, "batch kv_head key_pos d_head"],
    v: Float[Tensor, "batch kv_head key_pos d_head"],
    mask,
    sink: Float[Tensor, "batch head_index query_pos 1"],
) -> tuple[Tensor, Tensor, Tensor]:
    """Keys and values (heads first) with one more key at the end, zero in both, and the additive mask that gives that
    key the sink's logit as its score (``q . 0 = 0``, plus the logit): the fused kernel's form of ``softmax``.

    ``mask`` is what the kernel would have taken: None, a boolean ``allowed`` or an additive
    bias, broadcasting to ``[batch, head_index, query_pos, key_pos]``.
    """
    zero = k.new_zeros(k.shape[0], k.shape[1], 1, k.shape[3])
    k, v = torch.cat([k, zero], dim=2), torch.cat([v, zero], dim=2)
    batch, n_heads, query_pos = sink.shape[:3]
    key_pos = k.shape[2] - 1
    if mask is None:
        bias = sink.new_zeros(1, 1, query_pos, key_pos)
    elif mask.dtype == torch.bool:
        bias = sink.new_zeros(mask.shape).masked_fill(mask.logical_not(), float("-inf"))
    else:
        bias = mask.to(sink.dtype)
    return k, v, torch.cat([bias.expand(batch, n_heads, query_pos, key_pos), sink], dim=-1)


__all__ = ["AttentionSinks", "with_sink_key"]
