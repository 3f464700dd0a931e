"""BART: a post-LayerNorm encoder-decoder with learned positions read at an offset of 2 and an embedding LayerNorm.

Parts of each stack (``EncoderDecoderTransformer`` composes them)::

    x = embed_ln(W_E[tokens] * embed_scale + W_pos[positions + 2])     OffsetPosEmbed, LayerNorm
    encoder blocks: PostNormBlock(Attention(PaddingMask), LayerNorm, MLP, LayerNorm)
    decoder blocks: PostNormBlock(Attention(causal), LayerNorm, cross_attn=CrossAttention, cross_norm=LayerNorm,
                                  mlp=MLP, ln2=LayerNorm)
    logits = x W_U + b_U                                              (lm_head, final_logits_bias)

``embed_scale`` is ``sqrt(d_model)`` when ``scale_embedding`` (off in BART's own
checkpoints). There is no final norm: each stack ends in its last block's ``ln3``/``ln2``.
The token embedding is shared by both stacks, as in every BART checkpoint.
``build_post_norm`` is reused by Marian, which differs in its parts only (sinusoidal
positions, no embedding LayerNorm).
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from interp_transformer.families.encoder_decoder import (
    EncoderDecoderParts,
    encoder_decoder_capabilities,
    encoder_decoder_hook_names,
    validate_encoder_decoder_fields,
)
from interp_transformer.families.recipe_parts import fixed_architecture
from interp_transformer.families.seq2seq.recipe import build_pre_norm
from interp_transformer.parts import Embed
from interp_transformer.parts.offset_pos_embed import OffsetPosEmbed
from interp_transformer.parts.sinusoidal import ScaledEmbed

POSITION_OFFSET = 2  # BART reads position p from row p + 2 of its table


@dataclass(frozen=True)
class BartConfig:
    """Shape, numerics and special tokens of a BART model (``facebook/bart-base`` by default)."""

    d_model: int = 768  # width of the residual stream
    n_layers: int = 6  # encoder blocks
    n_decoder_layers: int = 6  # decoder blocks
    n_heads: int = 12  # attention heads per block (self- and cross-attention)
    d_head: int = 64  # d_model == n_heads * d_head
    d_mlp: int = 3072  # MLP hidden width
    d_vocab: int = 50265  # BART's byte-level BPE vocabulary
    n_ctx: int = 1024  # longest source or target; the position table has n_ctx + 2 rows
    act_fn: str = "gelu"  # exact (erf) GELU
    layer_norm_eps: float = 1e-5  # PyTorch's LayerNorm default, which BART uses
    init_range: float = 0.02  # std of the normal init of weight matrices
    scale_embedding: bool = False  # multiply token embeddings by sqrt(d_model)
    pad_token_id: int = 1
    eos_token_id: int = 2
    decoder_start_token_id: int = 2  # the first token the decoder reads
    name: str = "custom"  # free-form label shown in reports

    def __post_init__(self) -> None:
        validate_encoder_decoder_fields(self)
        if not isinstance(self.scale_embedding, bool):
            raise TypeError(f"scale_embedding must be a bool, got {self.scale_embedding!r}")

    def replace(self, **changes) -> "BartConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


def build_post_norm(
    cfg, embed: nn.Module, pos_embed: Callable[[], nn.Module], embed_ln: bool, final_norm: bool = False, **parts
) -> EncoderDecoderParts:
    """Post-norm stacks (BART, Marian): ``pos_embed()`` builds each stack's positions, a norm on each stack's
    embedding where ``embed_ln``, no final norm unless ``final_norm``; the other parts (``norm``, the attention
    parts) as ``seq2seq.build_pre_norm`` takes them."""
    return build_pre_norm(cfg, embed, pos_embed, final_norm=final_norm, post_norm=True, embed_ln=embed_ln, **parts)


def token_embedding(cfg, scale_embedding: bool) -> nn.Module:
    """``W_E[tokens] * sqrt(d_model)`` when ``scale_embedding``, else ``W_E[tokens]``."""
    return ScaledEmbed(cfg) if scale_embedding else Embed(cfg)


def build(cfg: BartConfig) -> EncoderDecoderParts:
    """BART's parts: offset learned positions and an embedding LayerNorm in each stack, post-norm blocks."""
    return build_post_norm(
        cfg, token_embedding(cfg, cfg.scale_embedding), lambda: OffsetPosEmbed(cfg, POSITION_OFFSET), embed_ln=True
    )


CAPABILITIES = encoder_decoder_capabilities("post", final_norm=False, embedding_norm=True)
HOOK_NAMES = encoder_decoder_hook_names(post_norm=True, pos_embed=True, embed_ln=True, final_norm=False)

ARCHITECTURE = fixed_architecture("bart", BartConfig, build, HOOK_NAMES, CAPABILITIES)


__all__ = ["ARCHITECTURE", "BartConfig", "POSITION_OFFSET", "build", "build_post_norm", "token_embedding"]
