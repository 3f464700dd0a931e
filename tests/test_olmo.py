"""OLMo 2 and OLMo 3 against Hugging Face: every hook, padding, the key/value cache, generation, refusals, the tools.

References: random-weight Hugging Face ``Olmo2ForCausalLM`` and ``Olmo3ForCausalLM`` (every
parameter perturbed, so no norm weight sits at 1 and no bias at 0), compared hook by hook with
``verify_against_hf`` in float32 (1e-4) and float64 (1e-10); Hugging Face's greedy ``generate``;
the identities of DESIGN section 3 through the norms after each sublayer; and the analysis
tools on a tiny OLMo 2, each held to an identity of its own.
"""

import pytest
import torch
import transformers
from transformers import Olmo2Config, Olmo2ForCausalLM, Olmo3Config

from analysis.patching import patch_residual
from analysis.readouts import attribution
from analysis.report import DISPLAY_ORDER, build_report
from interp_transformer import DemoTransformer
from interp_transformer.compat import HookedTransformer
from interp_transformer.core.kv_cache import KeyValueCache
from interp_transformer.families.olmo2.hf import config_from_hf, convert_state_dict, hf_reference_activations
from interp_transformer.families.olmo2.recipe import Olmo2Config as OurOlmo2Config
from interp_transformer.loading import CheckpointError, from_pretrained
from interp_transformer.models import processing
from interp_transformer.verify import verify_against_hf, verify_pretrained

from .gpt2_helpers import one_thread  # noqa: F401 (autouse fixture)
from .llama_helpers import float64_copy, left_padded, random_tokens
from .olmo_helpers import COMMON, FAMILIES, tiny_olmo
from .perturbed import CLEAN, CORRUPTED, SMALL_SHAPE, perturbed_decoder

TOKENS = random_tokens(2, 9, seed=5)  # longer than the sliding window of 3


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    """(label, Hugging Face model, our float32 model) for each family."""
    hf_model = tiny_olmo(request.param)
    return request.param, hf_model, from_pretrained(hf_model)


@pytest.fixture(scope="module")
def family64(family):
    label, hf_model, _ = family
    hf64 = float64_copy(hf_model)
    return label, hf64, from_pretrained(hf64, dtype=torch.float64)


# --- parity with Hugging Face -----------------------------------------------------------------
def test_config_follows_the_hugging_face_config(family):
    label, hf_model, model = family
    cfg, hf_cfg = model.cfg, hf_model.config
    assert (cfg.n_heads, cfg.n_key_value_heads, cfg.d_head) == (
        hf_cfg.num_attention_heads,
        hf_cfg.num_key_value_heads,
        16,
    )
    assert cfg.attn_biases == (("q", "k", "v", "o") if hf_cfg.attention_bias else ())
    assert [cfg.is_sliding(layer) for layer in range(cfg.n_layers)] == [
        kind == "sliding_attention" for kind in getattr(hf_cfg, "layer_types", None) or ["full_attention"] * 2
    ]
    assert cfg.n_params(hugging_face=True) == sum(p.numel() for p in hf_model.parameters())
    assert cfg.n_params() == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-4), (torch.float64, 1e-10)], ids=["float32", "float64"])
def test_every_hook_matches_hugging_face(family, family64, dtype, atol, padded):
    _, hf_model, model = family if dtype == torch.float32 else family64
    kwargs = dict(zip(("tokens", "attention_mask"), left_padded(TOKENS, (3, 0)))) if padded else {"tokens": TOKENS}
    report = verify_against_hf(model, hf_model, float64_recheck=False, atol=atol, rtol=0, **kwargs)
    assert report.within_tolerance, str(report)
    expected = {name for name in model.hook_dict if not name.endswith("hook_attn_scores")} | {"logits"}
    assert {row.hook for row in report.rows} == expected


def test_a_broken_q_norm_weight_is_found_at_its_hook(family64):
    label, hf64, model64 = family64
    weight = model64.blocks[1].attn.q_norm.w
    with torch.no_grad():
        weight[5] += 0.5
    try:
        report = verify_against_hf(model64, hf64, TOKENS, float64_recheck=False)
        assert not report.within_tolerance and report.first_divergence == "blocks.1.attn.q_norm.hook_normalized", label
    finally:
        with torch.no_grad():
            weight[5] -= 0.5


def test_each_row_of_a_padded_batch_equals_itself_alone(family64):
    _, _, model64 = family64
    tokens, mask = left_padded(TOKENS, (4, 1))
    batched = model64(tokens, attention_mask=mask)
    for row in range(2):
        alone = model64(tokens[row : row + 1, mask[row].bool()])
        torch.testing.assert_close(batched[row, mask[row].bool()], alone[0], atol=1e-12, rtol=0)


def test_token_by_token_with_a_key_value_cache(family64):
    """A 4-token prompt, then one token at a time past the window: each step's hooks are Hugging Face's."""
    _, hf64, model64 = family64
    reference = hf_reference_activations(hf64, TOKENS)
    kv_cache = KeyValueCache(model64.cfg.n_layers)
    for start, end in [(0, 4)] + [(p, p + 1) for p in range(4, TOKENS.shape[1])]:
        logits, cache = model64.run_with_cache(TOKENS[:, start:end], kv_cache=kv_cache)
        torch.testing.assert_close(logits, reference["logits"][:, start:end], atol=1e-10, rtol=0)
        for name, value in cache.items():
            if name.endswith("hook_attn_scores"):
                continue
            pattern = name.endswith("hook_pattern")
            expected = reference[name][:, :, start:end, :end] if pattern else reference[name][:, start:end]
            torch.testing.assert_close(value, expected, atol=1e-10, rtol=0, msg=f"{name} at {start}..{end - 1}")


@pytest.mark.parametrize("label", sorted(FAMILIES))
def test_greedy_generation_matches_hugging_face(label):
    hf_model = tiny_olmo(label, seed=3)
    model = from_pretrained(hf_model)
    prompt = random_tokens(1, 5, seed=7)
    ours = model.generate(prompt, max_new_tokens=12, temperature=0, stop_at_eos=False)
    assert torch.equal(ours, hf_model.generate(prompt, max_new_tokens=12, do_sample=False))
    assert torch.equal(model.generate(prompt, max_new_tokens=12, temperature=0, use_kv_cache=False), ours)


def test_greedy_generation_of_a_left_padded_batch_matches_hugging_face():
    hf_model = tiny_olmo("olmo3-gqa3-window-local-rope", seed=4)
    model = from_pretrained(hf_model)
    tokens, mask = left_padded(random_tokens(3, 6, seed=8), (2, 0, 4))
    theirs = hf_model.generate(tokens, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(tokens, attention_mask=mask, max_new_tokens=8, temperature=0), theirs)


def test_a_saved_directory_loads_and_verifies(tmp_path):
    hf_model = tiny_olmo("olmo3-gqa3-window-local-rope")
    hf_model.save_pretrained(tmp_path)
    from_directory, in_memory = from_pretrained(tmp_path), from_pretrained(hf_model)
    assert all(torch.equal(a, b) for a, b in zip(from_directory.state_dict().values(), in_memory.state_dict().values()))
    report = verify_pretrained(tmp_path)
    assert report.ok and report.within_tolerance, str(report)


@pytest.mark.parametrize("config_class", [Olmo2Config, Olmo3Config])
def test_hugging_face_default_configs_count_alike(config_class):
    """The default (7B) shapes, on the meta device: our count is Hugging Face's, OLMo 3's every 4th layer global."""
    hf_config = config_class()
    with torch.device("meta"):
        hf_model = transformers.AutoModelForCausalLM.from_config(hf_config)
    cfg = config_from_hf(hf_config)
    assert cfg.n_params(hugging_face=True) == sum(p.numel() for p in hf_model.parameters())
    assert [cfg.is_sliding(layer) for layer in range(4)] == [config_class is Olmo3Config] * 3 + [False]


# --- the parts: norms after the sublayers only, q/k norms over all heads ------------------------
def test_the_q_and_k_norms_are_over_all_heads_together(family64):
    _, _, model = family64
    _, cache = model.run_with_cache(TOKENS)
    attn = model.blocks[0].attn
    for letter, norm in (("q", attn.q_norm), ("k", attn.k_norm)):
        x = cache[letter, 0]
        flat = x.flatten(-2)
        scale = cache[f"blocks.0.attn.{letter}_norm.hook_scale"]
        assert scale.shape == (*x.shape[:2], 1)
        torch.testing.assert_close(scale, (flat.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt(), atol=1e-12, rtol=0)
        normalized = cache[f"blocks.0.attn.{letter}_norm.hook_normalized"]
        torch.testing.assert_close(normalized, (flat / scale * norm.w).unflatten(-1, x.shape[-2:]), atol=1e-12, rtol=0)
        per_head = x / (x.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt() * norm.w.view(x.shape[-2:])
        assert (normalized - per_head).abs().max() > 1e-3  # what Qwen3's per-head norms would compute differs


BLOCK_HOOKS = [  # the public contract of one block, in the order the hooks fire: [batch=2, pos=5]
    ("hook_resid_pre", (2, 5, 12)),
    ("attn.hook_q", (2, 5, 4, 4)),
    ("attn.hook_k", (2, 5, 2, 4)),
    ("attn.hook_v", (2, 5, 2, 4)),
    ("attn.q_norm.hook_scale", (2, 5, 1)),  # one scale per position, over every head
    ("attn.q_norm.hook_normalized", (2, 5, 4, 4)),
    ("attn.k_norm.hook_scale", (2, 5, 1)),
    ("attn.k_norm.hook_normalized", (2, 5, 2, 4)),
    ("attn.hook_rot_q", (2, 5, 4, 4)),
    ("attn.hook_rot_k", (2, 5, 2, 4)),
    ("attn.hook_attn_scores", (2, 4, 5, 5)),
    ("attn.hook_pattern", (2, 4, 5, 5)),
    ("attn.hook_z", (2, 5, 4, 4)),
    ("ln1_post.hook_scale", (2, 5, 1)),
    ("ln1_post.hook_normalized", (2, 5, 12)),
    ("hook_attn_out", (2, 5, 12)),
    ("hook_resid_mid", (2, 5, 12)),
    ("mlp.hook_pre", (2, 5, 20)),
    ("mlp.hook_pre_linear", (2, 5, 20)),
    ("mlp.hook_post", (2, 5, 20)),
    ("ln2_post.hook_scale", (2, 5, 1)),
    ("ln2_post.hook_normalized", (2, 5, 12)),
    ("hook_mlp_out", (2, 5, 12)),
    ("hook_resid_post", (2, 5, 12)),
]


def test_the_hook_names_and_shapes():
    cfg = OurOlmo2Config(
        **dict(SMALL_SHAPE, d_model=12, d_head=4, d_mlp=20, d_vocab=17, n_ctx=8),
        n_key_value_heads=2,
        layer_types=("sliding_attention", "full_attention"),
        sliding_window=3,
    )
    model = DemoTransformer(cfg, seed=0)
    shapes = {name: tuple(shape) for name, shape in model.hook_shapes(2, 5).items()}
    blocks = [[(f"blocks.{layer}.{name}", shape) for name, shape in BLOCK_HOOKS] for layer in range(2)]
    final = [("ln_final.hook_scale", (2, 5, 1)), ("ln_final.hook_normalized", (2, 5, 12))]
    assert list(shapes.items()) == [("hook_embed", (2, 5, 12))] + blocks[0] + blocks[1] + final
    assert model.act_name("scale", 1, "ln2_post") == "blocks.1.ln2_post.hook_scale"
    with pytest.raises(KeyError, match="'ln1_post' or 'ln2_post'"):
        model.act_name("scale", 0, "ln1")  # no norm before a sublayer
    with pytest.raises(KeyError, match="no positional embedding"):
        model.act_name("pos_embed")


def test_identities_through_the_output_norms(family64):
    _, _, model = family64
    logits, cache = model.run_with_cache(TOKENS)
    for layer, block in enumerate(model.blocks):
        torch.testing.assert_close(cache["resid_mid", layer], cache["resid_pre", layer] + cache["attn_out", layer])
        torch.testing.assert_close(cache["resid_post", layer], cache["resid_mid", layer] + cache["mlp_out", layer])
        heads = torch.einsum("bphd,hdm->bpm", cache["z", layer], model.W_O[layer]) + model.b_O[layer]
        frozen = block.ln1_post.apply_frozen(heads, cache["scale", layer, "ln1_post"])
        torch.testing.assert_close(frozen, cache["attn_out", layer])
        # attention reads the stream as it is: the norm at a block's input is the identity
        for mlp_input in (False, True):
            stack = cache.decompose_resid(layer=layer, mlp_input=mlp_input)
            read = cache.apply_ln_to_stack(stack, layer=layer, mlp_input=mlp_input)
            torch.testing.assert_close(read, stack, atol=0, rtol=0)
            resid = cache["resid_mid" if mlp_input else "resid_pre", layer]
            torch.testing.assert_close(read.sum(dim=0), resid, atol=1e-12, rtol=0)
    components = cache.decompose_resid()
    torch.testing.assert_close(components.sum(dim=0), cache["resid_post", -1])
    torch.testing.assert_close(cache.apply_ln_to_stack(components).sum(dim=0) @ model.W_U + model.b_U, logits)
    full = cache.get_full_resid_decomposition(expand_neurons=True)
    torch.testing.assert_close(full.sum(dim=0), cache["resid_post", -1], atol=1e-10, rtol=0)


def test_weight_processing_keeps_the_log_probs(family64):
    _, hf64, _ = family64
    model = from_pretrained(hf64, dtype=torch.float64)
    before = model(TOKENS).log_softmax(-1)
    processing.process_weights(model)  # the steps exact with RMSNorms: centring the writers is left out
    assert model.processing == ["fold_ln", "center_unembed", "fold_value_biases"]
    torch.testing.assert_close(model(TOKENS).log_softmax(-1), before, atol=1e-10, rtol=0)
    with pytest.raises(ValueError, match=r"norms \(.*RMSNorm\) do not subtract the mean"):
        processing.center_writing_weights(model)


# --- refusals, by name ----------------------------------------------------------------------------
def olmo_config(model_type: str, **changes):
    settings = dict(COMMON, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2)
    if model_type == "olmo3":
        settings.update(sliding_window=3)
    return (Olmo3Config if model_type == "olmo3" else Olmo2Config)(**{**settings, **changes})


@pytest.mark.parametrize(
    "model_type, changes, named",
    [
        ("olmo2", dict(hidden_act="relu2"), "hidden_act='relu2'"),
        ("olmo2", dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}), "'dynamic'"),
        (
            "olmo2",
            dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}),
            "partial_rotary_factor=0.5",
        ),
        (
            "olmo3",
            dict(
                rope_parameters={
                    "full_attention": {"rope_type": "default", "rope_theta": 1e4},
                    "sliding_attention": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4},
                }
            ),
            r"rope_parameters\[sliding_attention\] has rope_type='dynamic'",
        ),
        ("olmo3", dict(sliding_window=None), "sliding_window=None"),
    ],
)
def test_features_not_implemented_are_named(model_type, changes, named):
    with pytest.raises(ValueError, match=f"{model_type} config has features not implemented here: .*{named}"):
        config_from_hf(olmo_config(model_type, **changes))


def test_an_unknown_layer_type_and_a_bad_head_dim_are_named_together():
    hf_config = olmo_config("olmo3")
    hf_config.layer_types = ["sliding_attention", "chunked_attention", "full_attention"]
    hf_config.head_dim = 0
    with pytest.raises(ValueError, match=r"head_dim=0 .*; layer_types \['chunked_attention'\]"):
        config_from_hf(hf_config)


def test_a_refused_model_loads_nothing():
    """The public path refuses before any weight is read (the weights are on the meta device: nothing to read)."""
    with torch.device("meta"):
        hf_model = Olmo2ForCausalLM(olmo_config("olmo2", hidden_act="relu2"))
    with pytest.raises(ValueError, match="hidden_act='relu2'"):
        from_pretrained(hf_model)


def test_a_checkpoint_without_its_q_norm_is_refused():
    hf_model = tiny_olmo("olmo2-gqa2-llama3")
    state_dict = dict(hf_model.state_dict())
    del state_dict["model.layers.1.self_attn.q_norm.weight"]
    with pytest.raises(CheckpointError, match=r"missing 1 tensor\(s\): layers.1.self_attn.q_norm.weight"):
        convert_state_dict(state_dict, config_from_hf(hf_model.config))


def test_transformerlens_compat_refuses_olmo_by_name():
    """A ``HookedTransformerConfig`` has no norms after the sublayers only: load OLMo natively."""
    with pytest.raises(ValueError, match="Olmo2Config model: load it with interp_transformer.from_pretrained"):
        HookedTransformer.from_pretrained(tiny_olmo("olmo2-gqa2-llama3"))


# --- the analysis tools, unchanged --------------------------------------------------------------
@pytest.fixture(scope="module")
def small_olmo():
    return perturbed_decoder(OurOlmo2Config(**SMALL_SHAPE, n_key_value_heads=2))


def test_direct_logit_attribution_sums_to_the_logit_difference(small_olmo):
    logits, cache = small_olmo.run_with_cache(CLEAN)
    result = attribution.direct_logit_attribution(cache, tokens=3, incorrect_tokens=5)
    torch.testing.assert_close(result.total(), logits[:, -1, 3] - logits[:, -1, 5], rtol=0, atol=1e-10)


def test_activation_patching_restores_the_clean_run_where_the_stream_is_patched_whole(small_olmo):
    """Every block's whole input carries the clean run; a position where both prompts hold the same token
    carries nothing of the difference."""

    def metric(logits):
        return logits[:, -1, 3].mean() - logits[:, -1, 5].mean()

    with torch.no_grad():
        clean, corrupted = float(metric(small_olmo(CLEAN))), float(metric(small_olmo(CORRUPTED)))
    assert abs(clean - corrupted) > 1e-3
    whole = patch_residual(small_olmo, CLEAN, CORRUPTED, metric, per_position=False, progress=False)
    torch.testing.assert_close(whole, torch.full_like(whole, clean), rtol=0, atol=1e-10)
    per_position = patch_residual(small_olmo, CLEAN, CORRUPTED, metric, progress=False)
    same = (CLEAN == CORRUPTED).all(dim=0)  # positions 0, 2, 3, 5
    torch.testing.assert_close(
        per_position[0, same], torch.full_like(per_position[0, same], corrupted), rtol=0, atol=1e-10
    )
    assert bool(((per_position[0, ~same] - corrupted).abs() > 1e-6).any())


def test_the_report_has_every_decoder_section(small_olmo):
    report = build_report(small_olmo, CLEAN[0], title="OLMo 2")
    assert [section.key for section in report.sections] == list(DISPLAY_ORDER)
    assert report["attribution"].figures
