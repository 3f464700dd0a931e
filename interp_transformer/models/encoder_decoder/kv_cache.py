"""What an encoder-decoder keeps while it generates: per decoder block, self-attention and cross-attention keys/values.

Self-attention's keys and values grow by one position per step (``LayerKVCache.append``);
cross-attention's are the projections of the encoder's output, computed at the first step
and read unchanged afterwards. Beam search reorders the rows after every step
(``reorder``): each surviving beam continues from the keys and values of the beam it
extends. Cross-attention's rows need no reordering: the beams of one source share it.
"""

from jaxtyping import Int
from torch import Tensor

from interp_transformer.core.kv_cache import LayerKVCache
from interp_transformer.parts.cross_attention import DecoderLayerKVCache


class EncoderDecoderKVCache:
    """One ``DecoderLayerKVCache`` per decoder block. Pass to ``model.decode(..., kv_cache=cache)`` step after step."""

    def __init__(self, n_decoder_layers: int) -> None:
        if isinstance(n_decoder_layers, bool) or not isinstance(n_decoder_layers, int) or n_decoder_layers < 1:
            raise ValueError(f"n_decoder_layers must be a positive int, got {n_decoder_layers!r}")
        self.layers = [DecoderLayerKVCache(LayerKVCache(), LayerKVCache()) for _ in range(n_decoder_layers)]

    def __getitem__(self, layer: int) -> DecoderLayerKVCache:
        return self.layers[layer]

    def __len__(self) -> int:
        return len(self.layers)

    @property
    def n_positions(self) -> int:
        """Target positions already processed (the self-attention keys each layer holds)."""
        return self.layers[0].self_attn.n_positions

    def reorder(self, rows: Int[Tensor, "batch"]) -> None:
        """Keep self-attention row ``rows[i]`` as row ``i`` (beam search: each beam continues the one it extends)."""
        for layer in self.layers:
            cache = layer.self_attn
            if cache.keys is not None and cache.values is not None:  # both set or both None
                index = rows.to(cache.keys.device)
                cache.keys, cache.values = cache.keys.index_select(0, index), cache.values.index_select(0, index)


__all__ = ["EncoderDecoderKVCache"]
