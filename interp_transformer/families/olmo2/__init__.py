"""OLMo 2 and 3, whole.

* ``recipe.py``: its config, parts, capabilities and hook names
* ``hf.py``: its Hugging Face converter
* ``reference.py``: its Hugging Face reference recorder

Its one ``register(...)`` line below feeds loading's, GGUF's and TransformerLens' tables.
"""

from interp_transformer.families.olmo2 import recipe
from interp_transformer.families.registry import register

# why no HookedTransformerConfig describes it
NOT_DESCRIBED = (
    "its blocks normalize the outputs of attention and the MLP only, with no norm before them "
    "(TransformerLens' blocks always normalize their inputs)"
)
register(recipe.ARCHITECTURE, converter=f"{__name__}.hf", hf_model_types=("olmo2", "olmo3"), lens=NOT_DESCRIBED)
