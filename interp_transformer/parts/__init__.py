"""One part per file; each is small, typed, and hooked where DESIGN section 3 says.

Parts are interchangeable by protocol: an architecture module (``interp_transformer.families``)
picks them and a block or model composes them.
"""

from interp_transformer.parts.alibi import ALiBi
from interp_transformer.parts.attention import Attention
from interp_transformer.parts.bert_heads import MLMHead, Pooler
from interp_transformer.parts.blocks import ParallelBlock, PostNormBlock, PreNormBlock
from interp_transformer.parts.clipped_relative_bias import ClippedRelativeBias
from interp_transformer.parts.embed import Embed
from interp_transformer.parts.gated_mlp import GatedMLP
from interp_transformer.parts.layer_norm import LayerNorm
from interp_transformer.parts.layout import TokenLayout
from interp_transformer.parts.masks import CausalMask, PaddingMask, SlidingWindowMask
from interp_transformer.parts.mlp import MLP, gelu_new
from interp_transformer.parts.no_norm import NoNorm
from interp_transformer.parts.norm_pre import LayerNormPre, RMSNormPre
from interp_transformer.parts.normed_embed import NormedEmbed
from interp_transformer.parts.pos_embed import PosEmbed
from interp_transformer.parts.rms_norm import RMSNorm
from interp_transformer.parts.rotary import RopeScaling, Rotary
from interp_transformer.parts.sinusoidal import ScaledEmbed, SinusoidalPosEmbed
from interp_transformer.parts.token_type_embed import TokenTypeEmbed
from interp_transformer.parts.unbiased_layer_norm import UnbiasedLayerNorm
from interp_transformer.parts.unembed import Unembed

__all__ = [
    "ALiBi",
    "ClippedRelativeBias",
    "Attention",
    "CausalMask",
    "Embed",
    "GatedMLP",
    "LayerNorm",
    "LayerNormPre",
    "MLMHead",
    "MLP",
    "NoNorm",
    "NormedEmbed",
    "PaddingMask",
    "ParallelBlock",
    "Pooler",
    "PosEmbed",
    "PostNormBlock",
    "PreNormBlock",
    "RMSNorm",
    "RMSNormPre",
    "RopeScaling",
    "Rotary",
    "ScaledEmbed",
    "SinusoidalPosEmbed",
    "SlidingWindowMask",
    "TokenLayout",
    "TokenTypeEmbed",
    "UnbiasedLayerNorm",
    "Unembed",
    "gelu_new",
]
