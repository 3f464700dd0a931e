"""The pruned attribution graph as a plotly figure: nodes by layer and position, edges by weight.

Rows are the embeddings (bottom), each layer's features and error nodes, and the logits (top); columns are the
prompt's positions. Nodes sharing a cell are spread across it. An edge is a line from source to target, blue
where it raises its target and red where it lowers it (``RdBu``, as every signed figure here), its width in
four steps of ``|weight|`` over the largest kept edge.
"""

import numpy as np
import plotly.graph_objects as go

from ..plots.base import display_label
from .graph import AttributionGraph
from .pruning import PruneResult, prune_graph

POSITIVE, NEGATIVE = "#2166ac", "#b2182b"  # the ends of RdBu: above zero, below zero
WIDTH_STEPS = (0.5, 1.5, 3.0, 5.0)  # line widths for |weight| / max in (0, 1/4], ..., (3/4, 1]
MARKERS = {
    "feature": ("circle", "#4d4d4d"),
    "error": ("square", "#bababa"),
    "token": ("diamond", "#1b7837"),
    "logit": ("triangle-up", "#762a83"),
}


def _positions(graph: AttributionGraph, nodes: list[int]) -> dict[int, tuple[float, float]]:
    """``node -> (x, y)``: ``x`` its position spread within its cell, ``y`` its row (-1 tokens, layers, logits)."""
    cells: dict[tuple[int, int], list[int]] = {}
    for node in nodes:
        layer, pos = graph.layer_and_pos(node)
        cells.setdefault((layer, pos), []).append(node)
    placed = {}
    for (layer, pos), members in cells.items():
        offsets = np.linspace(-0.35, 0.35, len(members)) if len(members) > 1 else [0.0]
        for node, offset in zip(members, offsets):
            placed[node] = (pos + float(offset), float(layer))
    return placed


def _hover(graph: AttributionGraph, node: int, influence: float) -> str:
    text = f"{graph.label(node)}<br>influence {influence:.3f}"
    kind = graph.kind(node)
    if kind == "feature":
        text += f"<br>activation {float(graph.activation_values[node]):.4g}"
    elif kind == "logit":
        text += f"<br>p = {float(graph.logit_probabilities[node - graph.logits.start]):.3f}"
    return display_label(text).replace("&lt;br&gt;", "<br>")


def graph_figure(
    graph: AttributionGraph,
    prune: PruneResult | None = None,
    *,
    node_threshold: float = 0.8,
    edge_threshold: float = 0.98,
    title: str | None = None,
) -> go.Figure:
    """The graph's kept nodes and edges (``prune``, or ``prune_graph(graph, node_threshold, edge_threshold)``)."""
    prune = prune if prune is not None else prune_graph(graph, node_threshold, edge_threshold)
    nodes = prune.node_mask.nonzero().flatten().tolist()
    where = _positions(graph, nodes)
    fig = go.Figure()
    targets, sources = prune.edge_mask.nonzero(as_tuple=True)
    weights = graph.adjacency_matrix[targets, sources].double().numpy()
    largest = float(np.abs(weights).max()) if len(weights) else 1.0
    steps = np.minimum((np.abs(weights) / largest * len(WIDTH_STEPS)).astype(int), len(WIDTH_STEPS) - 1)
    for sign, colour in ((1, POSITIVE), (-1, NEGATIVE)):
        for step, width in enumerate(WIDTH_STEPS):
            chosen = [
                (t, s)
                for t, s, w, k in zip(targets.tolist(), sources.tolist(), weights, steps)
                if k == step and np.sign(w) == sign and s in where and t in where
            ]
            if not chosen:
                continue
            xs, ys = [], []
            for t, s in chosen:
                xs += [where[s][0], where[t][0], None]
                ys += [where[s][1], where[t][1], None]
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=ys,
                    mode="lines",
                    line=dict(color=colour, width=width),
                    hoverinfo="skip",
                    opacity=0.6,
                    name=f"{'raises' if sign > 0 else 'lowers'} target",
                    showlegend=False,
                )
            )
    for kind, (symbol, colour) in MARKERS.items():
        members = [node for node in nodes if graph.kind(node) == kind]
        if not members:
            continue
        fig.add_trace(
            go.Scatter(
                x=[where[n][0] for n in members],
                y=[where[n][1] for n in members],
                mode="markers",
                name=kind,
                marker=dict(
                    symbol=symbol, color=colour, size=[6 + 14 * float(1 - prune.cumulative_scores[n]) for n in members]
                ),
                text=[_hover(graph, n, float(prune.cumulative_scores[n])) for n in members],
                hoverinfo="text",
            )
        )
    tokens = graph.str_tokens or [str(int(t)) for t in graph.tokens]
    fig.update_layout(
        title=dict(text=title or f"attribution graph: {len(nodes)} nodes, {len(targets)} edges"),
        xaxis=dict(
            title="pos",
            tickmode="array",
            tickvals=list(range(graph.n_pos)),
            ticktext=[display_label(t) for t in tokens],
        ),
        yaxis=dict(
            title="layer",
            tickmode="array",
            tickvals=list(range(-1, graph.n_layers + 1)),
            ticktext=["embed"] + [str(layer) for layer in range(graph.n_layers)] + ["logits"],
        ),
        plot_bgcolor="white",
    )
    return fig


__all__ = ["graph_figure"]
