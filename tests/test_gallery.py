"""The gallery (docs/gallery.md): sixteen classic designs, each one builder call, each verified hook by hook in float64.

Every design's reference is written from scratch in plain PyTorch (``gallery_references``), its
weights moved off their init and loaded part by part (``load_from_modules``); every mapped hook and
the output must agree within 1e-10. Each check can fail: described with one part wrong (the norm's
place or eps, the activation, the mask, the ALiBi slopes, the sinusoid table's order, ...), the
same weights diverge, and the report names where.
"""

import pytest
import torch

from .gallery_designs import DESIGNS, GALLERY, hook_map, model_of, reference_of, verify_design

ATOL = 1e-10


def test_the_gallery_holds_sixteen_designs_with_distinct_names():
    assert len(GALLERY) == len(DESIGNS) == 16


@pytest.mark.parametrize("design", GALLERY, ids=[design.name for design in GALLERY])
def test_each_design_matches_its_reference_hook_by_hook(design):
    report = verify_design(design)
    assert report.ok, str(report)
    compared = {row.hook for row in report.rows}
    assert compared == set(hook_map(design)) | ({"logits"} if design.logits else set())
    assert max(row.max_abs_diff for row in report.rows) < ATOL
    assert len(compared) >= 12  # the embeddings or their norm, and every block's norms, sublayers and stream


def test_the_annotated_decoders_log_probabilities_equal_its_generators():
    """Its forward ends in a log-softmax: ours gives logits, whose log-softmax is theirs."""
    design = DESIGNS["annotated"]
    reference = reference_of(design)
    model = model_of(design, reference)
    with torch.no_grad():
        diff = (model(design.tokens).log_softmax(-1) - reference(design.tokens)).abs().max()
    assert float(diff) < ATOL


MISTAKES = [  # (design, the description changed to, the first hook where the same weights diverge)
    ("gpt2_pre", dict(placement="post"), "blocks.0.hook_attn_out"),
    ("annotated", dict(norm_eps=1e-5), "blocks.0.ln1.hook_normalized"),
    ("bert_segments_padding", dict(norm_eps=1e-5), "embed_ln.hook_normalized"),
    ("annotated", dict(norm="layer"), "blocks.0.ln1.hook_normalized"),
    ("gpt2_pre", dict(activation="gelu_new"), "blocks.0.mlp.hook_post"),
    ("bert_mlm_pre", dict(causal=True), "blocks.0.hook_attn_out"),
    ("alibi_from_one", dict(alibi_slopes=None), "blocks.0.attn.score_bias.hook_bias"),
    ("annotated", dict(positions="sinusoidal"), "blocks.0.hook_resid_pre"),
    ("seq2seq_post_shared", dict(positions="sinusoidal_interleaved"), "encoder.blocks.0.hook_resid_pre"),
    ("rotary", dict(rotary_interleaved=True), "blocks.0.hook_attn_out"),
    ("t5_style", dict(attn_scale=None), "encoder.blocks.0.hook_attn_out"),
    ("t5_style", dict(max_distance=40), "encoder.rel_pos_bias.hook_bias"),
    ("seq2seq_pre_separate", dict(embed_scale=None), "encoder.blocks.0.hook_resid_pre"),
    ("moe", dict(experts=dict(n_experts=4, top_k=2, router_bias=True, renormalize=False)), "blocks.0.hook_mlp_out"),
]


@pytest.mark.parametrize("name, wrong, where", MISTAKES, ids=[f"{n}-{next(iter(w))}" for n, w, _ in MISTAKES])
def test_a_part_described_wrong_is_found_where_it_acts(name, wrong, where):
    design = DESIGNS[name]
    report = verify_design(design, **wrong)
    assert not report.ok and report.first_divergence == where, str(report)
