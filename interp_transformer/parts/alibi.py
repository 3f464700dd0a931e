"""ALiBi (attention with linear biases): a per-head penalty on the scores, growing with the distance to the key.

ALiBi has no positional embedding. Each head ``h`` adds to its attention scores a bias
proportional to how far back the key is (Press et al., 2022)::

    score_bias[b, h, q, k] = -slope[h] * |position[q] - position[k]|
    attn_scores            = q . k * scale + score_bias             (-inf where masked)

The slopes are a geometric sequence fixed by the number of heads: for ``n`` a power of
two, ``slope[h] = 2^(-8 (h + 1) / n)``; otherwise the ``2^floor(log2 n)`` slopes of that
power of two, followed by every other slope of the next power of two. They are computed
in float32, as BLOOM and Hugging Face compute them, and the bias in float32 or the
model's dtype if wider.

Positions count real tokens only: with padding, each key's position is the number of
real keys before it in its row, so a left- or right-padded row gets exactly the bias
it gets alone; a key/value cache's keys keep their positions.

How it differs from BLOOM's code (Hugging Face): BLOOM adds ``slope[h] * position[k]``,
which differs from ours by ``slope[h] * position[q]``, the same for every key of a query;
the softmax removes such a constant, so the patterns are the same and only
``hook_attn_scores`` differs by that row constant. How it differs from TransformerLens:
TransformerLens adds ``slope[h] * min(position[k] - position[q], 0)``, which is ours on
every key a causal query sees.

``ALiBi`` is a part of ``Attention`` (``Attention(cfg, score_bias=ALiBi(n_heads))``, or
``ALiBi(n_heads, slopes=...)`` for other slopes, one positive number per head): it
holds no parameters and hooks its bias as ``hook_bias``
(``blocks.L.attn.score_bias.hook_bias``, ``[batch, head_index, query_pos, key_pos]``).
"""

import math
from collections.abc import Sequence

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from interp_transformer.hooks import HookPoint
from interp_transformer.parts.layout import TokenLayout


def alibi_slopes(n_heads: int) -> Float[Tensor, "head_index"]:
    """The slope of every head, float32 on the CPU (see the module docstring)."""
    if isinstance(n_heads, bool) or not isinstance(n_heads, int) or n_heads < 1:
        raise ValueError(f"n_heads must be a positive int, got {n_heads!r}")
    power_of_two = 2 ** math.floor(math.log2(n_heads))

    def powers(n: int, count: int, every: int = 1) -> Tensor:
        """``(2^(-8/n))^(1 + every * i)`` for ``i < count``; computed on exactly ``count`` entries, as BLOOM computes
        them (a longer tensor may take another vectorized path and round otherwise)."""
        base = torch.tensor(2 ** (-8 / n), dtype=torch.float32, device="cpu")
        return torch.pow(base, torch.arange(1, 1 + every * count, every, dtype=torch.int32, device="cpu"))

    slopes = powers(power_of_two, power_of_two)
    if power_of_two < n_heads:
        slopes = torch.cat([slopes, powers(2 * power_of_two, n_heads - power_of_two, every=2)])
    return slopes


def key_positions(layout: TokenLayout) -> Int[Tensor, "batch key_pos"]:
    """The position of every key, cached ones included: real keys counted from each row's first (``[1, key_pos]``
    unpadded)."""
    if layout.key_is_real is None:
        return layout.key_slots()[None, :]
    return (layout.key_is_real.long().cumsum(dim=-1) - 1).clamp(min=0)


def _checked_slopes(slopes, n_heads: int) -> Tensor:
    """``slopes`` as a float32 CPU tensor of ``n_heads`` positive finite numbers, or ``ValueError`` naming them."""
    values = torch.as_tensor(slopes, dtype=torch.float32, device="cpu").detach().clone()
    if values.shape != (n_heads,):
        raise ValueError(f"ALiBi needs one slope per head, shape ({n_heads},), got shape {tuple(values.shape)}")
    if not bool(torch.isfinite(values).all()) or not bool((values > 0).all()):
        raise ValueError(f"ALiBi slopes must be positive and finite (a penalty growing with distance), got {values}")
    return values


class ALiBi(nn.Module):
    """The bias ``-slope[h] * |position[q] - position[k]|`` for an ``Attention``'s scores (see the module docstring).

    ``slopes``: one positive number per head; by default ``alibi_slopes(n_heads)``, the paper's and BLOOM's. A
    design whose sequence starts elsewhere passes its own, e.g. ``2 ** (-8 * torch.arange(n_heads) / n_heads)``
    (starting at 1)."""

    def __init__(self, n_heads: int, slopes: Sequence[float] | None = None):
        super().__init__()
        self.n_heads = n_heads
        # float32, not a buffer: fixed numbers, like the rotary frequencies
        self.slopes = alibi_slopes(n_heads) if slopes is None else _checked_slopes(slopes, n_heads)
        self.hook_bias = HookPoint()

    def forward(self, layout: TokenLayout, dtype: torch.dtype) -> Float[Tensor, "batch head_index query_pos key_pos"]:
        queries = layout.positions  # [batch, query_pos]
        batch = queries.shape[0]
        if layout.key_is_real is None and queries.stride(0) == 0:  # every row alike: compute one, broadcast it
            queries = queries[:1]
        keys = key_positions(layout).to(queries.device)  # [batch or 1, key_pos]
        distance = (queries[:, :, None] - keys[:, None, :]).abs()  # [batch or 1, query_pos, key_pos]
        compute_dtype = torch.promote_types(dtype, torch.float32)
        slopes = self.slopes.to(device=queries.device, dtype=compute_dtype)
        bias = einops.einsum(
            -slopes,
            distance.to(compute_dtype),
            "head_index, batch query_pos key_pos -> batch head_index query_pos key_pos",
        )
        return self.hook_bias(bias.to(dtype).expand(batch, -1, -1, -1))

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}"


__all__ = ["ALiBi", "alibi_slopes", "key_positions"]
