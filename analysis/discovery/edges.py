"""Edge attribution patching (EAP) and its integrated-gradients form (EAP-IG) over the model's graph.

**The graph.** Upstream nodes write to the residual stream: the input (the embeddings summed),
every attention head (its write ``z_h W_O[h]``) and every MLP (its whole output; a mixture of
experts is one node). Readers read it, each through its own norm: every query head's query
input (``L3H5.q``), every key/value head's key and value inputs (``L3K1.k``, ``L3K1.v``: under
grouped-query attention a key/value head is one reader, shared by its query heads, and nothing is
ungrouped), every MLP's input, and the logits. An edge joins a node to every reader after it in
the stream (a sequential block's MLP also reads its own block's heads; a parallel block's does not).

**The score.** With ``Δ_u = clean_u - corrupt_u`` a node's write difference and ``g_r`` the gradient of
the metric with respect to the residual stream *as reader r reads it* (the gradient at the
reader's own projection, ``∂m/∂q_h W_Q[h]^T``, or at its MLP's input, pulled back through its norm's
full Jacobian at the run's residual)::

    EAP:     score(u -> r) = sum over positions of Δ_u . g_r            (g_r at the corrupted run)
    EAP-IG:  the same with g_r averaged over ``steps`` runs whose input (the stream entering
             block 0) is corrupt + (k / steps) (clean - corrupt), k = 1 .. steps   (EAP-IG-inputs)

Each is a first-order estimate of patching that one edge clean. Two identities hold exactly
(``tests/test_edges.py``): a node's edges sum to its attribution-patching score (the residual
stream is read only by the readers, so ``∂m/∂write_u = sum_r g_r``), and the edges into the logits
sum to the attribution-patching score of the final residual stream.

**Which models.** Decoders whose residual stream is a sum of writes (pre-norm): GPT-2, Llama,
Mistral, Qwen (grouped-query attention), GPT-NeoX and GPT-J (parallel blocks), BLOOM, OPT,
mixtures of experts (each mixture one node). Refused with the reason: post-norm models, writers
whose outputs pass their own norm before the stream (Gemma 2/3: a head's write there is not its
share of the difference), and encoder-decoders.
"""

from dataclasses import dataclass
from typing import Optional

import einops
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from .. import _checks
from .batched import RowMetric, _start, row_values

METHODS = ("EAP", "EAP-IG")


@dataclass
class EdgeScores:
    """``scores [upstream, reader, batch]`` (0 where no edge) over ``upstream`` and ``readers`` names; ``edge`` marks
    the edges."""

    upstream: list[str]
    readers: list[str]
    edge: Bool[Tensor, "upstream reader"]
    scores: Float[Tensor, "upstream reader batch"]
    method: str

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


def _require_graph(model) -> None:
    if not model.capabilities.additive_residual:
        raise ValueError(
            f"edge attribution needs a residual stream that is a sum of writes: {model.capabilities.why_not_additive()}"
        )
    for layer, block in enumerate(model.blocks):
        for writer in block.writers():
            if writer.output_norm is not None:
                raise ValueError(
                    f"block {layer}'s {writer.sublayer} passes its output through its own norm before the stream "
                    "(Gemma 2/3's post norms): a head's write there is not its share of the difference, so its edges "
                    "are not defined here"
                )
            if writer.sublayer not in ("attn", "mlp"):
                raise ValueError(
                    f"block {layer} has a {writer.sublayer!r} writer; edges are built for attention and MLPs"
                )


def _layout(model):
    """Per block: the attention part, its norm, the MLP part (or None) and its norm, and whether the MLP reads
    the block's own attention (a sequential block)."""
    plan = []
    for layer, block in enumerate(model.blocks):
        attn, mlp = block.writer("attn").part, getattr(block.writer("mlp"), "part", None)
        readers = block.norm_readers()
        attn_norm = next(norm for norm, part in readers if part is attn)
        mlp_norm = next((norm for norm, part in readers if part is mlp), None) if mlp is not None else None
        sequential = model.act_name("resid_mid", layer) in model.hook_dict
        plan.append((attn, attn_norm, mlp, mlp_norm, sequential))
    return plan


def _names(model, plan) -> tuple[list[tuple[str, int, str]], list[tuple[str, int, str]]]:
    upstream = [("input", -1, "input")]
    readers = []
    for layer, (attn, _, mlp, _, _) in enumerate(plan):
        upstream += [(f"L{layer}H{h}", layer, "head") for h in range(attn.n_heads)]
        readers += [(f"L{layer}H{h}.q", layer, "attn") for h in range(attn.n_heads)]
        readers += [(f"L{layer}K{g}.{x}", layer, "attn") for x in ("k", "v") for g in range(attn.n_key_value_heads)]
        if mlp is not None:
            upstream.append((f"MLP{layer}", layer, "mlp"))
            readers.append((f"MLP{layer}", layer, "mlp"))
    readers.append(("logits", len(plan), "logits"))
    return upstream, readers


def _edge_mask(upstream, readers, plan) -> Tensor:
    mask = torch.zeros(len(upstream), len(readers), dtype=torch.bool)
    for i, (_, lu, kind_u) in enumerate(upstream):
        for j, (_, lr, kind_r) in enumerate(readers):
            same_block = lu == lr and kind_u == "head" and kind_r == "mlp" and plan[lr][4]
            mask[i, j] = lu < lr or same_block
    return mask


def _writes(model, cache: dict, plan) -> Tensor:
    """Every upstream node's write ``[upstream, batch, pos, d_model]`` from a run's cached activations."""
    rows = [cache[model.act_name("resid_pre", 0)]]  # the stream entering block 0: the input's write
    for layer, block in enumerate(model.blocks):
        units = block.writer("attn").units
        rows += list(einops.rearrange(units.writes(cache[units.hook]), "b p h d -> h b p d"))
        if plan[layer][2] is not None:
            rows.append(cache[block.writer("mlp").output])
    return torch.stack(rows)


def _write_hooks(model, plan) -> list[str]:
    names = [model.act_name("resid_pre", 0)]
    for layer, block in enumerate(model.blocks):
        names.append(block.writer("attn").units.hook)
        if plan[layer][2] is not None:
            names.append(block.writer("mlp").output)
    return names


def _reader_gradients(model, plan, corrupted, mask, metric, batch, embed_at=None) -> Tensor:
    """``g_r [reader, batch, pos, d_model]``: the metric's gradient at the residual stream as each reader reads it."""
    final = model.hook_names.final_residual_name(model.cfg.n_layers)
    kept: dict[str, Tensor] = {}
    differentiated, residuals = [final], []  # gradients at the readers; residual values for their norms' Jacobians
    for layer, (attn, attn_norm, mlp, mlp_norm, sequential) in enumerate(plan):
        differentiated += [attn.hook_q.name, attn.hook_k.name, attn.hook_v.name]
        residuals.append(model.act_name("resid_pre", layer))
        if mlp is not None:
            differentiated.append(mlp_norm.hook_normalized.name)
            residuals.append(model.act_name("resid_mid" if sequential else "resid_pre", layer))
    differentiated = list(dict.fromkeys(differentiated))
    names = list(dict.fromkeys(differentiated + residuals))

    def keep(activation: Tensor, hook) -> None:
        kept[hook.name] = activation

    hooks = (embed_at or []) + [(name, keep) for name in names]  # an interpolated input first, then kept
    kwargs = {} if mask is None else {"attention_mask": mask}
    with torch.enable_grad():
        logits = model.run_with_hooks(corrupted, fwd_hooks=hooks, **kwargs)
        values = row_values(metric, logits, torch.arange(batch, device=logits.device))
        wanted = [kept[name] for name in differentiated]
        grads = dict(zip(differentiated, torch.autograd.grad(values.sum(), wanted, allow_unused=True)))
    grad = {name: (g if g is not None else torch.zeros_like(kept[name])) for name, g in grads.items()}
    rows = []
    for layer, (attn, attn_norm, mlp, mlp_norm, sequential) in enumerate(plan):
        g_q = einops.einsum(grad[attn.hook_q.name], attn.W_Q, "b p h e, h d e -> h b p d")
        g_k = einops.einsum(grad[attn.hook_k.name], attn.stored("W_K"), "b p g e, g d e -> g b p d")
        g_v = einops.einsum(grad[attn.hook_v.name], attn.stored("W_V"), "b p g e, g d e -> g b p d")
        attn_in = torch.cat([g_q, g_k, g_v])
        rows.append(_through_norm(attn_norm, kept[model.act_name("resid_pre", layer)].detach(), attn_in))
        if mlp is not None:
            mlp_in = grad[mlp_norm.hook_normalized.name]
            if mlp_norm is attn_norm:  # one norm read by both (GPT-J): the MLP's share is what attention's is not
                mlp_in = mlp_in - attn_in.sum(dim=0)
            resid = kept[model.act_name("resid_mid" if sequential else "resid_pre", layer)].detach()
            rows.append(_through_norm(mlp_norm, resid, mlp_in[None]))
    rows.append(grad[final][None])
    return torch.cat(rows).detach()


def _through_norm(norm, resid: Tensor, directions: Tensor) -> Tensor:
    """``J_norm(resid)^T d`` for each ``d`` in ``directions [n, batch, pos, d_model]``: the norm's full Jacobian."""
    _, pull = torch.func.vjp(norm.normalize, resid)
    return torch.func.vmap(lambda d: pull(d)[0])(directions)


def edge_attribution_patching(
    model: _checks.AnyModel,
    clean_tokens,
    corrupted_tokens,
    metric: RowMetric,
    *,
    method: str = "EAP",
    steps: int = 5,
    attention_mask: Optional[Int[Tensor, "batch pos"]] = None,
) -> EdgeScores:
    """Every edge's score (module docstring): ``method`` ``"EAP"`` or ``"EAP-IG"`` with ``steps`` interpolations."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    model, clean, corrupted, mask = _start(model, clean_tokens, corrupted_tokens, metric, attention_mask)
    _require_graph(model)
    plan = _layout(model)
    upstream, readers = _names(model, plan)
    batch = clean.shape[0]
    kwargs = {} if mask is None else {"attention_mask": mask}
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(clean, names_filter=_write_hooks(model, plan), **kwargs)
        _, corrupt_cache = model.run_with_cache(corrupted, names_filter=_write_hooks(model, plan), **kwargs)
    delta = (_writes(model, clean_cache, plan) - _writes(model, corrupt_cache, plan)).detach()
    if method == "EAP":
        gradients = _reader_gradients(model, plan, corrupted, mask, metric, batch)
    else:
        inputs = [model.act_name("resid_pre", 0)]
        gradients = 0
        for k in range(1, steps + 1):
            alpha = k / steps

            def interpolate(activation, hook, alpha=alpha):
                return corrupt_cache[hook.name] + alpha * (clean_cache[hook.name] - corrupt_cache[hook.name])

            run = _reader_gradients(model, plan, corrupted, mask, metric, batch, [(n, interpolate) for n in inputs])
            gradients = gradients + run / steps
    scores = einops.einsum(delta, gradients, "u b p d, r b p d -> u r b").to(torch.float64)
    edge = _edge_mask(upstream, readers, plan)
    return EdgeScores(
        [name for name, _, _ in upstream], [name for name, _, _ in readers], edge, scores * edge[..., None], method
    )


__all__ = ["EdgeScores", "METHODS", "edge_attribution_patching"]
