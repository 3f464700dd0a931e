"""Running a circuit: the model on the clean prompts with every edge outside the circuit fed its corrupted value.

Each reader (a query head's query input, a key/value head's key or value input, an MLP's input,
the logits) reads its own copy of the residual stream::

    x_r = resid_r - sum over edges u -> r left out of the circuit of (current_u - corrupt_u)

where ``current_u`` is node ``u``'s write in this run and ``corrupt_u`` its write on the corrupted
prompts (the stream is the sum of the writes and of biases both runs share, so the sum is exact).
The reader then computes from ``x_r`` through its own norm and projection (``q_h = norm(x_r)
W_Q[h] + b_Q[h]``, ...; an MLP whose input no hook holds, a mixture of experts with no norm or behind
stream norms, is run again on ``x_r`` at its output), and everything after it runs as usual. Keeping
every edge gives the clean run, keeping none the corrupted one, and leaving out every edge of one node is patching
that node (``tests/test_faithfulness.py`` holds all three, ``tests/test_edges_encdec.py`` on encoder-decoders).

An encoder-decoder's two streams (``graph.EncoderDecoderGraph``) are carried so in one run, each
with its own nodes and readers: the encoder's readers at its end, each cross-attention key/value
head's key and value inputs, read their own copy of the encoder's final stream, through its final
norm and their projections, when the decoder's cross-attention asks for its keys and values.

``faithfulness_curve`` keeps the ``n`` edges of largest |score| for each ``n`` and reports the
normalized metric ``(m_circuit - m_corrupt) / (m_clean - m_corrupt)``: 1 is the whole model's
behaviour, 0 none of it. Its area (mean over the counts asked) summarizes the curve, and so do
MIB's two scores over the fraction of the graph's edges kept (trapezoid areas over the counts
asked): CPR, the area under the curve (higher is better), and CMD, the area of ``|1 - curve|``
(lower is better). ``selection="greedy"`` grows each circuit from the logits instead
(``selection``), and ``ablation="mean"`` feeds left-out edges their mean write over the
corrupted prompts instead of each prompt's own.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from .. import _checks
from .batched import DEFAULT_MEMORY_BUDGET, row_bytes
from .circuit_streams import DenseOffsets, GroupedOffsets, mean_writes, stream_hooks
from .edges import EdgeScores
from .graph import build_graph
from .metrics import RowMetric, row_values
from .runs import Runs, start
from .selection import greedy_edges, top_edges

SELECTIONS = {"top": top_edges, "greedy": greedy_edges}


@dataclass
class FaithfulnessCurve:
    """``normalized[i]``: the circuit of the ``counts[i]`` strongest edges, ``(m - m_corrupt) / (m_clean - m_corrupt)``
    of the metrics averaged over prompts; ``metric [count, batch]`` the raw values."""

    counts: list[int]
    normalized: Float[Tensor, "count"]
    metric: Float[Tensor, "count batch"]
    clean: Float[Tensor, "batch"]
    corrupted: Float[Tensor, "batch"]
    n_edges: int  # the graph's edges: ``counts / n_edges`` is the fraction of the graph kept

    @property
    def fractions(self) -> Float[Tensor, "count"]:
        return torch.tensor(self.counts, dtype=torch.float64) / self.n_edges

    def _area(self, values: Tensor) -> float:
        """The trapezoid area of ``values`` over the fraction of edges kept, the counts sorted."""
        order = self.fractions.argsort()
        return float(torch.trapezoid(values[order], self.fractions[order]))

    @property
    def cpr(self) -> float:
        """MIB's circuit performance ratio: the area under the normalized curve over the fraction of edges kept
        (higher: small circuits carry more of the behaviour)."""
        return self._area(self.normalized)

    @property
    def cmd(self) -> float:
        """MIB's circuit-model difference: the area of ``|1 - normalized|`` over the fraction of edges kept (lower:
        circuits closer to the whole model)."""
        return self._area((1 - self.normalized).abs())

    @property
    def area(self) -> float:
        """The mean normalized metric over the counts: 1 when every circuit carries the whole behaviour."""
        return float(self.normalized.mean())

    def figure(self, title: str = "faithfulness"):
        import plotly.graph_objects as go

        fig = go.Figure(go.Scatter(x=self.counts, y=self.normalized.tolist(), mode="lines+markers"))
        fig.update_layout(
            title=dict(text=f"{title}: area {self.area:.3f}, CPR {self.cpr:.3f}, CMD {self.cmd:.3f}"),
            xaxis_title="edges kept (strongest first)",
            yaxis_title="(m - m_corrupt) / (m_clean - m_corrupt)",
            xaxis_type="log",
        )
        return fig


ABLATIONS = ("corrupted", "mean")


@dataclass(frozen=True)
class _Prepared:
    """The checked runs, the model's graph, each stream's ablated writes ``[upstream, batch, pos, d_model]`` and
    its timeline steps (``Graph.order``)."""

    runs: Runs
    graph: object
    corrupt: tuple
    steps: tuple

    def check_kept(self, kept, name: str, circuits: bool) -> Tensor:
        upstream, readers = len(self.graph.upstream), len(self.graph.readers)
        shape = ("circuit",) * circuits + (upstream, readers)
        ok = isinstance(kept, Tensor) and kept.dtype == torch.bool and kept.ndim == len(shape)
        if not ok or tuple(kept.shape[circuits:]) != (upstream, readers) or (circuits and not len(kept)):
            expected = ", ".join(str(n) for n in shape)
            raise ValueError(
                f"{name} must be a bool tensor [{'circuit, ' * circuits}upstream, reader] = [{expected}]"
                f"{' with at least one circuit' if circuits else ''}, got "
                f"{getattr(kept, 'dtype', type(kept).__name__)} {tuple(getattr(kept, 'shape', ()))}"
            )
        return kept.cpu()

    def blocks(self, dropped: Tensor):
        """Each stream's graph, ablated writes, steps and its block of ``dropped [..., upstream, reader]``."""
        rows = columns = 0
        for graph, corrupt, steps in zip(self.graph.streams, self.corrupt, self.steps):
            n_up, n_read = len(graph.upstream), len(graph.readers)
            yield graph, corrupt, steps, dropped[..., rows : rows + n_up, columns : columns + n_read]
            rows, columns = rows + n_up, columns + n_read


def _prepare(model, clean_tokens, corrupted_tokens, metric, ablation, attention_mask) -> _Prepared:
    if ablation not in ABLATIONS:
        raise ValueError(f"ablation must be one of {ABLATIONS}, got {ablation!r}")
    runs = start(model, clean_tokens, corrupted_tokens, metric, attention_mask)
    full = build_graph(runs.model)
    written = list(dict.fromkeys(name for graph in full.streams for name in graph.write_hooks()))
    with torch.no_grad():
        corrupt_cache = runs.cache(runs.corrupted, written)
    corrupt = []
    for graph, mask in zip(full.streams, runs.stream_masks):
        writes = graph.writes(corrupt_cache)
        corrupt.append(mean_writes(writes, mask) if ablation == "mean" else writes)
    return _Prepared(runs, full, tuple(corrupt), tuple(graph.order() for graph in full.streams))


@torch.no_grad()
def _run_one(prepared: _Prepared, metric, kept: Tensor, tool: str) -> Tensor:
    """The reference: one circuit in one forward of ``batch`` rows, every dropped edge summed at every read."""
    dropped = prepared.graph.edge_mask() & ~kept
    hooks = []
    for graph, corrupt, _, block in prepared.blocks(dropped):
        hooks += stream_hooks(graph, DenseOffsets(corrupt, block.to(corrupt.device, corrupt.dtype)))
    runs = prepared.runs
    logits = runs.run(runs.clean, hooks)
    return row_values(metric, logits, torch.arange(runs.batch, device=logits.device), tool).to(torch.float64)


@torch.no_grad()
def _run_group(prepared: _Prepared, metric, kept: Tensor, labels: list[int], tool: str) -> Tensor:
    """The circuits ``kept [G, upstream, reader]`` in one forward of ``G * batch`` rows: ``[G, batch]``."""
    runs, groups = prepared.runs, kept.shape[0]
    dropped = prepared.graph.edge_mask()[None] & ~kept
    hooks = []
    for graph, corrupt, steps, block in prepared.blocks(dropped):
        hooks += stream_hooks(graph, GroupedOffsets(corrupt, block, steps))
    inputs = tuple(x.repeat(groups, *([1] * (x.ndim - 1))) for x in runs.clean)
    kwargs = {} if runs.mask is None else {"attention_mask": runs.mask.repeat(groups, 1)}
    logits = runs.model.run_with_hooks(*inputs, fwd_hooks=hooks, **kwargs)
    prompt = torch.arange(runs.batch, device=logits.device).repeat(groups)
    where = lambda row: f"circuit {labels[row // runs.batch]}, prompt {row % runs.batch}"  # noqa: E731
    return row_values(metric, logits, prompt, tool, where).to(torch.float64).reshape(groups, runs.batch)


def _row_bytes(prepared: _Prepared, dropped: Tensor) -> int:
    """One row's memory in a grouped forward of the circuits ``dropped`` (an estimate): the forward's activations
    (``batched.row_bytes``) and, per stream, the partial nodes' differences ``GroupedOffsets`` keeps, one writer's
    differences, the readers of one read and, past stream norms, every reader's carried offset."""
    runs = prepared.runs
    total = sum(row_bytes(runs.model, corrupt.shape[2]) for corrupt in prepared.corrupt)
    for graph, corrupt, steps, block in prepared.blocks(dropped):
        per_node = corrupt.shape[2] * corrupt.shape[3] * corrupt.element_size()
        widest = max(len(nodes.names) for plan in graph.plan for nodes in plan.nodes())
        readers = max(len(graph.block_readers(layer, "attn")) for layer in range(len(graph.plan)))
        carried = 2 * len(graph.readers) if graph.has_stream_norms else 0
        slots = GroupedOffsets.slots_needed(block, steps)
        total += per_node * (slots + widest + 3 * readers + carried + 2)
    return total


def _chunks(prepared: _Prepared, kept: Tensor, memory_budget: int, per_chunk: int | None) -> list[list[int]]:
    """The circuits (indices into ``kept``) of each grouped forward, fewest edges first: as many as fit
    ``memory_budget`` (``_row_bytes``), or ``per_chunk`` each."""
    order = kept.flatten(1).sum(dim=1).argsort(stable=True).tolist()
    if per_chunk is not None:
        return [order[i : i + per_chunk] for i in range(0, len(order), per_chunk)]
    edge, batch = prepared.graph.edge_mask(), prepared.runs.batch
    chunks, chunk = [], []
    for index in order:
        grown = chunk + [index]
        if chunk and len(grown) * batch * _row_bytes(prepared, edge[None] & ~kept[grown]) > memory_budget:
            chunks.append(chunk)
            grown = [index]
        chunk = grown
    return chunks + [chunk]


def _work(prepared: _Prepared, kept: Tensor) -> list[float]:
    """Each circuit's cost in a grouped forward, in multiply-adds per row (for an honest ETA): the model's forward,
    and each partial node's difference summed into each reader it reaches with an edge dropped."""
    model = prepared.runs.model
    n_pos = sum(corrupt.shape[2] for corrupt in prepared.corrupt)
    d_model = prepared.corrupt[0].shape[3]
    forward = n_pos * sum(p.numel() for p in model.parameters())
    edge = prepared.graph.edge_mask()
    dropped = edge[None] & ~kept
    every = (dropped == edge[None]).all(dim=-1, keepdim=True)
    partial_reads = (dropped & ~every).flatten(1).sum(dim=1)
    return (forward + partial_reads.double() * n_pos * d_model).tolist()


@torch.no_grad()
def run_circuit(
    model: _checks.AnyModel,
    clean_tokens,
    corrupted_tokens,
    metric: RowMetric,
    kept: Bool[Tensor, "upstream reader"],
    *,
    ablation: str = "corrupted",
    attention_mask: Int[Tensor, "batch pos"] | None = None,
) -> Float[Tensor, "batch"]:
    """The metric of the circuit ``kept`` (``[upstream, reader]``, as ``EdgeScores.edge`` is laid out).

    Edges outside the circuit carry the node's write on the corrupted prompts (``ablation="corrupted"``) or
    its mean over the corrupted prompts at that position (``"mean"``). An encoder-decoder's prompts are
    ``(source, target)`` pairs (``runs``); each of its streams carries its readers' own streams. Many circuits:
    ``run_circuits``, in batched forwards."""
    prepared = _prepare(model, clean_tokens, corrupted_tokens, metric, ablation, attention_mask)
    kept = prepared.check_kept(kept, "kept", circuits=False)
    return _run_group(prepared, metric, kept[None], [0], "run_circuit")[0]


@torch.no_grad()
def run_circuits(
    model: _checks.AnyModel,
    clean_tokens,
    corrupted_tokens,
    metric: RowMetric,
    kept: Bool[Tensor, "circuit upstream reader"],
    *,
    ablation: str = "corrupted",
    attention_mask: Int[Tensor, "batch pos"] | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    circuits_per_chunk: int | None = None,
    progress: bool = False,
) -> Float[Tensor, "circuit batch"]:
    """``result[c, b]``: the metric on prompt ``b`` of the circuit ``kept[c]`` (``run_circuit`` of each), many
    circuits per forward.

    The clean prompts are repeated once per circuit along the batch axis, rows ``[c B, (c + 1) B)`` running
    circuit ``c`` (``circuit_streams.GroupedOffsets``), as ``patch_sites`` lays sites. Circuits of similar size go
    together, as many per forward as ``memory_budget`` (bytes; an estimate, ``_row_bytes``) allows, or
    ``circuits_per_chunk``. ``progress`` shows a bar whose ETA weighs each forward by its estimated work."""
    prepared = _prepare(model, clean_tokens, corrupted_tokens, metric, ablation, attention_mask)
    kept = prepared.check_kept(kept, "kept", circuits=True)
    memory_budget = _checks.count(memory_budget, "memory_budget", minimum=1)
    if circuits_per_chunk is not None:
        circuits_per_chunk = _checks.count(circuits_per_chunk, "circuits_per_chunk", minimum=1)
    return _run_chunks(prepared, metric, kept, memory_budget, circuits_per_chunk, progress, "run_circuits")


def _run_chunks(prepared, metric, kept, memory_budget, per_chunk, progress: bool, tool: str) -> Tensor:
    chunks = _chunks(prepared, kept, memory_budget, per_chunk)
    work = _work(prepared, kept)
    results = torch.empty(len(kept), prepared.runs.batch, dtype=torch.float64)
    bar = tqdm(
        total=sum(work), desc="circuits", disable=not progress, leave=False, unit="op", unit_scale=True,
        bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}{postfix}]",
    )  # fmt: skip
    with bar:
        finished = 0
        for chunk in chunks:
            bar.set_postfix_str(f"{finished}/{len(kept)} circuits, {len(chunk)} in this forward")
            results[chunk] = _run_group(prepared, metric, kept[chunk], chunk, tool).cpu()
            finished += len(chunk)
            bar.update(sum(work[index] for index in chunk))
        bar.set_postfix_str(f"{finished}/{len(kept)} circuits")
    return results


def faithfulness_curve(
    model: _checks.AnyModel,
    clean_tokens,
    corrupted_tokens,
    metric: RowMetric,
    scores: EdgeScores,
    counts: Sequence[int],
    *,
    selection: str = "top",
    ablation: str = "corrupted",
    attention_mask: Int[Tensor, "batch pos"] | None = None,
    one_at_a_time: bool = False,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    progress: bool = False,
) -> FaithfulnessCurve:
    """The circuits of ``n`` edges chosen from ``scores`` by ``selection`` (``"top"``: the strongest by mean
    |score|; ``"greedy"``: grown from the logits, ``selection.greedy_edges``), for each ``n`` in ``counts``.

    Every circuit, and the whole model and no edge at all, run in batched forwards (``run_circuits``, chunked to
    ``memory_budget``); ``one_at_a_time=True`` runs each alone, one forward each, every dropped edge summed at
    every read: the reference the batched curve equals (``tests/test_faithfulness_batched.py``)."""
    memory_budget = _checks.count(memory_budget, "memory_budget", minimum=1)
    circuits = curve_circuits(scores, counts, selection)
    prepared = _prepare(model, clean_tokens, corrupted_tokens, metric, ablation, attention_mask)
    kept = prepared.check_kept(circuits, "the scores' edges", circuits=True)
    if one_at_a_time:
        bar = tqdm(kept, desc="faithfulness, one circuit at a time", leave=False, disable=not progress)
        values = torch.stack([_run_one(prepared, metric, circuit, "faithfulness_curve") for circuit in bar]).cpu()
    else:
        values = _run_chunks(prepared, metric, kept, memory_budget, None, progress, "faithfulness_curve")
    return curve_of(values, [int(n) for n in counts], int(scores.edge.sum()))  # counts: checked ints by now


def curve_circuits(scores: EdgeScores, counts: Sequence[int], selection: str = "top") -> Tensor:
    """The circuits a curve runs, ``[2 + count, upstream, reader]``: every edge, none, then ``counts``' circuits
    chosen by ``selection`` (``faithfulness_curve``; ``curve_of`` turns their metrics into the curve)."""
    n_edges = int(scores.edge.sum())
    expected = f"counts must be ints in [0, {n_edges}] (the graph's edges)"
    given = counts
    counts = list(counts) if hasattr(counts, "__iter__") and not isinstance(counts, (str, bytes)) else []
    if not counts:
        raise ValueError(
            f"counts must be a non-empty list of ints in [0, {n_edges}] (the graph's edges), got {given!r}"
        )
    counts = [_checks.strict_count(n, "counts", minimum=0, most=n_edges, expected=expected) for n in counts]
    if selection not in SELECTIONS:
        raise ValueError(f"selection must be one of {tuple(SELECTIONS)}, got {selection!r}")
    none = torch.zeros_like(scores.edge)
    return torch.stack(
        [scores.edge.clone(), none] + [none if n == 0 else SELECTIONS[selection](scores, n) for n in counts]
    )


def curve_of(values: Float[Tensor, "circuit batch"], counts: Sequence[int], n_edges: int) -> FaithfulnessCurve:
    """The curve from the metrics of ``curve_circuits``' circuits (rows beyond them are ignored)."""
    clean, corrupted, metric_values = values[0], values[1], values[2 : 2 + len(counts)]
    gap = clean.mean() - corrupted.mean()
    if gap == 0:
        raise ValueError("the clean and corrupted prompts give the same mean metric: there is no behaviour to recover")
    normalized = (metric_values.mean(dim=-1) - corrupted.mean()) / gap
    return FaithfulnessCurve(list(counts), normalized, metric_values, clean, corrupted, n_edges)


__all__ = [
    "FaithfulnessCurve",
    "curve_circuits",
    "curve_of",
    "faithfulness_curve",
    "run_circuit",
    "run_circuits",
]
