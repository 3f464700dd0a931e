"""Stand-ins for the Hugging Face Hub, which these tests cannot reach.

Ported TransformerLens tests load hub checkpoints (``HookedTransformer.from_pretrained("gpt2")``)
and hub tokenizers (``AutoTokenizer.from_pretrained("gpt2")``). Here:

- ``stand_in(name, **kwargs)`` is ``HookedTransformer.from_pretrained`` of an in-memory Hugging
  Face GPT-2 with random weights (every bias and norm weight randomized too) of the named
  model's shape, with GPT-2's real tokenizer (built offline from its pinned files). The
  SoLU and TinyStories models become GPT-2-style models of their sizes: tests that depend
  on their own family (SoLU's hooks) or on their trained weights are skipped, each with its reason.
  ``pythia-14m`` is a random GPT-NeoX of its shape, with GPT-2's tokenizer;
- ``AutoTokenizer.from_pretrained(name)`` gives GPT-2's real tokenizer for GPT-2 names and skips
  the test for any other (it needs the hub);
- ``AutoModelForCausalLM.from_pretrained(name)`` gives the same random model ``stand_in`` converts,
  so a comparison with "Hugging Face" compares the same weights.
"""

import copy
import functools

import einops
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, GPTNeoXConfig, GPTNeoXForCausalLM

from interp_transformer import HookedTransformer, HookedTransformerConfig
from interp_transformer.compat.text import GPT2_TOKENIZER_NAMES
from interp_transformer.text.gpt2_tokenizer import offline_gpt2_tokenizer

from ..gpt2_helpers import randomize_

# the shapes of the hub models the ported tests load (vocabulary: GPT-2's, whose tokenizer we have)
SHAPES = {
    "gpt2": dict(),
    "distilgpt2": dict(n_layer=6),
    "solu-1l": dict(n_layer=1, n_embd=512, n_head=8, n_inner=2048),
    "solu-2l": dict(n_layer=2, n_embd=512, n_head=8, n_inner=2048),
    "tiny-stories-1M": dict(n_layer=8, n_embd=64, n_head=16, n_inner=256, n_positions=2048),
}
ALIASES = {"gpt2-small": "gpt2", "openai-community/gpt2": "gpt2", "EleutherAI/pythia-14m": "pythia-14m"}
# GPT-NeoX shapes: a random Pythia with GPT-2's tokenizer (Pythia's own needs the hub; its vocabulary covers GPT-2's
# ids)
NEOX_SHAPES = {
    "pythia-14m": dict(
        hidden_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        intermediate_size=512,
        vocab_size=50304,
        rotary_pct=0.25,
        max_position_embeddings=2048,
    )
}


def _shape_name(name: str) -> str:
    name = ALIASES.get(name, name)
    if name not in SHAPES and name not in NEOX_SHAPES:
        pytest.skip(f"needs the hub: {name!r} (a model family or checkpoint these tests have no stand-in for)")
    return name


@functools.cache
def hf_stand_in(name: str) -> GPT2LMHeadModel:
    """A random Hugging Face GPT-2 of ``name``'s shape (cached: read-only use only)."""
    name = _shape_name(name)
    torch.manual_seed(sum(map(ord, name)))
    if name in NEOX_SHAPES:
        return randomize_(
            GPTNeoXForCausalLM(GPTNeoXConfig(attn_implementation="eager", **NEOX_SHAPES[name])), seed=1
        ).eval()
    config = GPT2Config(activation_function="gelu_new", attn_implementation="eager", **SHAPES[name])
    return randomize_(GPT2LMHeadModel(config), seed=1).eval()


# TransformerLens' own attention-only checkpoints: built from a HookedTransformerConfig (no Hugging Face model has their
# shape)
ATTN_ONLY = {f"attn-only-{n}l": n for n in (1, 2, 3, 4)}


def stand_in(name: str, **kwargs) -> HookedTransformer:
    """``HookedTransformer.from_pretrained`` of the random model standing in for ``name``."""
    if name in ATTN_ONLY:
        return attn_only_stand_in(name, **kwargs)
    if ALIASES.get(name, name) in NEOX_SHAPES:
        kwargs.setdefault("tokenizer", offline_gpt2_tokenizer())
    return HookedTransformer.from_pretrained(hf_stand_in(name), **kwargs)


def attn_only_stand_in(
    name: str,
    fold_ln: bool = True,
    center_writing_weights: bool = True,
    center_unembed: bool = True,
    refactor_factored_attn_matrices: bool = False,
    fold_value_biases: bool = True,
    **kwargs,
) -> HookedTransformer:
    """A random attention-only model of ``name``'s shape (d_model 512, 8 heads, LayerNorm), processed as from_pretrained
    does."""
    cfg = HookedTransformerConfig(
        n_layers=ATTN_ONLY[name],
        d_model=512,
        d_head=64,
        n_heads=8,
        n_ctx=1024,
        d_vocab=50257,
        attn_only=True,
        normalization_type="LN",
        act_fn=None,
        model_name=name,
        seed=ATTN_ONLY[name],
    )
    model = HookedTransformer(cfg, tokenizer=offline_gpt2_tokenizer(), **kwargs)
    randomize_(model, seed=2)
    model.process_weights_(
        fold_ln=fold_ln,
        center_writing_weights=center_writing_weights,
        center_unembed=center_unembed,
        refactor_factored_attn_matrices=refactor_factored_attn_matrices,
        fold_value_biases=fold_value_biases,
    )
    return model.eval()


def stand_in_no_processing(name: str, **kwargs) -> HookedTransformer:
    if ALIASES.get(name, name) in NEOX_SHAPES:
        kwargs.setdefault("tokenizer", offline_gpt2_tokenizer())
    return HookedTransformer.from_pretrained_no_processing(hf_stand_in(name), **kwargs)


class AutoTokenizer:
    """``transformers.AutoTokenizer`` for GPT-2's tokenizer, offline; any other name skips the test."""

    @staticmethod
    def from_pretrained(name: str, add_bos_token: bool = False, **kwargs):
        if name not in GPT2_TOKENIZER_NAMES and name != "":
            pytest.skip(f"needs the hub: the tokenizer {name!r}")
        tokenizer = copy.deepcopy(offline_gpt2_tokenizer())
        tokenizer.pad_token = None  # as the hub's GPT-2 tokenizer: no pad token
        tokenizer.name_or_path = "gpt2"
        if add_bos_token:
            tokenizer.add_bos_token = True
        return tokenizer


class AutoModelForCausalLM:
    """``transformers.AutoModelForCausalLM`` of the stand-in models (the same weights ``stand_in`` converts)."""

    @staticmethod
    def from_pretrained(name: str, **kwargs):
        return hf_stand_in(name)


def einsum(pattern: str, *tensors):
    """``fancy_einsum.einsum``: the pattern first."""
    return einops.einsum(*tensors, pattern)


# the SoLU checkpoints' tokenizer, whose ids and pieces some tests assert
NEEDS_SOLU_TOKENIZER = pytest.mark.skip(
    reason="needs the hub: the SoLU models' tokenizer (NeelNanda/gpt-neox-tokenizer-digits), whose ids and pieces it "
    "asserts"
)
