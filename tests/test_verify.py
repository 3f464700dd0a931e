"""verify_against_hf: a report a program can check, that finds the hook where a broken model diverges."""

import copy

import pytest
import torch

from interp_transformer.loading import from_pretrained
from interp_transformer.models import processing
from interp_transformer.text.tokens import offline_gpt2_tokenizer
from interp_transformer.verify import VerifyReport, run_verify, verify_against_hf, verify_pretrained

from .gpt2_helpers import one_thread, random_tokens, tiny_gpt2  # noqa: F401 (autouse fixture)


@pytest.fixture(scope="module")
def hf_model():
    return tiny_gpt2(11)


@pytest.fixture(scope="module")
def tokens():
    return random_tokens(61, 2, 9, seed=4)


@pytest.fixture
def model(hf_model):
    return from_pretrained(hf_model)


def test_faithful_model_verifies_and_prints_a_table(model, hf_model, tokens):
    report = verify_against_hf(model, hf_model, tokens)
    assert isinstance(report, VerifyReport)
    assert report.ok and report.within_tolerance and report.first_divergence is None
    assert report.float64 is None  # nothing to re-check
    assert report.logits_max_diff == report["logits"].max_abs_diff < 1e-4
    assert all(row.mean_abs_diff <= row.max_abs_diff <= row.tolerance for row in report.rows)
    text = str(report)
    lines = text.splitlines()
    for row in report.rows:
        assert any(line.startswith(row.hook + " ") and line.endswith("ok") for line in lines), row.hook
    assert lines[-1].startswith("MATCH")
    # the hook columns line up
    assert len({line.index(" ok") for line in lines if line.endswith(" ok")}) == 1


@pytest.mark.parametrize(
    "parameter, index, expected",
    [
        ("blocks.1.attn.W_V", (2, 5, 3), "blocks.1.attn.hook_v"),
        ("blocks.0.attn.W_K", (1, 0, 0), "blocks.0.attn.hook_k"),
        ("blocks.0.mlp.W_out", (7, 4), "blocks.0.hook_mlp_out"),
        ("blocks.1.ln2.b", (3,), "blocks.1.ln2.hook_normalized"),
        ("pos_embed.W_pos", (4, 6), "hook_pos_embed"),
        ("ln_final.w", (0,), "ln_final.hook_normalized"),
        ("unembed.W_U", (5, 17), "logits"),
    ],
)
def test_broken_weight_is_found_at_the_right_hook(model, hf_model, tokens, parameter, index, expected):
    with torch.no_grad():
        model.get_parameter(parameter)[index] += 0.5
    report = verify_against_hf(model, hf_model, tokens)
    assert not report.ok
    assert report.first_divergence == expected
    assert report.float64 is not None and report.float64.first_divergence == expected  # not float noise
    assert "MISMATCH: first divergence at " + expected in str(report)


def test_float_noise_is_told_apart_by_the_float64_rerun(model, hf_model, tokens):
    report = verify_against_hf(model, hf_model, tokens, atol=0.0, rtol=0.0)  # float32 rounding now "fails"
    assert not report.within_tolerance and report.first_divergence is not None
    assert report.float64 is not None and report.float64.within_tolerance
    assert report.ok
    assert "float noise" in report.verdict()
    assert model.W_E.dtype == torch.float32 and next(hf_model.parameters()).dtype == torch.float32  # copies re-ran
    no_recheck = verify_against_hf(model, hf_model, tokens, atol=0.0, rtol=0.0, float64_recheck=False)
    assert not no_recheck.ok and no_recheck.float64 is None
    assert verify_against_hf(model, hf_model, tokens, float64_recheck="always").float64.ok
    with pytest.raises(ValueError, match="float64_recheck"):
        verify_against_hf(model, hf_model, tokens, float64_recheck="sometimes")


def test_processed_model_is_verified_on_the_hooks_processing_keeps(model, hf_model, tokens):
    processing.process_weights(model)
    report = verify_against_hf(model, hf_model, tokens)
    assert report.ok, str(report)
    hooks = [row.hook for row in report.rows]
    assert "log_probs" in hooks and "logits" not in hooks
    assert "blocks.0.attn.hook_pattern" in hooks and "blocks.1.mlp.hook_post" in hooks
    assert "blocks.0.hook_resid_pre" in report.skipped and "blocks.0.attn.hook_z" in report.skipped
    assert "weight processing applied" in str(report)
    # and a processing bug would still be caught on the hooks that are compared
    with torch.no_grad():
        model.blocks[0].attn.W_Q[1] *= 1.5
    assert verify_against_hf(model, hf_model, tokens).first_divergence == "blocks.0.attn.hook_q"


def test_tokens_may_be_text(hf_model):
    hf_gpt2_vocab = tiny_gpt2(2, vocab_size=50257, n_embd=16, n_head=2, n_layer=1)
    model = from_pretrained(hf_gpt2_vocab)
    report = verify_against_hf(model, hf_gpt2_vocab, "Hello world")
    assert report.ok and report.shape == (1, 3)
    with pytest.raises(TypeError, match="tokens"):
        verify_against_hf(model, hf_gpt2_vocab, torch.zeros(3))


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin"])
def test_verify_pretrained_and_run_verify_on_a_directory(hf_model, tmp_path, weights):
    if weights == "model.safetensors":
        hf_model.save_pretrained(tmp_path)
    else:
        hf_model.config.save_pretrained(tmp_path)
        torch.save({k: v for k, v in hf_model.state_dict().items() if k != "lm_head.weight"}, tmp_path / weights)
    report = verify_pretrained(tmp_path)
    assert report.ok and report.shape == (1, 16)  # no tokenizer: seeded random tokens
    with pytest.raises(ValueError, match="no tokenizer"):
        run_verify(str(tmp_path), "a prompt", "float32")


def test_run_verify_with_prompt_and_float64(tmp_path):
    hf_gpt2_vocab = tiny_gpt2(6, vocab_size=50257, n_embd=16, n_head=2, n_layer=2)
    hf_gpt2_vocab.save_pretrained(tmp_path)
    offline_gpt2_tokenizer().save_pretrained(tmp_path)
    report = run_verify(str(tmp_path), "The cat sat on the mat", "float64")
    assert report.dtype == torch.float64 and report.ok
    assert report.shape == (1, 7)  # BOS + 6 tokens
    assert report.logits_max_diff < 1e-10


def test_verify_leaves_both_models_unchanged(model, hf_model, tokens):
    before, hf_before = copy.deepcopy(model.state_dict()), copy.deepcopy(hf_model.state_dict())
    attention = hf_model.config._attn_implementation
    hf_model.set_attn_implementation("sdpa")
    try:
        verify_against_hf(model, hf_model, tokens, float64_recheck="always")
        assert hf_model.config._attn_implementation == "sdpa"
    finally:
        hf_model.set_attn_implementation(attention)
    assert all(torch.equal(t, before[name]) for name, t in model.state_dict().items())
    assert all(torch.equal(t, hf_before[name]) for name, t in hf_model.state_dict().items())
    assert not any(hook_point.has_hooks() for hook_point in model.hook_points())


def test_random_ids_for_a_model_without_tokenizer_avoid_the_padding_id():
    """verify_pretrained's random prompt never holds a padding id (the model would mask it, Hugging Face might not)."""
    from interp_transformer.verify import random_ids

    ids = random_ids(6, 4000, avoid={0, 3})
    assert set(ids.unique().tolist()) == {1, 2, 4, 5} and ids.shape == (1, 4000)
    assert torch.equal(ids, random_ids(6, 4000, avoid={3, 0}))
    assert set(random_ids(3, 500, avoid={2, 7}).unique().tolist()) == {0, 1}
