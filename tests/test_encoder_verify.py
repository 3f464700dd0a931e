"""``verify`` for encoders: real MiniLM on padded batches, padding left out, broken weights found at their hook."""

import pytest
import torch

from analysis.cli import EXIT_OK, EXIT_USAGE, main
from interp_transformer.models.encoder import EncoderTransformer
from interp_transformer.verify import DEFAULT_ENCODER_PROMPTS, verify_against_hf

from .encoder_helpers import SENTENCES, minilm, minilm_path, random_mlm


@pytest.fixture(scope="module")
def minilm_batch():
    model, hf = minilm(torch.float32)
    return model, hf, model.to_tokens_and_mask(SENTENCES)


def test_minilm_matches_on_real_tokens_in_float32_and_float64(minilm_batch):
    model, hf, batch = minilm_batch
    report = verify_against_hf(model, hf, batch, float64_recheck="always")
    n_real = int(batch.attention_mask.sum())
    assert n_real < batch.tokens.numel(), "the batch must be padded"
    assert report.real_positions == report.float64.real_positions == n_real
    assert len(report.rows) == len(model.hook_dict) - model.cfg.n_layers  # all but attn_scores, which HF never exposes
    assert report.within_tolerance and report.float64.within_tolerance, str(report)
    # float32 rounding stays well inside the documented tolerance; float64 agrees to rounding
    assert max(row.max_abs_diff for row in report.rows) < 1e-4
    assert max(row.max_abs_diff for row in report.float64.rows) < 1e-11
    text = str(report)
    assert f"{n_real} of {batch.tokens.numel()} positions real; padding excluded" in text
    assert text.splitlines()[-1].startswith("MATCH")


def _shift(positions):
    """A hook adding 1.0 to ``hook_mlp_out`` at ``positions`` (a [batch, pos] bool mask)."""

    def hook(mlp_out, hook):
        return mlp_out + positions[..., None].to(mlp_out.dtype)

    return hook


def test_padding_is_left_out_and_real_tokens_are_not(minilm_batch):
    model, hf, batch = minilm_batch
    padding = batch.attention_mask == 0
    # garbage at padding positions reaches no real token, and verify does not look at it
    with model.hooks([("blocks.3.hook_mlp_out", _shift(padding))]):
        report = verify_against_hf(model, hf, batch, float64_recheck=False)
    assert report.within_tolerance, str(report)
    one_real = torch.zeros_like(padding)
    one_real[1, 2] = True
    with model.hooks([("blocks.3.hook_mlp_out", _shift(one_real))]):
        report = verify_against_hf(model, hf, batch, float64_recheck=False)
    assert report.first_divergence == "blocks.3.hook_mlp_out"
    assert report["blocks.3.hook_mlp_out"].max_abs_diff == pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize(
    "parameter, index, expected",
    [
        ("token_type_embed.W_token_type", (1, 4), "hook_token_type_embed"),
        ("blocks.0.attn.W_K", (1, 3, 2), "blocks.0.attn.hook_k"),
        ("blocks.1.ln1.w", (5,), "blocks.1.ln1.hook_normalized"),
        ("blocks.1.ln2.b", (0,), "blocks.1.ln2.hook_normalized"),
        ("mlm_head.W_transform", (2, 3), "mlm_head.hook_pre"),
        ("mlm_head.unembed.b_U", (13,), "logits"),
    ],
)
def test_a_broken_encoder_weight_is_found_at_its_hook(parameter, index, expected):
    _, hf = random_mlm()
    model = EncoderTransformer.from_pretrained(hf, dtype=torch.float64)  # a fresh copy to break
    tokens = torch.tensor([[2, 9, 14, 9, 40, 13], [2, 17, 5, 13, 0, 0]])
    batch = dict(
        attention_mask=torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]]),
        token_type_ids=torch.tensor([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 0, 0]]),
    )
    assert verify_against_hf(model, hf, tokens, **batch).within_tolerance
    with torch.no_grad():
        model.get_parameter(parameter)[index] += 0.5
    report = verify_against_hf(model, hf, tokens, **batch)
    assert not report.ok and report.first_divergence == expected


def test_texts_are_padded_with_their_mask_and_the_mask_is_given_once(minilm_batch):
    model, hf, batch = minilm_batch
    report = verify_against_hf(model, hf, SENTENCES[:2], float64_recheck=False)
    assert report.within_tolerance and report.real_positions == int(
        model.to_tokens_and_mask(SENTENCES[:2]).attention_mask.sum()
    )
    with pytest.raises(ValueError, match="carries its own mask"):
        verify_against_hf(model, hf, batch, attention_mask=batch.attention_mask)


def test_cli_verifies_minilm_on_a_padded_batch(capsys):
    code = main(["verify", "--model", str(minilm_path())])  # default: a padded batch of sentences
    out = capsys.readouterr().out
    assert code == EXIT_OK, out
    assert f"tokens [{len(DEFAULT_ENCODER_PROMPTS)}, " in out and "padding excluded" in out
    model, _ = minilm(torch.float32)
    lines = out.splitlines()
    compared = [name for name in model.hook_dict if not name.endswith("hook_attn_scores")]
    for name in compared:
        row = next(line for line in lines if line.startswith(name + " "))
        max_diff, _, tolerance, verdict = row.split()[1:]
        assert verdict == "ok" and float(max_diff) <= float(tolerance), row
    assert lines[-1].startswith("MATCH")


def test_cli_verify_takes_several_prompts_and_one_source(monkeypatch, capsys):
    calls = []

    def fake_run_verify(source, prompt, dtype):
        calls.append((source, prompt, dtype))
        raise ValueError("stop here")

    monkeypatch.setattr("interp_transformer.verify.run_verify", fake_run_verify)
    main(["verify", "--model", "some-dir", "--prompt", "one", "--prompt", "two", "--float64"])
    main(["verify", "some-dir", "--prompt", "one"])
    assert calls == [("some-dir", ["one", "two"], torch.float64), ("some-dir", "one", torch.float32)]
    capsys.readouterr()
    for argv, message in (
        (["verify", "a", "--model", "b"], "give the model once"),
        (["verify"], "no model to verify"),
        (["verify", "a", "--prompt", " "], "a prompt is empty"),
    ):
        assert main(argv) == EXIT_USAGE
        assert message in capsys.readouterr().err
