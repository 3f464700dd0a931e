"""Choosing circuits from edge scores: top n, threshold, greedy from the logits, pruning; MIB's CPR and CMD.

A hand-made graph with known scores gives known answers; a real graph checks that greedy and
pruned circuits only hold nodes with a path to the logits, and that pruning never changes the
circuit's metric (a node with no path to the logits cannot change it: exact, 1e-10).
"""

import pytest
import torch

from analysis.discovery import (
    EdgeScores,
    circuit_nodes,
    edge_attribution_patching,
    faithfulness_curve,
    greedy_edges,
    logit_diff_per_row,
    prune,
    run_circuit,
    threshold_edges,
    top_edges,
)
from interp_transformer.families.llama.recipe import LlamaConfig

from .perturbed import ANSWERS, CLEAN, CORRUPTED, perturbed_decoder
from .perturbed import SMALL_SHAPE as SHAPE

METRIC = logit_diff_per_row(*ANSWERS)


def toy() -> EdgeScores:
    """input, A, B write; A reads "A.in", B reads "B.in"; A -> B.in, everything -> logits."""
    upstream, readers = ["input", "A", "B"], ["A.in", "B.in", "logits"]
    edge = torch.tensor([[1, 1, 1], [0, 1, 1], [0, 0, 1]], dtype=torch.bool)
    mean = torch.tensor([[0.5, 4.0, 0.1], [0.0, -3.0, 0.2], [0.0, 0.0, -1.0]], dtype=torch.float64)
    scores = torch.stack([mean - 0.1, mean + 0.1], dim=-1) * edge[..., None]
    return EdgeScores(upstream, readers, edge, scores, "EAP", {"input": (), "A": ("A.in",), "B": ("B.in",)})


def names(scores: EdgeScores, kept) -> set[tuple[str, str]]:
    return {(scores.upstream[i], scores.readers[j]) for i, j in kept.nonzero().tolist()}


def test_top_threshold_and_greedy_on_known_scores():
    scores = toy()
    assert names(scores, top_edges(scores, 2)) == {("input", "B.in"), ("A", "B.in")}
    assert names(scores, top_edges(scores, 1, absolute=False)) == {("input", "B.in")}
    assert names(scores, threshold_edges(scores, 0.9)) == {("input", "B.in"), ("A", "B.in"), ("B", "logits")}
    # greedy starts at the logits: the strongest edge into them is B's (-1.0), which opens B.in (input 4.0, A -3.0)
    assert names(scores, greedy_edges(scores, 1)) == {("B", "logits")}
    assert names(scores, greedy_edges(scores, 3)) == {("B", "logits"), ("input", "B.in"), ("A", "B.in")}
    with pytest.raises(ValueError, match="no edge reaches the threshold 5"):
        threshold_edges(scores, 5)
    with pytest.raises(ValueError, match="a circuit needs 1 to 6 edges"):
        top_edges(scores, 0)


def test_pruning_drops_nodes_with_no_path_to_the_logits():
    scores = toy()
    kept = torch.zeros_like(scores.edge)
    kept[0, 1] = kept[1, 0] = True  # input -> B.in and A's... nothing reads A here: A -> A.in is not an edge
    kept[0, 0] = True  # input -> A.in: A has no kept edge out, so A.in is dead
    assert not bool(prune(scores, kept).any())  # B never reaches the logits, so its input dies too
    kept[2, 2] = True  # now B -> logits
    assert names(scores, prune(scores, kept)) == {("input", "B.in"), ("B", "logits")}
    assert circuit_nodes(scores, prune(scores, kept)) == ["input", "B"]
    with pytest.raises(ValueError, match="the circuit is empty"):
        circuit_nodes(scores, torch.zeros_like(kept))


@pytest.fixture(scope="module")
def model_and_scores():
    model = perturbed_decoder(LlamaConfig(**SHAPE, n_key_value_heads=2))
    return model, edge_attribution_patching(model, CLEAN, CORRUPTED, METRIC)


def test_pruning_never_changes_the_circuits_metric(model_and_scores):
    model, scores = model_and_scores
    for n in (5, 20, 60):
        kept = top_edges(scores, n)
        pruned = prune(scores, kept)
        torch.testing.assert_close(
            run_circuit(model, CLEAN, CORRUPTED, METRIC, pruned),
            run_circuit(model, CLEAN, CORRUPTED, METRIC, kept),
            rtol=0,
            atol=1e-10,
        )
    assert int(prune(scores, top_edges(scores, 5)).sum()) < 5 or int(prune(scores, top_edges(scores, 20)).sum()) < 20


def test_greedy_circuits_are_connected_to_the_logits(model_and_scores):
    _, scores = model_and_scores
    kept = greedy_edges(scores, 30)
    assert int(kept.sum()) == 30 and torch.equal(prune(scores, kept), kept)
    assert bool(kept[:, scores.readers.index("logits")].any())


def test_cpr_and_cmd_are_the_areas_over_the_fraction_of_edges(model_and_scores):
    model, scores = model_and_scores
    n_edges = int(scores.edge.sum())
    counts = [0, 10, 40, n_edges]
    for selection in ("top", "greedy"):
        curve = faithfulness_curve(model, CLEAN, CORRUPTED, METRIC, scores, counts, selection=selection)
        x = torch.tensor(counts, dtype=torch.float64) / n_edges
        f = curve.normalized
        expected_cpr = float(((f[1:] + f[:-1]) / 2 * (x[1:] - x[:-1])).sum())
        assert curve.cpr == pytest.approx(expected_cpr, abs=1e-12)
        g = (1 - f).abs()
        assert curve.cmd == pytest.approx(float(((g[1:] + g[:-1]) / 2 * (x[1:] - x[:-1])).sum()), abs=1e-12)
    with pytest.raises(ValueError, match="selection must be one of"):
        faithfulness_curve(model, CLEAN, CORRUPTED, METRIC, scores, counts, selection="random")
