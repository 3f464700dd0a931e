"""Gemma 1, 2 and 3, whole.

* ``recipe.py``: its config, parts, capabilities and hook names
* ``hf.py``: its Hugging Face converter
* ``reference.py``: its Hugging Face reference recorder
* ``gguf.py``: its GGUF entries
* ``lens.py``: its TransformerLens mapping

Its one ``register(...)`` line below feeds loading's, GGUF's and TransformerLens' tables.
"""

from interp_transformer.families.gemma import gguf, lens, recipe
from interp_transformer.families.registry import register

# gemma3 (with a vision tower) is read only to be refused by name
register(
    recipe.ARCHITECTURE,
    converter=f"{__name__}.hf",
    hf_model_types=("gemma", "gemma2", "gemma3_text", "gemma3"),
    gguf=gguf.ARCHITECTURES,
    lens=lens.hooked_config,
)
