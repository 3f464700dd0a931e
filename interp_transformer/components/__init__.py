"""One part per file; each is small, typed, and hooked where DESIGN section 3 says.

Parts are interchangeable by protocol: an architecture module (``interp_transformer.architectures``)
picks them and a block or model composes them.
"""

from .alibi import ALiBi
from .clipped_relative_bias import ClippedRelativeBias
from .attention import Attention
from .bert_heads import MLMHead, Pooler
from .blocks import AttnOnlyBlock, PostNormBlock, TransformerBlock
from .embed import Embed
from .gated_mlp import GatedMLP
from .layer_norm import LayerNorm
from .layout import TokenLayout
from .masks import CausalMask, PaddingMask, SlidingWindowMask
from .mlp import MLP, gelu_new
from .no_norm import NoNorm
from .norm_pre import LayerNormPre, RMSNormPre
from .normed_embed import NormedEmbed
from .parallel_blocks import ParallelBlock, SharedNormParallelBlock
from .pos_embed import PosEmbed
from .rms_norm import RMSNorm
from .rotary import RopeScaling, Rotary
from .sinusoidal import ScaledEmbed, SinusoidalPosEmbed
from .token_type_embed import TokenTypeEmbed
from .unbiased_layer_norm import UnbiasedLayerNorm
from .unembed import Unembed

__all__ = [
    "ALiBi",
    "ClippedRelativeBias",
    "Attention",
    "AttnOnlyBlock",
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
    "RMSNorm",
    "RMSNormPre",
    "RopeScaling",
    "Rotary",
    "ScaledEmbed",
    "SharedNormParallelBlock",
    "SinusoidalPosEmbed",
    "SlidingWindowMask",
    "TokenLayout",
    "TokenTypeEmbed",
    "TransformerBlock",
    "UnbiasedLayerNorm",
    "Unembed",
    "gelu_new",
]
