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

import importlib
import sys

from interp_transformer.cache.activations import ActivationCache

# TransformerLens' classic API is a thin layer over the rest (see interp_transformer.compat)
from interp_transformer.compat import (
    FactoredMatrix,
    HookedTransformer,
    HookedTransformerConfig,
    HookedTransformerKeyValueCache,
    TransformerLensKeyValueCache,
    head_detector,
    patching,
    utils,
)
from interp_transformer.core import services
from interp_transformer.core.capabilities import Capabilities
from interp_transformer.core.kv_cache import KeyValueCache
from interp_transformer.core.losses import lm_loss
from interp_transformer.core.shape_checks import set_shape_checking, shape_checking, shape_checking_enabled
from interp_transformer.families.gemma.recipe import GemmaConfig
from interp_transformer.families.gpt2.recipe import PRESETS, TransformerConfig, preset
from interp_transformer.families.llama.recipe import LlamaConfig
from interp_transformer.families.moe.recipe import MoEConfig
from interp_transformer.hooks import HookedRootModule, HookPoint
from interp_transformer.hooks.names import get_act_name
from interp_transformer.hooks.slices import Slice
from interp_transformer.loading import from_pretrained
from interp_transformer.models.decoder import DemoTransformer
from interp_transformer.models.encoder import EncoderConfig, EncoderTransformer
from interp_transformer.models.encoder_decoder import EncoderDecoderTransformer
from interp_transformer.sae import splice

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

# The top floor hands the model classes the verbs the floors above them carry out (core/services.py)
services.provide(
    from_pretrained=from_pretrained,
    splice_saes=splice.splice_saes,
    run_with_saes=splice.run_with_saes,
    run_with_cache_with_saes=splice.run_with_cache_with_saes,
)

# TransformerLens' public module paths, for code that imports from them with only the package name changed
# (``from transformer_lens.hook_points import HookPoint``); docs/from_transformerlens.md lists them
TRANSFORMERLENS_MODULES = {
    "ActivationCache": "compat.cache",
    "FactoredMatrix": "compat.factored_matrix",
    "HookedRootModule": "hooks",
    "HookedTransformer": "compat.model",
    "HookedTransformerConfig": "compat.config",
    "head_detector": "compat.head_detector",
    "hook_points": "hooks",
    "loading_from_pretrained": "compat.pretrained",
    "patching": "compat.patching",
    "utils": "compat.utils",
}

# Served as plain entries of ``sys.modules`` (no import hook): ``import interp_transformer.hook_points`` finds the
# module registered here once the package has loaded. Where the package's attribute of that name is a class
# (``interp_transformer.FactoredMatrix``), the attribute stays the class, as in TransformerLens, and
# ``from interp_transformer.FactoredMatrix import FactoredMatrix`` reads the module.
for _name, _target in TRANSFORMERLENS_MODULES.items():
    _module = sys.modules.setdefault(f"{__name__}.{_name}", importlib.import_module(f"{__name__}.{_target}"))
    globals().setdefault(_name, _module)
del _name, _target, _module
