"""Tiny random-weight Hugging Face OLMo 2 and OLMo 3 models for parity tests.

Every parameter is perturbed away from its init (``llama_helpers.perturb_``): the norms' weights
start at 1 and the biases at 0, so a converter that dropped one would otherwise pass.
``head_dim=16`` as in ``llama_helpers``: the rotary tables then agree bit for bit.
"""

from transformers import Olmo2Config, Olmo2ForCausalLM, Olmo3Config, Olmo3ForCausalLM

from .llama_helpers import VOCAB, tiny_from

COMMON = dict(
    hidden_size=48,
    intermediate_size=80,
    head_dim=16,  # d_model != n_heads * d_head in two of the three: Hugging Face's attention reads head_dim
    vocab_size=VOCAB,
    max_position_embeddings=64,
    attn_implementation="eager",
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
# label -> (model class, config class, settings): key/value groups of 1, 2 and 3, attention biases, tied and untied
# read-outs, llama3 and linear rope scaling, OLMo 3's sliding layers (window 3, shorter than the prompts) with their
# own rotary base beside scaled full-attention layers
FAMILIES = {
    "olmo2-mha-biases-tied": (
        Olmo2ForCausalLM,
        Olmo2Config,
        dict(
            num_hidden_layers=2,
            num_attention_heads=3,
            num_key_value_heads=3,
            attention_bias=True,
            tie_word_embeddings=True,
        ),
    ),
    "olmo2-gqa2-llama3": (
        Olmo2ForCausalLM,
        Olmo2Config,
        dict(
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=False,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        ),
    ),
    "olmo3-gqa3-window-local-rope": (
        Olmo3ForCausalLM,
        Olmo3Config,
        dict(
            num_hidden_layers=3,
            num_attention_heads=6,
            num_key_value_heads=2,
            sliding_window=3,
            tie_word_embeddings=False,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            },
        ),
    ),
}


def tiny_olmo(label: str, seed: int = 0, **overrides):
    """A small random Hugging Face OLMo model of one family (eager attention, eval mode), every parameter perturbed."""
    return tiny_from(FAMILIES, COMMON, label, seed, overrides)
