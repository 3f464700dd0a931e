"""One module per architecture: its config, how its parts are built, its capabilities and hook names.

============  =====================  ====================================================================================
module        config                 model
============  =====================  ====================================================================================
``gpt2``      ``TransformerConfig``  ``DemoTransformer``: pre-LayerNorm causal decoder
``bert``      ``EncoderConfig``      ``EncoderTransformer``: post-LayerNorm encoder
``llama``     ``LlamaConfig``        ``DemoTransformer``: pre-RMSNorm causal decoder, rotary, grouped-query, gated MLP
``gpt_neox``  ``GPTNeoXConfig``      ``DemoTransformer``: parallel pre-LayerNorm blocks, partial rotary (Pythia)
``gptj``      ``GPTJConfig``         ``DemoTransformer``: one norm read by parallel attention and MLP, interleaved rotary
``opt``       ``OPTConfig``          ``DemoTransformer``: GPT-2's parts with ReLU (OPT-125m, 1.3b, ...)
              ``OPTPostNormConfig``  ``DemoTransformer``: post-LayerNorm blocks, no final norm (OPT-350m)
``bloom``     ``BloomConfig``        ``DemoTransformer``: normalized embeddings, ALiBi attention
============  =====================  ====================================================================================

Each module defines ``ARCHITECTURE`` (an ``Architecture``), registered here; its
Hugging Face converter lives in ``interp_transformer.loading``. ``docs/architecture.md``
is the recipe for adding one.
"""

from . import bert, bloom, gpt2, gpt_neox, gptj, llama, opt
from .registry import Architecture, DecoderParts, architecture_of, register, registered, unregister

register(gpt2.ARCHITECTURE)
register(bert.ARCHITECTURE)
register(llama.ARCHITECTURE)
register(gpt_neox.ARCHITECTURE)
register(gptj.ARCHITECTURE)
register(opt.ARCHITECTURE)
register(opt.POST_NORM_ARCHITECTURE)
register(bloom.ARCHITECTURE)

__all__ = ["Architecture", "DecoderParts", "architecture_of", "bert", "bloom", "gpt2", "gpt_neox", "gptj", "llama", "opt", "register",
           "registered", "unregister"]
