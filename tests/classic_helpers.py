"""Tiny random-weight Hugging Face models of the classic decoders (GPT-NeoX, GPT-J, OPT, BLOOM) for parity tests.

Hugging Face initialises every norm weight to 1 and every bias to 0, which would let a
converter that drops a norm weight or a bias pass; ``perturb_`` moves every parameter away
from its init. ``d_head=16`` everywhere: a multiple of 16 keeps every element of the rotary
cos/sin tables on the same (vectorized) kernel in both models, so float64 runs agree to
float64 rounding.
"""

import copy
import logging

import torch
from transformers import (
    BloomConfig,
    BloomForCausalLM,
    GPTJConfig,
    GPTJForCausalLM,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    OPTConfig,
    OPTForCausalLM,
)

from .llama_helpers import float64_copy, left_padded, perturb_  # noqa: F401 (re-exported for the classic tests)

logging.getLogger("transformers.configuration_utils").setLevel(logging.ERROR)

VOCAB = 61
NO_SPECIAL_TOKENS = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
NEOX = dict(
    hidden_size=48,
    num_hidden_layers=2,
    num_attention_heads=3,
    intermediate_size=80,
    vocab_size=VOCAB,
    max_position_embeddings=64,
    attn_implementation="eager",
    **NO_SPECIAL_TOKENS,
)
GPTJ = dict(
    n_embd=48,
    n_layer=2,
    n_head=3,
    n_inner=80,
    vocab_size=VOCAB,
    n_positions=64,
    attn_implementation="eager",
    **NO_SPECIAL_TOKENS,
)
OPT = dict(
    hidden_size=48,
    num_hidden_layers=2,
    num_attention_heads=3,
    ffn_dim=80,
    vocab_size=VOCAB,
    max_position_embeddings=64,
    attn_implementation="eager",
    pad_token_id=1,
    bos_token_id=None,
    eos_token_id=None,
)
BLOOM = dict(hidden_size=48, n_layer=2, vocab_size=VOCAB, **NO_SPECIAL_TOKENS)

# label -> (model class, config class, settings): parallel and sequential NeoX blocks, a quarter and half of each head
# rotated, interleaved GPT-J rotation on part of and on whole heads, OPT's pre-norm and its post-norm 350m layout with
# embeddings narrower than the residual stream, bias-free and affine-free OPT norms, ALiBi with a power of two heads
# and without (the extra slopes), tied and untied read-outs, erf, tanh and ReLU MLPs
FAMILIES = {
    "neox-parallel": (GPTNeoXForCausalLM, GPTNeoXConfig, dict(NEOX, rotary_pct=0.25, use_parallel_residual=True)),
    "neox-sequential-tied": (
        GPTNeoXForCausalLM,
        GPTNeoXConfig,
        dict(
            NEOX,
            rotary_pct=0.5,
            use_parallel_residual=False,
            attention_bias=False,
            tie_word_embeddings=True,
            hidden_act="gelu_new",
        ),
    ),
    "gptj-partial": (GPTJForCausalLM, GPTJConfig, dict(GPTJ, rotary_dim=8)),
    "gptj-whole-heads": (GPTJForCausalLM, GPTJConfig, dict(GPTJ, rotary_dim=16, activation_function="gelu_fast")),
    "opt-pre-norm": (OPTForCausalLM, OPTConfig, dict(OPT, do_layer_norm_before=True)),
    "opt-350m-layout": (OPTForCausalLM, OPTConfig, dict(OPT, do_layer_norm_before=False, word_embed_proj_dim=32)),
    "opt-projected-plain": (
        OPTForCausalLM,
        OPTConfig,
        dict(
            OPT,
            do_layer_norm_before=True,
            word_embed_proj_dim=32,
            enable_bias=False,
            layer_norm_elementwise_affine=False,
        ),
    ),
    "bloom-3-heads": (BloomForCausalLM, BloomConfig, dict(BLOOM, n_head=3)),
    "bloom-4-heads": (BloomForCausalLM, BloomConfig, dict(BLOOM, n_head=4, hidden_size=64)),
}
POST_NORM = ("opt-350m-layout",)


def tiny_hf_model(label: str, seed: int = 0, **overrides):
    """A small random Hugging Face model of one family (eager attention, eval mode), every parameter perturbed."""
    model_class, config_class, settings = FAMILIES[label]
    torch.manual_seed(seed)
    config = config_class(**{**copy.deepcopy(settings), **overrides})
    model = perturb_(model_class(config), seed)
    if config.tie_word_embeddings:
        model.tie_weights()
    return model.eval()


def random_tokens(batch: int, pos: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(2, VOCAB, (batch, pos), generator=torch.Generator().manual_seed(seed))
