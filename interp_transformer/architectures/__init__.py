"""One module per architecture: its config, how its parts are built, its capabilities and hook names.

============  =====================  ====================================================================================
module        config                 model
============  =====================  ====================================================================================
``gpt2``      ``TransformerConfig``  ``DemoTransformer``: pre-LayerNorm causal decoder
``bert``      ``EncoderConfig``      ``EncoderTransformer``: post-LayerNorm encoder
``llama``     ``LlamaConfig``        ``DemoTransformer``: pre-RMSNorm causal decoder, rotary, grouped-query, gated MLP
``gemma``     ``GemmaConfig``        ``DemoTransformer``: Gemma 1/2/3 (1 + w norms, scaled embedding, soft-caps, windows)
``moe``       ``MoEConfig``          ``DemoTransformer``: Llama's decoder with mixtures of experts (Mixtral, Qwen-MoE)
``gpt_neox``  ``GPTNeoXConfig``      ``DemoTransformer``: parallel pre-LayerNorm blocks, partial rotary (Pythia)
``gptj``      ``GPTJConfig``         ``DemoTransformer``: one norm read by parallel attention and MLP, interleaved rotary
``opt``       ``OPTConfig``          ``DemoTransformer``: GPT-2's parts with ReLU (OPT-125m, 1.3b, ...)
              ``OPTPostNormConfig``  ``DemoTransformer``: post-LayerNorm blocks, no final norm (OPT-350m)
``bloom``     ``BloomConfig``        ``DemoTransformer``: normalized embeddings, ALiBi attention
============  =====================  ====================================================================================

Encoder-decoders (``EncoderDecoderTransformer``; shared parts and hook names in
``encoder_decoder``): ``bart`` (``BartConfig``: post-LayerNorm, learned positions at an
offset of 2), ``marian`` (``MarianConfig``: post-LayerNorm, sinusoidal positions),
``seq2seq`` (``Seq2SeqConfig``: the pre-LayerNorm Transformer), ``t5`` (``T5Config``: pre-RMSNorm,
relative position biases, v1.0 and v1.1).

Each module defines ``ARCHITECTURE`` (an ``Architecture``), registered here; its
Hugging Face converter lives in ``interp_transformer.loading``. ``docs/architecture.md``
is the recipe for adding one.
"""

from . import bart, bert, bloom, gemma, gpt2, gpt_neox, gptj, llama, marian, moe, opt, seq2seq, t5
from .registry import Architecture, DecoderParts, architecture_of, register, registered, unregister

register(gpt2.ARCHITECTURE)
register(bert.ARCHITECTURE)
register(llama.ARCHITECTURE)
register(bart.ARCHITECTURE)
register(marian.ARCHITECTURE)
register(seq2seq.ARCHITECTURE)
register(t5.ARCHITECTURE)
register(gemma.ARCHITECTURE)
register(moe.ARCHITECTURE)
register(gpt_neox.ARCHITECTURE)
register(gptj.ARCHITECTURE)
register(opt.ARCHITECTURE)
register(opt.POST_NORM_ARCHITECTURE)
register(bloom.ARCHITECTURE)

__all__ = ["Architecture", "DecoderParts", "architecture_of", "bart", "bert", "bloom", "gemma", "gpt2", "gpt_neox", "gptj", "llama",
           "marian", "moe", "opt", "register", "registered", "seq2seq", "t5", "unregister"]
