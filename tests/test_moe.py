"""Mixture-of-experts decoders against Hugging Face: every hook, the router's outputs, ablating an expert, both paths.

References: random-weight Hugging Face ``MixtralForCausalLM``, ``Qwen2MoeForCausalLM`` and
``Qwen3MoeForCausalLM`` (``moe_helpers.FAMILIES``, every parameter perturbed), compared hook by
hook with ``verify_against_hf`` in float32 (1e-4) and float64 (1e-10); Hugging Face's own
``router_logits`` output; a Hugging Face model with one expert's weights removed; Hugging
Face's ``generate``; and our explicit path over every expert, against which the sparse path is held.
"""

import pytest
import torch
import transformers

from interp_transformer.core.kv_cache import KeyValueCache
from interp_transformer.families.moe.hf import config_from_hf, hf_reference_activations
from interp_transformer.families.moe.recipe import preset
from interp_transformer.families.moe.reference import moe_float64_patches
from interp_transformer.families.reference import reference_run
from interp_transformer.loading import from_pretrained
from interp_transformer.models import processing
from interp_transformer.verify import verify_against_hf, verify_pretrained

from .gpt2_helpers import one_thread  # noqa: F401 (autouse fixture)
from .llama_helpers import float64_copy, left_padded, random_tokens
from .moe_helpers import FAMILIES, tiny_moe

TOKENS = random_tokens(2, 9, seed=5)  # longer than Mixtral's window of 4
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-10}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    hf_model = tiny_moe(request.param)
    return request.param, hf_model, from_pretrained(hf_model)


@pytest.fixture(scope="module")
def family64(family):
    label, hf_model, _ = family
    hf64 = float64_copy(hf_model)
    hf64.config._experts_implementation = "eager"  # Hugging Face's default grouped product has no float64 kernel
    return label, hf64, from_pretrained(hf64, dtype=torch.float64)


def moe_layers(model) -> list[int]:
    return list(model.cfg.moe_layers)


# --- parity with Hugging Face -----------------------------------------------------------------
def test_config_follows_the_hugging_face_config(family):
    label, hf_model, model = family
    cfg = model.cfg
    assert model.has_experts and cfg.dense_layers == ((1,) if label.startswith("qwen2") else ())
    assert (cfg.d_mlp_shared is not None) == label.startswith("qwen2") and cfg.qk_norm == label.startswith("qwen3")
    assert cfg.normalize_routing == (not label.startswith("qwen2"))
    assert cfg.n_params(hugging_face=True) == sum(p.numel() for p in hf_model.parameters())
    assert cfg.n_params() == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_every_hook_matches_hugging_face(family, family64, dtype, padded):
    _, hf_model, model = family if dtype == torch.float32 else family64
    kwargs = dict(zip(("tokens", "attention_mask"), left_padded(TOKENS, (3, 0)))) if padded else {"tokens": TOKENS}
    report = verify_against_hf(model, hf_model, float64_recheck=False, atol=TOLERANCE[dtype], rtol=0, **kwargs)
    assert report.within_tolerance, str(report)
    expected = {name for name in model.hook_dict if not name.endswith("hook_attn_scores")} | {"logits"}
    assert {row.hook for row in report.rows} == expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_routing_hooks_equal_hugging_face_router_logits(family, family64, dtype):
    """``hook_router_logits`` is Hugging Face's ``router_logits`` output; the chosen experts are its top-k of their
    softmax."""
    _, hf_model, model = family if dtype == torch.float32 else family64
    # float64: Hugging Face's own code, with the steps it casts to float32 kept in float64 (loading.reference)
    with reference_run(hf_model, moe_float64_patches):
        output = hf_model(TOKENS, output_router_logits=True)
    router_logits = [logits for logits in output.router_logits]
    assert len(router_logits) == len(moe_layers(model))
    _, cache = model.run_with_cache(TOKENS)
    for layer, theirs in zip(moe_layers(model), router_logits):
        ours = cache["router_logits", layer]
        torch.testing.assert_close(ours.flatten(0, 1), theirs, atol=TOLERANCE[dtype], rtol=0)
        chosen = theirs.double().softmax(-1).topk(model.cfg.experts_per_token).indices
        assert torch.equal(cache["expert_indices", layer].flatten(0, 1), chosen)
        weights = cache["expert_weights", layer].gather(-1, cache["expert_indices", layer])
        if model.cfg.normalize_routing:
            weights = weights / weights.sum(-1, keepdim=True)
        torch.testing.assert_close(cache["routing_weights", layer], weights)


def test_zero_ablating_an_expert_through_its_hook_is_removing_its_weights(family64):
    """``experts.E.hook_post`` set to 0 gives what Hugging Face gives with expert E's down projection removed."""
    _, hf64, model64 = family64
    layer = moe_layers(model64)[-1]
    _, cache = model64.run_with_cache(TOKENS)
    expert = int(cache["expert_indices", layer][0, -1, 0])  # chosen by at least one token
    ablated = model64.run_with_hooks(
        TOKENS,
        fwd_hooks=[(f"blocks.{layer}.mlp.experts.{expert}.hook_post", lambda post, hook: torch.zeros_like(post))],
    )
    removed = float64_copy(hf64)
    with torch.no_grad():
        removed.model.layers[layer].mlp.experts.down_proj[expert].zero_()
    theirs = hf_reference_activations(removed, TOKENS)["logits"]
    torch.testing.assert_close(ablated, theirs, atol=1e-10, rtol=0)
    assert (ablated - model64(TOKENS)).abs().max() > 1e-3  # the expert mattered


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_the_sparse_path_equals_the_explicit_one(family, family64, dtype):
    _, _, model = family if dtype == torch.float32 else family64
    mixtures = [model.blocks[layer].mlp for layer in moe_layers(model)]
    assert all(mixture.uses_sparse_path(TOKENS.to(dtype)) for mixture in mixtures)
    sparse = model(TOKENS)
    try:
        for mixture in mixtures:
            mixture.use_sparse_experts = False
        explicit = model(TOKENS)
    finally:
        for mixture in mixtures:
            mixture.use_sparse_experts = True
    torch.testing.assert_close(sparse, explicit, atol={torch.float32: 1e-5, torch.float64: 1e-12}[dtype], rtol=0)
    with model.hooks(fwd_hooks=[(f"blocks.{moe_layers(model)[0]}.mlp.experts.0.hook_pre", lambda x, hook: None)]):
        assert not mixtures[0].uses_sparse_path(TOKENS.to(dtype))  # an observed expert runs on every token


def test_token_by_token_with_a_key_value_cache(family64):
    _, hf64, model64 = family64
    reference = hf_reference_activations(hf64, TOKENS)
    kv_cache = KeyValueCache(model64.cfg.n_layers)
    for start, end in [(0, 4)] + [(p, p + 1) for p in range(4, TOKENS.shape[1])]:
        logits, cache = model64.run_with_cache(TOKENS[:, start:end], kv_cache=kv_cache)
        torch.testing.assert_close(logits, reference["logits"][:, start:end], atol=1e-10, rtol=0)
        for name in ("blocks.1.mlp.hook_router_logits", "blocks.1.mlp.hook_routing_weights", "blocks.1.hook_mlp_out"):
            if name in cache:
                torch.testing.assert_close(cache[name], reference[name][:, start:end], atol=1e-10, rtol=0)


@pytest.mark.parametrize("label", sorted(FAMILIES))
def test_greedy_generation_matches_hugging_face(label):
    hf_model = tiny_moe(label, seed=3)
    model = from_pretrained(hf_model)
    prompt = random_tokens(1, 5, seed=7)
    ours = model.generate(prompt, max_new_tokens=12, temperature=0, stop_at_eos=False)
    theirs = hf_model.generate(prompt, max_new_tokens=12, do_sample=False)
    assert torch.equal(ours, theirs)
    assert torch.equal(model.generate(prompt, max_new_tokens=12, temperature=0, use_kv_cache=False), ours)


@pytest.mark.parametrize("label", sorted(FAMILIES))
def test_the_saved_per_expert_layout_loads_as_the_stacked_one(label, tmp_path):
    """``save_pretrained`` writes one tensor per expert; a model in memory stacks them: both convert alike."""
    hf_model = tiny_moe(label)
    hf_model.save_pretrained(tmp_path)
    from_directory, in_memory = from_pretrained(tmp_path), from_pretrained(hf_model)
    assert from_directory.state_dict().keys() == in_memory.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(from_directory.state_dict().values(), in_memory.state_dict().values()))
    report = verify_pretrained(tmp_path)
    assert report.ok and report.within_tolerance, str(report)


# --- weights and processing ---------------------------------------------------------------------
def test_stacked_weights_are_refused_with_the_per_expert_ones_named(family):
    _, _, model = family
    mixture = model.blocks[moe_layers(model)[0]].mlp
    cfg = model.cfg
    for name in ("W_in", "W_out", "b_in", "b_out"):
        with pytest.raises(
            AttributeError,
            match=rf"{name}: this layer's MLP is a mixture of {cfg.n_experts} experts.*"
            rf"experts\[E\]\.{name}.*stacked\('{name}'\)",
        ):
            getattr(model, name)
    assert mixture.stacked("W_in").shape == (cfg.n_experts, cfg.d_model, cfg.d_mlp)
    assert torch.equal(mixture.stacked("W_out")[1], mixture.experts[1].W_out)
    with pytest.raises(KeyError, match="stacks the expert weights"):
        mixture.stacked("W_router")
    assert model.W_Q.shape == (cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_head)  # attention weights still stack


def test_processing_leaves_the_output_unchanged(family64):
    _, hf64, _ = family64
    model = from_pretrained(hf64, dtype=torch.float64)
    before = model(TOKENS).log_softmax(-1)
    router = model.blocks[0].mlp.W_router.detach().clone()
    gain = model.blocks[0].ln2.w.detach().clone()
    processing.process_weights(model)
    assert model.processing == ["fold_ln", "center_unembed", "fold_value_biases"]
    torch.testing.assert_close(model(TOKENS).log_softmax(-1), before, atol=1e-10, rtol=0)
    if 0 in model.cfg.moe_layers:  # ln2's weight went into the router and every expert
        torch.testing.assert_close(model.blocks[0].mlp.W_router, router * gain[:, None])


# --- presets and bad input ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, count",
    [("Mixtral-8x7B", 46_702_792_704), ("Qwen1.5-MoE-A2.7B", 14_315_784_192), ("Qwen3-30B-A3B", 30_532_122_624)],
)
def test_presets_have_the_published_parameter_counts(name, count):
    assert preset(name).n_params(hugging_face=True) == count


@pytest.mark.parametrize(
    "config_class", [transformers.MixtralConfig, transformers.Qwen2MoeConfig, transformers.Qwen3MoeConfig]
)
def test_parameter_counts_of_full_size_hugging_face_configs(config_class):
    hf_config = config_class()
    with torch.device("meta"):
        hf_model = transformers.AutoModelForCausalLM.from_config(hf_config)
    assert config_from_hf(hf_config).n_params(hugging_face=True) == sum(p.numel() for p in hf_model.parameters())


def test_mixed_window_layers_are_refused():
    hf_config = transformers.Qwen2MoeConfig(
        hidden_size=48,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        use_sliding_window=True,
        sliding_window=4,
        max_window_layers=2,
    )
    with pytest.raises(ValueError, match="mixes full_attention and sliding_attention layers"):
        config_from_hf(hf_config)


def test_a_checkpoint_missing_an_expert_names_it(tmp_path):
    hf_model = tiny_moe("mixtral-top2-window")
    state = {name: tensor for name, tensor in hf_model.state_dict().items()}
    state.pop("model.layers.1.mlp.experts.down_proj")
    cfg = config_from_hf(hf_model.config)
    from interp_transformer.families.moe.hf import convert_state_dict

    with pytest.raises(ValueError, match=r"missing 1 tensor\(s\): layers\.1\.mlp\.experts\.down_proj"):
        convert_state_dict(state, cfg)
