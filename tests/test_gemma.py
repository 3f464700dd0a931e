"""The Gemma family against Hugging Face: every hook, soft-caps that bite, windows shorter than the prompt, generation.

References: random-weight Hugging Face ``GemmaForCausalLM``, ``Gemma2ForCausalLM`` and
``Gemma3ForCausalLM`` (``gemma_helpers.FAMILIES``, every parameter perturbed), compared hook
by hook with ``verify_against_hf`` in float32 (1e-4) and float64 (1e-10); Hugging Face's
``generate``; the identities of DESIGN section 3 (with Gemma 2's post norms); weight
processing against the unprocessed model; the published parameter counts.
"""

import pytest
import torch
import transformers

from interp_transformer.core.kv_cache import KeyValueCache
from interp_transformer.families.gemma.hf import config_from_hf, hf_reference_activations
from interp_transformer.families.gemma.recipe import PRESETS, preset
from interp_transformer.loading import from_pretrained
from interp_transformer.models import processing
from interp_transformer.verify import verify_against_hf, verify_pretrained

from .gemma_helpers import FAMILIES, tiny_gemma
from .gpt2_helpers import one_thread  # noqa: F401 (autouse fixture)
from .llama_helpers import float64_copy, left_padded, random_tokens

TOKENS = random_tokens(2, 9, seed=5)  # longer than every sliding window (3 and 4)
UNMAPPED = ("hook_attn_scores", "hook_attn_scores_uncapped")  # Hugging Face masks with a finite number


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    """(label, Hugging Face model, our float32 model) for each family."""
    hf_model = tiny_gemma(request.param)
    return request.param, hf_model, from_pretrained(hf_model)


@pytest.fixture(scope="module")
def family64(family):
    label, hf_model, _ = family
    hf64 = float64_copy(hf_model)
    return label, hf64, from_pretrained(hf64, dtype=torch.float64)


def expected_hooks(model) -> set:
    return {name for name in model.hook_dict if not name.endswith(UNMAPPED)} | {"logits"}


# --- parity with Hugging Face -----------------------------------------------------------------
def test_config_follows_the_hugging_face_config(family):
    label, hf_model, model = family
    cfg, hf_cfg = model.cfg, hf_model.config
    assert cfg.d_model != cfg.n_heads * cfg.d_head
    assert cfg.post_norms == (not label.startswith("gemma1")) and cfg.qk_norm == label.startswith("gemma3")
    assert [cfg.is_sliding(layer) for layer in range(cfg.n_layers)] == [
        kind == "sliding_attention" for kind in getattr(hf_cfg, "layer_types", ["full_attention"] * cfg.n_layers)
    ]
    assert cfg.attention_scale == hf_model.model.layers[0].self_attn.scaling
    assert cfg.n_params(hugging_face=True) == sum(p.numel() for p in hf_model.parameters())
    assert cfg.n_params() == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-4), (torch.float64, 1e-10)], ids=["float32", "float64"])
def test_every_hook_matches_hugging_face(family, family64, dtype, atol, padded):
    _, hf_model, model = family if dtype == torch.float32 else family64
    kwargs = dict(zip(("tokens", "attention_mask"), left_padded(TOKENS, (3, 0)))) if padded else {"tokens": TOKENS}
    report = verify_against_hf(model, hf_model, float64_recheck=False, atol=atol, rtol=0, **kwargs)
    assert report.within_tolerance, str(report)
    assert {row.hook for row in report.rows} == expected_hooks(model)


def test_the_soft_caps_bite(family):
    """Scores and logits reach several times their caps, so a missing or misplaced cap could not pass."""
    label, _, model = family
    if label.startswith("gemma1"):
        assert model.logit_softcap is None and "unembed.hook_logits_uncapped" not in model.hook_dict
        return
    _, cache = model.run_with_cache(TOKENS)
    cap = model.cfg.final_softcap
    assert model.logit_softcap == cap
    assert cache["logits_uncapped"].abs().max() > 2 * cap
    if model.cfg.attn_softcap is not None:
        uncapped = cache["attn_scores_uncapped", 0]
        assert uncapped[uncapped.isfinite()].abs().max() > 4 * model.cfg.attn_softcap
        capped, allowed = cache["attn_scores", 0], uncapped.isfinite()
        assert torch.equal(capped.isfinite(), allowed)  # masked keys stay -inf through the cap
        cap = model.cfg.attn_softcap
        torch.testing.assert_close(capped[allowed], torch.tanh(uncapped[allowed] / cap) * cap)


def test_a_broken_weight_is_found_at_its_hook(family64):
    label, hf64, model64 = family64
    norm = "ln1_post" if model64.cfg.post_norms else "ln2"
    weight = getattr(model64.blocks[1], norm).w_offset
    with torch.no_grad():
        weight[3] += 0.5
    try:
        report = verify_against_hf(model64, hf64, TOKENS, float64_recheck=False)
        assert not report.within_tolerance and report.first_divergence == f"blocks.1.{norm}.hook_normalized", label
    finally:
        with torch.no_grad():
            weight[3] -= 0.5


def test_token_by_token_with_a_key_value_cache(family64):
    """A 4-token prompt, then one token at a time past every window: each step's hooks are Hugging Face's."""
    _, hf64, model64 = family64
    reference = hf_reference_activations(hf64, TOKENS)
    kv_cache = KeyValueCache(model64.cfg.n_layers)
    for start, end in [(0, 4)] + [(p, p + 1) for p in range(4, TOKENS.shape[1])]:
        logits, cache = model64.run_with_cache(TOKENS[:, start:end], kv_cache=kv_cache)
        torch.testing.assert_close(logits, reference["logits"][:, start:end], atol=1e-10, rtol=0)
        for name, value in cache.items():
            if name.endswith(UNMAPPED):
                continue
            expected = (
                reference[name][:, :, start:end, :end]
                if name.endswith("hook_pattern")
                else reference[name][:, start:end]
            )
            torch.testing.assert_close(
                value, expected, atol=1e-10, rtol=0, msg=f"{name} at positions {start}..{end - 1}"
            )


@pytest.mark.parametrize("label", ["gemma2-capped-window", "gemma3-local-rope-capped"])
def test_a_saved_directory_loads_and_verifies(label, tmp_path):
    hf_model = tiny_gemma(label)
    hf_model.save_pretrained(tmp_path)
    from_directory, in_memory = from_pretrained(tmp_path), from_pretrained(hf_model)
    assert all(torch.equal(a, b) for a, b in zip(from_directory.state_dict().values(), in_memory.state_dict().values()))
    report = verify_pretrained(tmp_path)
    assert report.ok and report.within_tolerance, str(report)


# --- generation ---------------------------------------------------------------------------------
@pytest.mark.parametrize("label", sorted(FAMILIES))
def test_greedy_generation_matches_hugging_face_past_the_window(label):
    hf_model = tiny_gemma(label, seed=3)
    model = from_pretrained(hf_model)
    prompt = random_tokens(1, 5, seed=7)
    ours = model.generate(prompt, max_new_tokens=12, temperature=0, stop_at_eos=False)
    theirs = hf_model.generate(prompt, max_new_tokens=12, do_sample=False)
    assert torch.equal(ours, theirs)
    assert torch.equal(model.generate(prompt, max_new_tokens=12, temperature=0, use_kv_cache=False), ours)


def test_greedy_generation_of_a_left_padded_batch_matches_hugging_face():
    hf_model = tiny_gemma("gemma2-capped-window", seed=4)
    model = from_pretrained(hf_model)
    tokens, mask = left_padded(random_tokens(3, 6, seed=8), (2, 0, 4))
    theirs = hf_model.generate(tokens, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    ours = model.generate(tokens, attention_mask=mask, max_new_tokens=8, temperature=0, stop_at_eos=False)
    assert torch.equal(ours, theirs)


# --- identities and weight processing -----------------------------------------------------------
def test_identities_through_the_post_norms(family64):
    label, _, model = family64
    logits, cache = model.run_with_cache(TOKENS)
    torch.testing.assert_close(cache["embed"], model.W_E[TOKENS] * model.cfg.d_model**0.5)
    for layer, block in enumerate(model.blocks):
        torch.testing.assert_close(cache["resid_mid", layer], cache["resid_pre", layer] + cache["attn_out", layer])
        torch.testing.assert_close(cache["resid_post", layer], cache["resid_mid", layer] + cache["mlp_out", layer])
        heads = torch.einsum("bphd,hdm->bpm", cache["z", layer], model.W_O[layer]) + model.b_O[layer]
        if model.cfg.post_norms:  # the heads' sum passes through ln1_post, linear once its scale is frozen
            heads = block.ln1_post.apply_frozen(heads, cache["scale", layer, "ln1_post"])
        torch.testing.assert_close(heads, cache["attn_out", layer])
    components = cache.decompose_resid()
    torch.testing.assert_close(components.sum(dim=0), cache["resid_post", -1])
    uncapped = cache.apply_ln_to_stack(components).sum(dim=0) @ model.W_U + model.b_U
    cap = model.cfg.final_softcap
    torch.testing.assert_close(uncapped if cap is None else torch.tanh(uncapped / cap) * cap, logits)


def test_head_and_neuron_stacks_read_through_the_post_norms(family64):
    """Each head's and neuron's write passes through ln1_post/ln2_post (scale frozen): the full split sums to the
    stream."""
    label, _, model = family64
    _, cache = model.run_with_cache(TOKENS)
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    heads = cache.stack_head_results(layer=1)
    b_O = (
        model.b_O[0]
        if not model.cfg.post_norms
        else model.blocks[0].ln1_post.apply_frozen(model.b_O[0], cache["scale", 0, "ln1_post"])
    )
    torch.testing.assert_close(heads.sum(dim=0) + b_O, cache["attn_out", 0], atol=1e-10, rtol=0)
    neurons = cache.stack_neuron_results(layer=1)
    b_out = (
        model.b_out[0]
        if not model.cfg.post_norms
        else model.blocks[0].ln2_post.apply_frozen(model.b_out[0], cache["scale", 0, "ln2_post"])
    )
    torch.testing.assert_close(neurons.sum(dim=0) + b_out, cache["mlp_out", 0], atol=1e-10, rtol=0)
    full, labels = cache.get_full_resid_decomposition(expand_neurons=True, return_labels=True)
    assert len(labels) == n_layers * (n_heads + model.cfg.d_mlp) + 2
    torch.testing.assert_close(full.sum(dim=0), cache["resid_post", -1], atol=1e-10, rtol=0)
    direction = torch.randn(model.cfg.d_model, dtype=torch.float64)
    projected = cache.stack_neuron_results(layer=n_layers, project_output_onto=direction)
    torch.testing.assert_close(
        projected, neurons.new_tensor(0) + cache.stack_neuron_results(layer=n_layers) @ direction, atol=1e-10, rtol=0
    )


def test_fold_ln_leaves_the_output_unchanged_and_folds_one_plus_w(family64):
    label, hf64, _ = family64
    model = from_pretrained(hf64, dtype=torch.float64)
    before = model(TOKENS)
    gain = model.blocks[0].ln1.w.clone()
    W_Q = model.blocks[0].attn.W_Q.detach().clone()
    capped = model.cfg.final_softcap is not None
    processing.process_weights(model)  # by default, the steps exact with these norms and this read-out
    assert (
        model.processing == ["fold_ln", "fold_value_biases"]
        if capped
        else ["fold_ln", "center_unembed", "fold_value_biases"]
    )
    torch.testing.assert_close(model(TOKENS).log_softmax(-1), before.log_softmax(-1), atol=1e-10, rtol=0)
    torch.testing.assert_close(model.blocks[0].attn.W_Q, W_Q * gain[:, None])
    assert not model.blocks[0].ln1.w_offset.any() and torch.equal(model.blocks[0].ln1.w, torch.ones_like(gain))
    if model.cfg.post_norms:  # no reader to fold the post norms into: they keep their weights
        assert model.blocks[0].ln1_post.w_offset.any()
    with pytest.raises(ValueError, match=r"norms \(GemmaRMSNorm\) do not subtract the mean"):
        processing.center_writing_weights(model)


@pytest.mark.parametrize("label", ["gemma2-capped-window", "gemma3-local-rope-capped"])
def test_center_unembed_is_refused_when_the_logits_are_capped(label):
    model = from_pretrained(float64_copy(tiny_gemma(label)), dtype=torch.float64)
    W_U = model.W_U.clone()
    with pytest.raises(ValueError, match="soft-capped"):
        processing.center_unembed(model)
    assert model.processing == [] and torch.equal(model.W_U, W_U)
    # what the refusal prevents: the same centring done by hand changes the log-probs
    before = model(TOKENS).log_softmax(-1)
    with torch.no_grad():
        model.unembed.W_U.sub_(model.unembed.W_U.mean(dim=-1, keepdim=True))
    assert (model(TOKENS).log_softmax(-1) - before).abs().max() > 1e-6
    # and process_weights leaves the read-out alone by default
    fresh = processing.process_weights(from_pretrained(float64_copy(tiny_gemma(label)), dtype=torch.float64))
    assert "center_unembed" not in fresh.processing


# --- presets and configs ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, count",
    [
        ("gemma-2b", 2_506_172_416),
        ("gemma-7b", 8_537_680_896),
        ("gemma-2-2b", 2_614_341_888),
        ("gemma-2-9b", 9_241_705_984),
        ("gemma-3-1b", 999_885_952),
    ],
)
def test_presets_have_the_published_parameter_counts(name, count):
    assert preset(name).n_params(hugging_face=True) == count


@pytest.mark.parametrize(
    "config_class, name", [(transformers.GemmaConfig, "gemma-7b"), (transformers.Gemma2Config, "gemma-2-2b")]
)
def test_hugging_face_default_configs_are_the_presets(config_class, name):
    """Hugging Face's default Gemma and Gemma 2 configs are Gemma 7B's and Gemma 2 2B's shapes."""
    hf_config = config_class()
    with torch.device("meta"):
        hf_model = transformers.AutoModelForCausalLM.from_config(hf_config)
    cfg = config_from_hf(hf_config)
    assert cfg.replace(name=name, init_range=PRESETS[name].init_range) == PRESETS[name]
    assert cfg.n_params(hugging_face=True) == sum(p.numel() for p in hf_model.parameters())


# --- bad input ----------------------------------------------------------------------------------
def test_a_vision_tower_is_refused_by_name():
    """A multimodal Gemma 3 (built on the meta device: no weights) is refused before any weight is read."""
    with torch.device("meta"):
        hf_model = transformers.Gemma3ForConditionalGeneration(transformers.Gemma3Config())
    with pytest.raises(
        ValueError,
        match=r"gemma3 config has features not implemented here: .*vision tower "
        r"\(vision_config\)"
        r".*Gemma3ForCausalLM",
    ):
        from_pretrained(hf_model)


@pytest.mark.parametrize(
    "changes, named",
    [
        (dict(attn_logit_softcapping=30.0), "attn_logit_softcapping=30.0"),
        (dict(use_bidirectional_attention=True), "use_bidirectional_attention=True"),
        (dict(layer_types=["sliding_attention", "full_attention", "full_attention"]), "every n-th layer global"),
        (
            dict(
                rope_parameters={
                    "full_attention": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                }
            ),
            "rope_type='yarn'",
        ),
    ],
)
def test_gemma3_features_not_implemented_are_named(changes, named):
    settings = {**FAMILIES["gemma3-local-rope-capped"][2], **changes}
    hf_config = transformers.Gemma3TextConfig(
        hidden_size=48, intermediate_size=80, head_dim=16, vocab_size=61, **settings
    )
    with pytest.raises(ValueError, match=f"gemma3_text config has features not implemented here: .*{named}"):
        config_from_hf(hf_config)


def test_two_unimplemented_features_are_named_together():
    hf_config = transformers.Gemma3TextConfig(
        hidden_size=48,
        intermediate_size=80,
        head_dim=16,
        vocab_size=61,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        attn_logit_softcapping=30.0,
        use_bidirectional_attention=True,
    )
    with pytest.raises(ValueError, match="use_bidirectional_attention=True.*; attn_logit_softcapping=30.0"):
        config_from_hf(hf_config)
