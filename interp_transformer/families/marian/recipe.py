"""Marian (the Helsinki-NLP OPUS-MT translation models): the original Transformer's post-norm encoder-decoder.

BART's block structure (``bart.build_post_norm``) with the original Transformer's inputs::

    x = W_E[tokens] * sqrt(d_model) + sinusoidal(positions)      ScaledEmbed, SinusoidalPosEmbed (sines, then cosines)

no embedding LayerNorm and no final norm. The token embedding is shared by both stacks
(``share_encoder_decoder_embeddings``, the default of every OPUS-MT checkpoint).
"""

import dataclasses
from dataclasses import dataclass

from interp_transformer.families.bart.recipe import build_post_norm, token_embedding
from interp_transformer.families.encoder_decoder import (
    EncoderDecoderParts,
    encoder_decoder_capabilities,
    encoder_decoder_hook_names,
    validate_encoder_decoder_fields,
)
from interp_transformer.families.recipe_parts import fixed_architecture
from interp_transformer.parts.sinusoidal import SinusoidalPosEmbed


@dataclass(frozen=True)
class MarianConfig:
    """Shape, numerics and special tokens of a Marian model (``Helsinki-NLP/opus-mt-en-de`` by default)."""

    d_model: int = 512  # width of the residual stream
    n_layers: int = 6  # encoder blocks
    n_decoder_layers: int = 6  # decoder blocks
    n_heads: int = 8  # attention heads per block (self- and cross-attention)
    d_head: int = 64  # d_model == n_heads * d_head
    d_mlp: int = 2048  # MLP hidden width
    d_vocab: int = 58101  # the shared SentencePiece vocabulary of opus-mt-en-de
    n_ctx: int = 512  # longest source or target
    act_fn: str = "silu"  # Marian's "swish"
    layer_norm_eps: float = 1e-5  # PyTorch's LayerNorm default
    init_range: float = 0.02  # std of the normal init of weight matrices
    scale_embedding: bool = True  # multiply token embeddings by sqrt(d_model)
    pad_token_id: int = 58100
    eos_token_id: int = 0
    decoder_start_token_id: int = 58100  # Marian starts the decoder with the padding token
    name: str = "custom"  # free-form label shown in reports

    def __post_init__(self) -> None:
        validate_encoder_decoder_fields(self)
        if not isinstance(self.scale_embedding, bool):
            raise TypeError(f"scale_embedding must be a bool, got {self.scale_embedding!r}")

    def replace(self, **changes) -> "MarianConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


def build(cfg: MarianConfig) -> EncoderDecoderParts:
    """Marian's parts: scaled embeddings, sinusoidal positions (sines first), post-norm blocks."""
    return build_post_norm(
        cfg, token_embedding(cfg, cfg.scale_embedding), lambda: SinusoidalPosEmbed(cfg), embed_ln=False
    )


CAPABILITIES = encoder_decoder_capabilities("post", final_norm=False, embedding_norm=False)
HOOK_NAMES = encoder_decoder_hook_names(post_norm=True, pos_embed=True, final_norm=False)

ARCHITECTURE = fixed_architecture("marian", MarianConfig, build, HOOK_NAMES, CAPABILITIES)

__all__ = ["ARCHITECTURE", "MarianConfig", "build"]
