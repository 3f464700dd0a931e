"""BERT-style encoders: post-LayerNorm blocks, bidirectional attention with a padding mask,
token-type embeddings, and the MLM head / pooler that BERT checkpoints ship.

>>> import torch
>>> from interp_transformer.encoder import EncoderConfig, EncoderTransformer
>>> model = EncoderTransformer(EncoderConfig(d_model=32, n_layers=2, n_heads=4, d_head=8, d_mlp=64, d_vocab=50, n_ctx=16), seed=0)
>>> model(torch.tensor([[1, 5, 7, 2, 0]]), attention_mask=torch.tensor([[1, 1, 1, 1, 0]])).shape
torch.Size([1, 5, 32])
"""

from .components import EncoderAttention, EncoderBlock, MLMHead, Pooler, TokenTypeEmbed
from .config import ENCODER_PRESETS, EncoderConfig
from .inputs import EncoderTokens
from .model import RETURN_TYPES, EncoderTransformer

__all__ = [
    "ENCODER_PRESETS",
    "EncoderAttention",
    "EncoderBlock",
    "EncoderConfig",
    "EncoderTokens",
    "EncoderTransformer",
    "MLMHead",
    "Pooler",
    "RETURN_TYPES",
    "TokenTypeEmbed",
]
