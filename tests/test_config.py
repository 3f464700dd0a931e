"""TransformerConfig: validation, presets against Hugging Face's GPT-2 configs, parameter counts."""

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from interp_transformer import PRESETS, DemoTransformer, TransformerConfig, preset

from .test_components import single_thread  # noqa: F401

# Parameter counts Hugging Face reports for the GPT-2 family (tied embeddings, no lm_head bias).
PUBLISHED_N_PARAMS = {
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "distilgpt2": 81_912_576,
}
# The hub configs of those checkpoints (n_embd, n_layer, n_head); the rest are GPT2Config defaults.
HF_SHAPES = {
    "gpt2": (768, 12, 12),
    "gpt2-medium": (1024, 24, 16),
    "gpt2-large": (1280, 36, 20),
    "gpt2-xl": (1600, 48, 25),
    "distilgpt2": (768, 6, 12),
}


def test_presets_are_the_gpt2_family():
    assert sorted(PRESETS) == sorted(PUBLISHED_N_PARAMS)


@pytest.mark.parametrize("name", sorted(PUBLISHED_N_PARAMS))
def test_preset_matches_hugging_face_config(name):
    from transformers import GPT2Config

    n_embd, n_layer, n_head = HF_SHAPES[name]
    hf = GPT2Config(n_embd=n_embd, n_layer=n_layer, n_head=n_head)
    cfg = preset(name)
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads) == (hf.n_embd, hf.n_layer, hf.n_head)
    assert cfg.d_head == hf.n_embd // hf.n_head
    assert cfg.d_mlp == (hf.n_inner or 4 * hf.n_embd)
    assert (cfg.d_vocab, cfg.n_ctx) == (hf.vocab_size, hf.n_positions)
    assert cfg.act_fn == hf.activation_function == "gelu_new"
    assert cfg.layer_norm_eps == hf.layer_norm_epsilon
    assert cfg.init_range == hf.initializer_range
    assert cfg.name == name


@pytest.mark.parametrize("name", sorted(PUBLISHED_N_PARAMS))
def test_preset_parameter_counts_match_published_and_hugging_face(name):
    from transformers import GPT2Config, GPT2LMHeadModel

    n_embd, n_layer, n_head = HF_SHAPES[name]
    with torch.device("meta"):  # shapes only: no memory, no time
        hf_model = GPT2LMHeadModel(GPT2Config(n_embd=n_embd, n_layer=n_layer, n_head=n_head))
    hf_count = sum(p.numel() for p in hf_model.parameters())  # the tied lm_head is counted once
    cfg = preset(name)
    assert cfg.n_params(tied_embeddings=True) == PUBLISHED_N_PARAMS[name] == hf_count
    # untied, our model also holds its own W_U and b_U
    assert cfg.n_params() == hf_count + cfg.d_model * cfg.d_vocab + cfg.d_vocab


def test_demo_transformer_parameter_count_equals_n_params():
    with torch.device("meta"):
        model = DemoTransformer(preset("gpt2"))
    assert sum(p.numel() for p in model.parameters()) == preset("gpt2").n_params()


@settings(max_examples=20, deadline=None)
@given(
    n_heads=st.integers(1, 4),
    d_head=st.integers(1, 8),
    n_layers=st.integers(1, 3),
    d_mlp=st.one_of(st.none(), st.integers(1, 20)),
    d_vocab=st.integers(1, 30),
    n_ctx=st.integers(1, 10),
)
def test_small_model_parameter_count_equals_n_params(n_heads, d_head, n_layers, d_mlp, d_vocab, n_ctx):
    cfg = TransformerConfig(
        d_model=n_heads * d_head,
        n_layers=n_layers,
        n_heads=n_heads,
        d_head=d_head,
        d_mlp=d_mlp,
        d_vocab=d_vocab,
        n_ctx=n_ctx,
    )
    model = DemoTransformer(cfg, seed=0)
    assert sum(p.numel() for p in model.parameters()) == cfg.n_params()
    assert cfg.n_params() - cfg.n_params(tied_embeddings=True) == model.W_U.numel() + model.b_U.numel()


def test_config_is_frozen_and_replace_validates(small_cfg):
    with pytest.raises(dataclasses.FrozenInstanceError):
        small_cfg.d_model = 3
    wider = small_cfg.replace(n_heads=8, d_head=8)
    assert (wider.d_model, wider.n_heads, wider.d_head) == (64, 8, 8) and small_cfg.n_heads == 4
    with pytest.raises(ValueError, match="d_model=64 must equal n_heads\\*d_head=4\\*8"):
        small_cfg.replace(d_head=8)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(n_layers=0), "n_layers must be a positive int, got 0"),
        (dict(d_vocab=-5), "d_vocab must be a positive int, got -5"),
        (dict(n_ctx=2.0), "n_ctx must be a positive int, got 2.0"),
        (dict(n_heads=True, d_model=64, d_head=64), "n_heads must be a positive int, got True"),
        (dict(d_mlp=0), "d_mlp must be a positive int or None"),
        (dict(d_mlp=True), "d_mlp must be a positive int or None"),
        (dict(act_fn="swish"), "act_fn must be one of .*got 'swish'"),
        (dict(layer_norm_eps=0.0), "layer_norm_eps must be > 0"),
        (dict(init_range=-0.02), "init_range must be > 0"),
        (dict(d_model=100), "d_model=100 must equal n_heads\\*d_head=12\\*64=768"),
    ],
)
def test_invalid_configs(changes, message):
    with pytest.raises(ValueError, match=message):
        TransformerConfig(**changes)


def test_attn_only_flag():
    assert TransformerConfig(d_mlp=None).attn_only
    assert not TransformerConfig().attn_only


def test_model_requires_a_config():
    with pytest.raises(TypeError, match="TransformerConfig"):
        DemoTransformer({"d_model": 768})


def test_preset_unknown_name_suggests_close_ones():
    with pytest.raises(KeyError, match="closest: \\['gpt2-xl'"):
        preset("gpt2-xxl")
