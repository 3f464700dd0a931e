"""One module per architecture: its config, how its parts are built, its capabilities and hook names.

============  =====================  ===================================================================================
module        config                 model
============  =====================  ===================================================================================
``gpt2``      ``TransformerConfig``  ``DemoTransformer``: pre-LayerNorm causal decoder
``bert``      ``EncoderConfig``      ``EncoderTransformer``: post-LayerNorm encoder
``llama``     ``LlamaConfig``        ``DemoTransformer``: pre-RMSNorm causal decoder, rotary, grouped-query, gated MLP
``gemma``     ``GemmaConfig``        ``DemoTransformer``: Gemma 1/2/3 (1 + w norms, scaled embedding, soft-caps,
windows)
``moe``       ``MoEConfig``          ``DemoTransformer``: Llama's decoder with mixtures of experts (Mixtral, Qwen-MoE)
``gpt_oss``   ``GptOssConfig``       ``DemoTransformer``: mixtures of clamped SwiGLU experts, attention sinks, YaRN,
sliding layers
``gpt_neox``  ``GPTNeoXConfig``      ``DemoTransformer``: parallel pre-LayerNorm blocks, partial rotary (Pythia)
``gptj``      ``GPTJConfig``         ``DemoTransformer``: one norm read by parallel attention and MLP, interleaved
rotary
``opt``       ``OPTConfig``          ``DemoTransformer``: GPT-2's parts with ReLU (OPT-125m, 1.3b, ...)
              ``OPTPostNormConfig``  ``DemoTransformer``: post-LayerNorm blocks, no final norm (OPT-350m)
``bloom``     ``BloomConfig``        ``DemoTransformer``: normalized embeddings, ALiBi attention
``olmo2``     ``Olmo2Config``        ``DemoTransformer``: OLMo 2/3: norms after each sublayer only, q/k norms over all
heads, sliding windows
``phi3``      ``Phi3Config``         ``DemoTransformer``: Phi-3/Phi-4: Llama's parts, partial rotary, LongRoPE
``smollm3``   ``SmolLM3Config``      ``DemoTransformer``: Llama's parts, NoPE layers (no rotary), sliding layers
``adapter_decoder`` ``AdapterDecoderConfig`` ``DemoTransformer``: GPT-2 with a gated adapter beside each MLP
``composed``  ``DecoderSpec``          ``DemoTransformer``: any decoder composed from parts by name (``builder``)
============  =====================  ===================================================================================

Encoder-decoders (``EncoderDecoderTransformer``; shared parts and hook names in
``encoder_decoder``): ``bart`` (``BartConfig``: post-LayerNorm, learned positions at an
offset of 2), ``marian`` (``MarianConfig``: post-LayerNorm, sinusoidal positions),
``seq2seq`` (``Seq2SeqConfig``: the pre-LayerNorm Transformer), ``t5`` (``T5Config``: pre-RMSNorm,
relative position biases, v1.0 and v1.1). Composed from parts by name (``composed_stacks``):
``EncoderSpec`` (``EncoderTransformer``) and ``EncoderDecoderSpec`` (``EncoderDecoderTransformer``).

Each module defines ``ARCHITECTURE`` (an ``Architecture``), registered here in one line that
also names its Hugging Face converter (a module of ``interp_transformer.loading``) and the
``model_type`` values it reads; loading derives its table from these lines. ``docs/architecture.md``
is the recipe for adding one.
"""

from interp_transformer.families import composed, composed_stacks
from interp_transformer.families.adapter_decoder import recipe as adapter_decoder_recipe
from interp_transformer.families.bart import recipe as bart_recipe
from interp_transformer.families.bert import recipe as bert_recipe
from interp_transformer.families.bloom import recipe as bloom_recipe
from interp_transformer.families.gemma import recipe as gemma_recipe
from interp_transformer.families.gpt2 import recipe as gpt2_recipe
from interp_transformer.families.gpt_neox import recipe as gpt_neox_recipe
from interp_transformer.families.gpt_oss import recipe as gpt_oss_recipe
from interp_transformer.families.gptj import recipe as gptj_recipe
from interp_transformer.families.llama import recipe as llama_recipe
from interp_transformer.families.marian import recipe as marian_recipe
from interp_transformer.families.moe import recipe as moe_recipe
from interp_transformer.families.olmo2 import recipe as olmo2_recipe
from interp_transformer.families.opt import recipe as opt_recipe
from interp_transformer.families.phi3 import recipe as phi3_recipe
from interp_transformer.families.registry import (
    Architecture,
    DecoderParts,
    architecture_of,
    hf_converters,
    register,
    registered,
    unregister,
)
from interp_transformer.families.seq2seq import recipe as seq2seq_recipe
from interp_transformer.families.smollm3 import recipe as smollm3_recipe
from interp_transformer.families.t5 import recipe as t5_recipe

# one line a family: its architecture, the converter in interp_transformer.loading, the Hugging Face model_types it
# reads
register(gpt2_recipe.ARCHITECTURE, converter="gpt2", hf_model_types=("gpt2",))
register(bert_recipe.ARCHITECTURE, converter="bert", hf_model_types=("bert",))
register(llama_recipe.ARCHITECTURE, converter="llama", hf_model_types=("llama", "mistral", "qwen2", "qwen3"))
register(bart_recipe.ARCHITECTURE, converter="bart", hf_model_types=("bart",))
register(marian_recipe.ARCHITECTURE, converter="marian", hf_model_types=("marian",))
register(seq2seq_recipe.ARCHITECTURE)
register(t5_recipe.ARCHITECTURE, converter="t5", hf_model_types=("t5",))
# gemma3 (with a vision tower) is read only to be refused by name
register(gemma_recipe.ARCHITECTURE, converter="gemma", hf_model_types=("gemma", "gemma2", "gemma3_text", "gemma3"))
register(moe_recipe.ARCHITECTURE, converter="moe", hf_model_types=("mixtral", "qwen2_moe", "qwen3_moe"))
register(gpt_oss_recipe.ARCHITECTURE, converter="gpt_oss", hf_model_types=("gpt_oss",))
register(gpt_neox_recipe.ARCHITECTURE, converter="gpt_neox", hf_model_types=("gpt_neox",))
register(gptj_recipe.ARCHITECTURE, converter="gptj", hf_model_types=("gptj",))
register(opt_recipe.ARCHITECTURE, converter="opt", hf_model_types=("opt",))
register(opt_recipe.POST_NORM_ARCHITECTURE)  # the same converter builds it, from the same model_type
register(bloom_recipe.ARCHITECTURE, converter="bloom", hf_model_types=("bloom",))
register(olmo2_recipe.ARCHITECTURE, converter="olmo2", hf_model_types=("olmo2", "olmo3"))
register(phi3_recipe.ARCHITECTURE, converter="phi3", hf_model_types=("phi3",))  # Phi-3 and Phi-4
register(smollm3_recipe.ARCHITECTURE, converter="smollm3", hf_model_types=("smollm3",))
register(adapter_decoder_recipe.ARCHITECTURE)  # docs/architecture.md's worked example of a new kind of writer
# models composed from parts by name (interp_transformer.builder): one architecture per model class, for every design
register(composed.ARCHITECTURE)
register(composed_stacks.ENCODER_ARCHITECTURE)
register(composed_stacks.ENCODER_DECODER_ARCHITECTURE)

__all__ = [
    "Architecture",
    "adapter_decoder",
    "DecoderParts",
    "architecture_of",
    "hf_converters",
    "bart",
    "bert",
    "bloom",
    "composed",
    "composed_stacks",
    "gemma",
    "gpt2",
    "gpt_neox",
    "gpt_oss",
    "gptj",
    "llama",
    "marian",
    "moe",
    "olmo2",
    "opt",
    "phi3",
    "register",
    "registered",
    "seq2seq",
    "smollm3",
    "t5",
    "unregister",
]
