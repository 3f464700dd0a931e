"""SmolLM3 against Hugging Face: every hook (NoPE layers without rotation), sliding layers, the cache, generation.

References: random-weight Hugging Face ``SmolLM3ForCausalLM`` models (``FAMILIES``, every
parameter perturbed), compared hook by hook with ``verify_against_hf`` in float32 and float64,
and Hugging Face's ``generate``.
"""

import pytest
import torch
from transformers import SmolLM3Config, SmolLM3ForCausalLM

from analysis.discovery import Site, attribution_patching, edge_attribution_patching, logit_diff_per_row
from analysis.patching import patch_residual
from analysis.readouts.attribution import direct_logit_attribution
from analysis.report import DISPLAY_ORDER, build_report
from interp_transformer.compat import HookedTransformer
from interp_transformer.core.kv_cache import KeyValueCache
from interp_transformer.families.smollm3.hf import config_from_hf, hf_reference_activations
from interp_transformer.families.smollm3.recipe import SmolLM3Config as OurSmolLM3Config
from interp_transformer.loading import from_pretrained
from interp_transformer.verify import verify_against_hf

from .gpt2_helpers import one_thread  # noqa: F401 (autouse fixture)
from .llama_helpers import COMMON, LLAMA3_ROPE, float64_copy, left_padded, random_tokens, tiny_from
from .perturbed import ANSWERS, CLEAN, CORRUPTED, SMALL_SHAPE, perturbed_decoder

# label -> (model class, config class, settings): every other layer NoPE and sliding (a window of 3, shorter than
# the prompts), tied embeddings, two query heads per key/value head; Hugging Face's default of every fourth layer
# NoPE, with llama3 rope scaling, biases on q/k/v/o and three query heads per key/value head
FAMILIES = {
    "smollm3-nope2-sliding": (
        SmolLM3ForCausalLM,
        SmolLM3Config,
        dict(
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            no_rope_layer_interval=2,
            use_sliding_window=True,
            sliding_window=3,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
        ),
    ),
    "smollm3-nope4-llama3-biases": (
        SmolLM3ForCausalLM,
        SmolLM3Config,
        dict(
            num_hidden_layers=4,
            num_attention_heads=6,
            num_key_value_heads=2,
            attention_bias=True,
            tie_word_embeddings=False,
            rope_parameters=dict(LLAMA3_ROPE),
        ),
    ),
}
TOKENS = random_tokens(2, 9, seed=5)


def tiny_smollm3(label: str, seed: int = 0, **overrides):
    return tiny_from(FAMILIES, COMMON, label, seed, overrides)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    """(label, Hugging Face model, our float32 model, the float64 pair) for each family."""
    hf_model = tiny_smollm3(request.param)
    hf64 = float64_copy(hf_model)
    return request.param, hf_model, from_pretrained(hf_model), hf64, from_pretrained(hf64, dtype=torch.float64)


def expected_hooks(model) -> set:
    return {name for name in model.hook_dict if not name.endswith("hook_attn_scores")} | {"logits"}


# --- parity with Hugging Face -----------------------------------------------------------------
def test_config_follows_the_hugging_face_config(family):
    label, hf_model, model, _, _ = family
    cfg, hf_cfg = model.cfg, hf_model.config
    rotary = [bool(flag) for flag in hf_cfg.no_rope_layers[: cfg.n_layers]]
    assert [cfg.uses_rotary(layer) for layer in range(cfg.n_layers)] == rotary
    assert [block.attn.rotary is not None for block in model.blocks] == rotary
    assert rotary == ([True, False] * 2 if "nope2" in label else [True, True, True, False])
    sliding = [kind == "sliding_attention" for kind in hf_cfg.layer_types]
    assert [cfg.window(layer) is not None for layer in range(cfg.n_layers)] == sliding
    assert sliding == ([False, True] * 2 if "sliding" in label else [False] * 4)
    assert cfg.tied_embeddings == hf_cfg.tie_word_embeddings
    assert cfg.n_params(hugging_face=True) == sum(p.numel() for p in hf_model.parameters())
    assert cfg.n_params() == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_every_hook_matches_hugging_face(family, dtype, padded):
    _, hf32, model32, hf64, model64 = family
    hf_model, model = (hf32, model32) if dtype == torch.float32 else (hf64, model64)
    kwargs = dict(zip(("tokens", "attention_mask"), left_padded(TOKENS, (3, 0)))) if padded else {"tokens": TOKENS}
    atol = 1e-4 if dtype == torch.float32 else 1e-10
    report = verify_against_hf(model, hf_model, float64_recheck=False, atol=atol, rtol=0, **kwargs)
    assert report.within_tolerance, str(report)
    assert {row.hook for row in report.rows} == expected_hooks(model)


def test_nope_layers_have_no_rotated_q_and_k(family):
    """A NoPE layer's scores read q and k as projected: no rotation hooks, and positions change nothing in them."""
    _, _, _, _, model64 = family
    _, cache = model64.run_with_cache(TOKENS)
    for layer in range(model64.cfg.n_layers):
        assert (f"blocks.{layer}.attn.hook_rot_q" in cache) == model64.cfg.uses_rotary(layer)
    nope = next(layer for layer in range(model64.cfg.n_layers) if not model64.cfg.uses_rotary(layer))
    q, k = cache["q", nope], cache["k", nope]
    group = model64.cfg.n_heads // model64.cfg.n_key_value_heads
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(group, dim=2)) / model64.cfg.d_head**0.5
    pattern = cache["pattern", nope]
    window = model64.cfg.window(nope) or TOKENS.shape[1]
    allowed = torch.ones(9, 9, dtype=torch.bool).tril() & ~torch.ones(9, 9, dtype=torch.bool).tril(-window)
    torch.testing.assert_close(pattern, scores.masked_fill(~allowed, float("-inf")).softmax(-1))


def test_a_padded_batch_gives_each_row_what_it_gives_alone(family):
    _, _, _, _, model64 = family
    tokens, mask = left_padded(TOKENS, (4, 0))
    batched = model64(tokens, attention_mask=mask)
    for row in range(2):
        alone = model64(tokens[row : row + 1, mask[row].bool()])
        torch.testing.assert_close(batched[row : row + 1, mask[row].bool()], alone, atol=1e-12, rtol=0)


def test_token_by_token_with_a_key_value_cache(family):
    """A 4-token prompt, then one token at a time: each step's hooks are Hugging Face's at those positions."""
    _, _, _, hf64, model64 = family
    reference = hf_reference_activations(hf64, TOKENS)
    kv_cache = KeyValueCache(model64.cfg.n_layers)
    for start, end in [(0, 4)] + [(p, p + 1) for p in range(4, TOKENS.shape[1])]:
        logits, cache = model64.run_with_cache(TOKENS[:, start:end], kv_cache=kv_cache)
        torch.testing.assert_close(logits, reference["logits"][:, start:end], atol=1e-10, rtol=0)
        for name, value in cache.items():
            if name.endswith("hook_attn_scores"):
                continue
            expected = reference[name][:, :, start:end, :end] if name.endswith("hook_pattern") else None
            expected = reference[name][:, start:end] if expected is None else expected
            torch.testing.assert_close(value, expected, atol=1e-10, rtol=0, msg=f"{name} at {start}..{end - 1}")


# --- generation ---------------------------------------------------------------------------------
def test_greedy_generation_matches_hugging_face(family):
    _, hf_model, model, _, _ = family
    prompt = random_tokens(1, 5, seed=7)
    ours = model.generate(prompt, max_new_tokens=10, temperature=0, stop_at_eos=False)
    theirs = hf_model.generate(prompt, max_new_tokens=10, do_sample=False)
    assert torch.equal(ours, theirs)
    assert torch.equal(model.generate(prompt, max_new_tokens=10, temperature=0, use_kv_cache=False), ours)


def test_greedy_generation_of_a_left_padded_batch_matches_hugging_face():
    hf_model = tiny_smollm3("smollm3-nope2-sliding", seed=4)
    model = from_pretrained(hf_model)
    tokens, mask = left_padded(random_tokens(3, 6, seed=8), (2, 0, 4))
    theirs = hf_model.generate(tokens, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    ours = model.generate(tokens, attention_mask=mask, max_new_tokens=6, temperature=0, stop_at_eos=False)
    assert torch.equal(ours, theirs)
    for row in range(3):
        alone = model.generate(
            tokens[row : row + 1, mask[row].bool()], max_new_tokens=6, temperature=0, stop_at_eos=False
        )
        assert torch.equal(alone[0, -6:], ours[row, -6:])


# --- refusals -----------------------------------------------------------------------------------
def _config(**changes):
    hf_config = tiny_smollm3("smollm3-nope2-sliding").config
    for name, value in changes.items():
        setattr(hf_config, name, value)
    return hf_config


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"use_sliding_window": False}, r"sliding_attention layers \[1, 3\] with use_sliding_window=False"),
        ({"sliding_window": None}, r"sliding_attention layers \[1, 3\] with sliding_window=None"),
        ({"no_rope_layers": [1, 0, 1]}, "no_rope_layers=.*one entry per layer, num_hidden_layers=4"),
        ({"no_rope_layers": [1, 2, 1, 0]}, r"no_rope_layers=\[1, 2, 1, 0\] \(1 for a rotary layer, 0 for a NoPE"),
        ({"layer_types": ["full_attention", "chunked_attention"] * 2}, r"layer_types \['chunked_attention'\]"),
        ({"mlp_bias": True}, "mlp_bias=True"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0}}, "rope_type='yarn'"),
        ({"hidden_act": "relu2"}, "hidden_act='relu2'"),
    ],
)
def test_unsupported_config_values_are_refused_by_name(changes, match):
    with pytest.raises(ValueError, match=match):
        config_from_hf(_config(**changes))


def test_bad_layer_choices_are_refused():
    with pytest.raises(ValueError, match=r"nope_layers must be a tuple of distinct layer indices in \[0, n_layers=2\)"):
        OurSmolLM3Config(**SMALL_SHAPE, n_key_value_heads=2, nope_layers=(2,))
    with pytest.raises(ValueError, match=r"sliding_layers=\(0,\) need a sliding_window, got None"):
        OurSmolLM3Config(**SMALL_SHAPE, n_key_value_heads=2, sliding_layers=(0,))


def test_transformerlens_compat_refuses_smollm3_by_name():
    """A ``HookedTransformerConfig`` cannot say which layers have no positions: load SmolLM3 natively."""
    with pytest.raises(ValueError, match="SmolLM3Config model: load it with interp_transformer.from_pretrained"):
        HookedTransformer.from_pretrained(tiny_smollm3("smollm3-nope4-llama3-biases"))


# --- the analysis tools, unchanged --------------------------------------------------------------
def test_the_analysis_tools_run_on_a_nope_and_sliding_model():
    """Direct logit attribution sums to the logit difference, patching the whole input restores the clean run,
    the edges into the logits sum to the final residual's attribution-patching score, and the report has every
    decoder section."""
    model = perturbed_decoder(
        OurSmolLM3Config(**SMALL_SHAPE, n_key_value_heads=2, nope_layers=(1,), sliding_window=3, sliding_layers=(1,))
    )
    logits, cache = model.run_with_cache(CLEAN)
    result = direct_logit_attribution(cache, tokens=3, incorrect_tokens=5)
    torch.testing.assert_close(result.total(), logits[:, -1, 3] - logits[:, -1, 5], rtol=0, atol=1e-10)

    def metric(logits):
        return logits[:, -1, 3].mean() - logits[:, -1, 5].mean()

    with torch.no_grad():
        clean = float(metric(model(CLEAN)))
    patched = patch_residual(model, CLEAN, CORRUPTED, metric, per_position=False, progress=False)
    assert patched[0] == pytest.approx(clean, abs=1e-10)
    edges = edge_attribution_patching(model, CLEAN, CORRUPTED, logit_diff_per_row(*ANSWERS))
    assert "L1H3.q" in edges.readers and bool(edges.scores.abs().sum() > 0)
    final = Site(model.hook_names.final_residual_name(model.cfg.n_layers), model.cfg.n_layers - 1, (), None, "final")
    atp = attribution_patching(model, CLEAN, CORRUPTED, logit_diff_per_row(*ANSWERS), [final])[0]
    torch.testing.assert_close(edges.scores[:, edges.readers.index("logits")].sum(dim=0), atp, rtol=0, atol=1e-10)
    report = build_report(model, CLEAN[0], title="SmolLM3")
    assert [section.key for section in report.sections] == list(DISPLAY_ORDER)
