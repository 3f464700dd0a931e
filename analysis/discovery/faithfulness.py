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

from dataclasses import dataclass
from typing import Optional, Sequence

import einops
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from .. import _checks
from .edges import EdgeScores
from .graph import Graph, build_graph
from .metrics import RowMetric, row_values
from .runs import start
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


def _mean_writes(writes: Tensor, mask: Optional[Tensor]) -> Tensor:
    """Each node's write averaged over prompts at each position (real tokens only), for every prompt."""
    if mask is None:
        return writes.mean(dim=1, keepdim=True).expand_as(writes)
    weight = mask.to(writes.dtype)[None, :, :, None]
    mean = (writes * weight).sum(dim=1, keepdim=True) / weight.sum(dim=1, keepdim=True).clamp(min=1)
    return mean.expand_as(writes)


def _stream_hooks(graph: Graph, corrupt: Tensor, dropped: Tensor) -> list:
    """The forward hooks that give each reader of ``graph`` its own stream (module docstring): ``corrupt`` the nodes'
    ablated writes ``[upstream, batch, pos, d_model]``, ``dropped [upstream, reader]`` the edges fed them."""
    readers = graph.readers
    reader_index = {name: j for j, (name, _, _) in enumerate(readers)}
    reader_at = torch.tensor(graph.order()[1])
    current: list[Tensor] = []  # this run's writes, in upstream order, as they are computed
    seen: dict[str, Tensor] = {}  # activations of this run the next write or reader needs
    # each reader's stream minus this run's, carried through the last stream norm: (first reader, [reader, ...])
    carried: dict[str, tuple[int, Tensor]] = {}

    def offsets(columns: list[int]) -> Tensor:
        """``x_r - resid`` for the readers ``columns``: ``[reader, batch, pos, d_model]``."""
        since, done = (carried["since"][0] if carried else 0), len(current)
        offset = 0
        if done > since:
            diff = torch.stack(current[since:]) - corrupt[since:done]
            offset = -einops.einsum(dropped[since:done][:, columns], diff, "u r, u b p d -> r b p d")
        if carried:
            first, value = carried["value"]
            offset = offset + value[[column - first for column in columns]]
        return offset

    def reader_inputs(resid: Tensor, names: list[str]) -> Tensor:
        """``x_r`` for the readers ``names``: ``[reader, batch, pos, d_model]``."""
        return resid[None] + offsets([reader_index[name] for name in names])

    def renormalize(step: int, norm):
        def hook_fn(activation: Tensor, hook) -> None:  # a stream norm's input: carry each reader's offset through
            first = int((reader_at <= step).sum())
            ahead = list(range(first, len(readers)))
            value = norm.normalize(activation[None] + offsets(ahead)) - norm.normalize(activation)[None]  # [ahead, ...]
            carried.update(since=(len(current), None), value=(first, value))

        return hook_fn

    def remember(key: str):
        return lambda activation, hook: seen.__setitem__(key, activation)

    def write(nodes):
        def hook_fn(activation: Tensor, hook) -> None:  # the writer's output: its nodes' writes are all known now
            seen[hook.name] = activation
            current.extend(nodes.writes(seen.__getitem__))

        return hook_fn

    def projection(names: list[str], norm, weight: Tensor, bias: Tensor, key: str, pattern: str):
        def hook_fn(activation: Tensor, hook) -> Tensor:  # recomputed from each reader's own stream
            x = reader_inputs(seen[key], names)
            x = x if norm is None else norm.normalize(x)
            return einops.einsum(x, weight, pattern) + (0 if bias is None else bias)

        return hook_fn

    def mlp_input(name: list[str], norm, key: str):
        return lambda activation, hook: norm.normalize(reader_inputs(seen[key], name)[0])

    def first(hook_fn):
        return lambda activation, hook: hook_fn(activation, hook)[0]

    def rerun(name: list[str], block, key: str):
        def hook_fn(activation: Tensor, hook) -> Tensor:  # the part run again on its own stream; its hooks fire again
            return block.mlp_write_from(reader_inputs(seen[key], name)[0])

        return hook_fn

    heads = "r b p d, r d e -> b p r e"
    hooks = [(graph.input_hook, lambda activation, hook: current.append(activation))]
    steps = {id(payload): step for step, _, kind, payload in graph.timeline() if kind == "norm"}
    for layer, block in enumerate(graph.plan):
        attn, attn_norm = block.attn, block.attn_norm
        attn_key = block.reads_at["attn"]
        hooks.append((attn_key, remember(attn_key)))
        queries = [name for name in graph.block_readers(layer, "attn") if name.endswith(".q")]
        hooks.append((attn.hook_q.name, projection(queries, attn_norm, attn.W_Q, attn.b_Q, attn_key, heads)))
        for x in ("k", "v"):
            names = [name for name in graph.block_readers(layer, "attn") if name.endswith(f".{x}")]
            weight, bias = attn.stored(f"W_{x.upper()}"), attn.stored(f"b_{x.upper()}")
            hooks.append((getattr(attn, f"hook_{x}").name, projection(names, attn_norm, weight, bias, attn_key, heads)))
        for step in block.stream_norms:
            hooks.append((step.reads, renormalize(steps[id(step)], step.norm)))
        if block.cross is not None:  # its queries read this stream (its keys and values: the encoder's end)
            cross, cross_key = block.cross, block.reads_at["cross"]
            hooks.append((cross_key, remember(cross_key)))
            names = graph.block_readers(layer, "cross")
            hooks.append(
                (cross.hook_q.name, projection(names, block.cross_norm, cross.W_Q, cross.b_Q, cross_key, heads))
            )
        if block.mlp is not None:
            mlp_key = block.reads_at["mlp"]
            hooks.append((mlp_key, remember(mlp_key)))
            name = graph.block_readers(layer, "mlp")
            if block.mlp_reads == "norm":  # the norm's output, recomputed from the MLP's own stream
                hooks.append((block.mlp_norm.hook_normalized.name, mlp_input(name, block.mlp_norm, mlp_key)))
            elif block.mlp_reads == "projections":  # its input projections, recomputed (through its norm, if any)
                for hook, (W, b) in zip(block.mlp.input_hooks(), block.mlp.input_weights()):
                    pattern = "r b p d, d m -> r b p m"
                    hooks.append((hook, first(projection(name, block.mlp_norm, W, b, mlp_key, pattern))))
            else:  # its output, the part run again on its own stream (before the hook recording its nodes' writes)
                hooks.append((block.mlp_nodes.output, rerun(name, block, mlp_key)))
        for nodes in block.nodes():
            hooks += [(name, remember(name)) for name in nodes.hooks if name != nodes.output]
            hooks.append((nodes.output, write(nodes)))
    final, end = graph.final_hook, graph.end
    if not end.projections:  # the logits read the final stream itself
        return hooks + [(final, lambda activation, hook: reader_inputs(activation, list(end.names))[0])]
    hooks.append((final, remember(final)))
    for hook, weight, bias, names in end.projections:  # read later, by another stream's parts
        hooks.append((hook, projection(list(names), end.norm, weight, bias, final, heads)))
    return hooks


@torch.no_grad()
def run_circuit(
    model: _checks.AnyModel,
    clean_tokens,
    corrupted_tokens,
    metric: RowMetric,
    kept: Bool[Tensor, "upstream reader"],
    *,
    ablation: str = "corrupted",
    attention_mask: Optional[Int[Tensor, "batch pos"]] = None,
) -> Float[Tensor, "batch"]:
    """The metric of the circuit ``kept`` (``[upstream, reader]``, as ``EdgeScores.edge`` is laid out).

    Edges outside the circuit carry the node's write on the corrupted prompts (``ablation="corrupted"``) or
    its mean over the corrupted prompts at that position (``"mean"``). An encoder-decoder's prompts are
    ``(source, target)`` pairs (``runs``); each of its streams carries its readers' own streams."""
    return _run_circuit(model, clean_tokens, corrupted_tokens, metric, kept, ablation, attention_mask, "run_circuit")


@torch.no_grad()
def _run_circuit(model, clean_tokens, corrupted_tokens, metric, kept, ablation, attention_mask, tool: str) -> Tensor:
    """``run_circuit`` for ``tool``, which a non-finite metric names."""
    if ablation not in ABLATIONS:
        raise ValueError(f"ablation must be one of {ABLATIONS}, got {ablation!r}")
    runs = start(model, clean_tokens, corrupted_tokens, metric, attention_mask)
    full = build_graph(runs.model)
    upstream, readers = full.upstream, full.readers
    if not isinstance(kept, Tensor) or kept.dtype != torch.bool or kept.shape != (len(upstream), len(readers)):
        raise ValueError(
            f"kept must be a bool tensor [upstream, reader] = [{len(upstream)}, {len(readers)}], got "
            f"{getattr(kept, 'dtype', type(kept).__name__)} {tuple(getattr(kept, 'shape', ()))}"
        )
    written = list(dict.fromkeys(name for graph in full.streams for name in graph.write_hooks()))
    corrupt_cache = runs.cache(runs.corrupted, written)
    dropped = full.edge_mask() & ~kept.cpu()  # edges fed the ablated value
    hooks, rows, columns = [], 0, 0
    for graph, mask in zip(full.streams, runs.stream_masks):
        corrupt = graph.writes(corrupt_cache)  # [upstream, batch, pos, d_model]
        if ablation == "mean":
            corrupt = _mean_writes(corrupt, mask)
        n_up, n_read = len(graph.upstream), len(graph.readers)
        block = dropped[rows : rows + n_up, columns : columns + n_read].to(corrupt.device, corrupt.dtype)
        hooks += _stream_hooks(graph, corrupt, block)
        rows, columns = rows + n_up, columns + n_read
    logits = runs.run(runs.clean, hooks)
    return row_values(metric, logits, torch.arange(runs.batch, device=logits.device), tool).to(torch.float64)


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
    attention_mask: Optional[Int[Tensor, "batch pos"]] = None,
) -> FaithfulnessCurve:
    """The circuits of ``n`` edges chosen from ``scores`` by ``selection`` (``"top"``: the strongest by mean
    |score|; ``"greedy"``: grown from the logits, ``selection.greedy_edges``), for each ``n`` in ``counts``."""
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

    def circuit(kept: Tensor) -> Tensor:
        return _run_circuit(
            model, clean_tokens, corrupted_tokens, metric, kept, ablation, attention_mask, "faithfulness_curve"
        )

    clean, corrupted = circuit(scores.edge.clone()), circuit(none)
    values = []
    for n in tqdm(counts, desc="faithfulness", leave=False, disable=len(counts) < 8):
        values.append(circuit(none if n == 0 else SELECTIONS[selection](scores, n)))
    metric_values = torch.stack(values)
    gap = clean.mean() - corrupted.mean()
    if gap == 0:
        raise ValueError("the clean and corrupted prompts give the same mean metric: there is no behaviour to recover")
    normalized = (metric_values.mean(dim=-1) - corrupted.mean()) / gap
    return FaithfulnessCurve(list(counts), normalized, metric_values, clean, corrupted, n_edges)


__all__ = ["FaithfulnessCurve", "faithfulness_curve", "run_circuit"]
