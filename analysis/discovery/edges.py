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

**Which models.** Decoders whose residual stream is a sum of writes: GPT-2, Llama, Mistral, Qwen
(grouped-query attention), GPT-NeoX and GPT-J (parallel blocks), BLOOM, OPT, Gemma 2/3 (output
norms: attention sublayers as nodes), mixtures of experts (experts as nodes). Refused with the
reason: post-norm models and encoder-decoders (``graph``).
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


def _reader_gradients(
    model, plan: list[BlockPlan], corrupted, mask, metric, into: Tensor, weight: float, embed_at=None
):
    """Adds ``weight g_r`` to ``into [reader, batch, pos, d_model]``: ``g_r`` the metric's gradient at the residual
    stream as reader ``r`` reads it."""
    batch = corrupted.shape[0]
    final = model.hook_names.final_residual_name(model.cfg.n_layers)
    kept: dict[str, Tensor] = {}
    differentiated, residuals = [final], []  # gradients at the readers; residual values for their norms' Jacobians
    for layer, block in enumerate(plan):
        attn = block.attn
        differentiated += [attn.hook_q.name, attn.hook_k.name, attn.hook_v.name]
        residuals.append(model.act_name("resid_pre", layer))
        if block.mlp is not None:
            differentiated.append(block.mlp_norm.hook_normalized.name)
            residuals.append(model.act_name("resid_mid" if block.sequential else "resid_pre", layer))
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

    for layer, block in enumerate(plan):
        attn, attn_norm, mlp_norm = block.attn, block.attn_norm, block.mlp_norm
        g_q = einops.einsum(grad.pop(attn.hook_q.name), attn.W_Q, "b p h e, h d e -> h b p d")
        g_k = einops.einsum(grad.pop(attn.hook_k.name), attn.stored("W_K"), "b p g e, g d e -> g b p d")
        g_v = einops.einsum(grad.pop(attn.hook_v.name), attn.stored("W_V"), "b p g e, g d e -> g b p d")
        attn_in = torch.cat([g_q, g_k, g_v])
        add(_through_norm(attn_norm, kept[model.act_name("resid_pre", layer)].detach(), attn_in))
        if block.mlp is not None:
            mlp_in = grad.pop(mlp_norm.hook_normalized.name)
            if mlp_norm is attn_norm:  # one norm read by both (GPT-J): the MLP's share is what attention's is not
                mlp_in = mlp_in - attn_in.sum(dim=0)
            resid = kept[model.act_name("resid_mid" if block.sequential else "resid_pre", layer)].detach()
            add(_through_norm(mlp_norm, resid, mlp_in[None]))
    add(grad.pop(final)[None])


def _through_norm(norm, resid: Tensor, directions: Tensor) -> Tensor:
    """``J_norm(resid)^T d`` for each ``d`` in ``directions [n, batch, pos, d_model]``: the norm's full Jacobian."""
    _, pull = torch.func.vjp(norm.normalize, resid)
    return torch.func.vmap(lambda d: pull(d)[0])(directions)


def _interpolating(caches: tuple[dict, dict], names: list[str], alpha: float) -> list:
    """Forward hooks setting each of ``names`` to ``corrupt + alpha (clean - corrupt)``."""
    clean_cache, corrupt_cache = caches

    def interpolate(activation, hook):
        return corrupt_cache[hook.name] + alpha * (clean_cache[hook.name] - corrupt_cache[hook.name])

    return [(name, interpolate) for name in names]


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

    def gradients(interpolated: list[str]) -> Tensor:
        total = delta.new_zeros(len(graph.readers), *delta.shape[1:])
        if method == "EAP":
            _reader_gradients(model, graph.plan, corrupted, mask, metric, total, 1.0)
            return total
        for k in tqdm(range(1, steps + 1), desc=f"EAP-IG on {ig_on}", leave=False, disable=steps < 8):
            hooks = _interpolating(caches, interpolated, k / steps)
            _reader_gradients(model, graph.plan, corrupted, mask, metric, total, 1 / steps, hooks)
        return total

    if method == "EAP" or ig_on == "inputs":
        scores = _contract(delta, gradients([groups[0][0]]))
    else:  # each writer's edges read the gradients of the runs interpolating that writer's output
        scores = delta.new_zeros(delta.shape[0], len(graph.readers), batch)
        for output, nodes in tqdm(groups, desc="EAP-IG on activations", leave=False):
            scores[nodes] = _contract(delta[nodes], gradients([output]))
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
