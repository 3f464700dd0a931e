"""One module per component; each is small, typed, and hooked where DESIGN section 3 says."""

from .attention import Attention
from .block import AttnOnlyBlock, TransformerBlock
from .embed import Embed
from .layer_norm import LayerNorm
from .mlp import MLP, gelu_new
from .pos_embed import PosEmbed
from .unembed import Unembed

__all__ = ["Attention", "AttnOnlyBlock", "TransformerBlock", "Embed", "LayerNorm", "MLP", "gelu_new", "PosEmbed", "Unembed"]
