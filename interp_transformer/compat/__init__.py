"""TransformerLens' classic API on our model: code written for ``HookedTransformer`` runs with one import changed.

``from interp_transformer import HookedTransformer, HookedTransformerConfig, ActivationCache,
FactoredMatrix, utils`` gives TransformerLens' names with its defaults and semantics;
``interp_transformer.compat.head_detector`` and ``interp_transformer.compat.patching`` mirror its modules
of those names, and ``interp_transformer.hook_points``, ``interp_transformer.FactoredMatrix`` ... stand at
its module paths (``interp_transformer.TRANSFORMERLENS_MODULES``). Where TransformerLens asserts, errors
are ``CompatValueError``/``CompatKeyError``, also ``AssertionError`` (``compat.errors``). Everything
here is a thin layer over the core: ``HookedTransformer`` is a ``DemoTransformer`` built from a
registered architecture (``compat.architecture``), whose parts add hook points but never change a
value the core computes. What differs from
TransformerLens on purpose is listed in ``docs/from_transformerlens.md``.
"""

from interp_transformer.compat.architecture import ARCHITECTURE
from interp_transformer.compat.cache import ActivationCache
from interp_transformer.compat.config import HookedTransformerConfig
from interp_transformer.compat.factored_matrix import FactoredMatrix
from interp_transformer.compat.kv_cache import (
    HookedTransformerKeyValueCache,
    HookedTransformerKeyValueCacheEntry,
    TransformerLensKeyValueCache,
    TransformerLensKeyValueCacheEntry,
)
from interp_transformer.compat.model import HookedTransformer, Output

__all__ = [
    "ARCHITECTURE",
    "ActivationCache",
    "FactoredMatrix",
    "HookedTransformer",
    "HookedTransformerConfig",
    "HookedTransformerKeyValueCache",
    "HookedTransformerKeyValueCacheEntry",
    "Output",
    "TransformerLensKeyValueCache",
    "TransformerLensKeyValueCacheEntry",
]
