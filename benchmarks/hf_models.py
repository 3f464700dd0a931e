"""The Hugging Face models the benchmarks time, built the same way in every process and venv.

Imports only torch and transformers (never interp_transformer), so that
``tl_worker.py`` can use it inside the TransformerLens venv: both processes draw
the same random weights from the same seed, and ``weights_sha256`` lets the
parent check that they did.

``HF_MODELS`` maps a benchmark model name to its family and the fields of its
``transformers`` config:

- ``gpt2-small``: ``GPT2LMHeadModel`` at the GPT-2 small shape (12 layers,
  d_model 768, 12 heads, 50257 tokens, 1024 positions);
- ``smollm2``: ``LlamaForCausalLM`` at the SmolLM2-135M shape (30 layers, d_model
  576, 9 query / 3 key-value heads of 64, SwiGLU 1536, RMSNorm eps 1e-5, rotary
  theta 100000, tied embeddings, 49152 tokens), the config of
  ``interp_transformer.architectures.llama.preset("SmolLM2-135M")``;
- ``tiny`` and ``tiny-llama``: 2-layer models of each family, to smoke-test the scripts.
"""

import hashlib

import torch

HF_MODELS: dict[str, tuple[str, dict]] = {
    "gpt2-small": ("gpt2", dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)),
    "smollm2": ("llama", dict(
        num_hidden_layers=30, hidden_size=576, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
        intermediate_size=1536, hidden_act="silu", rms_norm_eps=1e-5, vocab_size=49152, max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0}, tie_word_embeddings=True,
        initializer_range=0.041666666666666664, bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )),
    "tiny": ("gpt2", dict(n_layer=2, n_embd=64, n_head=4, vocab_size=211, n_positions=128, bos_token_id=0, eos_token_id=0)),
    "tiny-llama": ("llama", dict(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        intermediate_size=96, hidden_act="silu", rms_norm_eps=1e-5, vocab_size=211, max_position_embeddings=128,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=True,
        bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )),
}
N_CTX_FIELD = {"gpt2": "n_positions", "llama": "max_position_embeddings"}
VOCAB_FIELD = "vocab_size"


def model_spec(name: str) -> tuple[str, dict]:
    """``(family, config fields)`` of a benchmark model; KeyError naming the known ones."""
    if name not in HF_MODELS:
        raise KeyError(f"expected a model in {sorted(HF_MODELS)}, received {name!r}")
    family, config = HF_MODELS[name]
    return family, dict(config)


def hf_config(family: str, config: dict):
    """The ``transformers`` config object of ``family`` ("gpt2" or "llama") with these fields."""
    if family == "gpt2":
        from transformers import GPT2Config

        return GPT2Config(**config)
    if family == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(**config)
    raise ValueError(f"expected family 'gpt2' or 'llama', received {family!r}")


def build_hf_model(family: str, config: dict, seed: int, attn_implementation: str = "eager"):
    """The family's causal LM (float32, eval), random weights drawn after ``torch.manual_seed(seed)``."""
    from transformers import GPT2LMHeadModel, LlamaForCausalLM

    model_class = {"gpt2": GPT2LMHeadModel, "llama": LlamaForCausalLM}[family]
    torch.manual_seed(seed)
    model = model_class(hf_config(family, config)).float().eval()
    model.set_attn_implementation(attn_implementation)
    return model


def n_ctx(family: str, config: dict) -> int:
    """The longest sequence the config allows."""
    return config[N_CTX_FIELD[family]]


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
