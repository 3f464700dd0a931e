"""Logit lens and direct logit attribution against the model's own logits and modules."""

import pytest
import torch

from analysis.readouts import attribution
from interp_transformer import DemoTransformer, TransformerConfig


def randomised(model: DemoTransformer, seed: int) -> DemoTransformer:
    """Every parameter random, biases and LayerNorm w/b included, so each bias term matters."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=param.dtype) * 0.3
            param.copy_(1.0 + noise if name.endswith(".w") else noise)
    return model.eval()


@pytest.fixture(scope="module")
def model64() -> DemoTransformer:
    cfg = TransformerConfig(d_model=32, n_layers=3, n_heads=4, d_head=8, d_mlp=64, d_vocab=29, n_ctx=12)
    return randomised(DemoTransformer(cfg, dtype=torch.float64, seed=0), seed=1)


@pytest.fixture(scope="module")
def attn_only64() -> DemoTransformer:
    cfg = TransformerConfig(d_model=16, n_layers=2, n_heads=2, d_head=8, d_mlp=None, d_vocab=23, n_ctx=8)
    return randomised(DemoTransformer(cfg, dtype=torch.float64, seed=0), seed=2)


@pytest.fixture(scope="module")
def run(model64):
    tokens = torch.randint(0, 29, (3, 9), generator=torch.Generator().manual_seed(0))
    logits, cache = model64.run_with_cache(tokens)
    return tokens, logits, cache


def test_logit_lens_final_layer_equals_logits(run):
    _, logits, cache = run
    lens, labels = attribution.logit_lens(cache, return_labels=True)
    assert lens.shape == (4, 3, 9, 29)
    assert labels == ["0_pre", "1_pre", "2_pre", "final_post"]
    assert torch.allclose(lens[-1], logits, atol=1e-12)
    assert torch.allclose(attribution.logit_lens(cache, pos_slice=-1)[:, :, 0], lens[:, :, -1])


def test_logit_lens_intermediate_layers_use_the_models_final_layernorm(model64, run):
    _, _, cache = run
    lens = attribution.logit_lens(cache, pos_slice=slice(2, 6))
    with torch.no_grad():
        for layer in range(3):
            reference = model64.unembed(model64.ln_final(cache["resid_pre", layer]))[:, 2:6]
            assert torch.allclose(lens[layer], reference, atol=1e-12)


def test_attributions_sum_to_the_logit(run):
    tokens, logits, cache = run
    answers = torch.tensor([3, 17, 28])
    attr = attribution.direct_logit_attribution(cache, answers, pos=-1)
    assert attr.heads.shape == (3, 4, 3) and attr.mlp.shape == (3, 3) and attr.embed.shape == (3,)
    assert torch.allclose(attr.total(), logits[torch.arange(3), -1, answers], atol=1e-10)
    # a logit difference, at a different position per batch entry
    pos = torch.tensor([2, 8, -3])
    diff = attribution.direct_logit_attribution(cache, 5, incorrect_tokens=answers, pos=pos)
    rows = torch.arange(3)
    expected = logits[rows, pos, 5] - logits[rows, pos, answers]
    assert torch.allclose(diff.total(), expected, atol=1e-10)
    # each bias term is nonzero here, so leaving one out would break the sum
    for term in (diff.attn_bias, diff.mlp_bias, diff.ln_final_bias, diff.unembed_bias, diff.pos_embed):
        assert term.abs().min() > 1e-6


def test_components_match_the_cache_decomposition(model64, run):
    """Per-head and per-layer terms equal ActivationCache's stack + apply_ln_to_stack + logit_attrs."""
    _, _, cache = run
    answers = torch.tensor([1, 2, 3])
    attr = attribution.direct_logit_attribution(cache, answers, incorrect_tokens=4, pos=-1)
    heads = cache.stack_head_results(pos_slice=-1)  # [layer*head, batch, d_model]; logit_attrs applies the final norm
    expected_heads = cache.logit_attrs(heads, answers, torch.tensor([4, 4, 4]), pos_slice=-1)
    assert torch.allclose(attr.heads.flatten(0, 1), expected_heads, atol=1e-10)
    parts, labels = cache.decompose_resid(pos_slice=-1, return_labels=True)
    expected = dict(zip(labels, cache.logit_attrs(parts, answers, torch.tensor([4, 4, 4]), pos_slice=-1)))
    assert torch.allclose(attr.embed, expected["embed"], atol=1e-10)
    for layer in range(3):
        assert torch.allclose(attr.attn[layer], expected[f"{layer}_attn_out"], atol=1e-10)
        assert torch.allclose(attr.mlp[layer], expected[f"{layer}_mlp_out"], atol=1e-10)


def test_neuron_attributions_sum_to_the_mlp_layer(run):
    _, _, cache = run
    attr = attribution.direct_logit_attribution(cache, 7, pos=4)
    per_neuron = attribution.neuron_logit_attribution(cache, 7, pos=4)
    assert per_neuron.shape == (3, 64, 3)
    assert torch.allclose(per_neuron.sum(dim=1) + attr.mlp_bias, attr.mlp, atol=1e-10)
    assert torch.allclose(attribution.neuron_logit_attribution(cache, 7, pos=4, layer=1), per_neuron[1])
    # one neuron against the cache's own neuron stack
    stack = cache.stack_neuron_results(layer=None, neuron_slice=[5], pos_slice=4)  # [layer, batch, d_model]
    assert torch.allclose(per_neuron[:, 5], cache.logit_attrs(stack, 7, pos_slice=4), atol=1e-10)


def test_attention_only_model(attn_only64):
    tokens = torch.randint(0, 23, (2, 6), generator=torch.Generator().manual_seed(1))
    logits, cache = attn_only64.run_with_cache(tokens, names_filter=attribution.attribution_hook_names(attn_only64))
    attr = attribution.direct_logit_attribution(cache, tokens[:, -1])
    assert attr.mlp is None and attr.mlp_bias is None
    assert torch.allclose(attr.total(), logits[torch.arange(2), -1, tokens[:, -1]], atol=1e-10)
    with pytest.raises(ValueError, match="attention-only"):
        attribution.neuron_logit_attribution(cache, 1)


def test_bad_input(model64, run):
    tokens, _, cache = run
    _, partial = model64.run_with_cache(tokens, names_filter=["hook_embed", "ln_final.hook_scale"])
    with pytest.raises(KeyError, match=r"hook_pos_embed.*names_filter=\['hook_embed', 'hook_pos_embed'"):
        attribution.direct_logit_attribution(partial, 1)
    with pytest.raises(KeyError, match="blocks.0.hook_resid_pre"):
        attribution.logit_lens(partial)
    with pytest.raises(KeyError, match=r"blocks\.0\.mlp\.hook_post"):
        attribution.neuron_logit_attribution(partial, 1)
    with pytest.raises(ValueError, match="d_vocab=29"):
        attribution.direct_logit_attribution(cache, 29)
    with pytest.raises(ValueError, match=r"pos must lie in \[-9, 9\)"):
        attribution.direct_logit_attribution(cache, 1, pos=9)
    with pytest.raises(ValueError, match=r"shape \[batch\]=\[3\]"):
        attribution.direct_logit_attribution(cache, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="layer=3 is out of range"):
        attribution.neuron_logit_attribution(cache, 1, layer=3)
