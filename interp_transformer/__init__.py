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
import importlib.abc
import importlib.util
import sys

from .architectures.gpt2 import PRESETS, TransformerConfig, preset
from .architectures.gemma import GemmaConfig
from .architectures.llama import LlamaConfig
from .architectures.moe import MoEConfig
from .hooks.cache import ActivationCache
from .models.capabilities import Capabilities
from .encoder import EncoderConfig, EncoderTransformer
from .encoder_decoder import EncoderDecoderTransformer
from .hooks.names import get_act_name
from .hooks import HookedRootModule, HookPoint
from .models.kv_cache import KeyValueCache
from .loading import from_pretrained
from .models.losses import lm_loss
from .models.decoder import DemoTransformer
from .models.shape_checks import set_shape_checking, shape_checking, shape_checking_enabled
from .hooks.slices import Slice

# TransformerLens' classic API (a thin layer over the above; see interp_transformer.compat)
from .compat import (  # noqa: E402
    FactoredMatrix,
    HookedTransformer,
    HookedTransformerConfig,
    HookedTransformerKeyValueCache,
    TransformerLensKeyValueCache,
)
from .compat import head_detector, patching, utils  # noqa: E402

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

# Modules that moved into the packages by concern keep their old import paths (docs/architecture.md, "Moves").
MOVED_MODULES = {
    "base": "models.base",
    "cache": "hooks.cache",
    "caching": "hooks.caching",
    "capabilities": "models.capabilities",
    "config": "models.config",
    "factored_matrix": "circuits.factored_matrix",
    "factored_spectra": "circuits.factored_spectra",
    "generate": "text.generate",
    "gpt2_tokenizer": "text.gpt2_tokenizer",
    "head_detector": "compat.head_detector",
    "hook_names": "hooks.names",
    "induction": "pretrained.induction",
    "kv_cache": "models.kv_cache",
    "losses": "models.losses",
    "model": "models.decoder",
    "patching": "compat.patching",
    "processing": "models.processing",
    "prompts": "text.prompts",
    "residual_norms": "hooks.residual_norms",
    "residual_stacks": "hooks.residual_stacks",
    "shape_checks": "models.shape_checks",
    "shipped": "pretrained",
    "slices": "hooks.slices",
    "stack": "models.stack",
    "text_methods": "text.methods",
    "token_checks": "models.token_checks",
    "tokens": "text.tokens",
    "translation": "pretrained.translation",
    "utils": "compat.utils",
    "verify_checks": "verify.checks",
    "verify_report": "verify.report",
}

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
_ALIASES = {**MOVED_MODULES, **TRANSFORMERLENS_MODULES}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import interp_transformer.tokens`` gives the module now at ``interp_transformer.text.tokens``, itself."""

    def find_spec(self, fullname, path=None, target=None):
        package, _, name = fullname.rpartition(".")
        if package == __name__ and name in _ALIASES:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        module = importlib.import_module(f"{__name__}.{_ALIASES[spec.name.rpartition('.')[2]]}")
        self._spec = module.__spec__  # the import system sets __spec__ to the old name's: put the real one back
        return module

    def exec_module(self, module) -> None:
        module.__spec__ = self._spec


if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModuleFinder())

# Where the package's attribute of a module path's name is a class (``interp_transformer.FactoredMatrix``), the path
# is registered directly: importing it through the finder would rebind the attribute to the module. As in
# TransformerLens, the attribute stays the class and ``from interp_transformer.FactoredMatrix import FactoredMatrix``
# reads the module.
for _name, _target in TRANSFORMERLENS_MODULES.items():
    if isinstance(globals().get(_name), type):
        sys.modules.setdefault(f"{__name__}.{_name}", importlib.import_module(f"{__name__}.{_target}"))
