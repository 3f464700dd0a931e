"""One part per file; each is small, typed, and hooked where DESIGN section 3 says.

Parts are interchangeable by protocol: an architecture module (``interp_transformer.architectures``)
picks them and a block or model composes them.
"""

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
from .pos_embed import PosEmbed
from .rms_norm import RMSNorm
from .rotary import RopeScaling, Rotary
from .token_type_embed import TokenTypeEmbed
from .unembed import Unembed

__all__ = [
    "Attention",
    "AttnOnlyBlock",
    "CausalMask",
    "Embed",
    "GatedMLP",
    "LayerNorm",
    "MLMHead",
    "MLP",
    "NoNorm",
    "PaddingMask",
    "Pooler",
    "PosEmbed",
    "PostNormBlock",
    "RMSNorm",
    "RopeScaling",
    "Rotary",
    "SlidingWindowMask",
    "TokenLayout",
    "TokenTypeEmbed",
    "TransformerBlock",
    "Unembed",
    "gelu_new",
]
