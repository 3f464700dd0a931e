"""Splicing SAEs into a model: parity with SAELens' HookedSAETransformer, and the identities that must hold."""

import einops
import pytest
import torch
from safetensors.torch import load_file

from interp_transformer import DemoTransformer
from interp_transformer.models import processing
from interp_transformer.sae import ProcessingMismatch, run_with_cache_with_saes, run_with_saes, splice_saes
from interp_transformer.sae.sae import HOOK_NAMES

from .sae_helpers import FIXTURES, SPLICE, SPLICE_CFG, fixture_sae, random_sae, saelens_model

EXPECTED = load_file(FIXTURES / "splice" / "expected.safetensors")
TOKENS = EXPECTED["tokens"]  # token 0 plays BOS
MODEL_TOLERANCE = 1e-5  # our model and TransformerLens' agree to float noise, not bit for bit


@pytest.fixture(scope="module")
def model():
    return DemoTransformer(SPLICE_CFG, seed=0).eval()


@pytest.fixture(scope="module")
def clean(model):
    with torch.no_grad():
        return model.run_with_cache(TOKENS)


def zero_feature(feature: int):
    def hook(acts, hook):
        acts = acts.clone()
        acts[..., feature] = 0.0
        return acts

    return hook


# --------------------------------------------------------------------------- parity with SAELens


@pytest.mark.parametrize("case", sorted(SPLICE["cases"]))
def test_spliced_model_equals_saelens(case):
    spec = SPLICE["cases"][case]
    model, sae = saelens_model(), fixture_sae(spec["sae"])
    prefix = spec["cache_prefix"]
    hooks = (
        [(f"{prefix}.hook_sae_acts_post", zero_feature(spec["ablate_feature"]))]
        if spec["ablate_feature"] is not None
        else []
    )
    # TransformerLens' hook_normalized is the pure normalization: ours is that after fold_ln
    with (
        torch.no_grad(),
        splice_saes(
            model,
            sae,
            use_error_term=spec["use_error_term"],
            exclude_special_tokens=spec["exclude_special_tokens"],
            apply_processing=True,
        ),
        model.hooks(hooks),
    ):
        logits, cache = model.run_with_cache(TOKENS, names_filter=lambda name: "hook_sae" in name)
    assert (logits - EXPECTED[f"{case}.logits"]).abs().max() < MODEL_TOLERANCE
    for key in ("hook_sae_acts_post", "hook_sae_output"):
        assert (cache[f"{prefix}.{key}"] - EXPECTED[f"{case}.{key}"]).abs().max() < MODEL_TOLERANCE, key
    assert (EXPECTED[f"{case}.logits"] - EXPECTED["clean_logits"]).abs().max() > 1e-2 or spec["ablate_feature"] is None


# --------------------------------------------------------------------------- identities


@pytest.mark.parametrize(
    "name", ["standard", "standard_layer_norm", "standard_hook_z", "gated", "topk", "jumprelu", "skip_transcoder"]
)
def test_error_term_leaves_the_logits_unchanged(model, clean, name):
    sae = fixture_sae(name)
    if sae.hook_name.endswith("hook_normalized"):  # read resid_mid instead: no fold_ln needed on this model
        sae.cfg = sae.cfg.replace(metadata={**sae.cfg.metadata, "hook_name": "blocks.0.hook_resid_mid"})
    with torch.no_grad():
        with_error = run_with_saes(model, TOKENS, saes=[sae], use_error_term=True)
        without = run_with_saes(model, TOKENS, saes=[sae])
    assert (with_error - clean[0]).abs().max() < MODEL_TOLERANCE
    assert (without - clean[0]).abs().max() > 1e-2  # the SAE alone does change the model


@pytest.mark.parametrize("use_error_term", [True, False])
def test_ablating_a_feature_subtracts_its_decoder_direction(model, use_error_term):
    sae, feature, hook_name = fixture_sae("standard"), 5, "blocks.1.hook_resid_pre"

    def subtract_feature(resid_pre, hook):
        with torch.no_grad():
            acts = sae.encode(resid_pre)
            base = resid_pre if use_error_term else sae(resid_pre)
            return base - acts[..., feature, None] * sae.W_dec[feature]

    with torch.no_grad():
        reference = model.run_with_hooks(TOKENS, fwd_hooks=[(hook_name, subtract_feature)])
        with splice_saes(model, [sae], use_error_term=use_error_term):
            ablated = model.run_with_hooks(
                TOKENS, fwd_hooks=[(f"{hook_name}.hook_sae_acts_post", zero_feature(feature))]
            )
    assert (ablated - reference).abs().max() < MODEL_TOLERANCE
    assert (ablated - model(TOKENS)).abs().max() > 1e-3


@pytest.mark.parametrize("name", ["transcoder_constant_norm", "skip_transcoder", "jumprelu_transcoder"])
def test_transcoder_output_replaces_the_mlp_output(model, name):
    sae = fixture_sae(name)
    sae.cfg = sae.cfg.replace(metadata={**sae.cfg.metadata, "hook_name": "blocks.0.hook_resid_mid"})
    read = {}

    def keep(resid_mid, hook):
        read["x"] = resid_mid

    def transcode(mlp_out, hook):
        return sae(read["x"]).detach()

    with torch.no_grad():
        reference = model.run_with_hooks(
            TOKENS, fwd_hooks=[("blocks.0.hook_resid_mid", keep), ("blocks.0.hook_mlp_out", transcode)]
        )
        logits, cache = run_with_cache_with_saes(model, TOKENS, saes=sae)
    assert (logits - reference).abs().max() < MODEL_TOLERANCE
    assert torch.equal(cache["blocks.0.hook_mlp_out.hook_sae_output"], cache["blocks.0.hook_mlp_out"])
    assert torch.equal(cache["blocks.0.hook_mlp_out.hook_sae_input"], cache["blocks.0.hook_resid_mid"])


def test_hook_z_sae_reads_and_writes_heads(model, clean):
    sae = fixture_sae("standard_hook_z")
    z = clean[1]["blocks.0.attn.hook_z"]  # [batch, pos, head_index, d_head]
    with torch.no_grad():
        reference = model.run_with_hooks(TOKENS, fwd_hooks=[("blocks.0.attn.hook_z", lambda z, hook: sae(z))])
        logits, cache = run_with_cache_with_saes(model, TOKENS, saes=[sae])
    flat = einops.rearrange(z, "batch pos head_index d_head -> batch pos (head_index d_head)")
    assert torch.equal(cache["blocks.0.attn.hook_z.hook_sae_input"], flat)
    assert cache["blocks.0.attn.hook_z.hook_sae_output"].shape == z.shape
    assert (logits - reference).abs().max() < MODEL_TOLERANCE


def test_special_token_positions_bypass_the_sae(model, clean):
    sae = fixture_sae("standard")
    bos = TOKENS == 0
    assert bos[:, 0].all() and bos[:, 1:].any()  # BOS, and a BOS id mid-sequence too
    resid_pre = clean[1]["blocks.1.hook_resid_pre"]
    with torch.no_grad():
        _, cache = run_with_cache_with_saes(model, TOKENS, saes=[sae], exclude_special_tokens=[0], use_error_term=True)
        _, plain = run_with_cache_with_saes(model, TOKENS, saes=[sae])
    output, error = cache["blocks.1.hook_resid_pre.hook_sae_output"], cache["blocks.1.hook_resid_pre.hook_sae_error"]
    assert torch.equal(output[bos], resid_pre[bos]) and (error[bos] == 0).all()
    assert (plain["blocks.1.hook_resid_pre.hook_sae_output"][bos] - resid_pre[bos]).abs().max() > 1e-2
    with torch.no_grad():
        _, cache = run_with_cache_with_saes(model, TOKENS, saes=[sae], exclude_special_tokens=[0])
        expected = torch.where(bos[..., None], resid_pre, sae(resid_pre))
    assert torch.allclose(cache["blocks.1.hook_resid_pre.hook_sae_output"], expected, atol=1e-6)
    with pytest.raises(ValueError, match="has none"):
        run_with_saes(model, TOKENS, saes=[sae], exclude_special_tokens=True)


# --------------------------------------------------------------------------- processing


def test_processing_mismatch_is_refused_or_applied():
    sae = random_sae("standard", metadata={"model_from_pretrained_kwargs": {"center_writing_weights": True}})
    model = DemoTransformer(SPLICE_CFG, seed=0).eval()
    with pytest.raises(
        ProcessingMismatch,
        match=r"needs "
        r"\['center_writing_weights'\].*processing.center_writing_weights\(model\)",
    ):
        run_with_saes(model, TOKENS, saes=[sae])
    assert model.processing == []
    with torch.no_grad():
        before = model(TOKENS)
        run_with_saes(model, TOKENS, saes=[sae], apply_processing=True)
        assert model.processing == ["center_writing_weights"]
        assert (model(TOKENS) - before).abs().max() < MODEL_TOLERANCE


def test_processing_that_cannot_be_undone_is_refused_and_irrelevant_steps_are_ignored():
    model = processing.center_writing_weights(DemoTransformer(SPLICE_CFG, seed=0))
    with pytest.raises(ProcessingMismatch, match=r"without \['center_writing_weights'\].*cannot be undone"):
        run_with_saes(model, TOKENS, saes=[fixture_sae("standard")])
    on_neurons = random_sae("standard", hook_name="blocks.0.mlp.hook_post", d_in=32)  # centring leaves it unchanged
    run_with_saes(model, TOKENS, saes=[on_neurons])


def test_hook_normalized_needs_fold_ln_because_ours_is_taken_after_w_and_b(model):
    with pytest.raises(ProcessingMismatch, match=r"needs \['fold_ln'\]"):
        run_with_saes(model, TOKENS, saes=[fixture_sae("jumprelu_transcoder")])


# --------------------------------------------------------------------------- nothing leaks


def _state(model):
    return (
        model.hook_dict,
        list(model.hook_dict.items()),
        [name for name, _ in model.named_modules()],
        [
            name
            for name, point in model.hook_dict.items()
            if point.has_hooks() or point._forward_hooks or point._forward_pre_hooks
        ],
        len(model._forward_hooks) + len(model._forward_pre_hooks),
    )


@pytest.mark.parametrize("raises", [False, True])
def test_everything_is_restored_on_exit(model, raises):
    saes = [fixture_sae("standard"), fixture_sae("standard_hook_z")]
    before = _state(model)
    with (
        pytest.raises(RuntimeError) if raises else torch.no_grad(),
        splice_saes(model, saes, exclude_special_tokens=[0]),
    ):
        assert "blocks.1.hook_resid_pre.hook_sae_acts_post" in model.hook_dict
        assert saes[0].hook_sae_acts_post.name == "blocks.1.hook_resid_pre.hook_sae_acts_post"
        # never removed by the caller
        model.add_hook("blocks.1.hook_resid_pre.hook_sae_acts_post", lambda acts, hook: None)
        model(TOKENS)
        if raises:
            raise RuntimeError("body failed")
    after = _state(model)
    assert after[0] is before[0] and after[1:] == before[1:] and after[3] == []
    assert [name for name, _ in saes[0].named_modules()] == ["", *saes[0].hook_dict]
    assert saes[0].hook_sae_acts_post.name == "hook_sae_acts_post"
    assert not any(point.has_hooks() for sae in saes for point in sae.hook_dict.values())


def test_unknown_hook_name_names_close_matches_and_attaches_nothing(model):
    before = _state(model)
    sae = random_sae("standard", hook_name="blocks.1.hook_resid_pree")
    with pytest.raises(KeyError, match=r"blocks.1.hook_resid_pree.*closest: \['blocks.1.hook_resid_pre'"):
        run_with_saes(model, TOKENS, saes=[sae])
    assert _state(model)[1:] == before[1:]


def test_two_saes_at_one_hook_are_refused(model):
    first, second = fixture_sae("standard"), fixture_sae("standard_no_b_dec_in")
    with pytest.raises(ValueError, match="two SAEs write at"):
        run_with_saes(model, TOKENS, saes=[first, second])
    with splice_saes(model, first), pytest.raises(ValueError, match="already has an SAE"):
        run_with_saes(model, TOKENS, saes=[second])
    with pytest.raises(ValueError, match="listed twice"):
        run_with_saes(model, TOKENS, saes=[first, first])


def test_sae_hooks_are_cached_and_editable_through_the_model(model):
    sae = fixture_sae("gated")
    names = [f"blocks.1.hook_resid_mid.{hook}" for hook in HOOK_NAMES]
    with torch.no_grad(), splice_saes(model, sae, use_error_term=True):
        _, cache = model.run_with_cache(TOKENS)
        assert [name for name in cache if "hook_sae" in name] == names
        steered = model.run_with_hooks(TOKENS, fwd_hooks=[(names[2], lambda acts, hook: acts * 2)])
    acts = cache[names[2]]
    assert torch.allclose(cache[names[3]], acts @ sae.W_dec + sae.b_dec, atol=1e-5)
    assert (steered - model(TOKENS)).abs().max() > 1e-2


def test_shape_only_dry_runs_see_the_spliced_saes(model):
    saes = [fixture_sae("standard"), fixture_sae("standard_hook_z"), fixture_sae("topk")]
    with torch.no_grad(), splice_saes(model, saes, use_error_term=True, exclude_special_tokens=[0]):
        shapes = model.hook_shapes(*TOKENS.shape)
        estimate = model.estimate_cache_bytes(*TOKENS.shape)
        _, cache = model.run_with_cache(TOKENS)
    assert sum("hook_sae" in name for name in shapes) == 18
    assert {name: tuple(t.shape) for name, t in cache.items()} == shapes
    assert estimate == cache.nbytes()
    assert all(not p.is_meta for sae in saes for p in sae.parameters())


def test_feature_gradients_are_the_downstream_gradient_read_through_the_decoder(model):
    """With the error term, d loss / d acts = (d loss / d resid_pre) W_dec^T: attribution through features."""
    sae, name = fixture_sae("standard"), "blocks.1.hook_resid_pre"
    _, clean = model.run_with_cache(TOKENS, names_filter=name, incl_bwd=True)
    with splice_saes(model, sae, use_error_term=True):
        _, spliced = model.run_with_cache(TOKENS, names_filter=f"{name}.hook_sae_acts_post", incl_bwd=True)
    expected = clean[f"{name}_grad"] @ sae.W_dec.detach().T
    assert torch.allclose(spliced[f"{name}.hook_sae_acts_post_grad"], expected, atol=1e-6)
    assert expected.abs().max() > 1e-3
