"""Weight processing leaves the model's output unchanged (log-probs for center_unembed) and does what it says."""

import copy

import pytest
import torch

from interp_transformer.loading import from_pretrained
from interp_transformer.models import processing

from .gpt2_helpers import one_thread, random_tokens, tiny_gpt2  # noqa: F401 (autouse fixture)

STEPS = ["fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases"]
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-4}


@pytest.fixture(scope="module")
def hf_model():
    return tiny_gpt2(21, n_layer=2, n_embd=32, n_head=4, vocab_size=53)


@pytest.fixture(scope="module")
def tokens():
    return random_tokens(53, 2, 10, seed=1)


@pytest.fixture(scope="module")
def reference_log_probs(hf_model, tokens):
    """Hugging Face's log-probs, computed in float64: the reference every processed model must match."""
    hf64 = copy.deepcopy(hf_model).double()
    with torch.no_grad():
        return hf64(tokens).logits.log_softmax(-1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("step", STEPS)
def test_each_step_leaves_the_output_unchanged(hf_model, tokens, reference_log_probs, step, dtype):
    model = from_pretrained(hf_model, dtype=dtype)
    with torch.no_grad():
        logits_before = model(tokens)
    assert getattr(processing, step)(model) is model
    assert model.processing == [step]
    with torch.no_grad():
        logits_after = model(tokens)
    tolerance = TOLERANCE[dtype]
    if step == "center_unembed":  # logits shift by a per-position constant; log-probs do not move
        assert (logits_after - logits_before).abs().max() > 1e-3
        logits_after, logits_before = logits_after.log_softmax(-1), logits_before.log_softmax(-1)
    assert (logits_after - logits_before).abs().max() < tolerance
    assert (logits_after.log_softmax(-1).double() - reference_log_probs).abs().max() < tolerance


def test_all_steps_together_match_hugging_face(hf_model, tokens, reference_log_probs):
    model = processing.process_weights(from_pretrained(hf_model, dtype=torch.float64))
    assert model.processing == STEPS
    with torch.no_grad():
        assert (model(tokens).log_softmax(-1) - reference_log_probs).abs().max() < 1e-10


def test_fold_ln_sets_layer_norms_to_identity_and_hook_normalized_to_the_pure_normalization(hf_model, tokens):
    model = processing.fold_ln(from_pretrained(hf_model, dtype=torch.float64))
    for name, param in model.named_parameters():
        if name.endswith(".w"):
            assert torch.equal(param, torch.ones_like(param)), name
        if name.endswith(".b"):
            assert torch.equal(param, torch.zeros_like(param)), name
    _, cache = model.run_with_cache(tokens)
    resid = cache["blocks.1.hook_resid_mid"]
    centred = resid - resid.mean(-1, keepdim=True)
    pure = centred / (centred.pow(2).mean(-1, keepdim=True) + model.cfg.layer_norm_eps).sqrt()
    assert (cache["blocks.1.ln2.hook_normalized"] - pure).abs().max() < 1e-12


def test_fold_ln_without_centering_is_the_plain_fold(hf_model, tokens):
    model = from_pretrained(hf_model, dtype=torch.float64)
    w, b, W_in, b_in = (t.clone() for t in (model.blocks[0].ln2.w, model.blocks[0].ln2.b, model.W_in[0], model.b_in[0]))
    processing.fold_ln(model, center_weights=False)
    assert torch.allclose(model.W_in[0], w[:, None] * W_in, atol=1e-14)
    assert torch.allclose(model.b_in[0], b_in + b @ W_in, atol=1e-14)


def test_center_writing_weights_gives_zero_mean_residual_streams(hf_model, tokens):
    model = from_pretrained(hf_model, dtype=torch.float64)
    writes = lambda name: (
        name.rsplit(".", 1)[-1]
        in (  # noqa: E731
            "hook_resid_pre",
            "hook_resid_mid",
            "hook_resid_post",
            "hook_embed",
            "hook_pos_embed",
            "hook_attn_out",
            "hook_mlp_out",
        )
    )
    _, cache = model.run_with_cache(tokens, names_filter=writes)
    assert max(float(cache[name].mean(-1).abs().max()) for name in cache) > 1e-3  # not centred to begin with
    processing.center_writing_weights(model)
    _, cache = model.run_with_cache(tokens, names_filter=writes)
    assert len(cache) == 2 + 2 * 5
    for name in cache:
        assert cache[name].mean(-1).abs().max() < 1e-12, name


def test_center_unembed_and_fold_value_biases_change_what_they_say(hf_model, tokens):
    model = from_pretrained(hf_model, dtype=torch.float64)
    _, before = model.run_with_cache(tokens)
    assert model.b_V.abs().max() > 0.01
    processing.fold_value_biases(processing.center_unembed(model))
    assert torch.equal(model.b_V, torch.zeros_like(model.b_V))
    assert model.W_U.mean(-1).abs().max() < 1e-12 and model.b_U.mean().abs() < 1e-12
    _, after = model.run_with_cache(tokens)
    assert (after["blocks.1.hook_attn_out"] - before["blocks.1.hook_attn_out"]).abs().max() < 1e-12
    assert (after["blocks.1.attn.hook_z"] - before["blocks.1.attn.hook_z"]).abs().max() > 1e-3


def test_steps_are_recorded_once_and_ordered(hf_model, tokens):
    model = from_pretrained(hf_model, dtype=torch.float64)
    processing.center_unembed(model)
    W_U = model.W_U.clone()
    processing.center_unembed(model)
    assert model.processing == ["center_unembed"] and torch.equal(model.W_U, W_U)
    processing.fold_value_biases(model)
    with pytest.raises(ValueError, match="fold_ln must come before fold_value_biases"):
        processing.fold_ln(model)
    with pytest.raises(TypeError, match="processing"):
        processing.fold_ln(torch.nn.Linear(2, 2))


def test_attention_only_model(attn_only_model):
    model = copy.deepcopy(attn_only_model).double()
    tokens = random_tokens(model.cfg.d_vocab, 2, 8)
    with torch.no_grad():
        for name, param in model.named_parameters():  # non-trivial LayerNorms and biases
            if not name.rsplit(".", 1)[-1].startswith("W_"):
                param.add_(
                    torch.randn(param.shape, generator=torch.Generator().manual_seed(0), dtype=param.dtype) * 0.3
                )
        before = model(tokens).log_softmax(-1)
        processing.process_weights(model)
        assert (model(tokens).log_softmax(-1) - before).abs().max() < 1e-10
