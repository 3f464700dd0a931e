"""Choosing a circuit from edge scores: the strongest ``n`` edges, a threshold, or greedily from the logits; pruning.

Every selector returns ``kept``, a bool ``[upstream, reader]`` mask laid out as ``EdgeScores.edge``,
which ``run_circuit`` and ``faithfulness_curve`` take. Strength is the mean score over prompts,
by absolute value (``absolute=False``: signed, so only edges that help the metric count).

- ``top_edges(scores, n)``: the ``n`` strongest edges anywhere in the graph.
- ``threshold_edges(scores, tau)``: every edge at least ``tau`` strong.
- ``greedy_edges(scores, n)``: grown from the logits, one edge at a time, always the strongest
  edge into the circuit so far: an edge into the logits, or into a reader of a node the circuit
  already holds (a head's query, key and value inputs, an MLP's input). Every node it adds has
  a path to the logits by construction.
- ``prune(scores, kept)``: drops the edges of nodes with no path to the logits (they cannot
  change the metric), repeated until nothing changes.
"""

import math
import numbers

import torch
from jaxtyping import Bool
from torch import Tensor

from .. import _checks
from .edges import EdgeScores


def _strength(scores: EdgeScores, absolute: bool) -> Tensor:
    """What the selections rank by (``EdgeScores.strength``: NaN scores on edges are refused there, by edge)."""
    return scores.strength(absolute)


def _check_count(scores: EdgeScores, n) -> int:
    """A circuit's size: an int in ``[1, edges of the graph]`` (a larger one would hold non-edges)."""
    n_edges = int(scores.edge.sum())
    return _checks.strict_count(
        n, "n", minimum=1, most=n_edges, expected=f"a circuit needs 1 to {n_edges} edges (the graph's)"
    )


def top_edges(scores: EdgeScores, n: int, *, absolute: bool = True) -> Bool[Tensor, "upstream reader"]:
    """The ``n`` strongest edges."""
    _check_count(scores, n)
    order = _strength(scores, absolute).flatten().argsort(descending=True)[:n]
    kept = torch.zeros(scores.edge.numel(), dtype=torch.bool)
    kept[order] = True
    return kept.reshape(scores.edge.shape)


def threshold_edges(scores: EdgeScores, tau: float, *, absolute: bool = True) -> Bool[Tensor, "upstream reader"]:
    """Every edge whose strength is at least ``tau``; refused when none is."""
    if isinstance(tau, Tensor) and tau.numel() == 1 and tau.is_floating_point():
        tau = float(tau)
    if isinstance(tau, bool) or not isinstance(tau, numbers.Real) or math.isnan(tau):
        raise ValueError(f"tau must be a number (the least strength kept), got {tau!r}")
    strength = _strength(scores, absolute)
    kept = strength >= tau
    if not bool(kept.any()):
        raise ValueError(f"no edge reaches the threshold {tau!r}: the strongest is {float(strength.max()):.4g}")
    return kept


def greedy_edges(scores: EdgeScores, n: int, *, absolute: bool = True) -> Bool[Tensor, "upstream reader"]:
    """``n`` edges grown from the logits, each the strongest edge into the circuit so far (module docstring)."""
    _check_count(scores, n)
    if not scores.reads:
        raise ValueError("greedy selection needs the readers each node reads through (EdgeScores.reads)")
    strength = _strength(scores, absolute)
    reader_index = {name: j for j, name in enumerate(scores.readers)}
    open_readers = torch.zeros(len(scores.readers), dtype=torch.bool)
    open_readers[reader_index["logits"]] = True
    in_circuit = torch.zeros(len(scores.upstream), dtype=torch.bool)
    kept = torch.zeros_like(scores.edge)
    for _ in range(n):
        candidates = strength.masked_fill(kept | ~open_readers[None, :], float("-inf"))
        best = int(candidates.flatten().argmax())
        if candidates.flatten()[best] == float("-inf"):
            break  # every edge into the circuit is taken
        i, j = divmod(best, len(scores.readers))
        kept[i, j] = True
        if not in_circuit[i]:
            in_circuit[i] = True
            open_readers[[reader_index[name] for name in scores.reads[scores.upstream[i]]]] = True
    return kept


def prune(scores: EdgeScores, kept: Bool[Tensor, "upstream reader"]) -> Bool[Tensor, "upstream reader"]:
    """``kept`` without the edges of nodes that have no path to the logits."""
    if kept.shape != scores.edge.shape or kept.dtype != torch.bool:
        raise ValueError(f"kept must be a bool tensor {tuple(scores.edge.shape)}, got {kept.dtype} {tuple(kept.shape)}")
    reader_index = {name: j for j, name in enumerate(scores.readers)}
    kept = kept & scores.edge
    while True:
        live_readers = torch.zeros(len(scores.readers), dtype=torch.bool)
        live_readers[reader_index["logits"]] = True
        for i, name in enumerate(scores.upstream):
            if bool(kept[i].any()):
                live_readers[[reader_index[r] for r in scores.reads.get(name, ())]] = True
        # a node's edges count only where they reach a live reader; a node whose edges all reach dead readers dies
        pruned = kept & live_readers[None, :]
        if torch.equal(pruned, kept):
            return kept
        kept = pruned


def circuit_nodes(scores: EdgeScores, kept: Bool[Tensor, "upstream reader"]) -> list[str]:
    """The upstream nodes with at least one kept edge; refused for an empty circuit."""
    names = [name for i, name in enumerate(scores.upstream) if bool((kept[i] & scores.edge[i]).any())]
    if not names:
        raise ValueError("the circuit is empty: no edge of the graph is kept")
    return names


__all__ = ["circuit_nodes", "greedy_edges", "prune", "threshold_edges", "top_edges"]
