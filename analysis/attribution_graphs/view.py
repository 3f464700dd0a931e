"""``graph_view``: an attribution graph as an interactive HTML view that works offline (``analysis.views.View``).

**What is drawn.** The kept nodes and edges of the pruned graph (``prune_graph``), placed as ``graph_figure`` places
them: rows are the embeddings (bottom), each layer's features and error nodes, and the logits (top); columns are
the prompt's positions, labelled with its tokens, and nodes sharing a cell are spread across it (a column is as
wide as its fullest cell needs). Shapes and colours follow the node's kind as in ``graph_figure``. With ``M`` the
largest kept ``|weight|``, an edge is ``MIN_WIDTH + (MAX_WIDTH - MIN_WIDTH) |weight| / M`` pixels wide, orange
where it raises its target and blue where it lowers it (the ends of ``colours.DIVERGING``, as in every view).

**Reading it.** Hovering a node says its label, value (a feature's activation; a logit node's ``logit - mean
logit`` and probability) and influence on the logits (``node_influence``). Clicking it opens a side panel with its
``TOP_EDGES`` strongest kept edges in and out and, for a feature, its ``FeatureInfo`` (``feature_info_from``).
Shift-click (or the panel's pin button) pins a node; "show pinned subgraph" shows the pinned nodes and the kept
edges among them, and a text box holds their ids (``node_id``), comma-separated, to copy.

**Interventions.** Select features, then ablate them (scale 0) or scale them by ``c``. With ``A`` the full
adjacency matrix (every edge, kept or not), the view predicts each logit node's change (of ``logit - mean logit``):

- *direct (frozen features)*: ``(c - 1) sum_s A[t, s]``, exact in the replacement model, where every other feature
  keeps its activation (``ReplacementModel.run(feature_scale=...)``);
- *through features (linear)*: ``(c - 1) sum_s [(I - A)^-1][t, s]`` (``logit_path_sums``), every path from ``s`` to
  ``t``: what happens if the features downstream recompute linearly, attention and norms still frozen.

Each selected feature's effect is added as if it were scaled alone. The view also writes the command that runs the
real intervention on the model (``intervention_command``: ``--ablate``, or ``--steer`` to ``c`` times the activation).
"""

import shlex
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from ..views import View, colours
from .feature_info import checked_feature_info
from .figure import MARKERS, _positions
from .graph import AttributionGraph
from .pruning import MAX_ITERATIONS, PruneResult, node_influence, prune_graph

MIN_WIDTH, MAX_WIDTH = 0.5, 6.0  # stroke widths (px) of an edge of weight 0 and of the strongest kept edge
RADIUS = {"feature": 6, "error": 5, "token": 7, "logit": 8}  # px; errors are squares, tokens diamonds, logits triangles
NODE_STEP = 16  # px between the centres of neighbouring nodes of a cell
MIN_COLUMN, ROW_STEP = 72, 64  # the narrowest column, and the distance between rows
LABEL_WIDTH, MARGIN = 56, 16  # the row labels on the left, and the space around the graph
TOP_SPACE, BOTTOM_SPACE = 48, 40  # above the logits (their tokens), below the embeddings (the prompt's tokens)
TOP_EDGES = 10  # edges in and out listed for a clicked node
FALLBACK_FEATURES = 20  # features listed in the plain-text fallback
COMMAND = "interp-transformer graph"
ABLATE_OPTION, STEER_OPTION = "--ablate", "--steer"  # the command's: --ablate L1:F17@3 ..., --steer L1:F17@3=VALUE ...

POSITIVE = colours.DIVERGING[-1][1]
NEGATIVE = colours.DIVERGING[0][1]


# ``node_id``'s spelling of each kind of node (``AttributionGraph.node_fields``)
NODE_IDS = {
    "feature": "L{layer}:F{feature}@{pos}",
    "error": "L{layer}:err@{pos}",
    "token": "tok@{pos}",
    "logit": "logit:{token}",
}


def node_id(graph: AttributionGraph, node: int) -> str:
    """A node's id in the view: ``L1:F17@3`` (feature 17 of layer 1 at position 3, the command line's spelling),
    ``L1:err@3``, ``tok@3``, ``logit:42`` (the logit of token id 42)."""
    fields = graph.node_fields(node)
    return NODE_IDS[fields["kind"]].format(**fields)


def logit_path_sums(graph: AttributionGraph) -> Float[Tensor, "logit node"]:
    """``[(I - A)^-1][t, s]`` for each logit node ``t`` and every node ``s``, in float64: the sum over every path from
    ``s`` to ``t`` of the product of its edges (``A = graph.adjacency_matrix``, ``[target, source]``).

    Computed as ``e_t (I + A + A^2 + ...)``, one product at a time: the graph has no cycle, so ``A`` is nilpotent and
    the series ends (``RuntimeError`` if it does not within ``MAX_ITERATIONS`` products)."""
    adjacency = graph.adjacency_matrix.double()
    current = torch.zeros(graph.n_logits, graph.n_nodes, dtype=torch.float64)
    current[torch.arange(graph.n_logits), torch.arange(graph.logits.start, graph.n_nodes)] = 1.0
    total = current.clone()
    for _ in range(MAX_ITERATIONS):
        current = current @ adjacency
        if not current.any():
            return total
        total += current
    raise RuntimeError(f"path sums did not converge after {MAX_ITERATIONS} products: the graph has a cycle")


def intervention_command(
    graph: AttributionGraph,
    features: Sequence[str],
    scale: float = 0.0,
    model_name: str | None = None,
    prompt: str | None = None,
) -> str:
    """The command that runs the intervention on the real model, ``features`` given by their ids (``node_id``).

    ``scale`` 0 ablates them (``--ablate L1:F17@3 ...``); another scale sets each one's activation at its position to
    ``scale`` times its activation on the prompt (``--steer L1:F17@3=VALUE ...``, ``VALUE`` to 6 significant digits).
    ``MODEL`` stands for ``model_name`` when it is not given; ``prompt`` (the prompt as typed) defaults to the
    graph's text, or its token ids for a model without a tokenizer."""
    nodes = {node_id(graph, node): node for node in range(graph.n_features)}
    unknown = [feature for feature in features if feature not in nodes]
    if unknown or not features:
        raise ValueError(
            f"features must be ids of the graph's active features (as node_id gives them, e.g. "
            f"{sorted(nodes)[:3]}), at least one; got {list(features)[:5]}, of which {unknown[:5]} are not"
        )
    prefix = _command_prefix(graph, model_name, prompt)
    if scale == 0:
        return f"{prefix} {ABLATE_OPTION} {' '.join(features)}"
    values = [_short_number(scale * float(graph.activation_values[nodes[f]])) for f in features]
    return f"{prefix} {STEER_OPTION} {' '.join(f'{f}={value}' for f, value in zip(features, values))}"


def _command_prefix(graph: AttributionGraph, model_name: str | None, prompt: str | None) -> str:
    model = shlex.quote(model_name) if model_name else "MODEL"
    text = prompt if prompt is not None else graph.prompt or " ".join(str(int(t)) for t in graph.tokens)
    return f"{COMMAND} --model {model} --prompt {shlex.quote(text)}"


def _short_number(value: float) -> str:
    """``value`` to 6 significant digits, written as JavaScript's ``String(Number(v.toPrecision(6)))`` writes it for
    values from 1e-4 to 1e16 (the page writes the same command)."""
    text = repr(float(f"{value:.6g}"))
    return text[:-2] if text.endswith(".0") else text


def graph_view(
    graph: AttributionGraph,
    *,
    pruned: PruneResult | None = None,
    feature_info: Mapping | None = None,
    node_threshold: float = 0.8,
    edge_threshold: float = 0.98,
    model_name: str | None = None,
    prompt: str | None = None,
    title: str | None = None,
) -> View:
    """The pruned graph as an interactive view (module docstring): ``view.save(path)`` writes a standalone page,
    and a notebook shows it inline.

    ``pruned``: what to draw (default ``prune_graph(graph, node_threshold, edge_threshold)``). ``feature_info``:
    ``{(layer, feature): FeatureInfo}`` shown for clicked features (``feature_info_from``; entries for features
    pruned away are left out). ``model_name`` and ``prompt`` fill the intervention command (``intervention_command``);
    ``title`` heads the view.
    """
    if not isinstance(graph, AttributionGraph):
        raise TypeError(f"graph_view takes an AttributionGraph (from attribute), got {type(graph).__name__}")
    pruned = _checked_prune(graph, pruned) if pruned is not None else prune_graph(graph, node_threshold, edge_threshold)
    info = checked_feature_info(graph, feature_info)
    kept = pruned.node_mask.nonzero().flatten().tolist()
    ids = {node: node_id(graph, node) for node in kept}
    layout = _layout(graph, kept)
    per_node = {
        "value": graph.values.double().tolist(),
        "influence": node_influence(graph).double().tolist(),
        "direct": graph.adjacency_matrix[graph.logits].double().T.tolist(),  # [node, logit]
        "total": logit_path_sums(graph).T.tolist(),
    }
    nodes = [_node_payload(graph, node, ids[node], layout, per_node) for node in kept]
    shown = {}  # the feature info of the kept features, by "L{layer}:F{feature}"
    for node in nodes:
        key = (node["layer"], node["feature"])
        if node["kind"] == "feature" and key in info:
            node["info"] = f"L{key[0]}:F{key[1]}"
            shown[node["info"]] = info[key]
    edges = _edges(graph, pruned, ids)
    n_features = sum(node["kind"] == "feature" for node in nodes)
    summary = f"{len(nodes)} nodes, {len(edges)} edges ({n_features} feature{'s' * (n_features != 1)})"
    of_prompt = f" of {graph.prompt!r}" if graph.prompt else ""
    data = {
        "title": title if title is not None else f"Attribution graph{of_prompt}: {summary}",
        "nodes": nodes,
        "edges": edges,
        "rows": layout["rows"],
        "columns": layout["columns"],
        "width": layout["width"],
        "height": layout["height"],
        "logits": [{"id": ids[node], "label": graph.label(node)} for node in range(graph.logits.start, graph.n_nodes)],
        "featureInfo": shown,
        "command": {
            "prefix": _command_prefix(graph, model_name, prompt),
            "ablate": ABLATE_OPTION,
            "steer": STEER_OPTION,
        },
        "legend": {
            "positive": _css(POSITIVE),
            "negative": _css(NEGATIVE),
            "strongest": max((abs(edge["weight"]) for edge in edges), default=0.0),
        },
        "topEdges": TOP_EDGES,
    }
    return View("attribution_graph", data, fallback=_fallback(data, nodes), description=summary)


def _node_payload(graph: AttributionGraph, node: int, id_: str, layout: dict, per_node: dict) -> dict:
    """What the page holds of one node: where it is drawn, what it is, and (a feature) its predicted logit effects."""
    kind = graph.kind(node)
    layer, pos = graph.layer_and_pos(node)
    payload = {
        "id": id_,
        "index": node,
        "kind": kind,
        "layer": layer,
        "pos": pos,
        "feature": int(graph.active_features[node, 2]) if kind == "feature" else None,
        "x": layout["x"][node],
        "y": layout["y"][node],
        "radius": RADIUS[kind],
        "shape": MARKERS[kind][0],
        "colour": MARKERS[kind][1],
        "label": graph.label(node),
        "value": per_node["value"][node] if kind in ("feature", "logit") else None,
        "influence": per_node["influence"][node],
        "info": None,
    }
    if kind == "logit":
        payload["probability"] = float(graph.logit_probabilities[node - graph.logits.start])
    if kind == "feature":
        payload["direct"] = per_node["direct"][node]
        payload["total"] = per_node["total"][node]
    payload["title"] = _node_title(payload)
    return payload


def _checked_prune(graph: AttributionGraph, pruned) -> PruneResult:
    """``pruned`` checked to be a pruning of ``graph``: masks of its size, no kept edge at a dropped node."""
    if not all(hasattr(pruned, name) for name in ("node_mask", "edge_mask")):
        raise TypeError(
            "pruned must be a PruneResult (prune_graph(graph)) with node_mask and edge_mask, "
            f"got {type(pruned).__name__}"
        )
    n = graph.n_nodes
    for name, shape in (("node_mask", (n,)), ("edge_mask", (n, n))):
        mask = getattr(pruned, name)
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            raise TypeError(
                f"pruned.{name} must be a bool tensor, got {type(mask).__name__} {getattr(mask, 'dtype', '')}"
            )
        if tuple(mask.shape) != shape:
            raise ValueError(
                f"pruned.{name} must have shape {list(shape)} (the graph's {n} nodes), got {list(mask.shape)}: "
                "was it pruned from another graph?"
            )
    dangling = pruned.edge_mask & ~(pruned.node_mask[:, None] & pruned.node_mask[None, :])
    if dangling.any():
        target, source = (int(i) for i in dangling.nonzero()[0])
        raise ValueError(
            f"pruned keeps {int(dangling.sum())} edges at nodes it drops, e.g. {graph.label(source)} -> "
            f"{graph.label(target)}: expected edges only among kept nodes"
        )
    if not pruned.node_mask.any():
        raise ValueError("pruned keeps no node: nothing to draw")
    return pruned


def _layout(graph: AttributionGraph, kept: list[int]) -> dict:
    """Each kept node's ``x`` and ``y`` in pixels, the rows' and columns' labels, and the drawing's size."""
    placed = _positions(graph, kept)  # node -> (pos + its offset in the cell, row: -1 embeddings .. n_layers logits)
    cells: dict[tuple[int, int], list[float]] = {}
    for node, (x, row) in placed.items():
        cells.setdefault((graph.layer_and_pos(node)[1], int(row)), []).append(x)
    widths = [MIN_COLUMN] * graph.n_pos
    for (pos, _), xs in cells.items():
        gaps = np.diff(sorted(xs))
        if len(gaps) and gaps.min() > 0:
            widths[pos] = max(widths[pos], NODE_STEP / float(gaps.min()))
    lefts = LABEL_WIDTH + np.concatenate([[0.0], np.cumsum(widths)])
    top = MARGIN + TOP_SPACE

    def y_of(row: float) -> float:
        return round(top + (graph.n_layers - row) * ROW_STEP, 2)

    xs, ys = {}, {}
    for node, (x, row) in placed.items():
        pos = graph.layer_and_pos(node)[1]
        xs[node] = round(float(lefts[pos] + widths[pos] * (0.5 + x - pos)), 2)
        ys[node] = y_of(row)
    names = ["embed"] + [f"L{layer}" for layer in range(graph.n_layers)] + ["logits"]
    tokens = graph.str_tokens or [str(int(token)) for token in graph.tokens]
    return {
        "x": xs,
        "y": ys,
        "rows": [{"label": name, "y": y_of(row)} for row, name in zip(range(-1, graph.n_layers + 1), names)],
        "columns": [
            {"pos": pos, "token": tokens[pos], "x": round(float(lefts[pos] + widths[pos] / 2), 2)}
            for pos in range(graph.n_pos)
        ],
        "width": round(float(lefts[-1]) + MARGIN, 2),
        "height": round(y_of(-1) + BOTTOM_SPACE + MARGIN, 2),
    }


def _edges(graph: AttributionGraph, pruned: PruneResult, ids: dict[int, str]) -> list[dict]:
    """The kept edges, weakest first (the strongest are drawn last, on top), with their exact weights."""
    targets, sources = pruned.edge_mask.nonzero(as_tuple=True)
    weights = graph.adjacency_matrix[targets, sources].double().tolist()
    strongest = max((abs(weight) for weight in weights), default=0.0)
    edges = []
    for weight, source, target in sorted(
        zip(weights, sources.tolist(), targets.tolist()), key=lambda e: (abs(e[0]), e[1:])
    ):
        share = abs(weight) / strongest if strongest > 0 else 0.0
        edges.append(
            {
                "source": ids[source],
                "target": ids[target],
                "weight": weight,
                "width": round(MIN_WIDTH + (MAX_WIDTH - MIN_WIDTH) * share, 2),
                "colour": _css(POSITIVE if weight > 0 else NEGATIVE),
            }
        )
    return edges


def _node_title(node: dict) -> str:
    """What hovering a node says."""
    parts = [node["label"]]
    if node["kind"] == "feature":
        parts.append(f"activation {node['value']:.4g}")
    elif node["kind"] == "logit":
        parts.append(f"logit - mean logit {node['value']:.4g}, p = {node['probability']:.3f}")
    parts.append(f"influence {node['influence']:.4g}")
    return "; ".join(parts)


def _fallback(data: dict, nodes: list[dict]) -> str:
    features = sorted((n for n in nodes if n["kind"] == "feature"), key=lambda n: -n["influence"])
    listed = [n["title"] for n in features[:FALLBACK_FEATURES]]
    more = [f"... and {len(features) - FALLBACK_FEATURES} more features"] if len(features) > FALLBACK_FEATURES else []
    return "\n".join([data["title"], *listed, *more])


def _css(rgb) -> str:
    return "rgb({}, {}, {})".format(*rgb)


__all__ = ["graph_view", "intervention_command", "logit_path_sums", "node_id"]
