"""Tiny random-weight Hugging Face models of the Llama family (Llama, Mistral, Qwen2, Qwen3) for parity tests.

Hugging Face initialises every norm weight to 1 and every bias to 0, which would let a
converter that drops a norm weight or a bias pass; ``perturb_`` moves every parameter
away from its init. ``head_dim=16`` everywhere: a multiple of 16 keeps every element of
the rotary cos/sin tables on the same (vectorized) kernel in both models, so they agree
bit for bit and float64 runs agree to float64 rounding.
"""

import copy
import logging

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

logging.getLogger("transformers.configuration_utils").setLevel(logging.ERROR)

VOCAB = 61
COMMON = dict(
    hidden_size=48,
    intermediate_size=80,
    num_hidden_layers=2,
    head_dim=16,
    vocab_size=VOCAB,
    max_position_embeddings=64,
    attn_implementation="eager",
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
# label -> (model class, config class, settings): together they cover grouped-query ratios 1, 2, 3 and 4, tied
# and untied embeddings, biases on q/k/v (Qwen2) and on q/k/v/o, q/k norms, a sliding window shorter than the
# prompt, llama3 and linear rope scaling, and d_model != n_heads * d_head
FAMILIES = {
    "llama-mha-biases": (
        LlamaForCausalLM,
        LlamaConfig,
        dict(num_attention_heads=3, num_key_value_heads=3, attention_bias=True, tie_word_embeddings=False),
    ),
    "llama-gqa3-tied-llama3": (
        LlamaForCausalLM,
        LlamaConfig,
        dict(num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=True, rope_parameters=dict(LLAMA3_ROPE)),
    ),
    "mistral-gqa4-window": (
        MistralForCausalLM,
        MistralConfig,
        dict(num_attention_heads=4, num_key_value_heads=1, sliding_window=3, tie_word_embeddings=False),
    ),
    "qwen2-gqa2-linear": (
        Qwen2ForCausalLM,
        Qwen2Config,
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "linear", "rope_theta": 1000.0, "factor": 2.0},
        ),
    ),
    "qwen3-gqa3-qk-norm": (
        Qwen3ForCausalLM,
        Qwen3Config,
        dict(num_attention_heads=6, num_key_value_heads=2, attention_bias=True, tie_word_embeddings=False),
    ),
}


def perturb_(hf_model, seed: int, scale: float = 0.2):
    """Add noise to every parameter (in place): norm weights, biases and matrices all leave their init."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in hf_model.parameters():
            param.add_(scale * torch.randn(param.shape, generator=generator, dtype=param.dtype))
    return hf_model


def tiny_from(families: dict, common: dict, label: str, seed: int, overrides: dict):
    """A small random Hugging Face model of ``families[label]`` (eager attention, eval mode), every parameter
    perturbed."""
    model_class, config_class, settings = families[label]
    torch.manual_seed(seed)
    config = config_class(**{**common, **copy.deepcopy(settings), **overrides})
    model = perturb_(model_class(config), seed)
    if config.tie_word_embeddings:
        model.tie_weights()
    return model.eval()


def tiny_hf_model(label: str, seed: int = 0, **overrides):
    """A small random Hugging Face model of one family (eager attention, eval mode), every parameter perturbed."""
    return tiny_from(FAMILIES, COMMON, label, seed, overrides)


def float64_copy(hf_model):
    return copy.deepcopy(hf_model).double()


def random_tokens(batch: int, pos: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, pos), generator=torch.Generator().manual_seed(seed))


def left_padded(tokens: torch.Tensor, n_padding: tuple[int, ...], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``tokens`` with the first ``n_padding[row]`` positions of each row turned into padding, and its mask."""
    tokens, mask = tokens.clone(), torch.ones_like(tokens)
    for row, n in enumerate(n_padding):
        tokens[row, :n], mask[row, :n] = pad_id, 0
    return tokens, mask
