"""Encoders and encoder-decoders composed from parts by name: ``EncoderSpec`` and ``EncoderDecoderSpec``.

The counterparts of ``DecoderSpec`` (``architectures.composed``) for the two other model
classes, each registered once by the library:

- ``EncoderSpec`` builds an ``EncoderTransformer``: BERT's composition (token, segment and
  position embeddings summed, an optional norm on the sum, post-norm blocks of bidirectional
  attention, an optional MLM head and pooler) with the norm, its eps, the positions, the
  activation and the embedding scale picked by name. (A pre-norm or rotary bidirectional
  stack with a linear read-out is ``DecoderSpec(causal=False)``.)
- ``EncoderDecoderSpec`` builds an ``EncoderDecoderTransformer``: two stacks around one token
  embedding (or one per side with ``separate_embeddings``; the positions are the same table
  in both), pre-norm blocks (``seq2seq.build_pre_norm``) or post-norm ones
  (``bart.build_post_norm``), each stack with a final norm unless ``final_norm=False``.

The names (``norm``, ``positions``, ``activation``, ``embed_scale``) are those of
``architectures.composed_parts``.
"""

import dataclasses
from dataclasses import dataclass
from typing import Optional, Union

from ..components import MLP, MLMHead, Pooler, PostNormBlock, TokenTypeEmbed
from ..models.capabilities import Capabilities
from . import bart, bert, seq2seq
from . import composed_parts as parts
from .bert import EncoderParts
from .encoder_decoder import (
    EncoderDecoderParts,
    encoder_decoder_capabilities,
    encoder_decoder_hook_names,
    validate_encoder_decoder_fields,
)
from .registry import Architecture

NORMS_WITH_A_SCALE = ("layer", "layer_unbiased", "rms")


class _PartNames:
    """The names the parts read (``act_fn``, ``layer_norm_eps``) and what every spec offers (``replace``)."""

    @property
    def act_fn(self) -> str:
        return self.activation

    @property
    def layer_norm_eps(self) -> float:
        return self.norm_eps

    @property
    def attn_only(self) -> bool:
        return False

    def replace(self, **changes):
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class EncoderSpec(_PartNames):
    """Which parts a BERT-style encoder is made of, and how big it is (see the module docstring)."""

    d_model: int = 64  # width of the residual stream
    n_layers: int = 2  # number of blocks
    n_heads: int = 4  # attention heads per block
    d_mlp: int = 256  # MLP hidden width
    d_vocab: int = 100  # vocabulary size
    n_ctx: int = 64  # longest sequence
    d_head: Optional[int] = None  # width of each head; None: d_model // n_heads
    n_token_types: int = 2  # segment ids: 0 for sentence A, 1 for sentence B
    norm: str = "layer"  # "layer", "layer_unbiased" or "rms": every norm of the stack
    norm_eps: float = 1e-12  # eps of every norm (BERT's)
    positions: str = "learned"  # "learned", "sinusoidal" or "sinusoidal_interleaved"
    embed_norm: bool = True  # a norm on the summed embeddings (BERT's embed_ln)
    activation: str = "gelu"  # the MLP's (and the MLM head's) activation
    mlm_head: bool = True  # BERT's MLM head: act(x W_transform + b) -> LayerNorm -> W_U
    pooler: bool = False  # tanh(x[CLS] W_pool + b_pool)
    embed_scale: Union[None, float, str] = None  # W_E[tokens] * scale: a number, or "sqrt_d_model"
    init_range: float = 0.02  # std of the normal init of weight matrices
    name: str = "custom"  # free-form label shown in reports

    def __post_init__(self) -> None:
        parts.check_shape(self, ("d_model", "n_layers", "n_heads", "d_mlp", "d_vocab", "n_ctx", "n_token_types"))
        parts.check_choice("norm", self.norm, NORMS_WITH_A_SCALE)
        parts.check_numerics(self)
        parts.check_positions(self, parts.ADDED_POSITIONS)
        for field in ("embed_norm", "mlm_head", "pooler"):
            parts.check_bool(field, getattr(self, field))

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
class EncoderDecoderSpec(_PartNames):
    """Which parts an encoder-decoder is made of, and how big it is (see the module docstring)."""

    d_model: int = 64  # width of the residual stream
    n_layers: int = 2  # encoder blocks
    n_decoder_layers: int = 2  # decoder blocks
    n_heads: int = 4  # attention heads per block (self- and cross-attention)
    d_mlp: int = 256  # MLP hidden width
    d_vocab: int = 100  # vocabulary size (shared by source and target)
    n_ctx: int = 64  # longest source or target
    d_head: Optional[int] = None  # width of each head; None: d_model // n_heads
    norm: str = "layer"  # "layer", "layer_unbiased" or "rms": every norm of both stacks
    norm_eps: float = 1e-5  # eps of every norm
    placement: str = "post"  # "post": the original Transformer's blocks; "pre": norms read by the sublayers
    final_norm: bool = True  # each stack ends in a norm (nn.Transformer's encoder and decoder norms)
    positions: str = "sinusoidal"  # "learned", "sinusoidal" or "sinusoidal_interleaved"
    separate_embeddings: bool = False  # the target has its own token embedding (decoder_embed)
    activation: str = "relu"  # the MLPs' activation
    embed_scale: Union[None, float, str] = None  # W_E[tokens] * scale: a number, or "sqrt_d_model"
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
        parts.check_positions(self, parts.ADDED_POSITIONS)
        for field in ("final_norm", "separate_embeddings"):
            parts.check_bool(field, getattr(self, field))
        validate_encoder_decoder_fields(self)


def build_encoder_decoder(spec: EncoderDecoderSpec) -> EncoderDecoderParts:
    """The pre-norm stacks of ``seq2seq`` or the post-norm ones of ``bart``, with the parts ``spec`` names."""
    embed = parts.token_embed(spec)
    decoder_embed = parts.token_embed(spec) if spec.separate_embeddings else None

    def positions():
        return parts.position_embed(spec)

    def norm():
        return parts.norm(spec)

    if spec.placement == "pre":
        return seq2seq.build_pre_norm(spec, embed, positions, decoder_embed, norm, final_norm=spec.final_norm)
    built = bart.build_post_norm(spec, embed, positions, embed_ln=False, final_norm=spec.final_norm, norm=norm)
    return dataclasses.replace(built, decoder_embed=decoder_embed)


ENCODER_DECODER_ARCHITECTURE = Architecture(
    name="composed-encoder-decoder",
    config_class=EncoderDecoderSpec,
    build=build_encoder_decoder,
    capabilities=lambda spec: encoder_decoder_capabilities(spec.placement, spec.final_norm, embedding_norm=False),
    hook_names=lambda spec: encoder_decoder_hook_names(
        post_norm=spec.placement == "post", pos_embed=True, final_norm=spec.final_norm
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
