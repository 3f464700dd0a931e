"""interp_transformer: transformers you can read, hook and verify.

Axis glossary (used in einsum strings, shape annotations, docstrings and plots):

=============  ==========================================================
``batch``      independent sequences in one call
``pos``        token position in a sequence (``query_pos``/``key_pos`` in attention)
``head_index`` attention head within a block
``layer``      block index
``d_model``    width of the residual stream
``d_head``     width of one head's query, key and value
``d_mlp``      hidden width of the MLP (one entry per neuron)
``d_vocab``    vocabulary size
``n_ctx``      longest sequence the model accepts
``expert``     an expert of a mixture of experts
``top_k``      the experts a token's router chose, largest weight first
=============  ==========================================================
"""

from .architectures.gpt2 import PRESETS, TransformerConfig, preset
from .architectures.gemma import GemmaConfig
from .architectures.llama import LlamaConfig
from .architectures.moe import MoEConfig
from .cache import ActivationCache
from .capabilities import Capabilities
from .encoder import EncoderConfig, EncoderTransformer
from .encoder_decoder import EncoderDecoderTransformer
from .hook_names import get_act_name
from .hooks import HookedRootModule, HookPoint
from .kv_cache import KeyValueCache
from .loading import from_pretrained
from .losses import lm_loss
from .model import DemoTransformer
from .shape_checks import set_shape_checking, shape_checking, shape_checking_enabled
from .slices import Slice

# TransformerLens' classic API (a thin layer over the above; see interp_transformer.compat)
from .compat import (  # noqa: E402
    FactoredMatrix,
    HookedTransformer,
    HookedTransformerConfig,
    HookedTransformerKeyValueCache,
    TransformerLensKeyValueCache,
)
from . import head_detector, patching, utils  # noqa: E402

__all__ = [
    "ActivationCache",
    "FactoredMatrix",
    "HookedTransformer",
    "HookedTransformerConfig",
    "HookedTransformerKeyValueCache",
    "Slice",
    "TransformerLensKeyValueCache",
    "Capabilities",
    "DemoTransformer",
    "EncoderConfig",
    "EncoderDecoderTransformer",
    "EncoderTransformer",
    "GemmaConfig",
    "HookPoint",
    "HookedRootModule",
    "KeyValueCache",
    "LlamaConfig",
    "MoEConfig",
    "PRESETS",
    "TransformerConfig",
    "from_pretrained",
    "get_act_name",
    "head_detector",
    "patching",
    "lm_loss",
    "preset",
    "set_shape_checking",
    "shape_checking",
    "shape_checking_enabled",
    "utils",
]
