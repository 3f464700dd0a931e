"""Models whose circuits are known by construction, and every discovery method scored against them.

Each model's circuit is confirmed by patching before any method is scored on it: the known edges alone carry the
behaviour, and ablating any one of them breaks it. The scores (AUROC, precision at the known size, MIB's CPR and
CMD) are checked on hand-made cases whose answers are known: a perfect and a reversed scorer, a hand-computed curve.
"""

import json
import math

import pytest
import torch

from analysis.cli import EXIT_OK, EXIT_USAGE, main
from analysis.discovery import EdgeScores, build_graph, edge_attribution_patching, run_circuit
from analysis.discovery.ground_truth import GROUND_TRUTHS, check_names, ground_truth, known_mask, read_edges
from analysis.discovery.ground_truth_scoring import (
    METHODS,
    MIB_PERCENTAGES,
    auroc,
    check_sizes,
    method_scores,
    mib_areas,
    score,
)


@pytest.fixture(scope="module", params=GROUND_TRUTHS)
def gt(request):
    return ground_truth(request.param)


@pytest.fixture(scope="module")
def induction():
    return ground_truth("induction")


def _faithfulness(gt, kept) -> float:
    data = (gt.model, gt.clean, gt.corrupted, gt.metric)
    edge = build_graph(gt.model).edge_mask()
    clean, corrupted = run_circuit(*data, edge).mean(), run_circuit(*data, torch.zeros_like(edge)).mean()
    return float((run_circuit(*data, kept).mean() - corrupted) / (clean - corrupted))


# --- the models: each circuit confirmed by patching ------------------------------------------------------------


def test_each_known_circuit_carries_the_behaviour_and_each_of_its_edges_is_needed(gt):
    """The circuit alone (every other edge fed its corrupted value) keeps the metric; without any one of its edges
    the behaviour is gone. The task has a real gap between the clean and corrupted prompts."""
    with torch.no_grad():
        rows = torch.arange(len(gt.clean))
        gap = gt.metric(gt.model(gt.clean), rows).mean() - gt.metric(gt.model(gt.corrupted), rows).mean()
    assert gap > 3
    known = gt.known()
    assert 0.9 < _faithfulness(gt, known) < 1.1
    edge = build_graph(gt.model).edge_mask()
    for i, j in known.nonzero().tolist():
        without = edge.clone()
        without[i, j] = False
        assert abs(_faithfulness(gt, without)) < 0.2, gt.edges


def test_the_ground_truths_cover_grouped_keys_and_values_and_experts():
    assert ground_truth("copy-gqa").model.cfg.n_key_value_heads == 2
    assert ground_truth("mlp-moe").model.cfg.experts.n_experts == 2
    assert ("L0H0", "L1K0.k") in ground_truth("induction").edges  # K-composition


def test_the_distractor_heads_cancel_together_and_move_the_metric_alone():
    """The trap is real: ablating both loud heads' edges to the logits changes nothing, ablating one changes a lot."""
    gt = ground_truth("distractor")
    scores = edge_attribution_patching(gt.model, gt.clean, gt.corrupted, gt.metric)
    edge, logits = scores.edge, scores.readers.index("logits")
    loud = [scores.upstream.index(name) for name in ("L0H1", "L0H2")]
    both, one = edge.clone(), edge.clone()
    both[loud, logits] = False
    one[loud[0], logits] = False
    assert abs(_faithfulness(gt, both) - 1) < 0.05
    assert abs(_faithfulness(gt, one) - 1) > 2


# --- scores on hand-made cases ---------------------------------------------------------------------------------


def test_auroc_of_a_perfect_scorer_is_one_of_the_reversed_zero_of_a_constant_one_half():
    edge = torch.ones(3, 4, dtype=torch.bool)
    edge[2, 0] = False
    known = torch.zeros(3, 4, dtype=torch.bool)
    known[0, 1] = known[1, 3] = True
    perfect = known.double() + 0.1 * torch.rand(3, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert auroc(perfect, edge, known) == 1.0
    assert auroc(-perfect, edge, known) == 0.0
    assert auroc(torch.zeros(3, 4), edge, known) == 0.5
    with pytest.raises(ValueError, match="known edges and other edges"):
        auroc(perfect, edge, torch.zeros_like(known))


def test_cpr_and_cmd_are_mibs_trapezoids_over_the_fraction_of_edges():
    """x = 0.1, 0.5, 1 and f = 0, 0.5, 1: CPR = 0.4 (0 + 0.5) / 2 + 0.5 (0.5 + 1) / 2 = 0.475, CMD = 0.4 (1 + 0.5) / 2
    + 0.5 (0.5 + 0) / 2 = 0.425; a curve above 1 counts |1 - f| in CMD."""
    cpr, cmd = mib_areas([10, 50, 100], [0.0, 0.5, 1.0])
    assert math.isclose(cpr, 0.475) and math.isclose(cmd, 0.425)
    cpr, cmd = mib_areas([50, 100], [1.5, 1.0])
    assert math.isclose(cpr, 0.5 * 2.5 / 2) and math.isclose(cmd, 0.5 * 0.5 / 2)
    assert MIB_PERCENTAGES == (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100)


def test_an_oracle_scores_one_and_its_curve_reaches_the_behaviour_at_the_known_size():
    gt = ground_truth("copy-gqa")
    base = edge_attribution_patching(gt.model, gt.clean, gt.corrupted, gt.metric)
    known = gt.known()
    oracle = EdgeScores(base.upstream, base.readers, base.edge, known.double()[..., None], "oracle", base.reads)
    result = score(oracle, gt, [1, 5, 50])
    n_edges = int(base.edge.sum())
    assert [int(p / 100 * n_edges) for p in (1, 5, 50)] == [0, 4, 41]  # MIB truncates: 1% of 82 edges is none
    assert result.auroc == 1.0 and result.precision == 1.0
    assert result.faithfulness[0] == 0.0 and all(abs(f - 1) < 0.1 for f in result.faithfulness[1:])
    assert (result.cpr, result.cmd) == mib_areas([1, 5, 50], result.faithfulness)


# --- the methods ------------------------------------------------------------------------------------------------


def test_eap_ig_finds_the_k_composition_edge_where_eap_misses_it(induction):
    """At the corrupted run the induction head's query (the new last token) matches no key, so the gradient at its
    keys points along that token, orthogonal to what the previous-token head changes there: EAP scores the
    K-composition edge about 0. Interpolating the inputs (EAP-IG) moves the query too, and finds it."""
    ig_scores = method_scores("eap-ig-inputs", induction)
    ig = score(ig_scores, induction)
    assert ig.auroc == 1.0 and ig.precision == 1.0
    eap = method_scores("eap", induction)
    at = (eap.upstream.index("L0H0"), eap.readers.index("L1K0.k"))
    assert abs(float(eap.mean[at])) < abs(float(ig_scores.mean[at])) / 10  # background-sized, not the edge's effect
    rank = int((eap.strength() > eap.strength()[at]).sum())
    assert rank >= len(induction.edges)  # edges outside the circuit outrank it


def test_patching_each_edge_ranks_the_known_circuit_first(induction):
    result = score(method_scores("patching", induction), induction, [10, 100])
    assert result.auroc == 1.0 and result.precision == 1.0


def test_node_methods_read_a_mixtures_experts_and_random_is_seeded():
    gt = ground_truth("mlp-moe")
    atp = method_scores("atp", gt)
    expert = atp.mean[atp.upstream.index("MLP0.E0"), atp.readers.index("logits")]
    assert float(expert) > 0 and bool(atp.mean.isfinite().all())
    first, again = method_scores("random", gt, seed=3), method_scores("random", gt, seed=3)
    assert torch.equal(first.scores, again.scores)
    assert not torch.equal(first.scores, method_scores("random", gt, seed=4).scores)


# --- bad input ---------------------------------------------------------------------------------------------------


def test_a_known_edge_naming_a_node_the_model_lacks_is_refused_by_name(induction, tmp_path):
    model = induction.model
    with pytest.raises(KeyError, match="no upstream node 'L0H7'.*did you mean"):
        known_mask(model, [("L0H7", "logits")])
    with pytest.raises(KeyError, match="no reader 'L1H0.z'.*did you mean 'L1H0.q'"):
        known_mask(model, [("L0H0", "L1H0.z")])
    with pytest.raises(ValueError, match="is no edge: L0K0.v reads before L1H0 writes"):
        known_mask(model, [("L1H0", "L0K0.v")])
    with pytest.raises(ValueError, match="at least one edge"):
        known_mask(model, [])
    path = tmp_path / "circuit.json"
    path.write_text(json.dumps([["input", "L0K0.v"], ["MLP7", "logits"]]))
    with pytest.raises(KeyError, match="no upstream node 'MLP7'"):
        known_mask(model, read_edges(path))
    path.write_text("[[1, 2, 3]]")
    with pytest.raises(ValueError, match="pair"):
        read_edges(path)


@pytest.mark.parametrize("sizes", [[0], [-5], [100.5], [float("nan")], ["5"], [True], []])
def test_sizes_outside_zero_to_a_hundred_percent_are_refused(sizes):
    with pytest.raises(ValueError, match=r"\(0, 100\]"):
        check_sizes(sizes)


def test_unknown_method_and_model_names_get_suggestions():
    with pytest.raises(ValueError, match="unknown method 'eap-ig'.*did you mean .*'eap-ig-inputs'"):
        check_names(["eap-ig"], METHODS, "method")
    with pytest.raises(ValueError, match="unknown ground-truth model 'inductoin'.*did you mean 'induction'"):
        ground_truth("inductoin")
    with pytest.raises(ValueError, match="unknown method"):
        method_scores("atp*", ground_truth("copy-gqa"))


def _one_line(capsys, *argv) -> str:
    code = main(["circuit-benchmark", *map(str, argv)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_USAGE and len(err) == 1, err
    return err[0]


def test_the_command_refuses_bad_names_and_sizes_in_one_line(capsys):
    assert "did you mean 'eap'" in _one_line(capsys, "--methods", "eap", "epa")
    assert "did you mean 'mlp-moe'" in _one_line(capsys, "--models", "mlp-mo")
    assert "(0, 100]" in _one_line(capsys, "--sizes", "0", "10")
    assert "'ten'" in _one_line(capsys, "--sizes", "ten")


def test_the_command_writes_the_table_the_page_and_mibs_files(tmp_path, capsys):
    page, mib = tmp_path / "page.html", tmp_path / "mib"
    code = main(
        ["circuit-benchmark", "--methods", "eap", "random", "--models", "copy-gqa", "--sizes", "5", "50", "100"]
        + ["--out", str(page), "--mib-out", str(mib), "--threads", "1"]
    )
    out = capsys.readouterr().out
    assert code == EXIT_OK
    assert "| eap | 1.00 / 1.00 /" in out and "| random |" in out
    text = page.read_text()
    assert "AUROC by method and model" in text and "L1H2 -&gt; logits" in text and 'src="http' not in text
    graph = json.loads((mib / "eap" / "copy_copy-gqa" / "importances.json").read_text())
    assert graph["cfg"]["n_key_value_heads"] == 2
    assert graph["edges"]["input->a1.kv1<v>"]["in_graph"] and graph["edges"]["a1.h2->logits"]["in_graph"]
    assert sum(edge["in_graph"] for edge in graph["edges"].values()) == 2
    assert len(graph["edges"]) == int(build_graph(ground_truth("copy-gqa").model).edge_mask().sum())
