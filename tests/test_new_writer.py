"""A family that brings a new kind of writer (a tanh-gated adapter beside each MLP) works in every tool unchanged.

Its files are ``components/adapter.py`` and ``architectures/adapter_decoder.py``, plus one
``register`` line. Each identity below is checked against the model's own cached activations.
"""

import pytest
import torch

from analysis.readouts import attribution
from analysis.report import DISPLAY_ORDER, build_report
from interp_transformer import DemoTransformer
from interp_transformer.families.adapter_decoder.recipe import AdapterDecoderConfig
from interp_transformer.models.processing import center_writing_weights, fold_ln

from .perturbed import perturbed_decoder

CFG = AdapterDecoderConfig(d_model=16, n_layers=2, n_heads=4, d_head=4, d_mlp=24, d_vocab=31, n_ctx=12, d_adapter=6)
TOKENS = torch.tensor([[1, 5, 9, 2, 7, 3], [4, 4, 8, 1, 0, 6]])


@pytest.fixture(scope="module")
def model():
    return perturbed_decoder(CFG)


def test_the_adapter_is_its_formula(model):
    _, cache = model.run_with_cache(TOKENS)
    adapter = model.blocks[0].adapter
    x = cache["normalized", 0, "ln2"]
    expected = torch.tanh(adapter.gate) * (
        adapter.act_fn(x @ adapter.W_down + adapter.b_down) @ adapter.W_up + adapter.b_up
    )
    torch.testing.assert_close(cache["adapter_out", 0], expected, rtol=0, atol=1e-12)
    assert float(adapter.gate.detach()) != 0  # perturbed: a zero gate would write nothing and prove nothing


def test_direct_logit_attribution_splits_the_adapter_too(model):
    logits, cache = model.run_with_cache(TOKENS)
    result = attribution.direct_logit_attribution(cache, tokens=3, incorrect_tokens=5)
    torch.testing.assert_close(result.total(), logits[:, -1, 3] - logits[:, -1, 5], rtol=0, atol=1e-10)
    assert set(result.other_writers) == {"adapter"} and result.other_writers["adapter"].shape == (2, 2)
    assert bool((result.other_writers["adapter"] != 0).all())


def test_decompose_resid_sums_to_the_final_residual(model):
    _, cache = model.run_with_cache(TOKENS)
    stack, labels = cache.decompose_resid(return_labels=True)
    assert labels[-3:] == ["1_attn_out", "1_mlp_out", "1_adapter_out"]
    torch.testing.assert_close(stack.sum(dim=0), cache["resid_post", -1], rtol=0, atol=1e-12)


def test_the_adapter_units_and_bias_rebuild_its_output(model):
    _, cache = model.run_with_cache(TOKENS)
    writer = model.blocks[1].writer("adapter")
    rebuilt = writer.units.writes(cache[writer.units.hook]).sum(dim=-2) + writer.bias_write(cache.__getitem__)
    torch.testing.assert_close(rebuilt, cache["adapter_out", 1], rtol=0, atol=1e-12)


def test_weight_processing_keeps_the_output():
    model = DemoTransformer(CFG, dtype=torch.float64, seed=3)
    with torch.no_grad():
        for block in model.blocks:
            block.adapter.gate.fill_(0.7)
            block.ln2.b.normal_()
    before = model(TOKENS).log_softmax(-1)
    fold_ln(model)
    center_writing_weights(model)
    torch.testing.assert_close(model(TOKENS).log_softmax(-1), before, rtol=0, atol=1e-10)


def test_the_report_has_every_decoder_section(model):
    report = build_report(model, TOKENS[0], title="adapter decoder")
    assert [section.key for section in report.sections] == list(DISPLAY_ORDER)
    assert report["attribution"].figures


@pytest.mark.parametrize("expand_neurons", [True, False])
def test_the_full_decomposition_sums_to_the_residual(model, expand_neurons):
    _, cache = model.run_with_cache(TOKENS)
    stack, labels = cache.get_full_resid_decomposition(expand_neurons=expand_neurons, return_labels=True)
    assert "1_adapter_out" in labels
    torch.testing.assert_close(stack.sum(dim=0), cache["resid_post", -1], rtol=0, atol=1e-12)
