"""BERT-style encoders: post-LayerNorm blocks, bidirectional attention with a padding mask,
token-type embeddings, and the MLM head / pooler that BERT checkpoints ship.

The architecture (config, parts, capabilities, hook names) is ``interp_transformer.families.bert.recipe``;
``EncoderTransformer`` composes it.

>>> import torch
>>> from interp_transformer.models.encoder import EncoderConfig, EncoderTransformer
>>> cfg = EncoderConfig(d_model=32, n_layers=2, n_heads=4, d_head=8, d_mlp=64, d_vocab=50, n_ctx=16)
>>> model = EncoderTransformer(cfg, seed=0)
>>> model(torch.tensor([[1, 5, 7, 2, 0]]), attention_mask=torch.tensor([[1, 1, 1, 1, 0]])).shape
torch.Size([1, 5, 32])
"""

from interp_transformer.families.bert.recipe import ENCODER_PRESETS, EncoderConfig
from interp_transformer.models.encoder.inputs import EncoderTokens
from interp_transformer.models.encoder.model import RETURN_TYPES, EncoderTransformer
from interp_transformer.parts import MLMHead, Pooler, PostNormBlock, TokenTypeEmbed

__all__ = [
    "ENCODER_PRESETS",
    "EncoderConfig",
    "EncoderTokens",
    "EncoderTransformer",
    "MLMHead",
    "Pooler",
    "PostNormBlock",
    "RETURN_TYPES",
    "TokenTypeEmbed",
]
