"""GPT-J, whole.

* ``recipe.py``: its config, parts, capabilities and hook names
* ``hf.py``: its Hugging Face converter

Its one ``register(...)`` line below feeds loading's, GGUF's and TransformerLens' tables.
"""

from interp_transformer.families.gptj import recipe
from interp_transformer.families.registry import register

register(recipe.ARCHITECTURE, converter=f"{__name__}.hf", hf_model_types=("gptj",))
