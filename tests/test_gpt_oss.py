"""gpt-oss against Hugging Face: every hook, sinks, YaRN, sliding layers, clamped experts, generation, refusals, tools.

References: random-weight Hugging Face ``GptOssForCausalLM`` models (every parameter perturbed,
the router's bias and the sinks included; a window of 3 keys on the sliding blocks, YaRN with
a pretraining context of 16, ``swiglu_limit=1.5`` so that the experts' clips bite) compared hook
by hook with ``verify_against_hf`` in float32 (1e-4) and float64 (1e-10), padded and not;
Hugging Face's ``generate``; Hugging Face's own YaRN frequencies (``ROPE_INIT_FUNCTIONS``) and
parameter counts (a model on the meta device); our explicit attention and experts paths,
against which the fast ones are held; and, for the analysis tools, the model's own cache.
"""

import copy
import re

import einops
import pytest
import torch
from transformers import GptOssConfig as HFGptOssConfig
from transformers import GptOssForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from analysis import patching
from analysis.discovery import edge_attribution_patching, logit_diff_per_row
from analysis.readouts import attribution, experts
from analysis.report import EXPERTS_DISPLAY_ORDER, build_report
from interp_transformer.core.kv_cache import KeyValueCache
from interp_transformer.families.gpt_oss.hf import config_from_hf, convert_state_dict
from interp_transformer.families.gpt_oss.recipe import GPT_OSS_ROPE, PRESETS, GptOssConfig
from interp_transformer.loading import CheckpointError, from_pretrained
from interp_transformer.models import processing
from interp_transformer.parts.rotary import RopeScaling, Rotary
from interp_transformer.verify import verify_against_hf, verify_pretrained

from .gpt2_helpers import one_thread  # noqa: F401 (autouse fixture)
from .llama_helpers import VOCAB, float64_copy, left_padded, random_tokens, tiny_from
from .perturbed import ANSWERS, CLEAN, CORRUPTED, perturbed_decoder

YARN = dict(
    rope_type="yarn",
    rope_theta=1000.0,
    factor=4.0,
    beta_fast=8.0,
    beta_slow=1.0,
    truncate=False,
    original_max_position_embeddings=16,
)
COMMON = dict(
    hidden_size=48,
    intermediate_size=24,
    head_dim=16,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_local_experts=4,
    num_experts_per_tok=2,
    vocab_size=VOCAB,
    max_position_embeddings=64,
    sliding_window=3,
    swiglu_limit=1.5,
    rope_parameters=YARN,
    attn_implementation="eager",
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
FAMILIES = {"gpt-oss": (GptOssForCausalLM, HFGptOssConfig, dict(num_hidden_layers=2, tie_word_embeddings=False))}
TOKENS = random_tokens(2, 9, seed=5)  # longer than the window of 3
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-10}


def tiny_gpt_oss(seed: int = 0, **overrides):
    return tiny_from(FAMILIES, COMMON, "gpt-oss", seed, overrides)


@pytest.fixture(scope="module")
def pair():
    hf_model = tiny_gpt_oss()
    return hf_model, from_pretrained(hf_model)


@pytest.fixture(scope="module")
def pair64(pair):
    hf64 = float64_copy(pair[0])
    return hf64, from_pretrained(hf64, dtype=torch.float64)


# --- parity with Hugging Face -----------------------------------------------------------------
def test_config_follows_the_hugging_face_config(pair):
    hf_model, model = pair
    cfg = model.cfg
    assert (cfg.n_experts, cfg.experts_per_token, cfg.d_mlp, cfg.sliding_window, cfg.swiglu_limit) == (4, 2, 24, 3, 1.5)
    assert cfg.layer_types == ("sliding_attention", "full_attention") and cfg.attn_biases == ("q", "k", "v", "o")
    assert cfg.rope_scaling == RopeScaling(
        "yarn", 4.0, original_max_position_embeddings=16, beta_fast=8.0, truncate=False
    )
    assert [block.attn.key_window() for block in model.blocks] == [3, None]
    assert cfg.n_params(hugging_face=True) == sum(p.numel() for p in hf_model.parameters())
    assert cfg.n_params() == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_parameter_counts_are_hugging_faces(name):
    cfg = PRESETS[name]
    hf_config = HFGptOssConfig(num_hidden_layers=cfg.n_layers, num_local_experts=cfg.n_experts)
    with torch.device("meta"):
        hf_model = GptOssForCausalLM(hf_config)
    assert cfg.n_params(hugging_face=True) == sum(p.numel() for p in hf_model.parameters())
    assert config_from_hf(hf_config).replace(name=name, layer_types=None) == cfg and cfg.rope_scaling == GPT_OSS_ROPE
    assert [cfg.is_sliding(layer) for layer in range(cfg.n_layers)] == [
        kind == "sliding_attention" for kind in hf_config.layer_types
    ]


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_every_hook_matches_hugging_face(pair, pair64, dtype, padded):
    hf_model, model = pair if dtype == torch.float32 else pair64
    kwargs = dict(zip(("tokens", "attention_mask"), left_padded(TOKENS, (3, 0)))) if padded else {"tokens": TOKENS}
    report = verify_against_hf(model, hf_model, float64_recheck=False, atol=TOLERANCE[dtype], rtol=0, **kwargs)
    assert report.within_tolerance, str(report)
    expected = {name for name in model.hook_dict if not name.endswith("hook_attn_scores")} | {"logits"}
    assert {row.hook for row in report.rows} == expected


def test_the_sinks_take_attention_and_the_clips_bite(pair64):
    """The features the parity test covers are at work: patterns sum to less than 1, every clip changes values."""
    _, model = pair64
    _, cache = model.run_with_cache(TOKENS)
    limit = model.cfg.swiglu_limit
    for layer in range(2):
        to_sink = 1 - cache["pattern", layer].sum(dim=-1)
        assert bool((to_sink > 0).all()) and bool((to_sink < 1).all()) and float(to_sink.mean()) > 0.1
        pre = torch.stack([cache[f"blocks.{layer}.mlp.experts.{e}.hook_pre"] for e in range(4)])
        pre_linear = torch.stack([cache[f"blocks.{layer}.mlp.experts.{e}.hook_pre_linear"] for e in range(4)])
        assert bool((pre > limit).any()) and bool((pre_linear > limit).any()) and bool((pre_linear < -limit).any())


def test_routing_is_the_top_k_of_the_logits_then_their_softmax(pair64):
    _, model = pair64
    _, cache = model.run_with_cache(TOKENS)
    for layer in range(2):
        logits, indices = cache["router_logits", layer], cache["expert_indices", layer]
        assert torch.equal(indices, logits.topk(2, dim=-1).indices)
        torch.testing.assert_close(
            cache["routing_weights", layer], logits.gather(-1, indices).softmax(-1), rtol=0, atol=0
        )
        chosen = cache["expert_weights", layer].gather(-1, indices)  # the same in exact arithmetic
        torch.testing.assert_close(cache["routing_weights", layer], chosen / chosen.sum(-1, keepdim=True))


def test_yarn_frequencies_and_scale_are_hugging_faces():
    """Bit for bit, with and without truncation, an explicit attention factor, DeepSeek's mscale pair, no factor."""
    variants = [
        dict(YARN),
        dict(YARN, rope_theta=100.0, beta_fast=1.0, beta_slow=0.25),  # a ramp from pair 1.62 to 4.03
        dict(YARN, rope_theta=100.0, beta_fast=1.0, beta_slow=0.25, truncate=True),  # ... rounded out to 1 and 5
        dict(YARN, attention_factor=0.7),
        dict(YARN, mscale=1.0, mscale_all_dim=0.5),
        dict(YARN, factor=None),  # Hugging Face then takes max_position_embeddings / original_max_position_embeddings
    ]
    frequencies = []
    for parameters in variants:
        hf_config = HFGptOssConfig(**{**COMMON, "rope_parameters": parameters, "num_hidden_layers": 2})
        inv_freq, attention_scaling = ROPE_INIT_FUNCTIONS["yarn"](hf_config)
        cfg = config_from_hf(hf_config)
        rotary = Rotary(cfg.d_head, base=cfg.rotary_base, scaling=cfg.rope_scaling)
        assert torch.equal(rotary.inv_freq, inv_freq), parameters
        assert rotary.cos_sin_scale == attention_scaling != 1.0, parameters
        frequencies.append(rotary.inv_freq)
    assert not torch.equal(frequencies[1], frequencies[2])  # truncate changes them


def test_a_saved_directory_loads_and_verifies(pair, tmp_path):
    hf_model, in_memory = pair
    hf_model.save_pretrained(tmp_path)
    from_directory = from_pretrained(tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(from_directory.state_dict().values(), in_memory.state_dict().values()))
    report = verify_pretrained(tmp_path)
    assert report.ok and report.within_tolerance, str(report)


# --- the fast paths equal the explicit ones ------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_fused_attention_with_sinks_equals_the_explicit_path(pair, pair64, dtype):
    """The fused kernel (sinks as a zero key), the fast scores with a hooked pattern, and every step's einsum."""
    _, model = pair if dtype == torch.float32 else pair64
    tokens, mask = left_padded(TOKENS, (3, 0))
    atol = {torch.float32: 1e-5, torch.float64: 1e-12}[dtype]
    assert all(block.attn.uses_fused_path() for block in model.blocks)
    fused = model(tokens, attention_mask=mask)
    with model.hooks(fwd_hooks=[(lambda name: name.endswith("hook_pattern"), lambda pattern, hook: None)]):
        assert not model.blocks[0].attn.uses_fused_path() and model.blocks[0].attn.uses_fast_kernels()
        fast_scores = model(tokens, attention_mask=mask)
    try:
        for block in model.blocks:
            block.attn.use_fused_attention = False
        explicit = model(tokens, attention_mask=mask)
    finally:
        for block in model.blocks:
            block.attn.use_fused_attention = True
    real = mask.bool()
    torch.testing.assert_close(fused[real], explicit[real], atol=atol, rtol=0)
    torch.testing.assert_close(fast_scores[real], explicit[real], atol=atol, rtol=0)


def test_the_sparse_experts_equal_the_explicit_ones(pair64):
    _, model = pair64
    sparse = model(TOKENS)
    try:
        for block in model.blocks:
            block.mlp.use_sparse_experts = False
        explicit = model(TOKENS)
    finally:
        for block in model.blocks:
            block.mlp.use_sparse_experts = True
    torch.testing.assert_close(sparse, explicit, atol=1e-12, rtol=0)


def test_token_by_token_with_a_key_value_cache_past_the_window(pair64):
    _, model64 = pair64
    whole = model64(TOKENS)
    kv_cache = KeyValueCache(model64.cfg.n_layers)
    for start, end in [(0, 4)] + [(p, p + 1) for p in range(4, TOKENS.shape[1])]:
        torch.testing.assert_close(
            model64(TOKENS[:, start:end], kv_cache=kv_cache), whole[:, start:end], atol=1e-12, rtol=0
        )


def test_a_padded_batch_gives_each_row_what_it_gives_alone(pair64):
    _, model = pair64
    tokens, mask = left_padded(random_tokens(3, 8, seed=6), (2, 0, 4))
    batched = model(tokens, attention_mask=mask)
    for row in range(3):
        alone = model(tokens[row : row + 1, mask[row].bool()])
        torch.testing.assert_close(batched[row, mask[row].bool()], alone[0], atol=1e-12, rtol=0)


def test_processing_keeps_the_output_and_leaves_the_value_biases_where_sinks_take_a_share(pair64):
    """``fold_value_biases`` is exact only where pattern rows sum to 1: here it is skipped, or refused when asked."""
    _, model = pair64
    model = copy.deepcopy(model)
    before = model(TOKENS).log_softmax(-1)
    processing.process_weights(model)
    assert model.processing == ["fold_ln", "center_unembed"]
    torch.testing.assert_close(model(TOKENS).log_softmax(-1), before, atol=1e-10, rtol=0)
    with pytest.raises(
        ValueError, match=r"fold_value_biases would change the output: the attention of blocks \[0, 1\]"
    ):
        processing.fold_value_biases(model)
    folded = copy.deepcopy(model)
    for block in folded.blocks:  # what the refusal prevents: folding anyway moves the logits
        attn = block.attn
        with torch.no_grad():
            attn.b_O.add_(einops.einsum(attn.b_V, attn.W_O, "head_index d_head, head_index d_head d_model -> d_model"))
            attn.stored("b_V").zero_()
    assert (folded(TOKENS).log_softmax(-1) - before).abs().max() > 1e-3


# --- generation ---------------------------------------------------------------------------------
def test_greedy_generation_matches_hugging_face():
    """A prompt longer than the window: the sliding blocks' key/value cache must forget what leaves it."""
    hf_model = tiny_gpt_oss(seed=3)
    model = from_pretrained(hf_model)
    prompt = random_tokens(1, 6, seed=7)
    ours = model.generate(prompt, max_new_tokens=10, temperature=0, stop_at_eos=False)
    assert torch.equal(ours, hf_model.generate(prompt, max_new_tokens=10, do_sample=False))
    assert torch.equal(model.generate(prompt, max_new_tokens=10, temperature=0, use_kv_cache=False), ours)
    tokens, mask = left_padded(random_tokens(3, 6, seed=8), (2, 0, 3))
    theirs = hf_model.generate(tokens, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    ours = model.generate(tokens, attention_mask=mask, max_new_tokens=6, temperature=0, stop_at_eos=False)
    assert torch.equal(ours, theirs)


# --- refusals -----------------------------------------------------------------------------------
UNSUPPORTED = {
    "rope_type='dynamic'": ("rope_parameters", {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}),
    "partial_rotary_factor=0.5": (
        "rope_parameters",
        {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5},
    ),
    "rope_parameters per layer type": (
        "rope_parameters",
        {"sliding_attention": {"rope_type": "default"}, "full_attention": {"rope_type": "default"}},
    ),
    "yarn rope_parameters without original_max_position_embeddings": (
        "rope_parameters",
        {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4},
    ),
    "layer_types ['chunked_attention']": ("layer_types", ["sliding_attention", "chunked_attention"]),
    "sliding_window=None": ("sliding_window", None),
    "quantization_config (mxfp4": ("quantization_config", {"quant_method": "mxfp4"}),
}


@pytest.mark.parametrize("feature", sorted(UNSUPPORTED))
def test_unsupported_config_values_are_refused_by_name(feature):
    hf_config = HFGptOssConfig(**{**COMMON, "num_hidden_layers": 2})
    field, value = UNSUPPORTED[feature]
    setattr(hf_config, field, value)
    with pytest.raises(ValueError, match=r"gpt_oss config has features not implemented here: .*" + re.escape(feature)):
        config_from_hf(hf_config)


def test_bad_configs_and_checkpoints_are_refused(pair):
    hf_model, _ = pair
    with pytest.raises(ValueError, match=r"layer_types must be a tuple of n_layers=2 names"):
        GptOssConfig(n_layers=2, layer_types=("sliding_attention",))
    with pytest.raises(ValueError, match=r"experts_per_token=5 must be at most n_experts=4"):
        GptOssConfig(n_experts=4, experts_per_token=5)
    with pytest.raises(ValueError, match=r"swiglu_limit must be a finite number > 0, got -1"):
        GptOssConfig(swiglu_limit=-1)
    with pytest.raises(ValueError, match=r"yarn beta_fast must be a finite number > 0"):
        RopeScaling("yarn", 4.0, beta_fast=0.0)
    with pytest.raises(ValueError, match=r"rope scaling \['truncate'\] belong to kind 'yarn'"):
        RopeScaling("linear", 4.0, truncate=False)
    state = {name: t for name, t in hf_model.state_dict().items() if not name.endswith("self_attn.sinks")}
    missing = r"missing 2 tensor\(s\): layers\.0\.self_attn\.sinks, layers\.1\.self_attn\.sinks"
    with pytest.raises(CheckpointError, match=missing):
        convert_state_dict(state, config_from_hf(hf_model.config))


# --- the hook contract and the analysis tools ----------------------------------------------------
def test_hook_names_and_shapes_in_order(pair):
    _, model = pair
    batch, pos = 2, 5
    shapes = model.hook_shapes(batch, pos)
    queries, keys, square = (batch, pos, 4, 16), (batch, pos, 2, 16), (batch, 4, pos, pos)
    expected = [
        ("hook_resid_pre", (batch, pos, 48)),
        ("ln1.hook_scale", (batch, pos, 1)),
        ("ln1.hook_normalized", (batch, pos, 48)),
        ("attn.hook_q", queries),
        ("attn.hook_k", keys),
        ("attn.hook_v", keys),
        ("attn.hook_rot_q", queries),
        ("attn.hook_rot_k", keys),
        ("attn.hook_attn_scores", square),
        ("attn.sinks.hook_logits", (batch, 4, pos, 1)),
        ("attn.hook_pattern", square),
        ("attn.hook_z", queries),
        ("hook_attn_out", (batch, pos, 48)),
        ("hook_resid_mid", (batch, pos, 48)),
        ("ln2.hook_scale", (batch, pos, 1)),
        ("ln2.hook_normalized", (batch, pos, 48)),
        ("mlp.hook_router_logits", (batch, pos, 4)),
        ("mlp.hook_expert_weights", (batch, pos, 4)),
        ("mlp.hook_expert_indices", (batch, pos, 2)),
        ("mlp.hook_routing_weights", (batch, pos, 2)),
    ]
    for e in range(4):
        expected += [(f"mlp.experts.{e}.hook_{name}", (batch, pos, 24)) for name in ("pre", "pre_linear", "post")]
    expected += [("hook_mlp_out", (batch, pos, 48)), ("hook_resid_post", (batch, pos, 48))]
    assert [(name, tuple(shapes[name])) for name in shapes if name.startswith("blocks.0.")] == [
        ("blocks.0." + name, shape) for name, shape in expected
    ]
    assert list(shapes)[0] == "hook_embed" and model.act_name("sink_logits", 1) == "blocks.1.attn.sinks.hook_logits"


def test_the_analysis_tools_run_unchanged():
    """Direct logit attribution, the experts' writes, patching, edge attribution with experts as nodes, the report."""
    model = perturbed_decoder(
        GptOssConfig(
            d_model=16,
            n_layers=2,
            n_heads=4,
            n_key_value_heads=2,
            d_head=4,
            d_mlp=8,
            n_experts=4,
            experts_per_token=2,
            d_vocab=31,
            n_ctx=12,
            sliding_window=3,
            swiglu_limit=1.0,
            rope_scaling=RopeScaling("yarn", 4.0, original_max_position_embeddings=4, truncate=False),
        )
    )
    logits, cache = model.run_with_cache(CLEAN)
    right, wrong = ANSWERS
    attr = attribution.direct_logit_attribution(cache, right, wrong)
    rows = torch.arange(2)
    torch.testing.assert_close(attr.total(), logits[rows, -1, right] - logits[rows, -1, wrong], atol=1e-10, rtol=0)
    split = experts.expert_logit_attribution(cache, right, wrong)
    torch.testing.assert_close(split.total(), attr.mlp[split.layers], atol=1e-10, rtol=0)
    part = model.blocks[1].mlp
    writes = part.expert_writes(cache.__getitem__)
    torch.testing.assert_close(writes.sum(dim=0), cache["blocks.1.hook_mlp_out"], atol=1e-12, rtol=0)

    metric = patching.logit_diff_metric(right, wrong, pos=-1)
    heads = patching.patch_head_outputs(model, CLEAN, CORRUPTED, metric, progress=False)
    assert heads.shape == (2, 4) and bool((heads != heads[0, 0]).any())
    edges = edge_attribution_patching(model, CLEAN, CORRUPTED, logit_diff_per_row(right, wrong))
    assert [name for name in edges.upstream if name.startswith("MLP0")] == [f"MLP0.E{e}" for e in range(4)]
    assert edges.reads["MLP0.E2"] == ("MLP0",) and edges.reads["L1H3"] == ("L1H3.q", "L1K1.k", "L1K1.v")
    report = build_report(model, CLEAN[0])
    assert [section.key for section in report.sections] == list(EXPERTS_DISPLAY_ORDER)
