"""Activation patching: clean/corrupted limits and hand-computed single patches."""

import einops
import pytest
import torch

from analysis import patching
from interp_transformer import DemoTransformer, TransformerConfig


@pytest.fixture(scope="module")
def model() -> DemoTransformer:
    cfg = TransformerConfig(d_model=32, n_layers=2, n_heads=4, d_head=8, d_mlp=64, d_vocab=31, n_ctx=10, init_range=0.3)
    return DemoTransformer(cfg, seed=5).eval()


@pytest.fixture(scope="module")
def prompts():
    generator = torch.Generator().manual_seed(0)
    clean = torch.randint(0, 31, (2, 7), generator=generator)
    corrupted = clean.clone()
    corrupted[:, 1] = (clean[:, 1] + 1) % 31  # the prompts differ at position 1 only
    return clean, corrupted


METRIC_POS = 4
metric = patching.logit_diff_metric(torch.tensor([3, 9]), torch.tensor([5, 2]), pos=METRIC_POS)


def value(model, tokens) -> float:
    with torch.no_grad():
        return float(metric(model(tokens)))


@pytest.mark.parametrize("kind", ["resid_pre", "resid_mid", "resid_post"])
def test_patching_the_whole_residual_recovers_the_clean_metric(model, prompts, kind):
    clean, corrupted = prompts
    results = patching.patch_residual(model, clean, corrupted, metric, kind=kind, per_position=False, progress=False)
    assert results.shape == (2,)
    assert value(model, clean) != value(model, corrupted)
    assert results.tolist() == [value(model, clean)] * 2


def test_patching_where_runs_agree_gives_the_corrupted_metric(model, prompts):
    clean, corrupted = prompts
    results = patching.patch_residual(model, clean, corrupted, metric, progress=False)
    assert results.shape == (2, 7)
    corrupted_value = value(model, corrupted)
    # position 0 precedes the difference; positions after the metric's cannot reach it
    for pos in (0, 5, 6):
        assert results[:, pos].tolist() == [corrupted_value] * 2
    # at layer 0 the residual differs only at position 1, so patching it there is patching everything
    assert results[0, 1] == value(model, clean)


def test_single_residual_patch_matches_a_hand_computation(model, prompts):
    clean, corrupted = prompts
    results = patching.patch_residual(model, clean, corrupted, metric, kind="resid_pre", progress=False)
    _, clean_cache = model.run_with_cache(clean)
    _, corrupted_cache = model.run_with_cache(corrupted)
    with torch.no_grad():
        for pos in (2, 4):
            resid = corrupted_cache["resid_pre", 1].clone()
            resid[:, pos] = clean_cache["resid_pre", 1][:, pos]
            logits = model.unembed(model.ln_final(model.blocks[1](resid)))
            assert float(results[1, pos]) == pytest.approx(float(metric(logits)), abs=1e-5)


def test_head_patch_matches_a_hand_computation(model, prompts):
    clean, corrupted = prompts
    results = patching.patch_head_outputs(model, clean, corrupted, metric, progress=False)
    assert results.shape == (2, 4)
    _, clean_cache = model.run_with_cache(clean)
    _, corrupted_cache = model.run_with_cache(corrupted)
    block = model.blocks[1]
    with torch.no_grad():
        for head in range(4):
            z = corrupted_cache["z", 1].clone()
            z[:, :, head] = clean_cache["z", 1][:, :, head]
            attn_out = (
                einops.einsum(
                    z, block.attn.W_O, "batch pos head_index d_head, head_index d_head d_model -> batch pos d_model"
                )
                + block.attn.b_O
            )
            resid_mid = corrupted_cache["resid_pre", 1] + attn_out
            resid_post = resid_mid + block.mlp(block.ln2(resid_mid))
            logits = model.unembed(model.ln_final(resid_post))
            assert float(results[1, head]) == pytest.approx(float(metric(logits)), abs=1e-5)


def test_clean_cache_is_reused_and_progress_is_shown(model, prompts, capsys):
    clean, corrupted = prompts
    names = [f"blocks.{layer}.attn.hook_z" for layer in range(2)]
    _, clean_cache = model.run_with_cache(clean, names_filter=names)
    with_cache = patching.patch_head_outputs(model, clean, corrupted, metric, clean_cache=clean_cache, progress=True)
    assert "patching heads" in capsys.readouterr().err
    assert torch.equal(with_cache, patching.patch_head_outputs(model, clean, corrupted, metric, progress=False))


def test_bad_input(model, prompts, attn_only_model):
    clean, corrupted = prompts
    with pytest.raises(ValueError, match="same"):
        patching.patch_residual(model, clean, corrupted[:, :5], metric, progress=False)
    with pytest.raises(ValueError, match="kind must be one of"):
        patching.patch_residual(model, clean, corrupted, metric, kind="resid", progress=False)
    with pytest.raises(ValueError, match="attention-only"):
        patching.patch_residual(attn_only_model, clean, corrupted, metric, kind="resid_mid", progress=False)
    _, partial = model.run_with_cache(clean, names_filter=["blocks.0.attn.hook_z"])
    with pytest.raises(KeyError, match=r"blocks\.1\.attn\.hook_z.*names_filter"):
        patching.patch_head_outputs(model, clean, corrupted, metric, clean_cache=partial, progress=False)
    with pytest.raises(ValueError, match="scalar"):
        patching.patch_head_outputs(model, clean, corrupted, lambda logits: logits[:, -1, 0], progress=False)
    with pytest.raises(TypeError, match="callable"):
        patching.patch_residual(model, clean, corrupted, "logit_diff", progress=False)
