"""GPT-2 with a gated adapter beside each MLP, whole (docs/architecture.md's worked example of a new kind of writer).

* ``recipe.py``: its config, parts, capabilities and hook names

Its one ``register(...)`` line below feeds loading's, GGUF's and TransformerLens' tables.
"""

from interp_transformer.families.adapter_decoder import recipe
from interp_transformer.families.registry import register

register(recipe.ARCHITECTURE)
