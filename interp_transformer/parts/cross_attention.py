"""Cross-attention: the decoder's queries over the encoder's keys and values.

``CrossAttention`` is ``Attention`` with ``kv_input``: queries come from the decoder's
(normalized) residual stream, keys and values from the encoder's output::

    q = x W_Q[h] + b_Q[h]                      x: the target, [batch, pos, d_model]
    k = encoder_out W_K[h] + b_K[h]            encoder_out: the source, [batch, key_pos, d_model]
    v = encoder_out W_V[h] + b_V[h]
    attn_scores = q k^T * scale                -inf at source padding (its only mask)
    z = softmax(attn_scores) v,  cross_attn_out = sum_h z_h W_O[h] + b_O

so ``hook_attn_scores`` and ``hook_pattern`` are ``[batch, head_index, query_pos, key_pos]``
with ``query_pos`` over the target and ``key_pos`` over the source, and ``hook_k``/``hook_v``
are ``[batch, key_pos, head_index, d_head]``. Its one mask is ``PaddingMask`` over the
source (``CrossAttentionSource.layout``): a target token may read every real source token.

What differs from ``Attention``: when generating, the encoder's output never changes, so
its keys and values are computed once, at the first step, kept in the layer's
``LayerKVCache`` and read from there at every later step (``hook_k``/``hook_v`` fire once);
and only ``W_Q`` reads the decoder's stream (``input_weights``), which is what folding the
norm before it may rewrite: ``W_K`` and ``W_V`` read the encoder's.
"""

from dataclasses import dataclass
from typing import NamedTuple

from jaxtyping import Bool, Float
from torch import Tensor

from interp_transformer.core.kv_cache import LayerKVCache
from interp_transformer.parts.attention import Attention
from interp_transformer.parts.layout import TokenLayout
from interp_transformer.parts.masks import PaddingMask


@dataclass(frozen=True)
class CrossAttentionSource:
    """What cross-attention reads: the encoder's output and which of its positions are real.

    ``encoder_out [batch, key_pos, d_model]`` may be None once every layer's keys and
    values are in a ``DecoderLayerKVCache``; ``key_is_real [batch, key_pos]`` is False at
    source padding (None: no padding).
    """

    encoder_out: Float[Tensor, "batch key_pos d_model"] | None
    key_is_real: Bool[Tensor, "batch key_pos"] | None = None

    def layout(self, queries: TokenLayout) -> TokenLayout:
        """The layout cross-attention's mask reads: the target's queries, the source's padding.

        Only ``PaddingMask`` reads it (``key_is_real``); slots and offsets, which a causal mask
        would read, have no meaning between two sequences.
        """
        return TokenLayout(queries.positions, 0, self.key_is_real)

    def repeat_rows(self, index: Tensor) -> "CrossAttentionSource":
        """The source of rows ``index`` (e.g. each row once per beam)."""
        pick = lambda t: None if t is None else t[index.to(t.device)]  # noqa: E731
        return CrossAttentionSource(pick(self.encoder_out), pick(self.key_is_real))


class DecoderLayerKVCache(NamedTuple):
    """What one decoder block keeps while generating: its self-attention's keys/values, and its cross-attention's."""

    self_attn: LayerKVCache
    cross_attn: LayerKVCache


class CrossAttention(Attention):
    """Attention of the target over the source (see the module docstring); ``masks`` is ``(PaddingMask(),)``.

    ``Attention``'s forward, with two seams of its own: keys and values come only from
    ``kv_input`` (or the cache), and the cache keeps the first step's, never appending more.
    """

    reads_kv_input = True

    def __init__(self, cfg, *, scale: float | None = None):
        super().__init__(cfg, masks=(PaddingMask(),), scale=scale)

    def input_weights(self) -> list[tuple[Tensor, Tensor]]:
        """``(W_Q, b_Q)``: the only weights that read the decoder's stream (``W_K``, ``W_V`` read the encoder's)."""
        return [(self.W_Q, self.b_Q)]

    def _new_keys_and_values(self, key_input: Tensor | None, value_input: Tensor | None, kv_cache):
        if kv_cache is not None and kv_cache.keys is not None:  # computed at the first step of generation
            return kv_cache.keys, kv_cache.values
        if key_input is None or value_input is None:  # both are kv_input
            raise ValueError("cross-attention reads the encoder's output: pass kv_input [batch, key_pos, d_model]")
        return super()._new_keys_and_values(key_input, value_input, kv_cache)

    @staticmethod
    def _with_cached(kv_cache: LayerKVCache, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if kv_cache.keys is None or kv_cache.values is None:  # empty (both are set together): fill it
            return kv_cache.append(k, v)
        return kv_cache.keys, kv_cache.values


__all__ = ["CrossAttention", "CrossAttentionSource", "DecoderLayerKVCache"]
