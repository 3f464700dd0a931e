"""The pre-LayerNorm Transformer encoder-decoder, whole.

* ``recipe.py``: its config, parts, capabilities and hook names

Its one ``register(...)`` line below feeds loading's, GGUF's and TransformerLens' tables.
"""

from interp_transformer.families.registry import register
from interp_transformer.families.seq2seq import recipe

register(recipe.ARCHITECTURE, model="encoder_decoder")
