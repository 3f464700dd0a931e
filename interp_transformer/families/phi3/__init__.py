"""Phi-3 and Phi-4, whole.

* ``recipe.py``: its config, parts, capabilities and hook names
* ``hf.py``: its Hugging Face converter
* ``gguf.py``: its GGUF entries

Its one ``register(...)`` line below feeds loading's, GGUF's and TransformerLens' tables.
"""

from interp_transformer.families.phi3 import gguf, recipe
from interp_transformer.families.registry import register

register(recipe.ARCHITECTURE, converter=f"{__name__}.hf", hf_model_types=("phi3",), gguf=gguf.ARCHITECTURES)
