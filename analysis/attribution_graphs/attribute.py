"""``attribute``: an attribution graph's edges, from backward passes of the replacement model batched over targets.

Every target reads the stream linearly: a feature's pre-activation is ``x_l[pos] . W_enc[:, f] + b_enc[f]``,
a logit node's value is ``normed[-1] . (W_U[:, t] - mean over tokens of W_U) + const`` (circuit-tracer's
logit minus mean logit). In the replacement model (``replacement``) the stream is linear in the sources,
so one backward pass from ``x . direction`` gives every source's direct effect on the target at once::

    edge(feature (l, p, f) -> t) = a_f * sum over outputs o of W_dec_l[f, o - l] . d t / d mlp_out_o[p]
    edge(error (o, p) -> t)      = error_o[p] . d t / d mlp_out_o[p]
    edge(token p -> t)           = embed[p] . d t / d embed[p]

Targets are laid along the batch axis: the model runs once on ``batch_size`` copies of the prompt (its
graph kept), and each backward pass reads a chunk of ``batch_size`` targets, one per row. Rows never
mix, so a target's edges do not depend on the chunk it is in.

With ``max_feature_nodes``, features are visited as circuit-tracer visits them: the logit targets first,
then, a chunk at a time, the unvisited features of largest influence on the logits through the rows
computed so far, until ``max_feature_nodes`` are visited. Only those become feature nodes; what the others
contribute to each target directly is kept, summed, in ``graph.unselected_effect``, so every node still sums.

Under ``torchrun`` (a ``torch.distributed`` process group, gloo or NCCL), each rank holds the replacement model
and computes its share of the chunks; the rows are summed across ranks, so every rank returns the whole graph,
equal to one process's (with ``max_feature_nodes``, each round visits ``batch_size`` targets per rank).
"""

import einops
import torch
import torch.distributed as dist
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from interp_transformer.hooks.thread_state import restores_thread_state

from .graph import AttributionGraph
from .memory import check_budget, plan_for
from .pruning import normalize_matrix
from .replacement import Gradients, ReplacementModel


@torch.no_grad()
def salient_logits(
    logits: Float[Tensor, "d_vocab"], max_n_logits: int = 10, desired_logit_prob: float = 0.95
) -> tuple[Tensor, Tensor]:
    """``(token ids, probabilities)``: the most probable next tokens, fewest whose probabilities sum to at least
    ``desired_logit_prob``, at most ``max_n_logits`` (circuit-tracer's rule)."""
    if isinstance(max_n_logits, bool) or not isinstance(max_n_logits, int) or max_n_logits < 1:
        raise ValueError(f"max_n_logits must be a positive int, got {max_n_logits!r}")
    if not 0 < desired_logit_prob <= 1:
        raise ValueError(f"desired_logit_prob must be in (0, 1], got {desired_logit_prob!r}")
    probs = logits.to(torch.float64).softmax(dim=-1)
    top_p, top_ids = probs.topk(min(max_n_logits, probs.shape[-1]))
    cutoff = (
        int(
            torch.searchsorted(
                top_p.cumsum(0), torch.tensor(desired_logit_prob, dtype=top_p.dtype, device=top_p.device)
            )
        )
        + 1
    )
    return top_ids[:cutoff], top_p[:cutoff].to(logits.dtype)


@restores_thread_state
def attribute(
    model,
    transcoders,
    tokens,
    *,
    max_n_logits: int = 10,
    desired_logit_prob: float = 0.95,
    batch_size: int = 32,
    memory_budget: int | None = None,
    max_feature_nodes: int | None = None,
    exclude_special_tokens=None,
    progress: bool = False,
) -> AttributionGraph:
    """The attribution graph of ``model`` with ``transcoders`` (a ``CrossLayerTranscoder``, or one transcoder ``SAE``
    per layer) on one prompt ``tokens`` (``[pos]``, or text when the model has a tokenizer).

    ``batch_size`` targets share a backward pass. The model must be processed as the transcoders expect (``fold_ln``
    for transcoders reading ``hook_normalized``; ``ProcessingMismatch`` otherwise). With ``memory_budget`` (bytes),
    the run is refused before it allocates its graph when ``plan_memory`` estimates a peak above it
    (``MemoryBudgetError``, naming both). ``max_feature_nodes`` keeps the graph to the features of most influence
    (module docstring). ``exclude_special_tokens`` (default: the tokenizer's special tokens, when it has a tokenizer;
    True, False or token ids) leaves those positions without features, as ``ReplacementModel`` says.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if max_feature_nodes is not None and (
        isinstance(max_feature_nodes, bool) or not isinstance(max_feature_nodes, int) or max_feature_nodes < 0
    ):
        raise ValueError(f"max_feature_nodes must be an int >= 0 or None, got {max_feature_nodes!r}")
    replacement = ReplacementModel(model, transcoders, tokens, exclude_special_tokens)
    logit_tokens, probabilities = salient_logits(replacement.logits[-1], max_n_logits, desired_logit_prob)
    n_selected = replacement.n_features if max_feature_nodes is None else min(max_feature_nodes, replacement.n_features)
    batch = min(batch_size, n_selected + len(logit_tokens))
    if memory_budget is not None:
        n_logits = len(logit_tokens)
        plan = plan_for(replacement, batch_size=batch, n_logits=n_logits, n_selected=n_selected)
        check_budget(plan, memory_budget)
    if n_selected == replacement.n_features:
        return _build(replacement, logit_tokens, probabilities, batch, progress)
    return _build_selected(replacement, logit_tokens, probabilities, batch, n_selected, progress)


def _targets(replacement: ReplacementModel, logit_tokens: Tensor) -> list[tuple[int | None, int, Tensor]]:
    """Every target as ``(layer or None for a logit, position, the direction it reads)``: features, then logits."""
    W_U = replacement.model.read_out.W_U.detach()
    demeaned = W_U[:, logit_tokens] - W_U.mean(dim=1, keepdim=True)
    targets = []
    for spec, span in zip(replacement.layers, replacement.feature_slices):
        _, pos, feature = replacement.active_features[span].unbind(-1)
        directions = spec.W_enc[:, feature].T
        targets += [(spec.layer, int(p), d) for p, d in zip(pos, directions)]
    return targets + [(None, replacement.n_pos - 1, demeaned[:, j]) for j in range(len(logit_tokens))]


def _reads(chunk: list[tuple[int | None, int, Tensor]]) -> list[tuple[int | None, Tensor, Tensor, Tensor]]:
    """A chunk of targets, one per row from row 0, grouped by where they read (``group_reads``)."""
    return group_reads([(layer, row, pos, direction) for row, (layer, pos, direction) in enumerate(chunk)])


def group_reads(
    items: list[tuple[int | None, int, int, Tensor]],
) -> list[tuple[int | None, Tensor, Tensor, Tensor]]:
    """Targets given as ``(layer or None for a logit, row, position, direction)``, grouped by where they read:
    ``(layer, rows, positions, directions)``, what ``Gradients.of`` takes."""
    groups: dict = {}
    for layer, row, pos, direction in items:
        groups.setdefault(layer, []).append((row, pos, direction))
    return [
        (
            layer,
            torch.tensor([r for r, _, _ in entries]),
            torch.tensor([p for _, p, _ in entries]),
            torch.stack([d for _, _, d in entries]),
        )
        for layer, entries in groups.items()
    ]


def _edges(replacement: ReplacementModel, grads: Gradients, chunk) -> Tensor:
    """``[len(chunk), n_sources]``: each target's edges from every feature, error and token node.

    Every product runs over all the pass's rows (rows past the chunk hold zero gradients), so a product's shape,
    and the kernel computing it, is the same for every chunk."""
    g_embed, g_outs = grads.of(_reads(chunk))
    return source_edges(replacement, g_embed, g_outs)[: len(chunk)]


def source_edges(replacement: ReplacementModel, g_embed: Tensor, g_outs: list[Tensor]) -> Tensor:
    """``[row, n_sources]``: the edges into each row's target from every feature, error and token node of
    ``replacement``'s prompt, given the target's gradients at the embeddings and MLP outputs (``[row, pos, d_model]``,
    the prompt's positions)."""
    n_f, n_layers, n_pos = replacement.n_features, replacement.n_layers, replacement.n_pos
    edges = g_embed.new_zeros(g_embed.shape[0], n_f + (n_layers + 1) * n_pos)
    for spec, writes in zip(replacement.layers, replacement.writes):
        for j, out_layer in enumerate(spec.out_layers):
            laid_out = einops.einsum(g_outs[out_layer], writes.writes[:, :, j], "row pos d, pos n d -> row pos n")
            edges[:, writes.span] += writes.gather(laid_out)
    for out_layer in range(n_layers):
        start = n_f + out_layer * n_pos
        edges[:, start : start + n_pos] = (g_outs[out_layer] * replacement.errors[out_layer]).sum(-1)
    edges[:, n_f + n_layers * n_pos :] = (g_embed * replacement.embed).sum(-1)
    return edges


def _group() -> tuple[int, int]:
    """``(rank, world size)`` of the process group this run is in; ``(0, 1)`` without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _sum_across_ranks(tensor: Tensor, device: torch.device) -> None:
    """``tensor`` (each rank's rows, zeros elsewhere) summed over the ranks, in place: ``x + 0`` is exact."""
    if _group()[1] == 1:
        return
    if dist.get_backend() == "nccl":
        on_device = tensor.to(device)
        dist.all_reduce(on_device)
        tensor.copy_(on_device.cpu())
    else:
        dist.all_reduce(tensor)


def _build(replacement: ReplacementModel, logit_tokens, probabilities, batch: int, progress: bool):
    targets = _targets(replacement, logit_tokens)
    n_f, n_logits = replacement.n_features, len(logit_tokens)
    n_sources = n_f + (replacement.n_layers + 1) * replacement.n_pos
    dtype = replacement.embed.dtype
    adjacency = torch.zeros(n_sources + n_logits, n_sources + n_logits, dtype=dtype)
    target_nodes = list(range(n_f)) + list(range(n_sources, n_sources + n_logits))
    rank, world = _group()
    chunks = list(range(0, len(targets), batch))[rank::world]  # chunk i on rank i % world
    with replacement.backward_pass(batch) as grads:
        for start in tqdm(chunks, desc="attribution", disable=not progress or rank > 0, leave=False):
            chunk = targets[start : start + batch]
            adjacency[target_nodes[start : start + len(chunk)], :n_sources] = _edges(replacement, grads, chunk).cpu()
    _sum_across_ranks(adjacency, replacement.embed.device)
    bias, values = _bias_and_values(replacement, logit_tokens, n_sources)
    return _graph(replacement, logit_tokens, probabilities, values, adjacency, bias)


def _graph(replacement, logit_tokens, probabilities, values, adjacency, bias, selected=None, unselected=None):
    model = replacement.model
    has_tokenizer = getattr(model, "tokenizer", None) is not None
    selected = torch.arange(replacement.n_features) if selected is None else selected
    return AttributionGraph(
        tokens=replacement.tokens.cpu(),
        active_features=replacement.active_features[selected].cpu(),
        activation_values=replacement.activations[selected].cpu(),
        logit_tokens=logit_tokens.cpu(),
        logit_probabilities=probabilities.cpu(),
        logit_values=values,
        adjacency_matrix=adjacency,
        bias=bias,
        n_layers=replacement.n_layers,
        prompt=model.to_string(replacement.tokens) if has_tokenizer else "",
        str_tokens=list(model.to_str_tokens(replacement.tokens)) if has_tokenizer else None,
        logit_str_tokens=list(model.to_str_tokens(logit_tokens)) if has_tokenizer else None,
        d_transcoder=max(spec.d_transcoder for spec in replacement.layers),
        selected_features=selected.cpu(),
        unselected_effect=unselected,
    )


def partial_influence(
    rows: Float[Tensor, "row source"], row_nodes: Tensor, start: Float[Tensor, "node"], max_iter: int = 1024
) -> Float[Tensor, "node"]:
    """Each node's influence on the logits through the rows computed so far: ``start (N + N^2 + ...)`` with ``N`` the
    rows' absolute values, each row divided by its sum, and row ``i`` the inputs of node ``row_nodes[i]``; ``start``
    holds the logits' probabilities at their nodes (circuit-tracer's partial influence)."""
    normalized = normalize_matrix(rows)
    influence = torch.zeros_like(start)
    current = start
    for _ in range(max_iter):  # the graph is acyclic: a path is at most as long as the model is deep
        current = current[row_nodes] @ normalized
        current = torch.nn.functional.pad(current, (0, start.shape[0] - current.shape[0]))
        if not bool(current.any()):
            return influence
        influence += current
    raise RuntimeError(f"influence did not vanish after {max_iter} steps: the rows do not form an acyclic graph")


def _build_selected(replacement: ReplacementModel, logit_tokens, probabilities, batch: int, n_selected: int, progress):
    """The graph of the ``n_selected`` features of most influence (module docstring), visited a chunk at a time."""
    targets = _targets(replacement, logit_tokens)
    n_f, n_logits, dtype = replacement.n_features, len(logit_tokens), replacement.embed.dtype
    n_sources = n_f + (replacement.n_layers + 1) * replacement.n_pos
    rows = torch.zeros(n_logits + n_selected, n_sources, dtype=dtype)
    row_nodes = torch.zeros(n_logits + n_selected, dtype=torch.long)  # each row's target as a node
    start = torch.zeros(n_sources + n_logits, dtype=dtype)
    start[n_sources:] = probabilities.to(dtype).cpu()
    visited = torch.zeros(n_f, dtype=torch.bool)
    rank, world = _group()
    bar = tqdm(total=n_logits + n_selected, desc="attribution", disable=not progress or rank > 0, leave=False)
    with replacement.backward_pass(batch) as grads:
        done = 0
        for first in range(0, n_logits, batch):  # the logits first, on every rank
            chunk = list(range(n_f + first, n_f + min(first + batch, n_logits)))
            rows[done : done + len(chunk)] = _edges(replacement, grads, [targets[t] for t in chunk]).cpu()
            row_nodes[done : done + len(chunk)] = torch.tensor(chunk) - n_f + n_sources
            done += len(chunk)
            bar.update(len(chunk))
        while done < n_logits + n_selected:
            influence = partial_influence(rows[:done], row_nodes[:done], start)[:n_f]
            take = min(batch * world, n_logits + n_selected - done)  # batch_size targets per rank
            chunk = influence.masked_fill(visited, -1.0).topk(take).indices.sort().values
            visited[chunk] = True
            mine = chunk[rank * batch : (rank + 1) * batch].tolist()
            if mine:
                first = done + rank * batch
                rows[first : first + len(mine)] = _edges(replacement, grads, [targets[t] for t in mine]).cpu()
            _sum_across_ranks(rows[done : done + take], replacement.embed.device)
            row_nodes[done : done + take] = chunk
            done += take
            bar.update(take)
    bar.close()
    selected = visited.nonzero()[:, 0]
    keep = torch.cat([selected, torch.arange(n_f, n_sources)])
    n_nodes = len(keep) + n_logits
    adjacency = torch.zeros(n_nodes, n_nodes, dtype=dtype)
    unselected = torch.zeros(n_nodes, dtype=dtype)
    node_of_feature = torch.empty(n_f, dtype=torch.long)
    node_of_feature[selected] = torch.arange(n_selected)
    is_logit = row_nodes >= n_sources
    nodes = torch.where(is_logit, row_nodes - n_sources + len(keep), node_of_feature[row_nodes.clamp(max=n_f - 1)])
    for first in range(0, len(rows), 1024):  # a block at a time: no copy of every row at once
        block = rows[first : first + 1024]
        adjacency[nodes[first : first + 1024], : len(keep)] = block[:, keep]
        # every feature's effect less the kept ones': no copy of the left-out columns (most of a block), and the
        # long sum is torch's pairwise one
        unselected[nodes[first : first + 1024]] = block[:, :n_f].sum(1) - block[:, selected].sum(1)
    del rows
    full_bias, values = _bias_and_values(replacement, logit_tokens, n_sources)
    bias = torch.cat([full_bias[selected], full_bias[n_f:]])
    return _graph(replacement, logit_tokens, probabilities, values, adjacency, bias, selected, unselected)


def _bias_and_values(replacement: ReplacementModel, logit_tokens: Tensor, n_sources: int) -> tuple[Tensor, Tensor]:
    """Each target with every source removed (its bias), and the logit nodes' values, from two forward runs."""
    n_f = replacement.n_features
    zero = replacement.embed.new_zeros
    off = replacement.run(zero(1, n_f), zero(1, replacement.n_layers, replacement.n_pos), zero(1, replacement.n_pos))
    on = replacement.run()
    bias = torch.zeros(n_sources + len(logit_tokens), dtype=replacement.embed.dtype)
    bias[:n_f] = off.features[0].cpu()
    bias[n_sources:] = _demeaned(off.uncapped[0], logit_tokens).cpu()
    return bias, _demeaned(on.uncapped[0], logit_tokens).cpu()


def _demeaned(logits: Tensor, tokens: Tensor) -> Tensor:
    return logits[tokens] - logits.mean()


__all__ = ["attribute", "partial_influence", "salient_logits"]
