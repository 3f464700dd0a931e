"""Model configs: the GPT-2 config and presets (``architectures.gpt2``) and the checks every config shares.

Each architecture keeps its config in its own module (``interp_transformer.architectures``);
this module keeps the names that were always importable from here.
"""

from ..architectures.gpt2 import PRESETS, TransformerConfig, preset
from ..architectures.validation import ACTIVATION_FUNCTIONS, validate_common_fields

__all__ = ["ACTIVATION_FUNCTIONS", "PRESETS", "TransformerConfig", "preset", "validate_common_fields"]
