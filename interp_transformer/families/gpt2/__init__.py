"""GPT-2, whole.

* ``recipe.py``: its config, parts, capabilities and hook names
* ``hf.py``: its Hugging Face converter
* ``gguf.py``: its GGUF entries
* ``lens.py``: its TransformerLens mapping

Its one ``register(...)`` line below feeds loading's, GGUF's and TransformerLens' tables.
"""

from interp_transformer.families.gpt2 import gguf, lens, recipe
from interp_transformer.families.registry import register

register(
    recipe.ARCHITECTURE,
    converter=f"{__name__}.hf",
    hf_model_types=("gpt2",),
    gguf=gguf.ARCHITECTURES,
    lens=lens.hooked_config,
)
