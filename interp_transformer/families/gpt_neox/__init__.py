"""GPT-NeoX (Pythia), whole.

* ``recipe.py``: its config, parts, capabilities and hook names
* ``hf.py``: its Hugging Face converter
* ``lens.py``: its TransformerLens mapping

Its one ``register(...)`` line below feeds loading's, GGUF's and TransformerLens' tables.
"""

from interp_transformer.families.gpt_neox import lens, recipe
from interp_transformer.families.registry import register

register(recipe.ARCHITECTURE, converter=f"{__name__}.hf", hf_model_types=("gpt_neox",), lens=lens.hooked_config)
