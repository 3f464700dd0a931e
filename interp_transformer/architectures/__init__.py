"""One module per architecture: its config, how its parts are built, its capabilities and hook names.

=========  ========================  ==================================================
module     config                    model
=========  ========================  ==================================================
``gpt2``   ``TransformerConfig``     ``DemoTransformer``: pre-LayerNorm causal decoder
``bert``   ``EncoderConfig``         ``EncoderTransformer``: post-LayerNorm encoder
``llama``  ``LlamaConfig``           ``DemoTransformer``: pre-RMSNorm causal decoder, rotary, grouped-query, gated MLP
``gemma``  ``GemmaConfig``           ``DemoTransformer``: Gemma 1/2/3 (1 + w norms, scaled embedding, soft-caps, windows)
``moe``    ``MoEConfig``             ``DemoTransformer``: Llama's decoder with mixtures of experts (Mixtral, Qwen-MoE)
=========  ========================  ==================================================

Each module defines ``ARCHITECTURE`` (an ``Architecture``), registered here; its
Hugging Face converter lives in ``interp_transformer.loading``. ``docs/architecture.md``
is the recipe for adding one.
"""

from . import bert, gemma, gpt2, llama, moe
from .registry import Architecture, DecoderParts, architecture_of, register, registered, unregister

register(gpt2.ARCHITECTURE)
register(bert.ARCHITECTURE)
register(llama.ARCHITECTURE)
register(gemma.ARCHITECTURE)
register(moe.ARCHITECTURE)

__all__ = ["Architecture", "DecoderParts", "architecture_of", "bert", "gemma", "gpt2", "llama", "moe", "register", "registered",
           "unregister"]
