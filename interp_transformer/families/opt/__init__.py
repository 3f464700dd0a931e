"""OPT, whole.

* ``recipe.py``: its config, parts, capabilities and hook names
* ``hf.py``: its Hugging Face converter
* ``lens.py``: its TransformerLens mapping

Its one ``register(...)`` line below feeds loading's, GGUF's and TransformerLens' tables.
"""

from interp_transformer.families.opt import lens, recipe
from interp_transformer.families.registry import register

# why no HookedTransformerConfig describes the post-norm OPT-350m
POST_NORM_NOT_DESCRIBED = "its blocks normalize after each sublayer (post-norm)"
register(recipe.ARCHITECTURE, converter=f"{__name__}.hf", hf_model_types=("opt",), lens=lens.hooked_config)
# the same converter builds it, from the same model_type
register(recipe.POST_NORM_ARCHITECTURE, lens=POST_NORM_NOT_DESCRIBED)
