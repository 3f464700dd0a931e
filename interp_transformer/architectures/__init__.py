"""One module per architecture: its config, how its parts are built, its capabilities and hook names.

=========  ========================  ==================================================
module     config                    model
=========  ========================  ==================================================
``gpt2``   ``TransformerConfig``     ``DemoTransformer``: pre-LayerNorm causal decoder
``bert``   ``EncoderConfig``         ``EncoderTransformer``: post-LayerNorm encoder
=========  ========================  ==================================================

Each module defines ``ARCHITECTURE`` (an ``Architecture``), registered here; its
Hugging Face converter lives in ``interp_transformer.loading``. ``docs/architecture.md``
is the recipe for adding one.
"""

from . import bert, gpt2
from .registry import Architecture, DecoderParts, architecture_of, register, registered, unregister

register(gpt2.ARCHITECTURE)
register(bert.ARCHITECTURE)

__all__ = ["Architecture", "DecoderParts", "architecture_of", "bert", "gpt2", "register", "registered", "unregister"]
