"""Encoder-decoders: an encoder over the source, a decoder over the target that reads it through cross-attention.

The architectures (config, parts, capabilities, hook names) are in
``interp_transformer.families`` (``seq2seq``, ``bart``, ``marian``);
``EncoderDecoderTransformer`` composes any of them. ``docs/encoder_decoder.md`` is the guide.

>>> import torch
>>> from interp_transformer.models.encoder_decoder import EncoderDecoderTransformer, Seq2SeqConfig
>>> cfg = Seq2SeqConfig(d_model=32, n_layers=2, n_decoder_layers=2, n_heads=4, d_head=8, d_mlp=64, d_vocab=40, n_ctx=16)
>>> model = EncoderDecoderTransformer(cfg, seed=0)
>>> logits, cache = model.run_with_cache(torch.tensor([[5, 6, 7, 1]]), torch.tensor([[2, 9, 10]]))
>>> logits.shape, cache["pattern", 0, "cross"].shape
(torch.Size([1, 3, 40]), torch.Size([1, 4, 3, 4]))
"""

from interp_transformer.families.bart.recipe import BartConfig
from interp_transformer.families.marian.recipe import MarianConfig
from interp_transformer.families.seq2seq.recipe import Seq2SeqConfig
from interp_transformer.models.encoder_decoder.inputs import SourceTokens
from interp_transformer.models.encoder_decoder.kv_cache import EncoderDecoderKVCache
from interp_transformer.models.encoder_decoder.model import EncoderDecoderTransformer

__all__ = [
    "BartConfig",
    "EncoderDecoderKVCache",
    "EncoderDecoderTransformer",
    "MarianConfig",
    "Seq2SeqConfig",
    "SourceTokens",
]
