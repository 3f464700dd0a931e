"""The pre-LayerNorm Transformer encoder-decoder: the original Transformer with its norms moved before each sub-layer.

Vaswani et al.'s inputs (scaled token embeddings plus sinusoidal positions, interleaved
sines and cosines) and blocks, with the norm placement later found easier to train
(tensor2tensor's default since 2018, fairseq's ``--encoder-normalize-before``, PyTorch's
``nn.Transformer(norm_first=True)``, Xiong et al. 2020)::

    x = W_E[tokens] * sqrt(d_model) + sinusoidal(positions)     (separate_embeddings: the decoder's own W_E)
    encoder blocks: PreNormBlock(LayerNorm, Attention(PaddingMask), LayerNorm, MLP)
    decoder blocks: PreNormBlock(LayerNorm, Attention(causal), cross_norm=LayerNorm, cross_attn=CrossAttention,
                                 ln2=LayerNorm, mlp=MLP)
    each stack ends in its own LayerNorm (ln_final); logits = decoder.ln_final(x) W_U + b_U

Pre-norm makes the decoder's residual stream a sum of every component's write (token
and position embeddings, each self-attention, cross-attention and MLP output), and its
logits linear in that sum once the final norm's scale is frozen: direct logit
attribution through the decoder's and the cross-attention's heads is exact. The shipped
``translate-tiny`` model (``interp_transformer.pretrained.translation``) has this architecture.
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from interp_transformer.families.encoder_decoder import (
    EncoderDecoderParts,
    StackParts,
    encoder_decoder_capabilities,
    encoder_decoder_hook_names,
    validate_encoder_decoder_fields,
)
from interp_transformer.families.recipe_parts import fixed_architecture
from interp_transformer.parts import (
    MLP,
    Attention,
    LayerNorm,
    NoNorm,
    PaddingMask,
    PostNormBlock,
    PreNormBlock,
    Unembed,
)
from interp_transformer.parts.cross_attention import CrossAttention
from interp_transformer.parts.sinusoidal import ScaledEmbed, SinusoidalPosEmbed


@dataclass(frozen=True)
class Seq2SeqConfig:
    """Shape, numerics and special tokens of a pre-LayerNorm Transformer encoder-decoder."""

    d_model: int = 512  # width of the residual stream (Transformer base)
    n_layers: int = 6  # encoder blocks
    n_decoder_layers: int = 6  # decoder blocks
    n_heads: int = 8  # attention heads per block (self- and cross-attention)
    d_head: int = 64  # d_model == n_heads * d_head
    d_mlp: int = 2048  # MLP hidden width
    d_vocab: int = 37000  # the shared BPE vocabulary of the WMT English-German base model
    n_ctx: int = 256  # longest source or target (sinusoidal positions have no table to outgrow)
    act_fn: str = "relu"  # the original Transformer's
    layer_norm_eps: float = 1e-5
    init_range: float = 0.02  # std of the normal init of weight matrices
    pad_token_id: int = 0
    eos_token_id: int = 1
    decoder_start_token_id: int = 2
    separate_embeddings: bool = False  # the target has its own token embedding (decoder_embed); positions shared
    name: str = "custom"  # free-form label shown in reports

    def __post_init__(self) -> None:
        validate_encoder_decoder_fields(self)
        if not isinstance(self.separate_embeddings, bool):
            raise TypeError(f"separate_embeddings must be a bool, got {self.separate_embeddings!r}")
        if self.d_model % 2:
            raise ValueError(f"interleaved sinusoidal positions need an even d_model, got {self.d_model}")

    def replace(self, **changes) -> "Seq2SeqConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


def build(cfg: Seq2SeqConfig) -> EncoderDecoderParts:
    """Scaled embeddings, interleaved sinusoidal positions, pre-LayerNorm blocks, a final LayerNorm per stack."""
    decoder_embed = ScaledEmbed(cfg) if cfg.separate_embeddings else None
    return build_pre_norm(cfg, ScaledEmbed(cfg), lambda: SinusoidalPosEmbed(cfg, interleaved=True), decoder_embed)


def build_pre_norm(
    cfg,
    embed: nn.Module,
    pos_embed: Callable[[], nn.Module | None],
    decoder_embed: nn.Module | None = None,
    norm: Callable[[], nn.Module] | None = None,
    final_norm: bool = True,
    self_attention: Callable[[bool], nn.Module] | None = None,
    cross_attention: Callable[[], nn.Module] | None = None,
    rel_pos_bias: Callable[[bool], nn.Module | None] | None = None,
    mlp: Callable[[], nn.Module] | None = None,
    post_norm: bool = False,
    embed_ln: bool = False,
) -> EncoderDecoderParts:
    """Pre-norm stacks: ``pos_embed()`` builds each stack's positions, ``norm()`` each norm (``LayerNorm`` by
    default), ``mlp()`` each MLP (``MLP`` by default); each stack ends in a final norm unless ``final_norm=False``
    (then ``NoNorm``). The parts ``self_attention(causal)``, ``cross_attention()`` and
    ``rel_pos_bias(bidirectional)`` (a stack's relative position bias, or None) default to the Transformer's (see
    ``default_attention``). ``post_norm``: post-norm blocks instead (BART's, ``bart.build_post_norm``), and with
    ``embed_ln`` a norm on each stack's embedding."""
    if norm is None:

        def norm() -> LayerNorm:
            return LayerNorm(cfg.d_model, cfg.layer_norm_eps)

    if mlp is None:

        def mlp() -> MLP:
            return MLP(cfg)

    self_attention, cross_attention, rel_pos_bias = default_attention(
        cfg, self_attention, cross_attention, rel_pos_bias
    )

    def encoder_block() -> nn.Module:
        if post_norm:
            return PostNormBlock(self_attention(False), norm(), mlp(), norm())
        return PreNormBlock(norm(), self_attention(False), norm(), mlp())

    def decoder_block() -> nn.Module:
        attn, ln1 = self_attention(True), norm()
        writers: dict[str, Any] = dict(cross_norm=norm(), cross_attn=cross_attention(), ln2=norm(), mlp=mlp())
        return PostNormBlock(attn, ln1, **writers) if post_norm else PreNormBlock(ln1, attn, **writers)

    def stack(block: Callable[[], nn.Module], n_blocks: int, bidirectional: bool) -> StackParts:
        blocks = [block() for _ in range(n_blocks)]
        embedding_norm = norm() if embed_ln else None
        return StackParts(
            pos_embed(), embedding_norm, rel_pos_bias(bidirectional), blocks, norm() if final_norm else NoNorm()
        )

    encoder, decoder = stack(encoder_block, cfg.n_layers, True), stack(decoder_block, cfg.n_decoder_layers, False)
    return EncoderDecoderParts(embed, encoder, decoder, Unembed(cfg), decoder_embed)


def default_attention(cfg, self_attention=None, cross_attention=None, rel_pos_bias=None) -> tuple:
    """The attention parts of the Transformer's stacks, each kept where given: ``self_attention(causal)``, an
    ``Attention`` masking padding (and later positions when ``causal``); ``cross_attention()``, a
    ``CrossAttention``; ``rel_pos_bias(bidirectional)``, None (no relative position bias)."""

    def transformer_self_attention(causal: bool) -> Attention:
        return Attention(cfg) if causal else Attention(cfg, masks=(PaddingMask(),))

    return (
        self_attention or transformer_self_attention,
        cross_attention or (lambda: CrossAttention(cfg)),
        rel_pos_bias or (lambda bidirectional: None),
    )


CAPABILITIES = encoder_decoder_capabilities("pre", final_norm=True, embedding_norm=False)
HOOK_NAMES = encoder_decoder_hook_names(post_norm=False, pos_embed=True, final_norm=True)

ARCHITECTURE = fixed_architecture("seq2seq-pre-ln", Seq2SeqConfig, build, HOOK_NAMES, CAPABILITIES)

__all__ = ["ARCHITECTURE", "Seq2SeqConfig", "build", "build_pre_norm", "default_attention"]
