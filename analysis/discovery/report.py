"""A circuit found and checked, as one offline page: the graph, node and edge heatmaps, the faithfulness curve.

``circuit_report(model, task)`` (a decoder's ``Task``, or an encoder-decoder's ``Seq2SeqTask`` of
(source, target) pairs) scores every edge (EAP or EAP-IG), chooses the circuit of ``edges`` edges
(default ``DEFAULT_EDGES``: tens of edges, a graph a person can read) or of ``fraction`` of the graph's
edges (top or greedy, pruned of nodes with no path to the logits), runs it and the
faithfulness curve over ``sizes`` (default MIB's, ``FRACTIONS``; every circuit in batched forwards), names
the smallest size of the curve reaching ``TARGET`` faithfulness, and returns a ``Report``
(``analysis.report.page``: plotly.js and the views' script embedded once, nothing fetched)
holding the numbers (``report["circuit"].data``) and:

- the circuit as a graph (``analysis.views.circuit_view``): hover for scores, click a head to see
  its attention on the first prompt (an encoder-decoder's: a decoder self-attention head's, on the first target);
- node scores (each node's edges summed) as a layer x unit heatmap;
- edge scores among the circuit's nodes as an upstream x reader heatmap;
- the faithfulness curve over circuit sizes, with MIB's CPR and CMD.
"""

import csv
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import plotly.graph_objects as go
import torch
from torch import Tensor

from ..report.context import ReportSection, SectionData
from ..report.page import Report
from ..views import circuit_view
from .edges import EdgeScores, edge_attribution_patching
from .faithfulness import curve_circuits, curve_of, run_circuits
from .graph import build_graph
from .metrics import RowMetric
from .selection import circuit_nodes, greedy_edges, prune, top_edges
from .seq2seq_tasks import Seq2SeqTask
from .tasks import Task

FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)  # MIB's circuit sizes
DEFAULT_EDGES = 50  # the drawn circuit when no size is asked: tens of edges, a graph a person can read
TARGET = 0.8  # the faithfulness whose smallest circuit on the curve the summary names


def circuit_sizes(sizes: str | Sequence[int | str], n_edges: int | None = None) -> list[int]:
    """Edge counts from ``sizes``: a comma list (``"50,200,1%,5%"``) or a sequence of ints and ``"P%"`` strings.

    An int is a count of edges, in ``[1, n_edges]``; ``"P%"`` is ``P`` percent of the graph's edges, ``P`` in
    ``(0, 100]`` (at least one edge). With ``n_edges`` None only the syntax and the percentages are checked and
    the counts are returned as given (percentages dropped): what a command line checks before a model loads."""
    given = sizes
    items = [item.strip() for item in sizes.split(",")] if isinstance(sizes, str) else list(sizes)
    expected = "sizes must be a comma list of edge counts (ints >= 1) or percentages of the edges in (0, 100]"
    counts = []
    if not items:
        raise ValueError(f"{expected}, e.g. '50,200,1%,5%'; got {given!r}")
    for item in items:
        text = str(item).strip()
        percent = text.endswith("%")
        try:
            value = float(text[:-1]) if percent else int(text)
        except ValueError:
            raise ValueError(f"{expected}, e.g. '50,200,1%,5%'; got {item!r} in {given!r}") from None
        if isinstance(item, bool) or (percent and not 0 < value <= 100) or (not percent and value < 1):
            raise ValueError(f"{expected}; got {item!r} in {given!r}")
        if n_edges is None:
            counts += [] if percent else [value]
        elif percent:
            counts.append(max(1, round(value / 100 * n_edges)))
        elif value > n_edges:
            raise ValueError(f"{expected}; got {value} edges, but the graph has {n_edges}")
        else:
            counts.append(value)
    return sorted(set(counts))


def write_edge_scores(scores: EdgeScores, kept: Tensor, path: str | Path) -> Path:
    """Every edge's mean score over prompts as CSV (``upstream,reader,score,in_circuit``), strongest first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mean, strength = scores.mean, scores.strength()
    order = strength.flatten().argsort(descending=True, stable=True)[: int(scores.edge.sum())]
    n_readers = len(scores.readers)
    with path.open("w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(["upstream", "reader", "score", "in_circuit"])
        for index in order.tolist():
            i, j = divmod(index, n_readers)
            writer.writerow([scores.upstream[i], scores.readers[j], f"{float(mean[i, j]):.6g}", int(kept[i, j])])
    return path


@dataclass
class CircuitData(SectionData):
    """The circuit's numbers: the graph's edges, those kept, its nodes, the metric clean / corrupted / in the circuit,
    the circuit's faithfulness, and MIB's CPR and CMD over ``FRACTIONS`` of the edges."""

    edges: int
    kept: Tensor
    nodes: list[str]
    clean: float
    corrupted: float
    circuit: float
    faithfulness: float
    cpr: float
    cmd: float
    counts: list[int] = field(default_factory=list)  # the curve's circuit sizes
    curve: list[float] = field(default_factory=list)  # their faithfulness
    smallest_faithful: int | None = None  # the smallest of ``counts`` reaching ``TARGET`` (None: none does)
    scores: EdgeScores | None = None  # every edge's scores (``write_edge_scores``)


def node_figure(scores: EdgeScores, title: str = "node scores"):
    """Each upstream node's score (its edges summed, mean over prompts) as a layer x unit heatmap."""
    totals = scores.mean.sum(dim=1)
    cells: dict[tuple[str, str], float] = {}
    for name, value in zip(scores.upstream, totals.tolist()):
        layer, unit = _layer_and_unit(name)
        cells[(layer, unit)] = value
    layers = list(dict.fromkeys(layer for layer, _ in cells))
    units = list(dict.fromkeys(unit for _, unit in cells))
    z = [[cells.get((layer, unit)) for unit in units] for layer in layers]
    bound = max(abs(v) for v in totals.tolist()) or 1.0
    fig = go.Figure(go.Heatmap(z=z, x=units, y=layers, colorscale="RdBu", reversescale=True, zmin=-bound, zmax=bound))
    fig.update_layout(title=dict(text=title), xaxis_title="unit", yaxis_title="block", yaxis_autorange="reversed")
    return fig


def _layer_and_unit(name: str) -> tuple[str, str]:
    """A node's row and column: ``L3H5`` -> ``("L3", "H5")``, ``MLP3.E0`` -> ``("L3", "E0")``, an encoder's
    ``enc.L0H1`` -> ``("enc.L0", "H1")``."""
    stack = "enc." if name.startswith("enc.") else ""
    bare = name.removeprefix(stack)
    if bare == "input":
        return name, "input"
    mlp = re.fullmatch(r"MLP(\d+)(?:\.(.+))?", bare)
    if mlp:
        return f"{stack}L{mlp[1]}", mlp[2] or "MLP"
    unit = re.fullmatch(r"L(\d+)(?:([A-Z]\d+)|\.(.+))", bare)
    if unit:
        return f"{stack}L{unit[1]}", unit[2] or unit[3]
    return name, name


def edge_figure(scores: EdgeScores, kept: torch.Tensor, title: str = "edge scores in the circuit"):
    """Mean edge scores among the circuit's nodes: upstream x reader (0 off the circuit's edges)."""
    rows = [i for i in range(len(scores.upstream)) if bool(kept[i].any())]
    columns = [j for j in range(len(scores.readers)) if bool(kept[:, j].any())]
    z = (scores.mean * kept)[rows][:, columns]
    bound = float(z.abs().max()) or 1.0
    fig = go.Figure(
        go.Heatmap(
            z=z.tolist(),
            x=[scores.readers[j] for j in columns],
            y=[scores.upstream[i] for i in rows],
            colorscale="RdBu",
            reversescale=True,
            zmin=-bound,
            zmax=bound,
        )
    )
    fig.update_layout(title=dict(text=title), xaxis_title="reader", yaxis_title="node", yaxis_autorange="reversed")
    return fig


def _patterns(model, task, nodes: list[str]) -> tuple[list[str] | None, dict]:
    """The first prompt's tokens and the attention pattern of each head among ``nodes`` (of a whole attention
    sublayer's node, ``L3.attn``, its heads' mean pattern). An encoder-decoder's: its decoder's self-attention heads
    over the first target."""
    wanted = {}  # node -> (layer, head or None)
    for name in nodes:
        head = re.fullmatch(r"L(\d+)H(\d+)", name)
        sublayer = re.fullmatch(r"L(\d+)\.attn", name)
        if head:
            wanted[name] = (int(head[1]), int(head[2]))
        elif sublayer:
            wanted[name] = (int(sublayer[1]), None)
    if model.writers_that("reads_source"):
        source, target = task.clean
        mask = None if task.attention_mask is None else task.attention_mask[:1]
        inputs, tokens, stack = (source[:1], target[:1]), target[:1], ("decoder",)
        kwargs = {} if mask is None else {"attention_mask": mask}
    else:
        n_real = int(task.attention_mask[0].sum()) if task.attention_mask is not None else task.clean.shape[1]
        tokens = task.clean[:1, :n_real]
        inputs, stack, kwargs = (tokens,), (), {}
    patterns = {}
    if wanted:
        layers = sorted({layer for layer, _ in wanted.values()})
        names = [model.act_name("pattern", layer, *stack) for layer in layers]
        _, cache = model.run_with_cache(*inputs, names_filter=names, **kwargs)
        for name, (layer, head) in wanted.items():
            pattern = cache[model.act_name("pattern", layer, *stack)][0]
            patterns[name] = (pattern.mean(0) if head is None else pattern[head]).detach().cpu()
    strings = model.to_str_tokens(tokens[0]) if model.tokenizer is not None else [str(t) for t in tokens[0].tolist()]
    return list(strings), patterns


def circuit_report(
    model,
    task: Task | Seq2SeqTask,
    *,
    metric: RowMetric | None = None,
    method: str = "EAP-IG",
    steps: int = 5,
    ig_on: str = "inputs",
    edges: int | None = None,
    fraction: float | None = None,
    sizes: None | str | Sequence[int | str] = None,
    selection: str = "top",
    ablation: str = "corrupted",
    title: str | None = None,
    scores_file: str | None = None,
    progress: bool = False,
) -> Report:
    """Find the circuit of ``edges`` edges (default ``DEFAULT_EDGES``) or ``fraction`` of the graph's for ``task``
    and check it over the curve of ``sizes`` (``circuit_sizes``; default MIB's ``FRACTIONS``) (module docstring).
    ``scores_file``: where the page links every edge's score (``write_edge_scores``). ``progress``: bars with an
    ETA for the scoring and the curve."""
    if edges is not None and fraction is not None:
        raise ValueError(f"give the circuit's size once: edges={edges!r} or fraction={fraction!r}")
    if fraction is not None and (
        not isinstance(fraction, (int, float)) or isinstance(fraction, bool) or not 0 < fraction <= 1
    ):
        raise ValueError(f"fraction must be in (0, 1], the share of the graph's edges to keep, got {fraction!r}")
    if edges is not None:
        circuit_sizes([edges])  # an int >= 1; checked against the graph's edges below
    if sizes is not None:
        circuit_sizes(sizes)  # the syntax, before the scoring
    if isinstance(task, Task):
        task.check_model(model, "circuit_report")
    metric = metric or task.metric
    data = (model, task.clean, task.corrupted, metric)
    options = dict(attention_mask=task.attention_mask)
    n_edges = int(build_graph(model).edge_mask().sum())
    if fraction is not None:
        size = max(1, round(fraction * n_edges))
    else:
        size = circuit_sizes([edges], n_edges)[0] if edges is not None else min(DEFAULT_EDGES, n_edges)
    counts = circuit_sizes(sizes, n_edges) if sizes is not None else [max(1, round(f * n_edges)) for f in FRACTIONS]
    counts = sorted(set(counts) | {0, size})
    scores = edge_attribution_patching(
        *data, method=method, steps=steps, ig_on=ig_on, progress=progress or None, **options
    )  # fmt: skip
    kept = prune(scores, (greedy_edges if selection == "greedy" else top_edges)(scores, size))
    nodes = circuit_nodes(scores, kept)
    circuits = torch.cat([curve_circuits(scores, counts, selection), kept[None]])  # one batched run for all
    values = run_circuits(*data, circuits, ablation=ablation, progress=progress, **options)
    curve, circuit = curve_of(values, counts, n_edges), values[-1].mean()
    clean, corrupted = curve.clean.mean(), curve.corrupted.mean()
    faithfulness = float((circuit - corrupted) / (clean - corrupted))
    reaching = [n for n, value in zip(counts, curve.normalized.tolist()) if value >= TARGET]
    smallest = min(reaching) if reaching else None
    tokens, patterns = _patterns(model, task, nodes)
    graph = circuit_view(
        scores, kept, tokens=tokens if patterns else None, patterns=patterns or None, title="the circuit"
    )
    numbers = CircuitData(
        n_edges, kept, nodes, float(clean), float(corrupted), float(circuit), faithfulness, curve.cpr, curve.cmd,
        list(counts), curve.normalized.tolist(), smallest, scores,
    )  # fmt: skip
    n_kept = int(kept.sum())
    asked = f"{fraction:.1%} of the edges" if fraction is not None else f"the {size} strongest edges"
    summary = [
        f"Task {task.name!r}, {len(task)} prompts; metric clean {float(clean):+.3f}, "
        f"corrupted {float(corrupted):+.3f}.",
        f"{scores.method} scored {n_edges} edges; the circuit ({asked}, {selection} selection, pruned) keeps "
        f"{n_kept} ({n_kept / n_edges:.1%}) over {len(nodes)} nodes, with {ablation} ablation of the rest.",
        f"The circuit's metric is {float(circuit):+.3f}: faithfulness {faithfulness:.2f} "
        "(1: the whole model, 0: none). "
        f"Over circuit sizes CPR {curve.cpr:.3f} (higher is better), CMD {curve.cmd:.3f} (lower is better).",
        f"The smallest circuit of the curve reaching faithfulness {TARGET}: "
        + (
            f"{smallest} edges ({smallest / n_edges:.1%}; draw it with --edges {smallest})."
            if smallest is not None
            else f"none of its sizes up to {max(counts)} edges."
        ),
    ]
    link = ""
    if scores_file is not None:
        name = html.escape(str(scores_file), quote=True)
        link = f'<p>Every edge\'s score (mean over prompts, strongest first): <a href="{name}">{name}</a></p>'
    sections = [
        ReportSection("circuit", "The circuit", summary, [], numbers, link + graph.to_html(include_script=False)),
        ReportSection("nodes", "Node scores", ["Each node's edges summed, mean over prompts."], [node_figure(scores)]),
        ReportSection("edges", "Edge scores", ["Among the circuit's nodes."], [edge_figure(scores, kept)]),
        ReportSection("faithfulness", "Faithfulness", ["Circuits of growing size."], [curve.figure()]),
    ]
    return Report(title or f"circuit: {task.name}", sections, summary)


__all__ = [
    "DEFAULT_EDGES",
    "FRACTIONS",
    "TARGET",
    "circuit_report",
    "circuit_sizes",
    "edge_figure",
    "node_figure",
    "write_edge_scores",
]
