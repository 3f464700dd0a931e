"""gpt-oss, whole.

* ``recipe.py``: its config, parts, capabilities and hook names
* ``hf.py``: its Hugging Face converter
* ``reference.py``: its Hugging Face reference recorder

Its one ``register(...)`` line below feeds loading's, GGUF's and TransformerLens' tables.
"""

from interp_transformer.families.gpt_oss import recipe
from interp_transformer.families.registry import register

# why no HookedTransformerConfig describes it
NOT_DESCRIBED = "its MLPs are mixtures of experts and its attention has sinks"
register(recipe.ARCHITECTURE, converter=f"{__name__}.hf", hf_model_types=("gpt_oss",), lens=NOT_DESCRIBED)
