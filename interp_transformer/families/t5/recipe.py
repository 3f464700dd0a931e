"""T5 (v1.0 and v1.1): a pre-RMSNorm encoder-decoder with relative position biases and unscaled attention scores.

Parts of each stack (``EncoderDecoderTransformer`` composes them)::

    x = W_E[tokens]                                   no position embedding
    bias = RelativePositionBias(stack)                one table per stack, bidirectional in the encoder, causal in the
                                                      decoder, added to every self-attention layer's scores
    encoder blocks: PreNormBlock(T5LayerNorm, Attention(PaddingMask, scale=1, score_bias=SharedScoreBias),
    T5LayerNorm, MLP)
    decoder blocks: PreNormBlock(T5LayerNorm, Attention(causal, scale=1, score_bias=SharedScoreBias),
    T5LayerNorm,
                                        CrossAttention(scale=1), T5LayerNorm, MLP)
    each stack ends in its T5LayerNorm (ln_final); logits = decoder.ln_final(x) W_U

T5 does not divide its scores by ``sqrt(d_head)`` (its init absorbs the factor), and has no
bias anywhere (our biases are zeros). The MLP is ``relu(x W_in) W_out`` in v1.0 and the
gated GELU ``(gelu_new(x W_gate) * x W_in) W_out`` in v1.1 (``gated_mlp``). v1.0 ties the
read-out to the embedding and rescales the decoder's output by ``d_model ** -0.5`` before
it; the converter folds that factor into ``W_U`` (``scaled_read_out`` records it), so that
``logits = ln_final(x) W_U`` as in every other model.
"""

import dataclasses
from dataclasses import dataclass

from interp_transformer.families.encoder_decoder import (
    EncoderDecoderParts,
    encoder_decoder_capabilities,
    encoder_decoder_hook_names,
    validate_encoder_decoder_fields,
)
from interp_transformer.families.recipe_parts import fixed_architecture
from interp_transformer.families.seq2seq.recipe import build_pre_norm
from interp_transformer.parts import MLP, Attention, Embed, PaddingMask
from interp_transformer.parts.cross_attention import CrossAttention
from interp_transformer.parts.gated_mlp import GatedMLP
from interp_transformer.parts.relative_position_bias import RelativePositionBias, SharedScoreBias
from interp_transformer.parts.t5_layer_norm import T5LayerNorm


@dataclass(frozen=True)
class T5Config:
    """Shape, numerics and special tokens of a T5 model (``t5-small`` by default)."""

    d_model: int = 512  # width of the residual stream
    n_layers: int = 6  # encoder blocks
    n_decoder_layers: int = 6  # decoder blocks
    n_heads: int = 8  # attention heads per block
    d_head: int = 64  # d_model == n_heads * d_head
    d_mlp: int = 2048  # MLP hidden width (d_ff)
    d_vocab: int = 32128  # T5's SentencePiece vocabulary (with its extra ids)
    n_ctx: int = 512  # longest source or target accepted (relative positions have no table to outgrow)
    act_fn: str = "relu"  # v1.0: relu; v1.1: gelu_new, gated
    gated_mlp: bool = False  # v1.1's gated MLP: act(x W_gate) * (x W_in)
    layer_norm_eps: float = 1e-6
    init_range: float = 0.02  # std of the normal init of weight matrices
    n_buckets: int = 32  # relative position buckets (relative_attention_num_buckets)
    max_distance: int = 128  # distances beyond share the last bucket (relative_attention_max_distance)
    scaled_read_out: bool = True  # v1.0: W_U holds lm_head^T * d_model**-0.5 (its rescaled decoder output, folded in)
    pad_token_id: int = 0
    eos_token_id: int = 1
    decoder_start_token_id: int = 0  # T5 starts the decoder with the padding token
    name: str = "custom"  # free-form label shown in reports

    def __post_init__(self) -> None:
        validate_encoder_decoder_fields(self)
        for name in ("gated_mlp", "scaled_read_out"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        for name in ("n_buckets", "max_distance"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")

    def replace(self, **changes) -> "T5Config":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


def build(cfg: T5Config) -> EncoderDecoderParts:
    """T5's parts: no position embedding, a relative position bias per stack, pre-RMSNorm blocks, unscaled scores."""

    def norm() -> T5LayerNorm:
        return T5LayerNorm(cfg.d_model, cfg.layer_norm_eps)

    def mlp():
        return GatedMLP(cfg) if cfg.gated_mlp else MLP(cfg)

    def self_attention(causal: bool) -> Attention:
        masks = None if causal else (PaddingMask(),)
        return Attention(cfg, masks, scale=1.0, score_bias=SharedScoreBias())

    def bias(bidirectional: bool) -> RelativePositionBias:
        return RelativePositionBias(cfg.n_heads, cfg.n_buckets, cfg.max_distance, bidirectional)

    return build_pre_norm(
        cfg,
        Embed(cfg),
        lambda: None,  # no position embedding: the relative position bias in the scores
        norm=norm,
        self_attention=self_attention,
        cross_attention=lambda: CrossAttention(cfg, scale=1.0),
        rel_pos_bias=bias,
        mlp=mlp,
    )


CAPABILITIES = encoder_decoder_capabilities("pre", final_norm=True, embedding_norm=False)
HOOK_NAMES = encoder_decoder_hook_names(post_norm=False, pos_embed=False, rel_pos_bias=True, final_norm=True)

ARCHITECTURE = fixed_architecture("t5", T5Config, build, HOOK_NAMES, CAPABILITIES)

__all__ = ["ARCHITECTURE", "T5Config", "build"]
