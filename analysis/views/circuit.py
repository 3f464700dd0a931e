"""``circuit_view``: a circuit of edge scores as a graph; clicking a head shows its attention on the prompt.

**Nodes.** The names of ``EdgeScores`` (``analysis.discovery``) become drawn nodes: a writer and
the reader of the same component are one node (``L3H1`` writes and ``L3H1.q`` reads it; ``MLP3``
is both), and a key/value head's two readers ``L3K0.k`` and ``L3K0.v`` are one node ``L3K0`` with
a port for each (under grouped-query attention it serves several query heads). Rows run from the
input (bottom) to the logits (top): per layer ``l`` one row for its attention (heads, key/value
heads, ``L{l}.attn``) and one above for its MLP (``MLP{l}``, ``L{l}.mlp``, its experts
``MLP{l}.E{e}`` or ``L{l}E{e}`` and ``MLP{l}.shared``). A name of another form is drawn as it
is, in a row of its own under the logits.

**Edges.** Only the kept ones, each from the top of its writer to the bottom of its reader (the
``k`` or ``v`` port of a key/value head). With ``m`` an edge's mean score over the prompts and
``M`` the largest ``|m|`` kept, its stroke is ``MIN_WIDTH + (MAX_WIDTH - MIN_WIDTH) |m| / M``
pixels wide, in the diverging scale's positive end (orange) when ``m > 0`` and its negative end
(blue) when ``m < 0``, as in every view of this package (``colours.DIVERGING``).
"""

import difflib
import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
from jaxtyping import Bool, Float
from torch import Tensor

from . import colours, inputs
from .view import View

DEFAULT_TOP = 50  # edges drawn when ``kept`` is None: enough for a circuit, few enough to read
MIN_WIDTH, MAX_WIDTH = 1.0, 8.0  # stroke widths (px) of an edge of score 0 and of the strongest kept edge
NODE_WIDTH, NODE_HEIGHT = 64, 24  # a node's box; "L10H11" fits in 11px type
COLUMN_STEP, ROW_STEP = 80, 72  # distance between neighbouring nodes of a row, and between rows
LABEL_WIDTH, MARGIN = 72, 16  # the row labels on the left, and the space around the graph
PORT_OFFSET = {"k": -NODE_WIDTH / 4, "v": NODE_WIDTH / 4}  # where a key/value head's two inputs enter
FALLBACK_EDGES = 20  # edges listed in the plain-text fallback

POSITIVE = colours.DIVERGING[-1][1]
NEGATIVE = colours.DIVERGING[0][1]
ZERO = (153, 153, 153)

_NAME = re.compile(
    r"(?P<input>input)|(?P<logits>logits)|MLP(?P<mlp>\d+)(?:\.E(?P<mlp_expert>\d+)|\.(?P<shared>shared))?"
    r"|L(?P<layer>\d+)(?:H(?P<head>\d+)(?P<q>\.q)?|K(?P<group>\d+)\.(?P<kv>[kv])|E(?P<expert>\d+)|\.(?P<part>attn|mlp))"
)
# The order of kinds inside a row; the MLP row's kinds come after the attention row's.
_KIND_ORDER = ("input", "head", "kv", "attn", "mlp", "sublayer_mlp", "expert", "shared_expert", "other", "logits")


class NodeName(NamedTuple):
    """What one upstream or reader name says: the node it belongs to, and the port of a reader.

    ``kind``: ``input``, ``head``, ``kv`` (a key/value head), ``attn`` (a whole attention
    sublayer), ``mlp``, ``sublayer_mlp`` (``L{l}.mlp``), ``expert`` (``MLP{l}.E{e}`` or
    ``L{l}E{e}``), ``shared_expert`` (``MLP{l}.shared``), ``logits`` or ``other``.
    ``index``: the head, key/value head or expert number (0 for other kinds).
    """

    node: str
    kind: str
    layer: int | None
    index: int
    port: str | None


def parse_node(name: str) -> NodeName:
    """The node of ``name``; a name of no known form is a node of kind ``other`` by itself.

    >>> parse_node("L3H5.q"), parse_node("L2K1.v").node, parse_node("resid").kind
    (NodeName(node='L3H5', kind='head', layer=3, index=5, port='q'), 'L2K1', 'other')
    """
    match = _NAME.fullmatch(name)
    if match is None:
        return NodeName(name, "other", None, 0, None)
    part = match.groupdict()
    if part["input"] or part["logits"]:
        return NodeName(name, name, None, 0, None)
    if part["mlp"] is not None:
        layer = int(part["mlp"])
        if part["mlp_expert"] is not None:
            return NodeName(name, "expert", layer, int(part["mlp_expert"]), None)
        return NodeName(name, "shared_expert" if part["shared"] else "mlp", layer, 0, None)
    layer = int(part["layer"])
    if part["head"] is not None:
        return NodeName(name.removesuffix(".q"), "head", layer, int(part["head"]), "q" if part["q"] else None)
    if part["group"] is not None:
        return NodeName(name.rsplit(".", 1)[0], "kv", layer, int(part["group"]), part["kv"])
    if part["expert"] is not None:
        return NodeName(name, "expert", layer, int(part["expert"]), None)
    return NodeName(name, "attn" if part["part"] == "attn" else "sublayer_mlp", layer, 0, None)


def circuit_view(
    scores,
    kept: Bool[Tensor, "upstream reader"] | np.ndarray | None = None,
    *,
    tokens: Sequence[str] | None = None,
    patterns: Mapping[str, Float[Tensor, "query_pos key_pos"] | np.ndarray] | None = None,
    prompt: int = 0,
    title: str | None = None,
) -> View:
    """The kept edges of ``scores`` (an ``EdgeScores``) as a graph of the nodes they join.

    ``kept``: a Bool ``[upstream, reader]`` mask of edges to draw (e.g. a circuit pruned
    upstream); None draws the ``DEFAULT_TOP`` edges of largest mean ``|score|`` over the
    prompts (edges whose mean is exactly 0 left out). Nodes without a kept edge are not drawn.
    Hovering (or focusing) a node or an edge says its name and scores: an edge's mean, its score
    on prompt ``prompt`` and its range over the prompts; a node's kept edges in and out.

    ``patterns`` maps head names (``"L1H0"``) to that head's ``[query_pos, key_pos]`` pattern on
    prompt ``prompt`` (or a whole attention sublayer's node, ``"L1.attn"``, to a pattern such as its
    heads' mean), whose ``tokens`` (``model.to_str_tokens``) are then required. Clicking a
    drawn head with a pattern (or Enter / Space on it) shows it below the graph as in
    ``attention_view``. ``title`` heads the view (default: the method and what is drawn).

    >>> import torch
    >>> from analysis.discovery import EdgeScores
    >>> scores = torch.tensor([[[2.0], [0.0]], [[0.0], [-1.0]]])
    >>> edges = EdgeScores(["input", "L0H0"], ["L0H0.q", "logits"], scores[..., 0] != 0, scores, "EAP")
    >>> view = circuit_view(edges)
    >>> view
    <View circuit: 2 edges among 3 nodes (EAP, 1 prompt)>
    >>> [(e["upstream"], e["reader"], e["width"]) for e in view.data["edges"]]
    [('L0H0', 'logits', 4.5), ('input', 'L0H0.q', 8.0)]
    """
    what = "circuit_view"
    upstream, readers, edge, values, method = _checked_scores(scores, what)
    n_prompts = values.shape[-1]
    prompt = inputs.index(prompt, n_prompts, "prompt", "prompts")
    mean = values.mean(axis=-1)
    mask = _kept_mask(kept, edge, mean, upstream, readers, what)
    pairs = sorted(zip(*np.nonzero(mask)), key=lambda pair: (abs(mean[pair]), pair))  # the strongest drawn last
    up_names, reader_names = [parse_node(n) for n in upstream], [parse_node(n) for n in readers]
    layout = _layout([up_names[i] for i, _ in pairs] + [reader_names[j] for _, j in pairs], up_names + reader_names)
    nodes = layout.nodes
    strongest = max(abs(float(mean[pair])) for pair in pairs) or 1.0  # all kept edges may score 0
    decimals = inputs.decimals_for(mean[mask])
    prompts = "1 prompt" if n_prompts == 1 else f"{n_prompts} prompts"
    edges, kept_means = [], {node: {"out": [], "in": []} for node in nodes}
    for i, j in pairs:
        source, target = nodes[up_names[i].node], nodes[reader_names[j].node]
        m, port = float(mean[i, j]), reader_names[j].port
        kept_means[source["id"]]["out"].append(m)
        kept_means[target["id"]]["in"].append(m)
        edges.append(
            {
                "upstream": upstream[i],
                "reader": readers[j],
                "source": source["id"],
                "target": target["id"],
                "port": port,
                "mean": inputs.rounded(np.array([m]), decimals)[0],
                "score": inputs.rounded(values[i, j, prompt : prompt + 1], decimals)[0],
                "width": round(MIN_WIDTH + (MAX_WIDTH - MIN_WIDTH) * abs(m) / strongest, 2),
                "colour": _css(POSITIVE if m > 0 else NEGATIVE if m < 0 else ZERO),
                "path": _path(source, target, PORT_OFFSET.get(port, 0.0)),
                "title": _edge_title(upstream[i], readers[j], values[i, j], prompt),
            }
        )
    groups = _groups(up_names + reader_names)
    for node in nodes.values():
        node["title"] = _node_title(node, kept_means[node["id"]], groups, prompts)
    attention = _attention_data(patterns, tokens, upstream, [node["id"] for node in nodes.values()], what)
    with_pattern = attention["heads"] if attention else []
    for node in nodes.values():
        node["pattern"] = with_pattern.index(node["id"]) if node["id"] in with_pattern else None  # a click target
    summary = f"{len(edges)} edges among {len(nodes)} nodes"
    data = {
        "title": title if title is not None else f"{method} circuit: {summary}, scores averaged over {prompts}",
        "nodes": list(nodes.values()),
        "edges": edges,
        "rows": layout.rows,
        "width": layout.width,
        "height": layout.height,
        "nodeSize": [NODE_WIDTH, NODE_HEIGHT],
        "legend": {"positive": _css(POSITIVE), "negative": _css(NEGATIVE), "strongest": round(strongest, 4)},
        "prompt": prompt,
        "attention": attention,
    }
    listed = [f"{e['upstream']} -> {e['reader']}: {e['mean']}" for e in edges[::-1][:FALLBACK_EDGES]]
    more = [f"... and {len(edges) - FALLBACK_EDGES} more"] if len(edges) > FALLBACK_EDGES else []
    fallback = "\n".join([data["title"], *listed, *more])
    return View("circuit", data, fallback=fallback, description=f"{summary} ({method}, {prompts})")


def _checked_scores(scores, what: str):
    fields = ("upstream", "readers", "edge", "scores", "method")
    if not all(hasattr(scores, name) for name in fields):
        raise TypeError(
            f"{what} takes an EdgeScores (analysis.discovery.edge_attribution_patching), with fields {fields}, "
            f"got {type(scores).__name__}"
        )
    upstream, readers = list(scores.upstream), list(scores.readers)
    for axis, names in (("upstream", upstream), ("readers", readers)):
        if not all(isinstance(name, str) for name in names) or len(set(names)) != len(names):
            raise ValueError(f"{what}: scores.{axis} must be distinct str names, got {names[:8]}")
    values = inputs.to_array(scores.scores, "scores.scores")
    edge = inputs.to_array(scores.edge, "scores.edge") != 0
    expected = (len(upstream), len(readers))
    if values.ndim != 3 or values.shape[:2] != expected or values.shape[2] == 0 or edge.shape != expected:
        raise ValueError(
            f"{what}: expected scores.scores [upstream={expected[0]}, reader={expected[1]}, batch>=1] and scores.edge "
            f"[upstream={expected[0]}, reader={expected[1]}], got shapes {tuple(values.shape)} and {tuple(edge.shape)}"
        )
    inputs.check_finite(values, "scores.scores")
    return upstream, readers, edge, values, str(scores.method)


def _kept_mask(kept, edge: np.ndarray, mean: np.ndarray, upstream, readers, what: str) -> np.ndarray:
    if kept is None:
        candidates = edge & (mean != 0)
        n = min(DEFAULT_TOP, int(candidates.sum()))
        order = np.argsort(-np.abs(np.where(candidates, mean, 0.0)).ravel(), kind="stable")[:n]
        mask = np.zeros(edge.size, dtype=bool)
        mask[order] = True
        mask = mask.reshape(edge.shape)
    else:
        dtype = getattr(kept, "dtype", None)
        if not isinstance(kept, (Tensor, np.ndarray)) or str(dtype) not in ("torch.bool", "bool"):
            raise TypeError(
                f"{what}: kept must be a Bool tensor [upstream, reader] like scores.edge, got {type(kept).__name__} "
                f"of dtype {dtype}"
            )
        mask = inputs.to_array(kept, "kept") != 0
        if mask.shape != edge.shape:
            raise ValueError(
                f"{what}: kept must have scores.edge's shape [upstream={edge.shape[0]}, reader={edge.shape[1]}], "
                f"got shape {tuple(mask.shape)}"
            )
        outside = [(upstream[i], readers[j]) for i, j in zip(*np.nonzero(mask & ~edge))]
        if outside:
            raise ValueError(
                f"{what}: kept marks {len(outside)} pairs that are not edges (scores.edge), e.g. {outside[:5]}"
            )
    if not mask.any():
        raise ValueError(
            f"{what}: no edge to draw: kept marks none" + (" with a nonzero score" if kept is None else "")
        )
    return mask


def _level(name: NodeName, top_layer: int) -> int:
    """The node's row, counted from the input's (0): layer ``l``'s attention is ``2l + 1``, its MLP ``2l + 2``."""
    if name.kind == "input":
        return 0
    if name.kind in ("head", "kv", "attn"):
        return 2 * name.layer + 1
    if name.kind in ("mlp", "sublayer_mlp", "expert", "shared_expert"):
        return 2 * name.layer + 2
    return 2 * top_layer + 3 + (name.kind == "logits")


def _row_label(name: NodeName) -> str:
    if name.layer is None:
        return name.kind
    return f"L{name.layer} attn" if name.kind in ("head", "kv", "attn") else f"L{name.layer} MLP"


class _Layout(NamedTuple):
    nodes: dict[str, dict]  # node id -> its payload, row by row from the bottom, left to right
    rows: list[dict]  # each row's label and y, from the bottom
    width: float
    height: float


def _layout(drawn: list[NodeName], every: list[NodeName]) -> _Layout:
    """Every drawn node with its place: rows by level, a row's nodes in order, centred on the widest row."""
    top_layer = max((name.layer for name in every if name.layer is not None), default=-1)
    names = {name.node: name for name in drawn}
    rows: dict[int, list[NodeName]] = {}
    for name in names.values():
        rows.setdefault(_level(name, top_layer), []).append(name)
    levels = sorted(rows)
    widest = max(len(row) for row in rows.values())
    nodes, row_payload = {}, []
    for rank, level in enumerate(levels):
        y = MARGIN + NODE_HEIGHT / 2 + (len(levels) - 1 - rank) * ROW_STEP  # SVG's y grows downwards
        offset = LABEL_WIDTH + (widest - len(rows[level])) * COLUMN_STEP / 2
        ordered = sorted(rows[level], key=lambda name: (_KIND_ORDER.index(name.kind), name.index, name.node))
        for column, name in enumerate(ordered):
            nodes[name.node] = {
                "id": name.node,
                "kind": name.kind,
                "layer": name.layer,
                "x": offset + (column + 0.5) * COLUMN_STEP,
                "y": y,
                "ports": ["k", "v"] if name.kind == "kv" else [],
            }
        row_payload.append({"label": _row_label(ordered[0]), "y": y})
    width = LABEL_WIDTH + widest * COLUMN_STEP + MARGIN
    return _Layout(nodes, row_payload, width, 2 * MARGIN + (len(levels) - 1) * ROW_STEP + NODE_HEIGHT)


def _path(source: dict, target: dict, port_offset: float) -> str:
    """A cubic curve from the top of ``source`` to the bottom of ``target`` (at its port), leaving and arriving
    vertically."""
    x1, y1 = source["x"], source["y"] - NODE_HEIGHT / 2
    x2, y2 = target["x"] + port_offset, target["y"] + NODE_HEIGHT / 2
    bend = max(ROW_STEP / 3, abs(y1 - y2) / 2)
    points = (x1, y1, x1, y1 - bend, x2, y2 + bend, x2, y2)
    return "M{:.1f} {:.1f} C{:.1f} {:.1f} {:.1f} {:.1f} {:.1f} {:.1f}".format(*points)


def _edge_title(up: str, reader: str, row: np.ndarray, prompt: int) -> str:
    if row.size == 1:
        return f"{up} \u2192 {reader}: score {float(row[0]):.4g} (1 prompt)"
    return (
        f"{up} \u2192 {reader}: mean score {float(row.mean()):.4g} over {row.size} prompts; "
        f"prompt {prompt}: {float(row[prompt]):.4g}; range {float(row.min()):.4g} to {float(row.max()):.4g}"
    )


def _groups(every: list[NodeName]) -> dict[int, tuple[int, int]]:
    """Per layer, its numbers of query heads and of key/value heads, counted from the readers' names."""
    groups: dict[int, tuple[int, int]] = {}
    for name in every:
        if name.port in ("q", "k"):
            heads, kv = groups.get(name.layer, (0, 0))
            groups[name.layer] = (heads + (name.port == "q"), kv + (name.port == "k"))
    return groups


def _node_title(node: dict, kept_means: dict[str, list[float]], groups: dict, prompts: str) -> str:
    """What the node is, and the sums of its kept edges' mean scores, out and in."""
    kind, layer = node["kind"], node["layer"]
    index = parse_node(node["id"]).index
    what = {
        "input": "the embeddings",
        "logits": "the logits",
        "head": f"attention head {index} of layer {layer}",
        "kv": f"key/value head {index} of layer {layer}",
        "attn": f"layer {layer}'s attention",
        "mlp": f"layer {layer}'s MLP",
        "sublayer_mlp": f"layer {layer}'s MLP",
        "expert": f"expert {index} of layer {layer}'s mixture",
        "shared_expert": f"the shared expert of layer {layer}'s mixture",
    }.get(kind, "a node")
    heads, kv = groups.get(layer, (0, 0))
    if kind == "kv" and kv and heads > kv and heads % kv == 0:  # grouped-query attention: consecutive query heads
        size = heads // kv
        what += f", shared by query heads {index * size}..{index * size + size - 1}"
    parts = [
        f"{len(means)} kept edges {way}, summing to {sum(means):.4g}" for way, means in kept_means.items() if means
    ]
    return f"{node['id']}: {what}. " + "; ".join(parts) + f" (mean scores over {prompts})"


def _attention_data(patterns, tokens, upstream: list[str], drawn: list[str], what: str) -> dict | None:
    """``attention_view``'s data for the drawn heads with a pattern, or None without ``patterns``."""
    if patterns is None:
        if tokens is not None:
            raise ValueError(f"{what}: tokens are shown with the heads' patterns: pass patterns too, or no tokens")
        return None
    if not isinstance(patterns, Mapping):
        raise TypeError(
            f"{what}: patterns must be a dict of head name -> [query_pos, key_pos], got {type(patterns).__name__}"
        )
    if tokens is None:
        raise ValueError(f"{what}: patterns need the prompt's tokens, e.g. tokens=model.to_str_tokens(prompt)")
    tokens = inputs.str_tokens(tokens, what)
    heads = [name for name in upstream if parse_node(name).kind in ("head", "attn")]
    checked = {}
    for name, pattern in patterns.items():
        if name not in heads:
            close = difflib.get_close_matches(str(name), heads, n=3)
            raise KeyError(
                f"{what}: patterns are keyed by the heads of scores.upstream (L{{layer}}H{{head}}), got {name!r}"
                + (f"; did you mean {close}?" if close else "")
            )
        array = inputs.to_array(pattern, f"patterns[{name!r}]")
        if array.ndim != 2:
            raise ValueError(
                f"{what}: patterns[{name!r}] must be one head's [query_pos, key_pos] on prompt's {len(tokens)} tokens, "
                f"got shape {tuple(array.shape)}"
            )
        checked[name] = inputs.attention_patterns(array, len(tokens), f"{what} patterns[{name!r}]")[0]
    shown = [node for node in drawn if node in checked]
    if not shown:
        return None
    return {
        "tokens": tokens,
        "heads": shown,
        "pattern": inputs.rounded(np.stack([checked[name] for name in shown]), 4),
        "initialHead": 0,
        "initialToken": len(tokens) - 1,
        "scale": colours.sequential_scale(1.0),
    }


def _css(rgb) -> str:
    return "rgb({}, {}, {})".format(*rgb)
