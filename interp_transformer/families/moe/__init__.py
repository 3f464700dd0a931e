"""Mixtures of experts (Mixtral, Qwen-MoE), whole.

* ``recipe.py``: its config, parts, capabilities and hook names
* ``hf.py``: its Hugging Face converter
* ``reference.py``: its Hugging Face reference recorder
* ``gguf.py``: its GGUF entries

Its one ``register(...)`` line below feeds loading's, GGUF's and TransformerLens' tables.
"""

from interp_transformer.families.moe import gguf, recipe
from interp_transformer.families.registry import register

# why no HookedTransformerConfig describes it
NOT_DESCRIBED = "its MLPs are mixtures of experts"
register(
    recipe.ARCHITECTURE,
    converter=f"{__name__}.hf",
    hf_model_types=("mixtral", "qwen2_moe", "qwen3_moe"),
    gguf=gguf.ARCHITECTURES,
    lens=NOT_DESCRIBED,
)
