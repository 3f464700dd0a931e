"""Circuit discovery on builder decoders the shipped families do not cover: no norms at all (plain, gated and expert
MLPs) and post-norm mixtures of experts.

On each (float64, every parameter perturbed off its init):

- each node's edges sum to its attribution-patching score (a mixture's experts together: AtP at its output);
- ``run_circuit`` with every edge kept is the clean run, with none the corrupted one, and so are the ends of
  ``faithfulness_curve``;
- made linear (activations the identity, a router that reads nothing, ``W_Q = W_K = 0``: uniform attention;
  a post-norm stream's norms ``x w + b``), every edge's EAP score is patching that edge, EAP-IG is EAP, and the
  edges into the logits sum to the total effect.

A norm-free decoder's MLPs read the stream itself; a mixture of experts lists no input projections, so its input
is reached through the part itself (``graph.MLP_READS``).
"""

import pytest
import torch

from analysis.discovery import (
    attribution_patching,
    edge_attribution_patching,
    faithfulness_curve,
    logit_diff_per_row,
    run_circuit,
    sites,
)
from interp_transformer.builder import build_decoder

from .perturbed import ANSWERS, CLEAN, CORRUPTED, LinearNorm, perturb

METRIC = logit_diff_per_row(*ANSWERS)
SHAPE = dict(d_model=16, n_layers=2, n_heads=4, d_mlp=24, d_vocab=31, n_ctx=12)
EXPERTS = dict(n_experts=4, top_k=2)
GATED_EXPERTS = dict(EXPERTS, expert_mlp="gated", router_bias=True)
SPECS = {
    "no_norm_mlp": dict(norm="none"),
    "no_norm_gated_mlp": dict(norm="none", gated_mlp=True, activation="silu"),
    "no_norm_experts": dict(norm="none", d_mlp=8, experts=EXPERTS),
    "no_norm_gated_experts": dict(norm="none", d_mlp=8, experts=GATED_EXPERTS, activation="silu"),
    "post_norm_experts": dict(placement="post", d_mlp=8, experts=EXPERTS),
    "post_norm_rms_gated_experts": dict(placement="post", norm="rms", d_mlp=8, experts=GATED_EXPERTS),
}


def decoder(name: str):
    return perturb(build_decoder(**{**SHAPE, **SPECS[name]}, dtype=torch.float64, seed=0))


def linear(name: str):
    """The decoder made linear in its input (module docstring)."""
    model = decoder(name)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.W_Q.zero_()
            block.attn.stored("W_K").zero_()
            experts = list(getattr(block.mlp, "experts", []))
            if experts:  # a router reading nothing routes every token to the same experts, with the same weights
                block.mlp.W_router.zero_()
            for part in experts or [block.mlp]:  # a gated MLP's gate is 1: act(gate) * up
                part.act_fn = torch.ones_like if hasattr(part, "W_gate") else (lambda x: x)
            if model.cfg.placement == "post":
                block.ln1, block.ln2 = (LinearNorm(model.cfg.d_model, generator, torch.float64) for _ in range(2))
        if model.cfg.placement == "post":
            model.ln_final = LinearNorm(model.cfg.d_model, generator, torch.float64)
    model.setup()
    return model.eval()


@pytest.fixture(scope="module", params=sorted(SPECS))
def model(request):
    return decoder(request.param)


@pytest.fixture(scope="module")
def edges(model):
    return edge_attribution_patching(model, CLEAN, CORRUPTED, METRIC)


def metric_of(model, tokens):
    with torch.no_grad():
        return METRIC(model(tokens), torch.arange(len(tokens))).double()


def _node_site(model, name: str):
    """The attribution-patching site whose score a node's edges sum to (a mixture's experts: together)."""
    if name == "input":
        return sites(model, "resid_pre", layers=[0])[0]
    if name.startswith("MLP"):
        return sites(model, "mlp_out", layers=[int(name[3:].split(".")[0])])[0]
    return next(site for site in sites(model, "heads", layers=[int(name[1:].split("H")[0])]) if site.label == name)


def test_each_nodes_edges_sum_to_its_attribution_patching_score(model, edges):
    by_site: dict = {}
    for row, name in enumerate(edges.upstream):
        by_site.setdefault(_node_site(model, name), []).append(row)
    atp = attribution_patching(model, CLEAN, CORRUPTED, METRIC, list(by_site))
    for index, rows in enumerate(by_site.values()):
        torch.testing.assert_close(edges.scores[rows].sum(dim=(0, 1)), atp[index], rtol=0, atol=1e-10)
    assert bool((atp.abs() > 1e-6).all())
    if model.cfg.experts is not None:  # experts are nodes, read by their mixture's input
        assert [name for name in edges.upstream if name.startswith("MLP1")] == [f"MLP1.E{e}" for e in range(4)]
        assert edges.reads["MLP1.E2"] == ("MLP1",) and edges.edge[edges.upstream.index("MLP0.E3")].any()


def test_run_circuit_keeping_every_edge_is_the_clean_run_and_none_the_corrupted(model, edges):
    clean, corrupt = metric_of(model, CLEAN), metric_of(model, CORRUPTED)
    assert float((clean - corrupt).abs().min()) > 1e-3
    every = run_circuit(model, CLEAN, CORRUPTED, METRIC, edges.edge.clone())
    none = run_circuit(model, CLEAN, CORRUPTED, METRIC, torch.zeros_like(edges.edge))
    torch.testing.assert_close(every, clean, rtol=0, atol=1e-10)
    torch.testing.assert_close(none, corrupt, rtol=0, atol=1e-10)
    mean = run_circuit(model, CLEAN, CORRUPTED, METRIC, edges.edge.clone(), ablation="mean")
    torch.testing.assert_close(mean, clean, rtol=0, atol=1e-10)


def test_eap_ig_runs_and_the_faithfulness_curves_ends_are_the_two_runs(model, edges):
    ig = edge_attribution_patching(model, CLEAN, CORRUPTED, METRIC, method="EAP-IG", steps=2)
    assert ig.scores.isfinite().all() and float(ig.scores.abs().max()) > 1e-3
    n_edges = int(edges.edge.sum())
    curve = faithfulness_curve(model, CLEAN, CORRUPTED, METRIC, ig, [0, 5, n_edges])
    torch.testing.assert_close(curve.clean, metric_of(model, CLEAN), rtol=0, atol=1e-10)
    torch.testing.assert_close(curve.corrupted, metric_of(model, CORRUPTED), rtol=0, atol=1e-10)
    torch.testing.assert_close(curve.metric[0], curve.corrupted, rtol=0, atol=1e-10)
    torch.testing.assert_close(curve.metric[-1], curve.clean, rtol=0, atol=1e-10)
    torch.testing.assert_close(curve.normalized[[0, -1]], torch.tensor([0.0, 1.0], dtype=torch.float64))


@pytest.fixture(scope="module", params=sorted(SPECS))
def linear_model(request):
    return linear(request.param)


@pytest.fixture(scope="module")
def linear_edges(linear_model):
    return edge_attribution_patching(linear_model, CLEAN, CORRUPTED, METRIC)


def test_on_a_linear_model_every_edges_score_is_patching_that_edge(linear_model, linear_edges):
    """``run_circuit`` with the prompts swapped runs the corrupted prompts and feeds dropped edges the clean writes:
    dropping one edge alone is patching it clean."""
    corrupt, edges = metric_of(linear_model, CORRUPTED), linear_edges
    assert int(edges.edge.sum()) >= 40
    for i, j in edges.edge.nonzero().tolist():
        alone = edges.edge.clone()
        alone[i, j] = False
        patched = run_circuit(linear_model, CORRUPTED, CLEAN, METRIC, alone)
        torch.testing.assert_close(edges.scores[i, j], patched - corrupt, rtol=0, atol=1e-10)
    assert float(edges.scores.abs().max()) > 0.1


@pytest.mark.parametrize("ig_on", ["inputs", "activations"])
def test_on_a_linear_model_eap_ig_is_eap_and_its_logits_edges_sum_to_the_total_effect(
    linear_model, linear_edges, ig_on
):
    ig = edge_attribution_patching(linear_model, CLEAN, CORRUPTED, METRIC, method="EAP-IG", steps=3, ig_on=ig_on)
    torch.testing.assert_close(ig.scores, linear_edges.scores, rtol=0, atol=1e-10)
    total = metric_of(linear_model, CLEAN) - metric_of(linear_model, CORRUPTED)
    torch.testing.assert_close(ig.scores[:, ig.readers.index("logits")].sum(dim=0), total, rtol=0, atol=1e-10)
    assert float(total.abs().min()) > 0.01


def test_a_stream_norm_whose_output_no_hook_holds_is_refused_by_name():
    """The parts after a stream norm read its output: with no hook on it (``NoNorm`` in a post-norm block's place),
    edges through it cannot be followed."""
    from interp_transformer.parts import NoNorm

    model = decoder("post_norm_experts")
    model.blocks[1].ln1 = NoNorm()
    model.setup()
    for tool in (
        lambda: edge_attribution_patching(model, CLEAN, CORRUPTED, METRIC),
        lambda: run_circuit(model, CLEAN, CORRUPTED, METRIC, torch.zeros(1, 1, dtype=torch.bool)),
    ):
        with pytest.raises(ValueError, match="block 1's stream norm 'ln1' \\(NoNorm\\) has no hook_normalized"):
            tool()
