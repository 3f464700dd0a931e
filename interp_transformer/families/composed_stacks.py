"""Encoders and encoder-decoders composed from parts by name: ``EncoderSpec`` and ``EncoderDecoderSpec``.

The counterparts of ``DecoderSpec`` (``architectures.composed``) for the two other model
classes, each registered once by the library:

- ``EncoderSpec`` builds an ``EncoderTransformer``: BERT's composition (token, segment and
  position embeddings summed, an optional norm on the sum, post-norm blocks of bidirectional
  attention, an optional MLM head and pooler) with the norm, its eps, the positions, the
  activation and the embedding scale picked by name. (A pre-norm or rotary bidirectional
  stack with a linear read-out is ``DecoderSpec(causal=False)``.)
- ``EncoderDecoderSpec`` builds an ``EncoderDecoderTransformer``: two stacks around one token
  embedding (or one per side with ``separate_embeddings``, each of its own vocabulary size with
  ``d_vocab_source``), pre-norm blocks (``seq2seq.build_pre_norm``) or post-norm ones
  (``bart.build_post_norm``), each stack with a final norm unless ``final_norm=False``.
  Positions: a table added to each stack's embeddings (``"learned"``: one table per stack, or one
  read by both with ``share_positions``; ``"sinusoidal"``, ``"sinusoidal_interleaved"``: computed,
  the same in both), T5's relative buckets only (``"relative_bucketed"``: a
  ``RelativePositionBias`` per stack, bidirectional in the encoder, causal in the decoder, added
  to every self-attention's scores; ``n_buckets`` and ``max_distance`` default to T5's 32 and
  128), or none (``"none"``: the decoder's causal mask orders the target; the encoder reads its
  source as a set). ``attn_scale=1.0`` and ``attn_bias``/``mlp_bias``/``readout_bias=False``
  give T5's unscaled scores and bias-free parts.

Every spec's ``norm_eps`` defaults to 1e-5 (``composed_parts.NORM_EPS``): BERT's 1e-12 is
``build_encoder(norm_eps=1e-12)``.

The names (``norm``, ``positions``, ``activation``, ``embed_scale``) are those of
``architectures.composed_parts``.
"""

import dataclasses
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from interp_transformer.core.capabilities import Capabilities
from interp_transformer.families import composed_parts as parts
from interp_transformer.families.bart import recipe as bart
from interp_transformer.families.bert import recipe as bert
from interp_transformer.families.bert.recipe import EncoderParts
from interp_transformer.families.encoder_decoder import (
    EncoderDecoderParts,
    encoder_decoder_capabilities,
    encoder_decoder_hook_names,
    validate_encoder_decoder_fields,
)
from interp_transformer.families.registry import Architecture
from interp_transformer.families.seq2seq import recipe as seq2seq
from interp_transformer.families.validation import check_bools, check_positive_number
from interp_transformer.parts import MLP, MLMHead, Pooler, PostNormBlock, TokenTypeEmbed
from interp_transformer.parts.cross_attention import CrossAttention

NORMS_WITH_A_SCALE = ("layer", "layer_unbiased", "rms")


@dataclass(frozen=True)
class EncoderSpec(parts.PartNames):
    """Which parts a BERT-style encoder is made of, and how big it is (see the module docstring)."""

    d_model: int = 64  # width of the residual stream
    n_layers: int = 2  # number of blocks
    n_heads: int = 4  # attention heads per block
    d_mlp: int = 256  # MLP hidden width
    d_vocab: int = 100  # vocabulary size
    n_ctx: int = 64  # longest sequence
    d_head: int | None = None  # width of each head; None: d_model // n_heads
    n_token_types: int = 2  # segment ids: 0 for sentence A, 1 for sentence B
    norm: str = "layer"  # "layer", "layer_unbiased" or "rms": every norm of the stack
    norm_eps: float = parts.NORM_EPS  # eps of every norm (1e-5 in all three specs; BERT's is 1e-12)
    positions: str = "learned"  # "learned", "sinusoidal" or "sinusoidal_interleaved"
    embed_norm: bool = True  # a norm on the summed embeddings (BERT's embed_ln)
    activation: str = "gelu"  # the MLP's (and the MLM head's) activation
    mlm_head: bool = True  # BERT's MLM head: act(x W_transform + b) -> LayerNorm -> W_U
    pooler: bool = False  # tanh(x[CLS] W_pool + b_pool)
    embed_scale: None | float | str = None  # W_E[tokens] * scale: a number, or "sqrt_d_model"
    init_range: float = 0.02  # std of the normal init of weight matrices
    name: str = "custom"  # free-form label shown in reports

    def __post_init__(self) -> None:
        parts.check_shape(self, ("d_model", "n_layers", "n_heads", "d_mlp", "d_vocab", "n_ctx", "n_token_types"))
        parts.check_choice("norm", self.norm, NORMS_WITH_A_SCALE)
        parts.check_numerics(self)
        parts.check_positions(self, parts.ADDED_POSITIONS)
        check_bools(self, ("embed_norm", "mlm_head", "pooler"))
        parts.check_fits(self)

    @property
    def has_mlm_head(self) -> bool:
        return self.mlm_head

    @property
    def has_pooler(self) -> bool:
        return self.pooler


def build_encoder(spec: EncoderSpec) -> EncoderParts:
    """Embeddings (their norm if asked), post-norm bidirectional blocks, the heads asked for."""

    def block() -> PostNormBlock:
        return PostNormBlock(parts.attention(spec, causal=False), parts.norm(spec), MLP(spec), parts.norm(spec))

    return EncoderParts(
        embed=parts.token_embed(spec),
        pos_embed=parts.position_embed(spec),
        token_type_embed=TokenTypeEmbed(spec),
        embed_ln=parts.norm(spec) if spec.embed_norm else None,
        blocks=[block() for _ in range(spec.n_layers)],
        mlm_head=MLMHead(spec) if spec.mlm_head else None,
        pooler=Pooler(spec) if spec.pooler else None,
    )


def encoder_capabilities(spec: EncoderSpec) -> Capabilities:
    return dataclasses.replace(bert.CAPABILITIES, embedding_norm="embed_ln" if spec.embed_norm else None)


ENCODER_ARCHITECTURE = Architecture(
    name="composed-encoder",
    config_class=EncoderSpec,
    build=build_encoder,
    capabilities=encoder_capabilities,
    hook_names=bert.HOOK_NAMES,
)


@dataclass(frozen=True)
class EncoderDecoderSpec(parts.PartNames):
    """Which parts an encoder-decoder is made of, and how big it is (see the module docstring)."""

    d_model: int = 64  # width of the residual stream
    n_layers: int = 2  # encoder blocks
    n_decoder_layers: int = 2  # decoder blocks
    n_heads: int = 4  # attention heads per block (self- and cross-attention)
    d_mlp: int = 256  # MLP hidden width
    d_vocab: int = 100  # the target's vocabulary size (the read-out's), and the source's unless d_vocab_source
    n_ctx: int = 64  # longest source or target
    d_head: int | None = None  # width of each head; None: d_model // n_heads
    d_vocab_source: int | None = None  # the source's vocabulary size (None: d_vocab); needs separate_embeddings
    norm: str = "layer"  # "layer", "layer_unbiased" or "rms": every norm of both stacks
    norm_eps: float = parts.NORM_EPS  # eps of every norm (1e-5 in all three specs)
    placement: str = "post"  # "post": the original Transformer's blocks; "pre": norms read by the sublayers
    final_norm: bool = True  # each stack ends in a norm (nn.Transformer's encoder and decoder norms)
    positions: str = "sinusoidal"  # composed_parts.ENCODER_DECODER_POSITIONS (see the module docstring)
    share_positions: bool = False  # positions="learned": one table read by both stacks (False: one per stack)
    n_buckets: int | None = None  # positions="relative_bucketed": buckets of each stack's table (None: 32)
    max_distance: int | None = None  # positions="relative_bucketed": where the last bucket starts (None: 128)
    attn_scale: float | None = None  # what q k^T is multiplied by (None: 1/sqrt(d_head); T5: 1.0)
    separate_embeddings: bool = False  # the target has its own token embedding (decoder_embed)
    attn_bias: bool = True  # False: every attention's b_Q, b_K, b_V, b_O held at zero
    mlp_bias: bool = True  # False: b_in, b_out held at zero
    readout_bias: bool = True  # False: b_U held at zero
    activation: str = "relu"  # the MLPs' activation
    embed_scale: None | float | str = None  # W_E[tokens] * scale: a number, or "sqrt_d_model"
    init_range: float = 0.02  # std of the normal init of weight matrices
    pad_token_id: int = 0
    eos_token_id: int = 1
    decoder_start_token_id: int = 2
    name: str = "custom"  # free-form label shown in reports

    def __post_init__(self) -> None:
        parts.check_shape(self, ("d_model", "n_layers", "n_decoder_layers", "n_heads", "d_mlp", "d_vocab", "n_ctx"))
        parts.check_choice("norm", self.norm, NORMS_WITH_A_SCALE)
        parts.check_choice("placement", self.placement, parts.PLACEMENTS)
        parts.check_numerics(self)
        parts.check_positions(self, parts.ENCODER_DECODER_POSITIONS)
        check_bools(
            self, ("final_norm", "separate_embeddings", "share_positions", "attn_bias", "mlp_bias", "readout_bias")
        )
        if self.attn_scale is not None:
            check_positive_number("attn_scale", self.attn_scale)
        if self.share_positions and self.positions != "learned":
            raise ValueError(
                f"share_positions=True shares a learned table between the stacks: it needs positions='learned', got "
                f"positions={self.positions!r} (a sinusoidal table is computed, the same in both stacks already)"
            )
        validate_encoder_decoder_fields(self)
        if self.d_vocab_source is not None:
            parts.check_positive_int("d_vocab_source", self.d_vocab_source)
            if self.d_vocab_source != self.d_vocab and not self.separate_embeddings:
                raise ValueError(
                    f"d_vocab_source={self.d_vocab_source} differs from d_vocab={self.d_vocab} (the target's): each "
                    "side then needs its own token embedding, set separate_embeddings=True"
                )
            if self.pad_token_id >= self.d_vocab_source:
                raise ValueError(
                    f"pad_token_id pads the source too: it must be in [0, d_vocab_source={self.d_vocab_source}), got "
                    f"{self.pad_token_id}"
                )
        parts.check_fits(self)

    @property
    def source_vocab(self) -> int:
        """The source's vocabulary size: ``d_vocab_source``, or ``d_vocab`` when the two sides share one."""
        return self.d_vocab if self.d_vocab_source is None else self.d_vocab_source


def build_encoder_decoder(spec: EncoderDecoderSpec) -> EncoderDecoderParts:
    """The pre-norm stacks of ``seq2seq`` or the post-norm ones of ``bart``, with the parts ``spec`` names."""
    source = SimpleNamespace(d_vocab=spec.source_vocab, d_model=spec.d_model, embed_scale=spec.embed_scale)
    embed = parts.token_embed(source)
    decoder_embed = parts.token_embed(spec) if spec.separate_embeddings else None
    shared_positions = parts.position_embed(spec) if spec.share_positions else None

    def positions():
        return shared_positions if spec.share_positions else parts.position_embed(spec)

    def norm():
        return parts.norm(spec)

    stacks: dict[str, Any] = dict(
        self_attention=lambda causal: parts.attention(spec, causal),
        cross_attention=lambda: CrossAttention(spec, scale=spec.attn_scale),
        rel_pos_bias=lambda bidirectional: parts.relative_bias(spec, bidirectional),
    )
    if spec.placement == "pre":
        built = seq2seq.build_pre_norm(
            spec, embed, positions, decoder_embed, norm, final_norm=spec.final_norm, **stacks
        )
    else:
        built = bart.build_post_norm(
            spec, embed, positions, embed_ln=False, final_norm=spec.final_norm, norm=norm, **stacks
        )
        built = dataclasses.replace(built, decoder_embed=decoder_embed)
    for block in built.encoder.blocks + built.decoder.blocks:
        if not spec.attn_bias:
            parts.hold_at_zero(block, parts.ATTENTION_BIASES)
        if not spec.mlp_bias:
            parts.hold_at_zero(block, parts.MLP_BIASES)
    if not spec.readout_bias:
        parts.hold_at_zero(built.unembed, ("b_U",))
    return built


ENCODER_DECODER_ARCHITECTURE = Architecture(
    name="composed-encoder-decoder",
    config_class=EncoderDecoderSpec,
    build=build_encoder_decoder,
    capabilities=lambda spec: encoder_decoder_capabilities(spec.placement, spec.final_norm, embedding_norm=False),
    hook_names=lambda spec: encoder_decoder_hook_names(
        post_norm=spec.placement == "post",
        pos_embed=spec.positions in parts.ADDED_POSITIONS,
        rel_pos_bias=spec.positions == "relative_bucketed",
        final_norm=spec.final_norm,
    ),
)

__all__ = [
    "ENCODER_ARCHITECTURE",
    "ENCODER_DECODER_ARCHITECTURE",
    "EncoderDecoderSpec",
    "EncoderSpec",
    "build_encoder",
    "build_encoder_decoder",
    "encoder_capabilities",
]
