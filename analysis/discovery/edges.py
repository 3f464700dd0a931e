"""Edge attribution patching (EAP) and its integrated-gradients form (EAP-IG) over the model's graph.

**The graph** (``graph.build_graph``). Upstream nodes write to the residual stream: the input,
every attention head (or the attention sublayer where its output passes its own norm, Gemma 2/3),
every MLP, every expert of a mixture (weighted by its routing). Readers read it, each through its
own norm: every query head's query input (``L3H5.q``), every key/value head's key and value
inputs (``L3K1.k``, ``L3K1.v``: under grouped-query attention nothing is ungrouped), every MLP's
input, and the logits. An edge joins a node to every reader after it in the stream.

**The score.** With ``Δ_u = clean_u - corrupt_u`` a node's write difference and ``g_r`` the gradient of
the metric with respect to the residual stream *as reader r reads it* (the gradient at the
reader's own projection, ``∂m/∂q_h W_Q[h]^T``, or at its MLP's input, pulled back through its norm's
full Jacobian at the run's residual)::

    EAP:     score(u -> r) = sum over positions of Δ_u . g_r            (g_r at the corrupted run)
    EAP-IG:  the same with g_r averaged over ``steps`` runs whose input (the stream entering
             block 0) is corrupt + (k / steps) (clean - corrupt), k = 1 .. steps   (EAP-IG-inputs)
    EAP-IG (ig_on="activations"): for each writer, its edges read g_r averaged over ``steps``
             runs in which that writer's output alone is interpolated so (the rest corrupted)

Sign and direction: ``Δ`` is clean minus corrupt and the gradient is taken at (or towards) the
corrupted run, so a score estimates ``metric(corrupt with the edge clean) - metric(corrupt)``:
positive means the edge carries the clean behaviour the metric measures.

Each is a first-order estimate of patching that one edge clean. Two identities hold exactly
(``tests/test_edges.py``): a node's edges sum to its attribution-patching score (the residual
stream is read only by the readers, so ``∂m/∂write_u = sum_r g_r``), and the edges into the logits
sum to the attribution-patching score of the final residual stream.

**Which models.** Decoders: GPT-2, Llama, Mistral, Qwen (grouped-query attention), GPT-NeoX and
GPT-J (parallel blocks), BLOOM, OPT and post-norm OPT (each reader's gradient pulled back through
the stream norms between it and each writer), Gemma 2/3 (output norms: attention sublayers as
nodes), mixtures of experts (experts as nodes, pre- or post-norm), decoders with no norms at all (each reader
reads the stream itself; ``tests/test_tools_any_decoder.py``); encoders (BERT: post-norm, both directions,
a masked-LM read-out the metric reads); and encoder-decoders (T5, BART, Marian, the pre-LN
Transformer of ``translate-tiny``), whose prompts are ``(source, target)`` pairs (``runs``).
In a post-norm model the logits' edges no longer sum to the final stream's score (the writes
reach it through norms); each node's edges still sum to its own.

**Encoder-decoders** have two streams (``graph.EncoderDecoderGraph``), each walked on its own:
the encoder's nodes over the source positions, read by the encoder's readers and by every
cross-attention key/value head (``L0CK1.k``, ``L0CK1.v``, whose gradient is pulled back through
the encoder's final norm at the run's final encoder stream); the decoder's over the target
positions, read by its self-attention, its cross-attention's queries (``L0C2.q``), its MLPs and
the logits. EAP-IG on inputs interpolates both streams' inputs together. Both identities hold
per stream: an encoder node's edges sum to its attribution-patching score too (the encoder's
output reaches the metric only through the cross-attention keys and values).
"""

from dataclasses import dataclass, field

import einops
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from interp_transformer.hooks.thread_state import restores_thread_state

from .. import _checks
from .graph import BlockPlan, Graph, build_graph
from .metrics import RowMetric, row_values
from .runs import Runs, start

METHODS = ("EAP", "EAP-IG")
IG_ON = ("inputs", "activations")


@dataclass
class EdgeScores:
    """``scores [upstream, reader, batch]`` (0 where no edge) over ``upstream`` and ``readers`` names; ``edge`` marks
    the edges."""

    upstream: list[str]
    readers: list[str]
    edge: Bool[Tensor, "upstream reader"]
    scores: Float[Tensor, "upstream reader batch"]
    method: str
    reads: dict[str, tuple[str, ...]] = field(default_factory=dict)  # the readers each node reads through

    @property
    def mean(self) -> Float[Tensor, "upstream reader"]:
        """The mean score over prompts, 0 where there is no edge."""
        return self.scores.mean(dim=-1).masked_fill(~self.edge, 0.0)

    def strength(self, absolute: bool = True) -> Float[Tensor, "upstream reader"]:
        """Each edge's mean score over prompts (``absolute``: its magnitude), ``-inf`` where there is no edge; what
        every selection ranks by. A NaN score on an edge is refused, naming the edges (it would rank anywhere)."""
        mean = self.mean
        nan = mean.isnan() & self.edge
        if bool(nan.any()):
            n_readers = len(self.readers)
            where = nan.flatten().nonzero().flatten().tolist()
            named = [f"{self.upstream[i // n_readers]} -> {self.readers[i % n_readers]}" for i in where]
            shown = ", ".join(named[:5]) + (f" and {len(named) - 5} more" if len(named) > 5 else "")
            raise ValueError(
                f"{self.method} scores hold NaN on {len(named)} edges ({shown}): edges cannot be ranked; recompute the "
                "scores with a finite metric"
            )
        return (mean.abs() if absolute else mean).masked_fill(~self.edge, float("-inf"))

    def top(self, k: int = 10) -> list[tuple[str, str, float]]:
        """The ``k`` edges of largest mean |score| over prompts: ``(upstream, reader, mean score)``, strongest first.

        Only edges are listed: a ``k`` above the graph's edges lists every edge; a negative ``k`` is refused."""
        k = _checks.count(k, "k", available=int(self.edge.sum()))
        order = self.strength().flatten().argsort(descending=True, stable=True)[:k]
        n_readers = len(self.readers)
        flat = self.mean.flatten()
        return [(self.upstream[i // n_readers], self.readers[i % n_readers], float(flat[i])) for i in order.tolist()]

    def figure(self, k: int = 20):
        """The ``k`` strongest edges as horizontal bars (mean score over prompts), strongest on top (``top(k)``: a
        ``k`` above the graph's edges draws every edge)."""
        import plotly.graph_objects as go

        top = self.top(k)
        fig = go.Figure(
            go.Bar(
                x=[score for _, _, score in top][::-1],
                y=[f"{up} -> {reader}" for up, reader, _ in top][::-1],
                orientation="h",
                marker_color=["#b2182b" if score > 0 else "#2166ac" for _, _, score in top][::-1],
            )
        )
        fig.update_layout(
            title=dict(text=f"{self.method}: the {len(top)} strongest edges"), xaxis_title="score (mean over prompts)"
        )
        return fig


def _mlp_input_hooks(block: BlockPlan) -> list[str]:
    """Where the MLP's input gradient is read (``BlockPlan.mlp_reads``): its norm's output, its input projections,
    or (the part run again on its stream) its output."""
    if block.mlp_reads == "norm":
        return [block.mlp_norm.hook_normalized.name]
    return block.mlp.input_hooks() if block.mlp_reads == "projections" else [block.mlp_nodes.output]


def _mlp_gradient(block: BlockPlan, grad: dict, resid: Tensor, attn_in: Tensor) -> Tensor:
    """``[1, batch, pos, d_model]``: the MLP reader's gradient at the stream ``resid`` it reads (before its norm)."""
    if block.mlp_reads == "part":  # its output's gradient pulled back through the part, run again on its stream
        with torch.enable_grad():
            at = resid.detach().requires_grad_(True)
            (pulled,) = torch.autograd.grad(block.mlp_write_from(at), at, grad.pop(block.mlp_nodes.output))
        return pulled[None]
    if block.mlp_reads == "norm":
        mlp_in = grad.pop(block.mlp_norm.hook_normalized.name)
        if block.mlp_norm is block.attn_norm:  # one norm read by both (GPT-J): the MLP's share
            mlp_in = mlp_in - attn_in.sum(dim=0)
    else:  # its input projections read the stream (through a norm with no hook of its own, if any)
        pairs = zip(block.mlp.input_hooks(), block.mlp.input_weights())
        mlp_in = sum(einops.einsum(grad.pop(hook), W, "b p m, d m -> b p d") for hook, (W, _) in pairs)
    return _through_norm(block.mlp_norm, resid, mlp_in[None])


def _hooks_read(graph: Graph) -> tuple[list[str], list[str]]:
    """``(differentiated, residuals)``: the hooks a stream's reader gradients are read at, and the streams their
    norms' Jacobians are taken at."""
    differentiated, residuals = [], [graph.final_hook]
    for block in graph.plan:
        attn = block.attn
        differentiated += [attn.hook_q.name, attn.hook_k.name, attn.hook_v.name]
        residuals += [block.reads_at["attn"]] + [step.reads for step in block.stream_norms]
        if block.cross is not None:
            differentiated.append(block.cross.hook_q.name)
            residuals.append(block.reads_at["cross"])
        if block.mlp is not None:
            differentiated += _mlp_input_hooks(block)
            residuals.append(block.reads_at["mlp"])
    end = graph.end
    differentiated += [hook for hook, _, _, _ in end.projections] if end.projections else [graph.final_hook]
    return differentiated, residuals


def _end_gradients(graph: Graph, grad: dict, kept: dict) -> Tensor:
    """``[reader, batch, pos, d_model]``: the gradients of the readers at the stream's end, at its final stream."""
    end = graph.end
    if not end.projections:
        return grad.pop(graph.final_hook)[None]
    read = [einops.einsum(grad.pop(hook), W, "b p g e, g d e -> g b p d") for hook, W, _, _ in end.projections]
    return _through_norm(end.norm, kept[graph.final_hook].detach(), torch.cat(read))


def _fill(graph: Graph, grad: dict, kept: dict, into: Tensor, weight: float) -> None:
    """Adds ``weight g_r`` of every reader of ``graph`` to ``into [reader, batch, pos, d_model]``."""
    row = 0

    def add(rows: Tensor) -> None:
        nonlocal row
        into[row : row + len(rows)].add_(rows.detach(), alpha=weight)
        row += len(rows)

    def stream(block: BlockPlan, side: str) -> Tensor:
        return kept[block.reads_at[side]].detach()

    for block in graph.plan:
        attn, attn_norm = block.attn, block.attn_norm
        g_q = einops.einsum(grad.pop(attn.hook_q.name), attn.W_Q, "b p h e, h d e -> h b p d")
        g_k = einops.einsum(grad.pop(attn.hook_k.name), attn.stored("W_K"), "b p g e, g d e -> g b p d")
        g_v = einops.einsum(grad.pop(attn.hook_v.name), attn.stored("W_V"), "b p g e, g d e -> g b p d")
        attn_in = torch.cat([g_q, g_k, g_v])
        add(_through_norm(attn_norm, stream(block, "attn"), attn_in))
        if block.cross is not None:  # its queries read this stream; its keys and values are the encoder's readers
            g_q = einops.einsum(grad.pop(block.cross.hook_q.name), block.cross.W_Q, "b p h e, h d e -> h b p d")
            add(_through_norm(block.cross_norm, stream(block, "cross"), g_q))
        if block.mlp is not None:
            add(_mlp_gradient(block, grad, stream(block, "mlp"), attn_in))
    add(_end_gradients(graph, grad, kept))


def _reader_gradients(runs: Runs, graphs, metric, into: list[Tensor], weight: float, embed_at=None) -> list[dict]:
    """Adds ``weight g_r`` to ``into[s] [reader, batch, pos, d_model]`` for each stream ``graphs[s]``: ``g_r`` the
    metric's gradient at the residual stream as reader ``r`` reads it, from one forward and one backward pass on the
    corrupted inputs. Returns each stream's stream-norm inputs in this run (their Jacobians' points)."""
    kept: dict[str, Tensor] = {}
    reading = [_hooks_read(graph) for graph in graphs]
    differentiated = list(dict.fromkeys(name for names, _ in reading for name in names))
    names = list(dict.fromkeys(differentiated + [name for _, residuals in reading for name in residuals]))

    def keep(activation: Tensor, hook) -> Tensor:
        if not activation.requires_grad:  # set by an interpolating hook: the gradient is still read there
            activation = activation.detach().requires_grad_(True)
        kept[hook.name] = activation
        return activation

    hooks = (embed_at or []) + [(name, keep) for name in names]  # an interpolated input first, then kept
    with torch.enable_grad():
        logits = runs.run(runs.corrupted, hooks)
        values = row_values(metric, logits, torch.arange(runs.batch, device=logits.device), "edge_attribution_patching")
        if not values.requires_grad:
            raise ValueError("the metric's values do not depend on the logits (no gradient reaches them)")
        wanted = [kept[name] for name in differentiated]
        grads = dict(zip(differentiated, torch.autograd.grad(values.sum(), wanted, allow_unused=True)))
    grad = {name: (g if g is not None else torch.zeros_like(kept[name])) for name, g in grads.items()}
    for graph, rows in zip(graphs, into):
        _fill(graph, grad, kept, rows, weight)
    return [{step.reads: kept[step.reads].detach() for block in g.plan for step in block.stream_norms} for g in graphs]


def _through_norm(norm, resid: Tensor, directions: Tensor) -> Tensor:
    """``J_norm(resid)^T d`` for each ``d`` in ``directions [n, batch, pos, d_model]``: the norm's full Jacobian
    (no norm: the directions themselves)."""
    if norm is None:
        return directions
    # plain autograd over the directions laid along a leading axis (a norm acts on each position alone): no
    # torch.func transform, whose nesting level a Ctrl-C could leave set for the whole process
    with torch.enable_grad():
        at = resid.detach().expand(directions.shape[0], *resid.shape).requires_grad_(True)
        (pulled,) = torch.autograd.grad(norm.normalize(at), at, directions)
    return pulled


def _interpolating(caches: tuple[dict, dict], names: list[str], alpha: float) -> list:
    """Forward hooks setting each of ``names`` to ``corrupt + alpha (clean - corrupt)``."""
    clean_cache, corrupt_cache = caches

    def interpolate(activation, hook):
        return corrupt_cache[hook.name] + alpha * (clean_cache[hook.name] - corrupt_cache[hook.name])

    return [(name, interpolate) for name in names]


@torch.no_grad()
def _differences(graph: Graph, clean_cache, corrupt_cache) -> Tensor:
    """``clean_u - corrupt_u`` for every node ``[upstream, batch, pos, d_model]``, one writer at a time."""
    first = clean_cache[graph.input_hook]
    delta = first.new_empty(len(graph.upstream), *first.shape)
    delta[0] = first - corrupt_cache[graph.input_hook]
    row = 1
    for block in graph.plan:
        for nodes in block.nodes():
            delta[row : row + len(nodes.names)] = nodes.writes(clean_cache.__getitem__)
            delta[row : row + len(nodes.names)] -= nodes.writes(corrupt_cache.__getitem__)
            row += len(nodes.names)
    return delta


def _contract(delta: Tensor, gradients: Tensor) -> Tensor:
    """``sum over pos, d_model of delta[u, b] gradients[r, b]``: ``[upstream, reader, batch]``, one prompt at a time
    (no copy of either whole tensor)."""
    return torch.stack(
        [einops.einsum(delta[:, b], gradients[:, b], "u p d, r p d -> u r") for b in range(delta.shape[1])], dim=-1
    )


@torch.no_grad()
def _walk(graph: Graph, delta: Tensor, gradients: Tensor, norm_inputs: dict[str, Tensor]) -> Tensor:
    """Every edge's score: the stream walked backwards from its end, each writer's differences read along the
    directions of the readers after it, which every stream norm on the way pulls back through its Jacobian (at
    ``norm_inputs``). ``gradients`` (each reader's ``g_r``) is used as that working space."""
    upstream_at, reader_at = graph.order()
    reader_at = torch.tensor(reader_at)
    scores = delta.new_zeros(len(graph.upstream), len(graph.readers), delta.shape[1])
    node_index = {name: i for i, (name, _, _) in enumerate(graph.upstream)}
    for step, _, kind, payload in reversed(graph.timeline()):
        after = int((reader_at <= step).sum())  # readers are in forward order: those after ``step`` are a suffix
        if kind == "write":
            rows = slice(node_index[payload.names[0]], node_index[payload.names[-1]] + 1)
            scores[rows, after:] = _contract(delta[rows], gradients[after:])
        elif kind == "norm":
            gradients[after:] = _through_norm(payload.norm, norm_inputs[payload.reads], gradients[after:])
    scores[0] = _contract(delta[:1], gradients)[0]  # the input, written before every reader
    return scores


def memory_estimate(model, batch: int, n_pos: int) -> int:
    """Bytes edge attribution holds at its peak, an estimate: every node's write difference and every reader's
    gradient (``(upstream + readers) x batch x pos x d_model``), plus one backward pass's activations (the residual
    stream's working set per block and the logits, with their gradients)."""
    graph = build_graph(model)
    cfg, itemsize = model.cfg, model.W_E.element_size()
    d_mlp = getattr(cfg, "d_mlp", None) or 0
    n_layers = cfg.n_layers + (getattr(cfg, "n_decoder_layers", None) or 0)
    held = (len(graph.upstream) + len(graph.readers)) * cfg.d_model
    backward = n_layers * (16 * cfg.d_model + 4 * d_mlp) + 3 * cfg.d_vocab
    return batch * n_pos * (held + backward) * itemsize


def _writer_groups(graphs) -> list[tuple[int, str, slice]]:
    """``(stream, output hook, slice of that stream's upstream nodes)`` per writer of every stream, inputs first."""
    return [(s, output, nodes) for s, graph in enumerate(graphs) for output, nodes in graph.writer_groups()]


@restores_thread_state
def edge_attribution_patching(
    model: _checks.AnyModel,
    clean_tokens,
    corrupted_tokens,
    metric: RowMetric,
    *,
    method: str = "EAP",
    steps: int = 5,
    ig_on: str = "inputs",
    attention_mask: Int[Tensor, "batch pos"] | None = None,
    progress: bool | None = None,
) -> EdgeScores:
    """Every edge's score (module docstring): ``method`` ``"EAP"`` or ``"EAP-IG"`` with ``steps`` interpolations of
    the inputs (``ig_on="inputs"``: every stream's input together) or of each writer's output in turn
    (``ig_on="activations"``). An encoder-decoder's prompts are ``(source, target)`` pairs (``runs``).
    ``progress``: a bar over EAP-IG's runs and the final walk (None: only from 8 steps)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if ig_on not in IG_ON:
        raise ValueError(f"ig_on must be one of {IG_ON}, got {ig_on!r}")
    runs = start(model, clean_tokens, corrupted_tokens, metric, attention_mask)
    full = build_graph(runs.model)
    graphs = full.streams
    groups = _writer_groups(graphs)
    hooks = [name for graph in graphs for name in graph.write_hooks()] + [output for _, output, _ in groups]
    cached = list(dict.fromkeys(hooks))
    with torch.no_grad():
        clean_cache, corrupt_cache = runs.cache(runs.clean, cached), runs.cache(runs.corrupted, cached)
    deltas = [_differences(graph, clean_cache, corrupt_cache) for graph in graphs]
    caches = (clean_cache, corrupt_cache)

    def walks(totals: list[Tensor], inputs: list[dict]) -> list[Tensor]:
        return [_walk(graph, delta, total, at) for graph, delta, total, at in zip(graphs, deltas, totals, inputs)]

    def scores_of(interpolated: list[str]) -> list[Tensor]:
        """Per stream ``[upstream, reader, batch]``: the edges' scores, gradients at the corrupted run (EAP) or
        averaged over the runs interpolating ``interpolated`` (EAP-IG). Through stream norms each run is walked on
        its own."""
        totals = [delta.new_zeros(len(graph.readers), *delta.shape[1:]) for graph, delta in zip(graphs, deltas)]
        if method == "EAP":
            return walks(totals, _reader_gradients(runs, graphs, metric, totals, 1.0))
        per_run = full.has_stream_norms  # a norm's Jacobian depends on the run: no sum of gradients then
        scores, inputs = [0] * len(graphs), [{} for _ in graphs]
        shown = steps >= 8 if progress is None else progress
        with tqdm(total=steps + 1, desc=f"EAP-IG on {ig_on}", unit="run", leave=False, disable=not shown) as bar:
            for k in range(1, steps + 1):  # the walk after them counted as one more run
                hooks = _interpolating(caches, interpolated, k / steps)
                for total in totals if per_run else ():
                    total.zero_()
                inputs = _reader_gradients(runs, graphs, metric, totals, 1 / steps, hooks)
                if per_run:
                    scores = [before + now for before, now in zip(scores, walks(totals, inputs))]
                bar.update()
            scores = scores if per_run else walks(totals, inputs)
            bar.update()
        return scores

    if method == "EAP" or ig_on == "inputs":
        scores = scores_of([graph.input_hook for graph in graphs])
    else:  # each writer's edges read the gradients of the runs interpolating that writer's output
        scores = [
            delta.new_zeros(delta.shape[0], len(graph.readers), runs.batch) for graph, delta in zip(graphs, deltas)
        ]
        for stream, output, nodes in tqdm(groups, desc="EAP-IG on activations", leave=False):
            scores[stream][nodes] = scores_of([output])[stream][nodes]
    edge = full.edge_mask()
    joined, rows, columns = scores[0].new_zeros(*edge.shape, runs.batch), 0, 0
    for block in scores:  # each stream's edges on the diagonal
        joined[rows : rows + block.shape[0], columns : columns + block.shape[1]] = block
        rows, columns = rows + block.shape[0], columns + block.shape[1]
    return EdgeScores(
        [name for name, _, _ in full.upstream],
        [name for name, _, _ in full.readers],
        edge,
        joined.to(torch.float64).cpu() * edge[..., None],
        method if method == "EAP" else f"{method} ({ig_on})",
        full.reads,
    )


__all__ = ["EdgeScores", "IG_ON", "METHODS", "edge_attribution_patching", "memory_estimate"]
