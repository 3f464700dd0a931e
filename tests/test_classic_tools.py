"""Everything downstream of loading, on GPT-NeoX, GPT-J, OPT and BLOOM: identities, the cache's tools, processing,
report.

Models come from random-weight Hugging Face models (``classic_helpers.FAMILIES``) in float64,
so every identity and every processing step is held to 1e-10 against the model's own output or
Hugging Face's. The post-norm OPT-350m layout gets the refusals its capabilities call for.
"""

import pytest
import torch

from analysis import patching
from analysis.readouts import attribution
from analysis.report import DISPLAY_ORDER, build_report
from interp_transformer.loading import architecture_module, from_pretrained
from interp_transformer.models import processing

from .classic_helpers import FAMILIES, POST_NORM, float64_copy, random_tokens, tiny_hf_model
from .gpt2_helpers import one_thread  # noqa: F401 (autouse fixture)

TOKENS = random_tokens(2, 9, seed=11)
PRE_NORM = sorted(label for label in FAMILIES if label not in POST_NORM)


def float64_family(label: str):
    """(label, float64 Hugging Face model, its log-probs on TOKENS)."""
    hf64 = float64_copy(tiny_hf_model(label, seed=2))
    reference = architecture_module(hf64.config.model_type).hf_reference_activations(hf64, TOKENS)
    return label, hf64, reference["logits"].log_softmax(-1)


@pytest.fixture(scope="module", params=PRE_NORM)
def family64(request):
    """A pre-norm family in float64 (see ``float64_family``)."""
    return float64_family(request.param)


@pytest.fixture(scope="module", params=POST_NORM)
def post_norm64(request):
    """A post-norm family in float64 (see ``float64_family``)."""
    return float64_family(request.param)


def model_of(family64):
    return from_pretrained(family64[1], dtype=torch.float64)


def close(actual, expected, msg=""):
    torch.testing.assert_close(actual, expected, atol=1e-10, rtol=0, msg=msg)


# --- identities (DESIGN section 3) -------------------------------------------------------------
def test_identities(family64):
    label, _, _ = family64
    model = model_of(family64)
    logits, cache = model.run_with_cache(TOKENS)
    for layer in range(len(model.blocks)):
        written = cache["attn_out", layer] + cache["mlp_out", layer]
        if model.act_name("resid_mid", layer) in model.hook_dict:
            close(cache["resid_mid", layer], cache["resid_pre", layer] + cache["attn_out", layer])
        close(cache["resid_post", layer], cache["resid_pre", layer] + written)  # both block orders
        per_head = torch.einsum("bphd,hdm->bpm", cache["z", layer], model.W_O[layer])
        close(per_head + model.b_O[layer], cache["attn_out", layer])
    components, labels = cache.decompose_resid(return_labels=True)
    assert labels[0] == "embed" and ("pos_embed" in labels) == label.startswith("opt")
    close(components.sum(dim=0), cache["resid_post", -1])
    normalized = cache.apply_ln_to_stack(components).sum(dim=0) + model.ln_final.b  # the bias is left out of the stack
    close(normalized, cache["normalized"])
    close(normalized @ model.W_U + model.b_U, logits)
    answers = TOKENS[:, 1:]
    attributions = cache.logit_attrs(components[:, :, :-1], answers, pos_slice=(0, -1))  # read through the final norm
    bias_terms = (model.ln_final.b @ model.W_U)[answers] + model.b_U[answers]
    close(attributions.sum(dim=0), logits[:, :-1].gather(-1, answers[..., None])[..., 0] - bias_terms)


def test_parallel_blocks_have_no_residual_mid_point(family64):
    label, _, _ = family64
    model = model_of(family64)
    parallel = label in ("neox-parallel", "gptj-partial", "gptj-whole-heads")
    assert all(
        (model.act_name("resid_mid", layer) in model.hook_dict) != parallel for layer in range(model.cfg.n_layers)
    )
    if not parallel:
        return
    _, cache = model.run_with_cache(TOKENS)
    stack, labels = cache.accumulated_resid(incl_mid=True, return_labels=True)
    assert labels == ["0_pre", "1_pre", "final_post"]
    with pytest.raises(
        KeyError,
        match="no 'blocks.0.hook_resid_mid': block 0 is a (Parallel|SharedNormParallel)Block, "
        "which computes no 'resid_mid'",
    ):
        cache["resid_mid", 0]
    with pytest.raises(ValueError, match="no blocks.0.hook_resid_mid .*parallel block no residual mid-point"):
        patching.patch_residual(
            model, TOKENS[:1], TOKENS[1:], lambda logits: logits[0, -1, 0], kind="resid_mid", progress=False
        )


def test_gptj_reads_one_norm_twice_and_says_so():
    model = from_pretrained(tiny_hf_model("gptj-partial"))
    for block in model.blocks:
        assert block.norm_readers() == [(block.ln1, block.attn), (block.ln1, block.mlp)] and not hasattr(block, "ln2")
    assert model.act_name("scale", 0, "ln1") == "blocks.0.ln1.hook_scale"
    with pytest.raises(KeyError, match=r"needs the norm: \('scale', 0, 'ln1'\); got 'ln2'"):
        model.act_name("scale", 0, "ln2")


def test_mlp_input_of_a_parallel_block_is_its_resid_pre_read_by_the_mlps_norm(family64):
    """A parallel block's MLP reads resid_pre through ln2 (GPT-NeoX) or the shared ln1 (GPT-J); mlp_input says so."""
    label, _, _ = family64
    model = model_of(family64)
    _, cache = model.run_with_cache(TOKENS)
    block = model.blocks[1]
    mlp_norm = next(norm for norm, part in block.norm_readers() if part is block.mlp)
    name = "ln2" if getattr(block, "ln2", None) is mlp_norm else "ln1"
    components = cache.decompose_resid(layer=1, mlp_input=True)
    close(
        components.sum(dim=0),
        cache["resid_mid", 1] if model.act_name("resid_mid", 1) in model.hook_dict else cache["resid_pre", 1],
    )
    normalized = cache.apply_ln_to_stack(components, layer=1, mlp_input=True).sum(dim=0) + mlp_norm.b
    close(normalized, cache["normalized", 1, name])
    full = cache.get_full_resid_decomposition(layer=1, mlp_input=True, expand_neurons=True)
    close(full.sum(dim=0), components.sum(dim=0))


def test_post_norm_identities_and_refusals(post_norm64):
    model = model_of(post_norm64)
    logits, cache = model.run_with_cache(TOKENS)
    for layer in range(model.cfg.n_layers):
        close(cache["resid_mid", layer], cache["resid_pre", layer] + cache["attn_out", layer])
        close(cache["resid_post", layer], cache["normalized", layer, "ln1"] + cache["mlp_out", layer])
        close(cache["normalized_resid_post", layer], cache["normalized", layer, "ln2"])
    close(cache["normalized_resid_post", -1] @ model.W_U + model.b_U, logits)  # no final norm
    stack, labels = cache.accumulated_resid(return_labels=True)
    assert labels[-1] == "final_post" and torch.equal(stack[-1], cache["normalized_resid_post", -1])
    calls = [
        cache.decompose_resid,
        lambda: cache.accumulated_resid(apply_ln=True),
        lambda: cache.logit_attrs(stack, 3),
        lambda: processing.fold_ln(model),
        lambda: processing.process_weights(model),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="post-norm"):
            call()
    with pytest.raises(TypeError, match="logit_lens needs next-token logits read linearly"):
        attribution.logit_lens(cache)
    assert model.processing == []
    with pytest.raises(KeyError, match="no final norm: the last block's ln2 output"):
        cache["scale"]


# --- weight processing ----------------------------------------------------------------------------
@pytest.mark.parametrize("step", processing.STEPS)
def test_each_step_leaves_the_output_unchanged(family64, step):
    _, _, reference = family64
    model = model_of(family64)
    before = model(TOKENS)
    getattr(processing, step)(model)
    after = model(TOKENS)
    assert model.processing == [step]
    if step == "center_unembed":
        assert (after - before).abs().max() > 1e-3  # logits move, log-probs do not
    else:
        close(after, before)
    close(after.log_softmax(-1), reference)


def test_process_weights_folds_every_norm_into_every_reader(family64):
    label, _, reference = family64
    model = processing.process_weights(model_of(family64))
    assert model.processing == list(processing.STEPS)
    close(model(TOKENS).log_softmax(-1), reference)
    _, cache = model.run_with_cache(TOKENS)
    for layer, block in enumerate(model.blocks):
        for norm, _ in block.norm_readers():
            assert torch.equal(norm.w, torch.ones_like(norm.w)) and not norm.b.any()
        for name in ("attn_out", "mlp_out"):  # every weight that writes was centred
            close(cache[name, layer].mean(-1), torch.zeros_like(cache[name, layer][..., 0]))
    embed_mean = cache["embed"].mean(-1).abs().max()
    # BLOOM's normalized embedding keeps a mean no weight holds (components.normed_embed); every other embedding is
    # centred
    assert (embed_mean > 1e-3) if label.startswith("bloom") else (embed_mean < 1e-10)


# --- analysis and the report --------------------------------------------------------------------
@pytest.mark.parametrize("label", PRE_NORM)
def test_logit_lens_and_direct_logit_attribution(label):
    model = from_pretrained(tiny_hf_model(label, seed=5), dtype=torch.float64)
    logits, cache = model.run_with_cache(TOKENS)
    lens = attribution.logit_lens(cache)
    close(lens[-1], logits)
    answer = TOKENS[:, -1]
    attrs = attribution.direct_logit_attribution(cache, answer, pos=-2)
    close(attrs.total(), logits[:, -2].gather(-1, answer[:, None])[:, 0])


@pytest.mark.parametrize("label", sorted(FAMILIES))
def test_the_report_builds_and_its_sections_follow_the_capabilities(label):
    model = from_pretrained(tiny_hf_model(label, seed=6))
    prompt = torch.tensor([3, 5, 9, 13, 7, 5, 9, 13, 7, 5])
    report = build_report(model, prompt, title=label)
    keys = [section.key for section in report.sections]
    if label in POST_NORM:
        assert keys == [
            "model",
            "tokens",
            "interpretation",
            "omitted",
            "attention",
            "detectors",
            "circuits",
            "composition",
            "neurons",
        ]
        assert "post-LayerNorm" in report["omitted"].data.parts[0]["why"]
    else:
        assert keys == list(DISPLAY_ORDER)
        data = report["attribution"].data
        assert data["predicted"] == int(model(prompt)[0, -1].argmax())
        assert data["attribution_total"] == pytest.approx(data["logit"], abs=1e-3)
    assert "<section" in report.to_html()


def test_circuits_start_from_what_each_token_writes():
    """BLOOM writes ln(W_E[token]), not W_E[token]: the full OV circuit's row is the head's direct effect of that
    write."""
    from analysis.readouts import circuits

    model = from_pretrained(float64_copy(tiny_hf_model("bloom-3-heads", seed=2)), dtype=torch.float64)
    token = 7
    _, cache = model.run_with_cache(torch.tensor([[token]]))
    torch.testing.assert_close(circuits.token_writes(model)[token], cache["embed"][0, 0], atol=1e-12, rtol=0)
    ov = circuits.full_ov_circuit(model, 0, 1)
    expected = cache["embed"][0, 0] @ model.W_V[0, 1] @ model.W_O[0, 1] @ model.W_U
    torch.testing.assert_close(ov[token], expected, atol=1e-10, rtol=0)
