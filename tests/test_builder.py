"""The builder: any classic design in one call, refused at build time when it cannot be, read by every tool.

- Each refusal names the field, what it takes and what it got, before any weight exists.
- What a built model is follows from its parts: hooks, hook names and capabilities.
- ``load_from_modules`` refuses what does not fit, by name.
- The tools work on a built model as on a shipped family: direct logit attribution sums to the logit
  difference, patching the whole clean stream gives the clean metric, edge attribution's edges sum to
  attribution patching's scores, weight processing keeps the log-probabilities (or is refused, post-norm),
  the report builds (each checked against the model's own forward).
"""

import copy

import pytest
import torch
from torch import nn

from analysis.discovery import attribution_patching, edge_attribution_patching, logit_diff_per_row, sites
from analysis.patching import logit_diff_metric, patch_residual
from analysis.readouts.attribution import direct_logit_attribution
from analysis.report import build_report
from interp_transformer.builder import (
    DecoderSpec,
    EncoderDecoderSpec,
    EncoderSpec,
    build_decoder,
    build_encoder,
    build_encoder_decoder,
    load_from_modules,
    weights_from_modules,
)
from interp_transformer.core.strict import CheckpointError
from interp_transformer.models import processing

from .perturbed import ANSWERS, CLEAN, CORRUPTED, SMALL_SHAPE, perturb

SHAPE = {key: value for key, value in SMALL_SHAPE.items() if key != "d_head"}

REFUSALS = [  # (spec class, fields, what the message says)
    (DecoderSpec, dict(placement="post", norm="none"), "placement='post' .* needs a norm, got norm='none'"),
    (DecoderSpec, dict(experts=dict(n_experts=2, top_k=3)), "top_k=3 must be at most n_experts=2"),
    (DecoderSpec, dict(positions="alibi", alibi_slopes=(1.0, -0.5, 0.25, 0.125)), r"positive and finite.*\[-0.5\]"),
    (DecoderSpec, dict(positions="alibi", alibi_slopes=(1.0, 0.5)), r"one slope per head \(4\), got \(1.0, 0.5\)"),
    (DecoderSpec, dict(positions="relative_clipped", max_distance=0), "max_distance must be a positive int, got 0"),
    (DecoderSpec, dict(positions="relative_clipped"), "needs max_distance"),
    (DecoderSpec, dict(activation="gelu_neww"), r"activation must be one of .* got 'gelu_neww'; closest: \['gelu_new'"),
    (DecoderSpec, dict(positions="rotry"), r"positions must be one of .* got 'rotry'; closest: \['rotary'\]"),
    (DecoderSpec, dict(norm="layernorm"), r"norm must be one of \('layer', .* got 'layernorm'"),
    (DecoderSpec, dict(placement="sandwich"), r"placement must be one of \('pre', 'post', 'output'\), got 'sandwich'"),
    (DecoderSpec, dict(d_model=20, n_heads=4, positions="rotary"), "d_head must be even, got 5"),
    (DecoderSpec, dict(d_model=30, n_heads=4), "d_model=30 must be a multiple of n_heads=4"),
    (DecoderSpec, dict(d_model=15, n_heads=3, positions="sinusoidal_interleaved"), "d_model must be even, got 15"),
    (DecoderSpec, dict(alibi_slopes=(1.0,) * 4), "alibi_slopes is read only with positions='alibi'"),
    (DecoderSpec, dict(positions="rotary", max_distance=3), "max_distance is read only with positions='relative_"),
    (DecoderSpec, dict(rotary_base=500.0), "rotary_base is read only with positions='rotary'"),
    (DecoderSpec, dict(positions="rotary", rotary_base=1.0), "rotary_base must be a finite number > 1"),
    (DecoderSpec, dict(norm_eps=0.0), "norm_eps must be a finite number > 0, got 0.0"),
    (DecoderSpec, dict(attn_scale=-1.0), "attn_scale must be a finite number > 0"),
    (DecoderSpec, dict(embed_scale="sqrt"), "embed_scale must be None, a number or 'sqrt_d_model', got 'sqrt'"),
    (DecoderSpec, dict(experts=dict(n_experts=4, top_k=2, shared=1)), r"experts has unknown fields \['shared'\]"),
    (DecoderSpec, dict(experts=dict(n_experts=4, top_k=2, expert_mlp="swiglu")), "expert_mlp must be one of"),
    (DecoderSpec, dict(experts=dict(n_experts=4, top_k=2), gated_mlp=True), "leave gated_mlp=False"),
    (DecoderSpec, dict(d_mlp=None, placement="post"), "d_mlp=None .* pre-norm block without an MLP"),
    (DecoderSpec, dict(causal="yes"), "causal must be a bool, got 'yes'"),
    (EncoderSpec, dict(positions="rotary"), r"positions must be one of \('learned', 'sinusoidal', 'sinusoidal_inter"),
    (EncoderSpec, dict(norm="none"), r"norm must be one of \('layer', 'layer_unbiased', 'rms'\), got 'none'"),
    (EncoderDecoderSpec, dict(positions="alibi"), "positions must be one of"),
    (EncoderDecoderSpec, dict(pad_token_id=31), r"pad_token_id must be a token id in \[0, d_vocab=31\), got 31"),
    (EncoderDecoderSpec, dict(placement="middle"), "placement must be one of"),
]


@pytest.mark.parametrize(
    "spec, fields, message", REFUSALS, ids=[f"{s.__name__}-{'-'.join(f)}-{i}" for i, (s, f, _) in enumerate(REFUSALS)]
)
def test_a_design_that_cannot_be_built_is_refused_by_name(spec, fields, message):
    with pytest.raises((ValueError, TypeError), match=message):
        spec(**{**SHAPE, **fields})


def test_d_head_is_derived_and_the_spec_reads_as_the_parts_config():
    spec = DecoderSpec(**SHAPE, activation="relu", norm_eps=1e-6)
    assert (spec.d_head, spec.act_fn, spec.layer_norm_eps, spec.attn_only) == (4, "relu", 1e-6, False)
    assert spec.replace(placement="post").placement == "post"
    assert DecoderSpec(**{**SHAPE, "d_model": 18, "n_heads": 3}, positions="sinusoidal_interleaved").d_head == 6
    with pytest.raises(ValueError, match="norm='none'"):
        spec.replace(placement="post", norm="none")


def test_hooks_and_capabilities_follow_the_parts():
    rotary = build_decoder(**SHAPE, positions="rotary", seed=0)
    assert "hook_pos_embed" not in rotary.hook_dict and "blocks.0.attn.hook_rot_q" in rotary.hook_dict
    assert rotary.hook_names.input_writers == ("embed",)
    with pytest.raises(KeyError, match="positions \\(rotary\\) act inside attention"):
        rotary.act_name("pos_embed")
    post = build_decoder(**SHAPE, placement="post", final_norm=False, seed=0)
    caps = post.capabilities
    assert (caps.norm_placement, caps.final_norm, caps.additive_residual) == ("post", None, False)
    assert post.act_name("normalized_resid_post", -1) == "blocks.1.hook_normalized_resid_post"
    with pytest.raises(KeyError, match="no final norm"):
        post.act_name("scale")
    bidirectional = build_decoder(**SHAPE, causal=False, seed=0)
    assert not bidirectional.capabilities.causal and not bidirectional.capabilities.next_token_logits
    alibi = build_decoder(**SHAPE, positions="alibi", seed=0)
    assert alibi.act_name("alibi", 0) == alibi.act_name("score_bias", 0) == "blocks.0.attn.score_bias.hook_bias"
    moe = build_decoder(**SHAPE, experts=dict(n_experts=3, top_k=2, router_bias=True), seed=0)
    assert moe.has_experts and moe.blocks[0].mlp.b_router is not None
    assert type(moe.blocks[0].mlp.experts[0]).__name__ == "MLP"


def test_every_hook_name_in_the_table_is_a_hook_of_the_model():
    for fields in (
        dict(positions="rotary", gated_mlp=True),
        dict(placement="post"),
        dict(positions="alibi"),
        dict(positions="relative_clipped", max_distance=2, experts=dict(n_experts=2, top_k=1)),
    ):
        model = build_decoder(**SHAPE, **fields, seed=0)
        names = model.hook_names
        for key in names.layer_keys:
            if key in ("scale", "normalized", "result"):
                continue
            assert model.act_name(key, 0) in model.hook_dict, (fields, key)
        assert all(template in model.hook_dict for template in names.global_keys.values()), fields


def test_a_bias_the_design_lacks_is_held_at_zero():
    model = build_decoder(**SHAPE, attn_bias=False, mlp_bias=False, readout_bias=False, seed=0)
    frozen = sorted({name.rsplit(".", 1)[-1] for name, p in model.named_parameters() if not p.requires_grad})
    assert frozen == ["b_K", "b_O", "b_Q", "b_U", "b_V", "b_in", "b_out"]
    assert all(float(p.abs().max()) == 0 for p in model.parameters() if not p.requires_grad)


def test_a_bias_frozen_by_its_user_still_loads_only_one_held_at_zero_is_refused():
    model = build_decoder(**SHAPE, seed=0)
    model.blocks[0].attn.b_Q.requires_grad_(False)  # frozen for training, not absent from the design
    linears = tuple(nn.Linear(16, 16) for _ in range(4))
    loaded = weights_from_modules(model, {"blocks.0.attn": linears})
    torch.testing.assert_close(loaded["blocks.0.attn.b_Q"], linears[0].bias.detach().reshape(4, 4), rtol=0, atol=0)
    held = build_decoder(**SHAPE, attn_bias=False, seed=0)
    assert held.blocks[0].attn.held_at_zero == {"b_Q", "b_K", "b_V", "b_O"}
    with pytest.raises(ValueError, match="holds b_Q at zero"):
        weights_from_modules(held, {"blocks.0.attn": linears})


def test_load_from_modules_refuses_what_does_not_fit():
    model = build_decoder(**SHAPE, attn_bias=False, seed=0)
    with pytest.raises(ValueError, match="blocks.0.attn: the source has a non-zero bias where our part holds b_Q"):
        load_from_modules(model, {"blocks.0.attn": tuple(nn.Linear(16, 16) for _ in range(4))})
    with pytest.raises(ValueError, match=r"blocks.0.mlp: the source's linear weight \(16, 16\) has 16 output feat"):
        load_from_modules(model, {"blocks.0.mlp": (nn.Linear(16, 16), nn.Linear(24, 16))})
    with pytest.raises(KeyError, match="'blocks.0.atn' names no part of the model; closest"):
        load_from_modules(model, {"blocks.0.atn": nn.Linear(16, 16)})
    with pytest.raises(ValueError, match="left over"):
        load_from_modules(model, {"blocks.0.mlp": (nn.Linear(16, 24),)})
    with pytest.raises(CheckpointError, match="missing"):
        load_from_modules(model, {"embed": nn.Embedding(31, 16)})


def test_a_fused_projection_and_a_tied_read_out_load_as_ours():
    model = build_decoder(**SHAPE, readout_bias=False, seed=0, dtype=torch.float64)
    fused, out, embedding = nn.Linear(16, 48).double(), nn.Linear(16, 16).double(), nn.Embedding(31, 16).double()
    state = weights_from_modules(model, {"blocks.0.attn": (fused, out), "unembed": embedding})
    x = torch.randn(1, 3, 16, dtype=torch.float64)
    q = torch.einsum("bpd,hde->bphe", x, state["blocks.0.attn.W_Q"]) + state["blocks.0.attn.b_Q"]
    expected = fused(x)[..., :16].reshape(1, 3, 4, 4)
    torch.testing.assert_close(q, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(state["unembed.W_U"], embedding.weight.T, rtol=0, atol=0)


DESIGNS_FOR_TOOLS = {
    "alibi": dict(positions="alibi", alibi_slopes=(1.0, 0.25, 0.0625, 0.015625)),
    "relative_moe": dict(
        positions="relative_clipped", max_distance=2, experts=dict(n_experts=3, top_k=2, router_bias=True)
    ),
    "rotary_gated_rms": dict(positions="rotary", norm="rms", gated_mlp=True, activation="silu"),
    "post_norm_final_norm": dict(placement="post", final_norm=True),
}


@pytest.fixture(scope="module", params=sorted(DESIGNS_FOR_TOOLS))
def built(request):
    return perturb(build_decoder(**SHAPE, **DESIGNS_FOR_TOOLS[request.param], dtype=torch.float64, seed=0))


def test_direct_logit_attribution_sums_to_the_logit_difference(built):
    logits, cache = built.run_with_cache(CLEAN)
    if not built.capabilities.linear_logits:
        with pytest.raises(TypeError, match="direct_logit_attribution needs next-token logits read linearly"):
            direct_logit_attribution(cache, ANSWERS[0], ANSWERS[1])
        return
    result = direct_logit_attribution(cache, ANSWERS[0], ANSWERS[1])
    rows = torch.arange(2)
    expected = logits[rows, -1, ANSWERS[0]] - logits[rows, -1, ANSWERS[1]]
    torch.testing.assert_close(result.total(), expected, rtol=0, atol=1e-10)


def test_patching_the_whole_clean_stream_gives_the_clean_metric(built):
    metric = logit_diff_metric(ANSWERS[0], ANSWERS[1])
    results = patch_residual(built, CLEAN, CORRUPTED, metric, per_position=False, progress=False)
    with torch.no_grad():
        clean = float(metric(built(CLEAN)))
    torch.testing.assert_close(results, torch.full_like(results, clean), rtol=0, atol=1e-10)


def test_edges_sum_to_attribution_patching_at_the_input(built):
    metric = logit_diff_per_row(*ANSWERS)
    edges = edge_attribution_patching(built, CLEAN, CORRUPTED, metric)
    rows = [row for row, name in enumerate(edges.upstream) if name == "input"]
    atp = attribution_patching(built, CLEAN, CORRUPTED, metric, [sites(built, "resid_pre", layers=[0])[0]])[0]
    torch.testing.assert_close(edges.scores[rows].sum(dim=(0, 1)), atp, rtol=0, atol=1e-10)
    assert bool((atp.abs() > 1e-6).all())


def test_weight_processing_keeps_the_log_probabilities(built):
    processed = copy.deepcopy(built)
    if not built.capabilities.additive_residual:
        with pytest.raises(ValueError, match="post-norm"):
            processing.process_weights(processed)
        return
    processing.process_weights(processed)
    assert processed.processing[0] == "fold_ln"
    with torch.no_grad():
        before, after = built(CLEAN).log_softmax(-1), processed(CLEAN).log_softmax(-1)
    torch.testing.assert_close(after, before, rtol=0, atol=1e-10)


def test_the_report_builds_for_a_built_model():
    model = perturb(build_decoder(**SHAPE, positions="alibi", seed=0))
    report = build_report(model, CLEAN[:1], title="built")
    keys = [section.key for section in report.sections]
    assert "attention" in keys and "model" in keys and "<section" in report.to_html()


def test_encoder_and_encoder_decoder_builders_give_their_model_classes():
    encoder = build_encoder(**SHAPE, positions="sinusoidal", embed_norm=False, seed=0)
    assert type(encoder).__name__ == "EncoderTransformer" and encoder.capabilities.embedding_norm is None
    assert encoder(CLEAN).shape == (2, 6, 31)
    seq2seq = build_encoder_decoder(**SHAPE, placement="pre", final_norm=False, separate_embeddings=True, seed=0)
    assert type(seq2seq).__name__ == "EncoderDecoderTransformer" and seq2seq.decoder_embed is not None
    assert seq2seq.capabilities.final_norm is None and seq2seq(CLEAN + 3, CLEAN[:, :3] + 3).shape == (2, 3, 31)
