"""Which nodes and edges of an attribution graph matter for its logits, and how much of it the features explain.

Circuit-tracer's definitions, on ``A = adjacency_matrix`` (``[target, source]``):

- the **normalized matrix** ``N = |A|`` with each row divided by its sum: the share of each of a target's
  inputs in the target's total absolute input;
- the **influence** of the nodes on the logits, ``w (N + N^2 + N^3 + ...)``, with ``w`` the logits'
  probabilities at the logit nodes (0 elsewhere): every path's product of shares, summed. The graph has no
  cycles, so ``N`` is nilpotent and the series ends;
- **pruning** (``prune_graph``): keep the nodes holding ``node_threshold`` of the total influence (tokens
  and logits always), then, on the graph of those nodes, the edges holding ``edge_threshold`` of the total
  edge influence ``N[t, s] (influence[t] + w[t])``; then drop, until nothing changes, the feature and error
  nodes without a kept outgoing edge and the features without a kept incoming one;
- the **replacement score** (``graph_scores``): of the influence reaching the tokens and error nodes, the
  share that reaches the tokens, i.e. flows from tokens to logits through features only;
- the **completeness score**: the share of the nodes' inputs (in ``N``) that do not come from error nodes,
  averaged over the nodes weighted by their influence plus ``w``.

Both scores are 1 for a graph without error (a perfect replacement model) and fall as errors carry more of it.
"""

from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from .graph import AttributionGraph

MAX_ITERATIONS = 1000


def normalize_matrix(matrix: Float[Tensor, "target source"]) -> Float[Tensor, "target source"]:
    """``|matrix|`` with each row divided by its sum (rows summing to 0 stay 0)."""
    normalized = matrix.abs()
    return normalized.div_(normalized.sum(dim=1, keepdim=True).clamp(min=1e-10))  # in place: one copy of the matrix


def compute_influence(
    normalized: Float[Tensor, "node node"], weights: Float[Tensor, "node"], max_iterations: int = MAX_ITERATIONS
) -> Float[Tensor, "node"]:
    """``weights (N + N^2 + ...)``, one product at a time until a product is zero (``N`` is nilpotent on a graph
    without cycles); ``RuntimeError`` after ``max_iterations`` products (the graph has a cycle)."""
    current = weights @ normalized
    influence = current.clone()
    for _ in range(max_iterations):
        if not current.any():
            return influence
        current = current @ normalized
        influence += current
    raise RuntimeError(f"influence did not converge after {max_iterations} products: the graph has a cycle")


def node_influence(graph: AttributionGraph) -> Float[Tensor, "node"]:
    """Each node's influence on the logits (module docstring)."""
    return compute_influence(normalize_matrix(graph.adjacency_matrix), graph.logit_weights())


def edge_influence(matrix: Float[Tensor, "node node"], weights: Float[Tensor, "node"]) -> Float[Tensor, "node node"]:
    """Each edge's influence: its share of its target's input times the target's influence plus its weight."""
    normalized = normalize_matrix(matrix)
    return normalized * (compute_influence(normalized, weights) + weights)[:, None]


def find_threshold(scores: Tensor, fraction: float) -> Tensor:
    """The score above which (inclusive) the largest scores add up to ``fraction`` of the total."""
    ordered = torch.sort(scores.flatten(), descending=True).values
    cumulative = ordered.cumsum(0) / ordered.sum()
    index = min(
        int(torch.searchsorted(cumulative, torch.tensor(fraction, dtype=cumulative.dtype, device=cumulative.device))),
        len(ordered) - 1,
    )
    return ordered[index]


@dataclass
class PruneResult:
    """``node_mask [node]`` and ``edge_mask [target, source]``: what pruning keeps; ``cumulative_scores [node]``: each
    node's place in the cumulative influence (the share of the total held by it and every node above it)."""

    node_mask: Bool[Tensor, "node"]
    edge_mask: Bool[Tensor, "node node"]
    cumulative_scores: Float[Tensor, "node"]


def _check_fraction(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a fraction in [0, 1], got {value!r}")


def prune_graph(graph: AttributionGraph, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> PruneResult:
    """The nodes and edges carrying ``node_threshold`` and ``edge_threshold`` of the influence (module docstring)."""
    _check_fraction("node_threshold", node_threshold)
    _check_fraction("edge_threshold", edge_threshold)
    adjacency, weights = graph.adjacency_matrix, graph.logit_weights()
    n_features, always = graph.n_features, graph.token_nodes.start  # tokens and logits from ``always`` on
    influence = compute_influence(normalize_matrix(adjacency), weights)
    node_mask = influence >= find_threshold(influence, node_threshold)
    node_mask[always:] = True
    pruned = adjacency.clone()
    pruned[~node_mask] = 0
    pruned[:, ~node_mask] = 0
    scores = edge_influence(pruned, weights)
    edge_mask = scores >= find_threshold(scores, edge_threshold)

    def drop_dangling() -> None:
        node_mask[:always] &= edge_mask[:, :always].any(0)  # features and errors need an outgoing edge
        node_mask[:n_features] &= edge_mask[:n_features].any(1)  # features need an incoming edge

    before = node_mask.clone()
    drop_dangling()
    while not torch.equal(node_mask, before):  # a node dropped may leave others dangling
        before = node_mask.clone()
        edge_mask[~node_mask] = False
        edge_mask[:, ~node_mask] = False
        drop_dangling()
    ordered, order = torch.sort(influence, descending=True)
    cumulative = torch.zeros_like(influence)
    cumulative[order] = ordered.cumsum(0) / ordered.sum()
    return PruneResult(node_mask, edge_mask, cumulative)


@dataclass(frozen=True)
class GraphScores:
    """``replacement`` and ``completeness`` (module docstring), each in [0, 1]."""

    replacement: float
    completeness: float


def graph_scores(graph: AttributionGraph) -> GraphScores:
    """The replacement and completeness scores of ``graph`` (module docstring)."""
    weights = graph.logit_weights()
    normalized = normalize_matrix(graph.adjacency_matrix)
    influence = compute_influence(normalized, weights)
    token_influence = influence[graph.token_nodes].sum()
    error_influence = influence[graph.errors].sum()
    replacement = token_influence / (token_influence + error_influence)
    non_error = 1 - normalized[:, graph.errors].sum(dim=1)
    output_influence = influence + weights
    completeness = (non_error * output_influence).sum() / output_influence.sum()
    return GraphScores(float(replacement), float(completeness))


__all__ = [
    "GraphScores",
    "PruneResult",
    "compute_influence",
    "edge_influence",
    "find_threshold",
    "graph_scores",
    "node_influence",
    "normalize_matrix",
    "prune_graph",
]
