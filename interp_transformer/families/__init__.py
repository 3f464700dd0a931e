"""The families: one folder per family, holding it whole, and the registry every family table derives from.

Each family is one folder, ``families/<name>/``, holding it whole: ``recipe.py`` (its config, parts,
capabilities and hook names), ``hf.py`` (its Hugging Face converter), ``reference.py`` (its reference
recorder, where it has its own), ``gguf.py`` (its GGUF entries) and ``lens.py`` (its TransformerLens
mapping). Its ``__init__.py`` holds its one ``register(...)`` line, which feeds loading's table
(``hf_converters``), GGUF's (``gguf_architectures``) and TransformerLens' (``lens_of``). Every folder
here is imported when this package is, so adding a family is adding its folder and nothing else
(``docs/architecture.md``). Shared by the converters: ``conversion``, ``encoder_decoder_conversion``,
``reference`` (the recorder), ``gguf_entry`` and ``versions``; by the recipes: ``rotary_decoder``,
``encoder_decoder`` (the encoder-decoders' shared parts and hook names) and ``validation``. Composed from
parts by name (``interp_transformer.builder``): ``composed`` (``DecoderSpec``) and ``composed_stacks``
(``EncoderSpec``, ``EncoderDecoderSpec``), registered here.
"""

import importlib
import pkgutil

from interp_transformer.families import composed, composed_stacks
from interp_transformer.families.registry import (
    MODELS,
    Architecture,
    DecoderParts,
    architecture_of,
    gguf_architectures,
    hf_converters,
    lens_of,
    register,
    registered,
    unregister,
)

# every family folder registers itself (its __init__.py holds its one register line)
for _folder in sorted(module.name for module in pkgutil.iter_modules(__path__) if module.ispkg):
    importlib.import_module(f"{__name__}.{_folder}")
# models composed from parts by name (interp_transformer.builder): one architecture per model class, for every design
register(composed.ARCHITECTURE)
register(composed_stacks.ENCODER_ARCHITECTURE, model="encoder")
register(composed_stacks.ENCODER_DECODER_ARCHITECTURE, model="encoder_decoder")

__all__ = [
    "MODELS",
    "Architecture",
    "DecoderParts",
    "architecture_of",
    "composed",
    "composed_stacks",
    "gguf_architectures",
    "hf_converters",
    "lens_of",
    "register",
    "registered",
    "unregister",
]
