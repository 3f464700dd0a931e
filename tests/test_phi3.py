"""Phi-3 (and Phi-4, the same class) against Hugging Face: every hook, LongRoPE, the key/value cache, generation.

References: random-weight Hugging Face ``Phi3ForCausalLM`` models (``FAMILIES``, every parameter
perturbed), compared hook by hook with ``verify_against_hf`` in float32 and float64; Hugging
Face's ``generate``; its own ``_compute_longrope_parameters`` (through the public
``ROPE_INIT_FUNCTIONS``). The LongRoPE models have an original context of 8 positions, so
prompts of 12 use the long factors and prompts of 7 the short ones.
"""

import math

import pytest
import torch
from transformers import Phi3Config, Phi3ForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from analysis.discovery import Site, attribution_patching, edge_attribution_patching, logit_diff_per_row
from analysis.patching import patch_residual
from analysis.readouts.attribution import direct_logit_attribution
from analysis.report import DISPLAY_ORDER, build_report
from interp_transformer.core.kv_cache import KeyValueCache
from interp_transformer.families.phi3.hf import config_from_hf, hf_reference_activations
from interp_transformer.families.phi3.recipe import Phi3Config as OurPhi3Config
from interp_transformer.loading import from_pretrained
from interp_transformer.parts.rotary import RopeScaling, Rotary
from interp_transformer.verify import verify_against_hf, verify_pretrained

from .gpt2_helpers import one_thread  # noqa: F401 (autouse fixture)
from .llama_helpers import float64_copy, left_padded, random_tokens, tiny_from
from .perturbed import ANSWERS, CLEAN, CORRUPTED, SMALL_SHAPE, perturbed_decoder

ORIGINAL = 8  # original_max_position_embeddings of the LongRoPE models
COMMON = dict(
    hidden_size=64,
    intermediate_size=80,
    num_hidden_layers=2,
    vocab_size=61,
    max_position_embeddings=32,
    original_max_position_embeddings=ORIGINAL,
    attn_implementation="eager",
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)


def long_rope(pairs: int, **extra) -> dict:
    return {
        "rope_type": "longrope",
        "rope_theta": 500.0,
        "short_factor": [1.0 + 0.1 * i for i in range(pairs)],
        "long_factor": [1.5 + 0.4 * i for i in range(pairs)],
        **extra,
    }


# label -> (model class, config class, settings): whole-head rotary with a window shorter than the prompts and
# four heads of their own (Phi-3-mini's kind), half-rotary LongRoPE with one key/value head for two query heads
# and tied embeddings (Phi-4-mini's kind, its attention factor from max / original context), and three-quarter
# rotary LongRoPE with a given factor and attention factor
FAMILIES = {
    "phi3-mha-window": (
        Phi3ForCausalLM,
        Phi3Config,
        dict(num_attention_heads=4, num_key_value_heads=4, sliding_window=3, tie_word_embeddings=False),
    ),
    "phi4mini-gqa2-half-longrope-tied": (
        Phi3ForCausalLM,
        Phi3Config,
        dict(
            num_attention_heads=2,
            num_key_value_heads=1,
            tie_word_embeddings=True,
            rope_parameters=long_rope(8, partial_rotary_factor=0.5),
        ),
    ),
    "phi3-gqa2-three-quarter-longrope": (
        Phi3ForCausalLM,
        Phi3Config,
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=False,
            rope_parameters=long_rope(6, partial_rotary_factor=0.75, factor=3.0, attention_factor=1.3),
        ),
    ),
}
LONG_ROPE = "phi4mini-gqa2-half-longrope-tied"
SHORT, LONG = random_tokens(2, 7, seed=5), random_tokens(2, 12, seed=6)


def tiny_phi3(label: str, seed: int = 0, **overrides):
    return tiny_from(FAMILIES, COMMON, label, seed, overrides)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    """(label, Hugging Face model, our float32 model, the float64 pair) for each family."""
    hf_model = tiny_phi3(request.param)
    hf64 = float64_copy(hf_model)
    return request.param, hf_model, from_pretrained(hf_model), hf64, from_pretrained(hf64, dtype=torch.float64)


def expected_hooks(model) -> set:
    return {name for name in model.hook_dict if not name.endswith("hook_attn_scores")} | {"logits"}


# --- parity with Hugging Face -----------------------------------------------------------------
def test_config_follows_the_hugging_face_config(family):
    label, hf_model, model, _, _ = family
    cfg, hf_cfg = model.cfg, hf_model.config
    assert (cfg.n_heads, cfg.n_key_value_heads, cfg.d_head) == (
        hf_cfg.num_attention_heads,
        hf_cfg.num_key_value_heads,
        64 // hf_cfg.num_attention_heads,
    )
    assert cfg.rotary_dim == int(cfg.d_head * hf_cfg.rope_parameters.get("partial_rotary_factor", 1.0))
    assert model.blocks[0].attn.rotary.rotary_dim == cfg.rotary_dim
    assert (cfg.rope_scaling is not None) == ("longrope" in label) and cfg.tied_embeddings == hf_cfg.tie_word_embeddings
    assert cfg.sliding_window == hf_cfg.sliding_window
    assert cfg.n_params(hugging_face=True) == sum(p.numel() for p in hf_model.parameters())
    assert cfg.n_params() == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "tokens, padding",
    [(SHORT, None), (LONG, None), (LONG, (2, 0)), (SHORT, (3, 0))],
    ids=["short", "long", "long-left-padded", "short-left-padded"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_every_hook_matches_hugging_face(family, dtype, tokens, padding):
    """Left padding keeps every row on its side of the original context, where Hugging Face (which picks LongRoPE's
    set by the longest row of the batch) and we (row by row) agree."""
    _, hf32, model32, hf64, model64 = family
    hf_model, model = (hf32, model32) if dtype == torch.float32 else (hf64, model64)
    kwargs = dict(zip(("tokens", "attention_mask"), left_padded(tokens, padding))) if padding else {"tokens": tokens}
    atol = 1e-4 if dtype == torch.float32 else 1e-10
    report = verify_against_hf(model, hf_model, float64_recheck=False, atol=atol, rtol=0, **kwargs)
    assert report.within_tolerance, str(report)
    assert {row.hook for row in report.rows} == expected_hooks(model)


def test_a_padded_batch_gives_each_row_what_it_gives_alone(family):
    _, _, _, _, model64 = family
    tokens, mask = left_padded(LONG, (3, 0))
    batched = model64(tokens, attention_mask=mask)
    for row in range(2):
        alone = model64(tokens[row : row + 1, mask[row].bool()])
        torch.testing.assert_close(batched[row : row + 1, mask[row].bool()], alone, atol=1e-12, rtol=0)


def test_qkv_and_gate_up_are_split_where_hugging_face_splits_them(family):
    """A change to one row of the fused weights shows at the one hook that reads it, and nowhere before."""
    label, _, _, hf64, model64 = family
    attn = model64.blocks[1].attn
    with torch.no_grad():
        attn.stored("W_V")[0, 3, 5] += 0.5
    try:
        report = verify_against_hf(model64, hf64, SHORT, float64_recheck=False)
        assert not report.within_tolerance and report.first_divergence == "blocks.1.attn.hook_v", label
    finally:
        with torch.no_grad():
            attn.stored("W_V")[0, 3, 5] -= 0.5


# --- LongRoPE ------------------------------------------------------------------------------------
@pytest.mark.parametrize("label", [LONG_ROPE, "phi3-gqa2-three-quarter-longrope"])
def test_long_rope_frequencies_and_attention_factor_are_hugging_faces(label):
    """Both sets of frequencies bit for bit, and the attention factor, from Hugging Face's own function."""
    hf_config = tiny_phi3(label).config
    rotary = from_pretrained(tiny_phi3(label)).blocks[0].attn.rotary
    short, factor = ROPE_INIT_FUNCTIONS["longrope"](hf_config, None)
    long, _ = ROPE_INIT_FUNCTIONS["longrope"](hf_config, None, seq_len=ORIGINAL + 1)
    assert torch.equal(rotary.inv_freq, short) and torch.equal(rotary.long_inv_freq, long)
    assert not torch.equal(short, long) and rotary.cos_sin_scale == factor != 1.0
    assert rotary.length_thresholds() == (ORIGINAL,)


def test_a_row_uses_the_long_factors_past_the_original_context():
    """The set is chosen by each row's length: a row's first 4 positions rotate differently once a fifth is there
    (original context 4), and two rows of different lengths each get their own set."""
    scaling = RopeScaling("longrope", 4.0, original_max_position_embeddings=4, short_factor=(1.0, 2.0),
                          long_factor=(3.0, 5.0))  # fmt: skip
    rotary = Rotary(8, rotary_dim=4, base=100.0, scaling=scaling)
    x = torch.randn(2, 5, 1, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    positions = torch.tensor([[0, 1, 2, 3, 3], [0, 1, 2, 3, 4]])  # row 0: 4 positions (a padded fifth), row 1: 5
    both = rotary(x, positions)
    torch.testing.assert_close(both[0], rotary(x[:1], positions[:1])[0], rtol=0, atol=0)
    torch.testing.assert_close(both[1], rotary(x[1:, :], positions[1:])[0], rtol=0, atol=0)
    short = rotary(x[1:, :4], positions[1:, :4])
    assert not torch.allclose(both[1:, 1:4], short[:, 1:4])  # a fifth position changed the first four's rotation
    torch.testing.assert_close(both[..., 4:], x[..., 4:], rtol=0, atol=0)  # partial: the rest passes
    assert scaling.cos_sin_scale() == pytest.approx(math.sqrt(2))  # sqrt(1 + ln(factor) / ln(original))
    torch.testing.assert_close(both[:, 0, :, :4], x[:, 0, :, :4] * math.sqrt(2))  # angle 0: only the factor acts


def test_token_by_token_with_a_key_value_cache_past_the_original_context(family):
    """A 9-token prompt (already long), then one token at a time: each step's hooks are Hugging Face's there."""
    _, _, _, hf64, model64 = family
    tokens = random_tokens(2, 13, seed=7)
    reference = hf_reference_activations(hf64, tokens)
    kv_cache = KeyValueCache(model64.cfg.n_layers)
    for start, end in [(0, 9)] + [(p, p + 1) for p in range(9, 13)]:
        logits, cache = model64.run_with_cache(tokens[:, start:end], kv_cache=kv_cache)
        torch.testing.assert_close(logits, reference["logits"][:, start:end], atol=1e-10, rtol=0)
        for name, value in cache.items():
            if name.endswith("hook_attn_scores"):
                continue
            expected = reference[name][:, :, start:end, :end] if name.endswith("hook_pattern") else None
            expected = reference[name][:, start:end] if expected is None else expected
            torch.testing.assert_close(value, expected, atol=1e-10, rtol=0, msg=f"{name} at {start}..{end - 1}")


def test_a_cache_of_short_rotations_is_refused_past_the_original_context():
    model = from_pretrained(tiny_phi3(LONG_ROPE))
    kv_cache = KeyValueCache(model.cfg.n_layers)
    tokens = random_tokens(1, ORIGINAL + 1, seed=8)
    model(tokens[:, :ORIGINAL], kv_cache=kv_cache)
    with pytest.raises(ValueError, match="rotated for rows of at most 8 positions.*start a new cache"):
        model(tokens[:, ORIGINAL:], kv_cache=kv_cache)
    assert kv_cache.n_positions == ORIGINAL  # nothing stored by the refused run


# --- generation ---------------------------------------------------------------------------------
@pytest.mark.parametrize("prompt_length", [5, 10], ids=["crossing-the-original-context", "already-past-it"])
def test_greedy_generation_matches_hugging_face(family, prompt_length):
    """From 5 tokens to 13 the rows cross LongRoPE's original context of 8: both models start again there."""
    _, hf_model, model, _, _ = family
    prompt = random_tokens(1, prompt_length, seed=9)
    ours = model.generate(prompt, max_new_tokens=8, temperature=0, stop_at_eos=False)
    theirs = hf_model.generate(prompt, max_new_tokens=8, do_sample=False)
    assert torch.equal(ours, theirs)
    assert torch.equal(model.generate(prompt, max_new_tokens=8, temperature=0, use_kv_cache=False), ours)


@pytest.mark.parametrize(
    "label, padding, like_hugging_face",
    [("phi3-mha-window", (2, 0, 5), True), (LONG_ROPE, (2, 0, 1), True), (LONG_ROPE, (5, 0, 1), False)],
    ids=["window", "long-rope-every-row-long", "long-rope-rows-on-both-sides"],
)
def test_greedy_generation_of_a_left_padded_batch(label, padding, like_hugging_face):
    """Each row continues as it does alone. Hugging Face picks LongRoPE's set by the longest row of the batch, we
    row by row: with every row past the original context the two agree; with a row of 7 real tokens beside rows of
    12 and 11, only ours gives that row what it gives alone (and starts again when it grows past 8)."""
    hf_model = tiny_phi3(label, seed=4)
    model = from_pretrained(hf_model)
    tokens, mask = left_padded(random_tokens(3, 12, seed=10), padding)
    ours = model.generate(tokens, attention_mask=mask, max_new_tokens=5, temperature=0, stop_at_eos=False)
    if like_hugging_face:
        theirs = hf_model.generate(tokens, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
        assert torch.equal(ours, theirs)
    for row in range(3):
        alone = model.generate(
            tokens[row : row + 1, mask[row].bool()], max_new_tokens=5, temperature=0, stop_at_eos=False
        )
        assert torch.equal(alone[0, -5:], ours[row, -5:])


def test_a_saved_directory_loads_and_verifies(tmp_path):
    """``save_pretrained`` leaves the tied read-out out; the directory loads and verifies all the same."""
    hf_model = tiny_phi3(LONG_ROPE)
    hf_model.save_pretrained(tmp_path)
    from_directory, in_memory = from_pretrained(tmp_path), from_pretrained(hf_model)
    assert all(torch.equal(a, b) for a, b in zip(from_directory.state_dict().values(), in_memory.state_dict().values()))
    report = verify_pretrained(tmp_path)  # 16 random tokens: the long factors
    assert report.ok and report.within_tolerance, str(report)


# --- refusals -----------------------------------------------------------------------------------
def _config(**changes):
    hf_config = tiny_phi3(LONG_ROPE).config
    for name, value in changes.items():
        setattr(hf_config, name, value)
    return hf_config


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"rope_parameters": {"rope_type": "linear", "factor": 2.0}}, r"rope_type='linear' \(supported: \['default', "),
        ({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.1}}, "rotates 3 of d_head=32"),
        ({"rope_parameters": long_rope(5, partial_rotary_factor=0.5, original_max_position_embeddings=8)},
         r"short_factor of 5 entries \(rotary_dim=16 needs 8"),
        ({"rope_parameters": long_rope(8, partial_rotary_factor=0.5, original_max_position_embeddings=8,
                                       attention_factor=0.0)}, "attention_factor=0.0"),
        ({"rope_parameters": long_rope(8, partial_rotary_factor=0.5)}, "original_max_position_embeddings=None"),
        ({"rope_parameters": {"full_attention": {"rope_type": "default"}}}, "rope_parameters per layer type"),
        ({"sliding_window": 0}, "sliding_window=0"),
        ({"hidden_act": "relu2"}, "hidden_act='relu2'"),
        ({"num_key_value_heads": 3}, "num_key_value_heads=3"),
    ],
)  # fmt: skip
def test_unsupported_config_values_are_refused_by_name(changes, match):
    with pytest.raises(ValueError, match=match):
        config_from_hf(_config(**changes))


def test_every_unsupported_feature_is_named_in_one_error():
    with pytest.raises(ValueError, match=r"hidden_act='tanh'.*sliding_window=-2.*rope_type='dynamic'"):
        config_from_hf(_config(sliding_window=-2, hidden_act="tanh", rope_parameters={"rope_type": "dynamic"}))


def test_bad_long_rope_settings_are_refused():
    with pytest.raises(ValueError, match="need one entry per frequency each, got 2 and 3"):
        RopeScaling("longrope", 2.0, short_factor=(1.0, 1.0), long_factor=(1.0, 1.0, 1.0))
    with pytest.raises(ValueError, match=r"\['short_factor'\] belong to kind 'longrope', got kind 'linear'"):
        RopeScaling("linear", 2.0, short_factor=(1.0,))
    with pytest.raises(ValueError, match=r"need rotary_dim/2=4 entries \(one per frequency\), got 2"):
        Rotary(8, scaling=RopeScaling("longrope", 2.0, short_factor=(1.0, 1.0), long_factor=(1.0, 1.0)))
    with pytest.raises(ValueError, match="rotary_dim must be even and at most d_head=4, got 6"):
        OurPhi3Config(**SMALL_SHAPE, n_key_value_heads=2, rotary_dim=6)
    with pytest.raises(ValueError, match=r"attn_biases must be \(\)"):
        OurPhi3Config(**SMALL_SHAPE, n_key_value_heads=2, attn_biases=("q",))


# --- the analysis tools, unchanged --------------------------------------------------------------
def test_the_analysis_tools_run_on_a_long_rope_model():
    """Direct logit attribution sums to the logit difference, patching the whole input restores the clean run,
    the edges into the logits sum to the final residual's attribution-patching score, and the report has every
    decoder section."""
    scaling = RopeScaling("longrope", 3.0, original_max_position_embeddings=4, short_factor=(1.0, 1.5),
                          long_factor=(2.0, 4.0))  # fmt: skip
    model = perturbed_decoder(OurPhi3Config(**SMALL_SHAPE, n_key_value_heads=2, rotary_dim=4, rope_scaling=scaling))
    logits, cache = model.run_with_cache(CLEAN)  # 6 positions: the long factors
    result = direct_logit_attribution(cache, tokens=3, incorrect_tokens=5)
    torch.testing.assert_close(result.total(), logits[:, -1, 3] - logits[:, -1, 5], rtol=0, atol=1e-10)

    def metric(logits):
        return logits[:, -1, 3].mean() - logits[:, -1, 5].mean()

    with torch.no_grad():
        clean = float(metric(model(CLEAN)))
    patched = patch_residual(model, CLEAN, CORRUPTED, metric, per_position=False, progress=False)
    assert patched[0] == pytest.approx(clean, abs=1e-10)
    edges = edge_attribution_patching(model, CLEAN, CORRUPTED, logit_diff_per_row(*ANSWERS))
    assert edges.readers[:4] == ["L0H0.q", "L0H1.q", "L0H2.q", "L0H3.q"] and bool(edges.scores.abs().sum() > 0)
    final = Site(model.hook_names.final_residual_name(model.cfg.n_layers), model.cfg.n_layers - 1, (), None, "final")
    atp = attribution_patching(model, CLEAN, CORRUPTED, logit_diff_per_row(*ANSWERS), [final])[0]
    torch.testing.assert_close(edges.scores[:, edges.readers.index("logits")].sum(dim=0), atp, rtol=0, atol=1e-10)
    report = build_report(model, CLEAN[0], title="Phi-3")
    assert [section.key for section in report.sections] == list(DISPLAY_ORDER)
