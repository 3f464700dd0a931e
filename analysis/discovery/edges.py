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
nodes), mixtures of experts (experts as nodes); and encoders (BERT: post-norm, both directions,
a masked-LM read-out the metric reads). Refused with the reason: encoder-decoders (``graph``).
In a post-norm model the logits' edges no longer sum to the final stream's score (the writes
reach it through norms); each node's edges still sum to its own.
"""

from dataclasses import dataclass, field
from typing import Optional

import einops
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from .. import _checks
from tqdm.auto import tqdm

from .batched import RowMetric, _start, row_values
from .graph import BlockPlan, Graph, build_graph

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

    def top(self, k: int = 10) -> list[tuple[str, str, float]]:
        """The ``k`` edges of largest mean |score| over prompts: ``(upstream, reader, mean score)``."""
        mean = self.scores.mean(dim=-1).masked_fill(~self.edge, 0.0)
        order = mean.abs().flatten().argsort(descending=True)[:k]
        n_readers = len(self.readers)
        flat = mean.flatten()
        return [(self.upstream[i // n_readers], self.readers[i % n_readers], float(flat[i])) for i in order.tolist()]

    def figure(self, k: int = 20):
        """The ``k`` strongest edges as horizontal bars (mean score over prompts), strongest on top."""
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
    """Where the MLP's input gradient is read: its norm's output, or (no norm of its own) its input projections."""
    return [block.mlp_norm.hook_normalized.name] if block.mlp_norm is not None else block.mlp.input_hooks()


def _reader_gradients(model, graph: Graph, corrupted, mask, metric, into: Tensor, weight: float, embed_at=None):
    """Adds ``weight g_r`` to ``into [reader, batch, pos, d_model]``: ``g_r`` the metric's gradient at the residual
    stream as reader ``r`` reads it. Returns the inputs of the stream norms in this run (their Jacobians' points)."""
    batch = corrupted.shape[0]
    final = model.hook_names.final_residual_name(model.cfg.n_layers)
    kept: dict[str, Tensor] = {}
    differentiated, residuals = [final], []  # gradients at the readers; residual values for the norms' Jacobians
    for layer, block in enumerate(graph.plan):
        attn = block.attn
        differentiated += [attn.hook_q.name, attn.hook_k.name, attn.hook_v.name]
        residuals += [graph.stream_at_read(model, layer, "attn")] + [step.reads for step in block.stream_norms]
        if block.mlp is not None:
            differentiated += _mlp_input_hooks(block)
            residuals.append(graph.stream_at_read(model, layer, "mlp"))
    differentiated = list(dict.fromkeys(differentiated))
    names = list(dict.fromkeys(differentiated + residuals))

    def keep(activation: Tensor, hook) -> None:
        kept[hook.name] = activation

    hooks = (embed_at or []) + [(name, keep) for name in names]  # an interpolated input first, then kept
    kwargs = {} if mask is None else {"attention_mask": mask}
    with torch.enable_grad():
        logits = model.run_with_hooks(corrupted, fwd_hooks=hooks, **kwargs)
        values = row_values(metric, logits, torch.arange(batch, device=logits.device))
        if not values.requires_grad:
            raise ValueError("the metric's values do not depend on the logits (no gradient reaches them)")
        wanted = [kept[name] for name in differentiated]
        grads = dict(zip(differentiated, torch.autograd.grad(values.sum(), wanted, allow_unused=True)))
    grad = {name: (g if g is not None else torch.zeros_like(kept[name])) for name, g in grads.items()}
    row = 0

    def add(rows: Tensor) -> None:
        nonlocal row
        into[row : row + len(rows)].add_(rows.detach(), alpha=weight)
        row += len(rows)

    for layer, block in enumerate(graph.plan):
        attn, attn_norm, mlp_norm = block.attn, block.attn_norm, block.mlp_norm
        g_q = einops.einsum(grad.pop(attn.hook_q.name), attn.W_Q, "b p h e, h d e -> h b p d")
        g_k = einops.einsum(grad.pop(attn.hook_k.name), attn.stored("W_K"), "b p g e, g d e -> g b p d")
        g_v = einops.einsum(grad.pop(attn.hook_v.name), attn.stored("W_V"), "b p g e, g d e -> g b p d")
        attn_in = torch.cat([g_q, g_k, g_v])
        add(_through_norm(attn_norm, kept[graph.stream_at_read(model, layer, "attn")].detach(), attn_in))
        if block.mlp is not None:
            if mlp_norm is not None:
                mlp_in = grad.pop(mlp_norm.hook_normalized.name)
            else:  # the MLP reads the stream itself: through its input projections
                pairs = zip(block.mlp.input_hooks(), block.mlp.input_weights())
                mlp_in = sum(einops.einsum(grad.pop(hook), W, "b p m, d m -> b p d") for hook, (W, _) in pairs)
            if mlp_norm is not None and mlp_norm is attn_norm:  # one norm read by both (GPT-J): the MLP's share
                mlp_in = mlp_in - attn_in.sum(dim=0)
            resid = kept[graph.stream_at_read(model, layer, "mlp")].detach()
            add(_through_norm(mlp_norm, resid, mlp_in[None]))
    add(grad.pop(final)[None])
    return {step.reads: kept[step.reads].detach() for block in graph.plan for step in block.stream_norms}


def _through_norm(norm, resid: Tensor, directions: Tensor) -> Tensor:
    """``J_norm(resid)^T d`` for each ``d`` in ``directions [n, batch, pos, d_model]``: the norm's full Jacobian
    (no norm: the directions themselves)."""
    if norm is None:
        return directions
    _, pull = torch.func.vjp(norm.normalize, resid)
    return torch.func.vmap(lambda d: pull(d)[0])(directions)


def _interpolating(caches: tuple[dict, dict], names: list[str], alpha: float) -> list:
    """Forward hooks setting each of ``names`` to ``corrupt + alpha (clean - corrupt)``."""
    clean_cache, corrupt_cache = caches

    def interpolate(activation, hook):
        return corrupt_cache[hook.name] + alpha * (clean_cache[hook.name] - corrupt_cache[hook.name])

    return [(name, interpolate) for name in names]


@torch.no_grad()
def _differences(model, graph: Graph, clean_cache, corrupt_cache) -> Tensor:
    """``clean_u - corrupt_u`` for every node ``[upstream, batch, pos, d_model]``, one writer at a time."""
    first = clean_cache[model.act_name("resid_pre", 0)]
    delta = first.new_empty(len(graph.upstream), *first.shape)
    delta[0] = first - corrupt_cache[model.act_name("resid_pre", 0)]
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
    """Every edge's score: the stream walked backwards from the logits, each writer's differences read along the
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
    held = (len(graph.upstream) + len(graph.readers)) * cfg.d_model
    backward = cfg.n_layers * (16 * cfg.d_model + 4 * d_mlp) + 3 * cfg.d_vocab
    return batch * n_pos * (held + backward) * itemsize


def _writer_groups(model, graph: Graph) -> list[tuple[str, slice]]:
    """``(output hook, slice of upstream nodes)`` per writer, the input first."""
    groups, start = [(model.act_name("resid_pre", 0), slice(0, 1))], 1
    for block in graph.plan:
        for nodes in block.nodes():
            groups.append((nodes.output, slice(start, start + len(nodes.names))))
            start += len(nodes.names)
    return groups


def edge_attribution_patching(
    model: _checks.AnyModel,
    clean_tokens,
    corrupted_tokens,
    metric: RowMetric,
    *,
    method: str = "EAP",
    steps: int = 5,
    ig_on: str = "inputs",
    attention_mask: Optional[Int[Tensor, "batch pos"]] = None,
) -> EdgeScores:
    """Every edge's score (module docstring): ``method`` ``"EAP"`` or ``"EAP-IG"`` with ``steps`` interpolations of
    the inputs (``ig_on="inputs"``) or of each writer's output in turn (``ig_on="activations"``)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if ig_on not in IG_ON:
        raise ValueError(f"ig_on must be one of {IG_ON}, got {ig_on!r}")
    model, clean, corrupted, mask = _start(model, clean_tokens, corrupted_tokens, metric, attention_mask)
    graph = build_graph(model)
    batch = clean.shape[0]
    kwargs = {} if mask is None else {"attention_mask": mask}
    groups = _writer_groups(model, graph)
    cached = list(dict.fromkeys(graph.write_hooks(model) + [output for output, _ in groups]))
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(clean, names_filter=cached, **kwargs)
        _, corrupt_cache = model.run_with_cache(corrupted, names_filter=cached, **kwargs)
    delta = _differences(model, graph, clean_cache, corrupt_cache)
    caches = (clean_cache, corrupt_cache)

    def scores_of(interpolated: list[str]) -> Tensor:
        """``[upstream, reader, batch]``: the edges' scores, gradients at the corrupted run (EAP) or averaged over
        the runs interpolating ``interpolated`` (EAP-IG). Through stream norms each run is walked on its own."""
        total = delta.new_zeros(len(graph.readers), *delta.shape[1:])
        if method == "EAP":
            return _walk(graph, delta, total, _reader_gradients(model, graph, corrupted, mask, metric, total, 1.0))
        per_run = graph.has_stream_norms  # a norm's Jacobian depends on the run: no sum of gradients then
        scores, inputs = 0, {}
        for k in tqdm(range(1, steps + 1), desc=f"EAP-IG on {ig_on}", leave=False, disable=steps < 8):
            hooks = _interpolating(caches, interpolated, k / steps)
            if per_run:
                total.zero_()
            inputs = _reader_gradients(model, graph, corrupted, mask, metric, total, 1 / steps, hooks)
            if per_run:
                scores = scores + _walk(graph, delta, total, inputs)
        return scores if per_run else _walk(graph, delta, total, inputs)

    if method == "EAP" or ig_on == "inputs":
        scores = scores_of([groups[0][0]])
    else:  # each writer's edges read the gradients of the runs interpolating that writer's output
        scores = delta.new_zeros(delta.shape[0], len(graph.readers), batch)
        for output, nodes in tqdm(groups, desc="EAP-IG on activations", leave=False):
            scores[nodes] = scores_of([output])[nodes]
    edge = graph.edge_mask()
    return EdgeScores(
        [name for name, _, _ in graph.upstream],
        [name for name, _, _ in graph.readers],
        edge,
        scores.to(torch.float64).cpu() * edge[..., None],
        method if method == "EAP" else f"{method} ({ig_on})",
        graph.reads,
    )


__all__ = ["EdgeScores", "IG_ON", "METHODS", "edge_attribution_patching", "memory_estimate"]
