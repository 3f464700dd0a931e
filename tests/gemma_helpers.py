"""Tiny random-weight Hugging Face Gemma models (Gemma 1, 2, 3) for parity tests.

Every parameter is perturbed away from its init (``llama_helpers.perturb_``): Gemma's norm
weights start at 0 (gain 1), so a converter that dropped them, or forgot the ``1 +``, would
otherwise pass. The soft-caps are small enough to bite (scores and logits reach several times
the cap), the sliding windows are shorter than the test prompts, ``query_pre_attn_scalar``
differs from ``head_dim``, and ``d_model != n_heads * d_head`` in every family.
"""

from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GemmaConfig,
    GemmaForCausalLM,
)

from .llama_helpers import VOCAB, tiny_from

COMMON = dict(
    hidden_size=48,
    intermediate_size=80,
    head_dim=16,
    vocab_size=VOCAB,
    max_position_embeddings=64,
    attn_implementation="eager",
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
# label -> (model class, config class, settings)
FAMILIES = {
    "gemma1-gqa2-biases": (
        GemmaForCausalLM,
        GemmaConfig,
        dict(
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            attention_bias=True,
            tie_word_embeddings=True,
        ),
    ),
    "gemma2-capped-window": (
        Gemma2ForCausalLM,
        Gemma2Config,
        dict(
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=1,
            sliding_window=3,
            query_pre_attn_scalar=24,
            attn_logit_softcapping=0.8,
            final_logit_softcapping=1.5,
            tie_word_embeddings=False,
        ),
    ),
    "gemma3-local-rope-capped": (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        dict(
            num_hidden_layers=3,
            num_attention_heads=6,
            num_key_value_heads=2,
            sliding_window=4,
            query_pre_attn_scalar=20,
            final_logit_softcapping=2.0,
            tie_word_embeddings=True,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            },
        ),
    ),
}


def tiny_gemma(label: str, seed: int = 0, **overrides):
    """A small random Hugging Face Gemma model of one family (eager attention, eval mode), every parameter perturbed."""
    return tiny_from(FAMILIES, COMMON, label, seed, overrides)
