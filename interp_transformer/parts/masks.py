"""Attention masks: small parts that say which keys each query may see.

A mask part answers ``allowed(layout)``: a boolean tensor that broadcasts to
``[batch, head_index, query_pos, key_pos]`` and is True where the query may attend to
the key, or ``None`` when it restricts nothing for this layout (``restricts(layout)``
says which, without building the tensor). An ``Attention`` holds
a tuple of them and lets a query see a key only where every one allows it.

The two paths of ``Attention`` read the same answer in the two forms they need: the
explicit path sets the scores of disallowed keys to ``-inf`` before the softmax;
the fused kernel takes the boolean tensor as ``attn_mask`` (or ``is_causal=True``
when the only restriction is a plain causal mask, which lets it skip the masked half).

=====================  =====================================================
``CausalMask``         a query sees keys in its own and earlier slots
``PaddingMask``        no query sees a padding key (``layout.key_is_real``)
``SlidingWindowMask``  causal, and at most ``window`` keys back (the query's own included)
=====================  =====================================================
"""

from collections.abc import Iterable
from typing import Any

from jaxtyping import Bool
from torch import Tensor, nn

from interp_transformer.parts.layout import TokenLayout


class CausalMask(nn.Module):
    """``allowed[q, k] = key_slot[k] <= query_slot[q]``: a query never sees a later token."""

    def allowed(self, layout: TokenLayout) -> Bool[Tensor, "1 1 query_pos key_pos"]:
        return layout.key_slots()[None, None, None, :] <= layout.query_slots()[None, None, :, None]

    def restricts(self, layout: TokenLayout) -> bool:
        return True

    def is_plain_causal(self, layout: TokenLayout) -> bool:
        """True when ``allowed`` is the square lower triangle the fused kernel builds itself."""
        return layout.offset == 0


class SlidingWindowMask(nn.Module):
    """``allowed[q, k] = query_slot - window < key_slot <= query_slot``: causal, ``window`` keys at most."""

    def __init__(self, window: int):
        super().__init__()
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be a positive int, got {window!r}")
        self.window = window

    def allowed(self, layout: TokenLayout) -> Bool[Tensor, "1 1 query_pos key_pos"]:
        keys, queries = layout.key_slots()[None, :], layout.query_slots()[:, None]
        return ((keys <= queries) & (keys > queries - self.window))[None, None]

    def restricts(self, layout: TokenLayout) -> bool:
        return True

    def is_plain_causal(self, layout: TokenLayout) -> bool:
        return False

    def extra_repr(self) -> str:
        return f"window={self.window}"


class PaddingMask(nn.Module):
    """``allowed[b, k] = key_is_real[b, k]``: padding keys take no attention (None without padding)."""

    def allowed(self, layout: TokenLayout) -> Bool[Tensor, "batch 1 1 key_pos"] | None:
        if layout.key_is_real is None:
            return None
        return layout.key_is_real[:, None, None, :]

    def restricts(self, layout: TokenLayout) -> bool:
        return layout.key_is_real is not None

    def is_plain_causal(self, layout: TokenLayout) -> bool:
        return False


def allowed_keys(masks: Iterable[Any], layout: TokenLayout) -> Tensor | None:
    """Where every mask allows the key, broadcastable to ``[batch, head_index, query_pos, key_pos]``; None: anywhere.

    A query left with no key at all (a padding token before the first real one of its
    row, under a causal mask) attends to itself alone: its output is meaningless, as every
    padding position's is, but finite, and no real query ever reads it.
    """
    allowed = None
    for mask in masks:
        this = mask.allowed(layout)
        if this is not None:
            allowed = this if allowed is None else allowed & this
    if allowed is not None and layout.key_is_real is not None:
        sees_nothing = ~allowed.any(dim=-1, keepdim=True)
        if bool(sees_nothing.any()):
            itself = layout.key_slots()[None, None, None, :] == layout.query_slots()[None, None, :, None]
            allowed = allowed | (sees_nothing & itself)
    return allowed


def fused_is_causal(masks: Iterable[Any], layout: TokenLayout) -> bool:
    """True when the masks amount to a plain causal mask (the fused kernel's ``is_causal=True``)."""
    restricting = [mask for mask in masks if mask.restricts(layout)]
    return len(restricting) == 1 and restricting[0].is_plain_causal(layout)


__all__ = ["CausalMask", "PaddingMask", "SlidingWindowMask", "allowed_keys", "fused_is_causal"]
