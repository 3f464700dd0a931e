"""T5's relative position bias: a learned number per head and bucketed distance, added to the attention scores.

T5 has no position embedding. Instead every attention score gets a bias that depends on
the head and on the distance ``key_slot - query_slot``, looked up in a table
``W_rel_pos [n_buckets, head_index]``::

    attn_scores[b, h, q, k] = q . k * scale + W_rel_pos[bucket(key_slot[k] - query_slot[q]), h]

Distances are grouped into buckets: exact for short distances, logarithmically wider up to
``max_distance``, one bucket beyond. Bidirectional attention (the encoder) gives half the
buckets to keys after the query; causal attention (the decoder) spends them all on keys
before it. One table serves every layer of a stack (Hugging Face keeps it in layer 0):
``RelativePositionBias`` belongs to the stack, computes the bias once per forward pass
(``hook_bias``, ``[1, head_index, query_pos, key_pos]``), and hands it to every layer in a
``BiasedLayout``; each layer's ``Attention`` adds it through its ``score_bias`` part,
``SharedScoreBias`` (the seam ALiBi uses), on the explicit and the fused path alike.

The bucket of a distance ``n >= max_exact`` is ``max_exact + floor(log(n / max_exact) /
log(max_distance / max_exact) * (n_buckets - max_exact))``, capped at ``n_buckets - 1``
(``n_buckets`` halved first for bidirectional attention, ``max_exact`` half of it); the
logarithm is taken in float32, as Hugging Face and Mesh TensorFlow take it, so that a
distance on a bucket boundary lands in the same bucket.
"""

import dataclasses
import math
from dataclasses import dataclass

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from interp_transformer.hooks import HookPoint
from interp_transformer.parts.layout import TokenLayout


def relative_position_bucket(
    relative_position: Int[Tensor, "..."], bidirectional: bool, n_buckets: int, max_distance: int
) -> Int[Tensor, "..."]:
    """The bucket of each distance ``key_slot - query_slot`` (see the module docstring)."""
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        n_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * n_buckets  # keys after the query get the upper half
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)  # a causal query never sees later keys: they share bucket 0
    max_exact = n_buckets // 2
    # clamp(min=1) only keeps log(0) out of the discarded branch
    log_ratio = torch.log(distance.clamp(min=1).float() / max_exact) / math.log(max_distance / max_exact)
    large = (max_exact + (log_ratio * (n_buckets - max_exact)).long()).clamp(max=n_buckets - 1)
    return buckets + torch.where(distance < max_exact, distance, large)


class RelativePositionBias(nn.Module):
    """``bias[0, h, q, k] = W_rel_pos[bucket(key_slot[k] - query_slot[q]), h]`` for one stack (see the module
    docstring)."""

    def __init__(self, n_heads: int, n_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True):
        super().__init__()
        for name, value in (("n_heads", n_heads), ("n_buckets", n_buckets), ("max_distance", max_distance)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        smallest_exact = n_buckets // 4 if bidirectional else n_buckets // 2
        if smallest_exact < 1 or max_distance <= smallest_exact:
            raise ValueError(
                f"n_buckets={n_buckets} and max_distance={max_distance} leave no room for exact and logarithmic "
                f"buckets: need n_buckets >= {4 if bidirectional else 2} and max_distance > {max(smallest_exact, 1)}"
            )
        self.n_buckets, self.max_distance, self.bidirectional = n_buckets, max_distance, bool(bidirectional)
        self.W_rel_pos = nn.Parameter(torch.empty(n_buckets, n_heads))
        self.hook_bias = HookPoint()

    def buckets(self, layout: TokenLayout) -> Int[Tensor, "query_pos key_pos"]:
        """The bucket of every (query, key) pair of ``layout`` (slots, so a key/value cache's keys count)."""
        relative = layout.key_slots()[None, :] - layout.query_slots()[:, None]
        return relative_position_bucket(relative, self.bidirectional, self.n_buckets, self.max_distance)

    def forward(self, layout: TokenLayout) -> Float[Tensor, "1 head_index query_pos key_pos"]:
        bias = self.W_rel_pos[self.buckets(layout).to(self.W_rel_pos.device)]
        return self.hook_bias(einops.rearrange(bias, "query_pos key_pos head_index -> 1 head_index query_pos key_pos"))

    def extra_repr(self) -> str:
        return f"n_buckets={self.n_buckets}, max_distance={self.max_distance}, bidirectional={self.bidirectional}"


@dataclass(frozen=True)
class BiasedLayout(TokenLayout):
    """A ``TokenLayout`` that also carries the bias every layer adds to its scores, ``[1 or batch, head_index,
    query_pos, key_pos]``."""

    score_bias: Tensor | None = None

    @classmethod
    def of(cls, layout: TokenLayout, score_bias: Tensor) -> "BiasedLayout":
        """``layout`` with ``score_bias`` attached."""
        fields = {field.name: getattr(layout, field.name) for field in dataclasses.fields(TokenLayout)}
        return cls(**fields, score_bias=score_bias)


class SharedScoreBias(nn.Module):
    """The ``score_bias`` part of a layer whose bias the stack computed once for the forward pass (T5).

    ``Attention`` asks its ``score_bias`` part for ``[1 or batch, head_index, query_pos, key_pos]``
    (as it asks ``ALiBi``); this part answers with the bias the stack's ``RelativePositionBias``
    attached to the layout (``BiasedLayout``), so one table serves every layer and its hook
    (``rel_pos_bias.hook_bias``) fires once. No weight, no hook of its own.
    """

    def forward(self, layout: TokenLayout, dtype: torch.dtype) -> Float[Tensor, "batch head_index query_pos key_pos"]:
        bias = getattr(layout, "score_bias", None)
        if bias is None:
            raise ValueError(
                "this attention adds the stack's position bias to its scores and needs it in the layout: a "
                "BiasedLayout "
                f"with score_bias (the stack's RelativePositionBias builds it), got {type(layout).__name__}"
            )
        return bias.to(dtype)


__all__ = ["BiasedLayout", "RelativePositionBias", "SharedScoreBias", "relative_position_bucket"]
