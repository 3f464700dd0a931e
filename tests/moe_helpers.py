"""Tiny random-weight Hugging Face mixture-of-experts models (Mixtral, Qwen2-MoE, Qwen3-MoE) for parity tests.

Every parameter is perturbed away from its init (``llama_helpers.perturb_``), the router
included, so routing differs from token to token. Together the families cover top-2 of 4
with renormalised weights and a window shorter than the prompt (Mixtral), a shared expert
and its gate, q/k/v biases, un-normalised top-3 and a dense layer (Qwen2-MoE), q/k norms,
renormalised top-2 of 5 and ``d_model != n_heads * d_head`` (Qwen3-MoE).
"""

from transformers import (
    MixtralConfig,
    MixtralForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from .llama_helpers import VOCAB, tiny_from

COMMON = dict(
    hidden_size=48,
    head_dim=16,
    vocab_size=VOCAB,
    max_position_embeddings=64,
    attn_implementation="eager",
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
FAMILIES = {
    "mixtral-top2-window": (
        MixtralForCausalLM,
        MixtralConfig,
        dict(
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=24,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=4,
            tie_word_embeddings=False,
        ),
    ),
    "qwen2moe-shared-dense": (
        Qwen2MoeForCausalLM,
        Qwen2MoeConfig,
        dict(
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=4,
            intermediate_size=40,
            moe_intermediate_size=20,
            shared_expert_intermediate_size=28,
            num_experts=6,
            num_experts_per_tok=3,
            norm_topk_prob=False,
            mlp_only_layers=[1],
            tie_word_embeddings=False,
        ),
    ),
    "qwen3moe-qk-norm": (
        Qwen3MoeForCausalLM,
        Qwen3MoeConfig,
        dict(
            num_hidden_layers=2,
            num_attention_heads=6,
            num_key_value_heads=2,
            intermediate_size=40,
            moe_intermediate_size=20,
            num_experts=5,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            tie_word_embeddings=True,
        ),
    ),
}


def tiny_moe(label: str, seed: int = 0, **overrides):
    """A small random Hugging Face mixture-of-experts model of one family (eager attention, eval mode), every parameter
    perturbed."""
    return tiny_from(FAMILIES, COMMON, label, seed, overrides)
