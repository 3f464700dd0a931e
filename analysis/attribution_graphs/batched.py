"""``attribute_prompts``: the attribution graphs of several prompts from shared backward passes, each equal to its
prompt's graph alone.

Each prompt's replacement model is made alone, from its own forward (``ReplacementModel``): neither another prompt
nor padding reaches its frozen patterns, scales, errors or features. The backward passes are shared. The prompts
are left-padded to the longest (``pos`` positions) and a pass's rows are split into one block per prompt, each
block running its prompt's replacement model: its embeddings, MLP outputs, frozen patterns and scales, padded.

Padding cannot leak into a prompt's graph. Every frozen pattern is zero at the padded keys (and on the padded
queries), and nothing else in the replacement model mixes positions, so a gradient reaches a padded position only
through a product with zero. A padded position holds finite values that nothing reads: scale and frozen queries
and keys 1, embedding and MLP outputs 0. A prompt's targets read its positions shifted by its padding, and its
edges are the one-prompt products (``source_edges``) of its block's gradients at its own positions. Rows never
mix, so each graph equals ``attribute``'s on its prompt alone, up to rounding (the products' shapes differ).

Prompts share passes with prompts of about their length (``length_groups``: at most ``batch_size`` prompts,
none padded by more than a quarter of its length), since a padded position costs a pass as much as a real one.
In a group the rows are shared out so that the passes are fewest: with ``T`` passes, prompt ``k``'s ``n_k``
targets (its active features and logits) take ``ceil(n_k / T)`` rows, and ``T`` is the smallest whose rows fit
``batch_size``. Under ``torchrun`` the passes are shared out among the ranks, as ``attribute`` shares its chunks.

What sharing saves is a prompt's own forward and its last, part-empty pass: much where prompts have fewer targets
than a pass has rows, little where each fills many passes alone (``benchmarks/bench_attribution_prompts.py``).
"""

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor
from tqdm.auto import tqdm

from interp_transformer.hooks.thread_state import restores_thread_state

from .. import _checks
from .attribute import (
    _bias_and_values,
    _build,
    _graph,
    _group,
    _sum_across_ranks,
    _targets,
    group_reads,
    salient_logits,
    source_edges,
)
from .graph import AttributionGraph
from .memory import MemoryPlan, check_budget, plan_for, plan_memory
from .replacement import Gradients, ReplacementModel

PADDING = 0.25  # the most padding a prompt sharing passes takes, as a share of its own length


@restores_thread_state
def attribute_prompts(
    model,
    transcoders,
    prompts: Sequence,
    *,
    max_n_logits: int = 10,
    desired_logit_prob: float = 0.95,
    batch_size: int = 32,
    memory_budget: int | None = None,
    exclude_special_tokens=None,
    max_padding: float = PADDING,
    progress: bool = False,
) -> list[AttributionGraph]:
    """The attribution graph of each of ``prompts`` (text, or ``[pos]`` tokens), from backward passes shared among
    them (module docstring): ``attribute(model, transcoders, prompt, ...)`` for each, up to rounding.

    ``batch_size`` is the rows of one pass, over all the prompts of a group; ``memory_budget`` (bytes) refuses a
    group whose planned peak exceeds it (``MemoryBudgetError``) before its passes run. ``max_padding`` is the most
    padding a prompt takes to share passes, as a share of its length (``float("inf")``: every group is the next
    ``batch_size`` prompts by length). The other arguments are ``attribute``'s. Graphs are kept whole (every
    active feature): choosing features by influence (``max_feature_nodes``) visits one prompt's features in rounds
    that depend on its own rows, which is ``attribute``'s work, one prompt at a time.
    """
    graphs: list = [None] * len(prompts)
    for indices, replacements, logits in _groups(
        model, transcoders, prompts, batch_size, exclude_special_tokens, max_n_logits, desired_logit_prob, max_padding
    ):
        group = _group_graphs(replacements, logits, batch_size, memory_budget, transcoders, progress)
        for index, graph in zip(indices, group):
            graphs[index] = graph
    return graphs


@restores_thread_state
def plan_prompts(
    model,
    transcoders,
    prompts: Sequence,
    *,
    batch_size: int = 32,
    max_n_logits: int = 10,
    desired_logit_prob: float = 0.95,
    exclude_special_tokens=None,
    max_padding: float = PADDING,
) -> list[MemoryPlan]:
    """The planned peak of ``attribute_prompts`` with these arguments, one plan per group of prompts that share
    passes (``length_groups``; ``PaddedPrompts.plan``). It runs each prompt's forward, and measures a few rows at
    the padded length."""
    plans = []
    for _, replacements, logits in _groups(
        model, transcoders, prompts, batch_size, exclude_special_tokens, max_n_logits, desired_logit_prob, max_padding
    ):
        padded = PaddedPrompts(replacements, rows_per_prompt(_target_counts(replacements, logits), batch_size))
        plans.append(padded.plan(transcoders, [len(tokens) for tokens, _ in logits]))
    return plans


def _groups(
    model, transcoders, prompts, batch_size, exclude_special_tokens, max_n_logits, desired_logit_prob, max_padding
):
    """The prompts' replacement models and salient logits in groups of similar length, each as ``(the prompts'
    indices, replacement models, salient logits)`` (``length_groups``), made one group at a time."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if isinstance(prompts, (str, Tensor)) or not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise ValueError(f"prompts must be a non-empty list of prompts (text or [pos] tokens), got {prompts!r:.80}")
    if isinstance(max_padding, bool) or not isinstance(max_padding, (int, float)) or not max_padding >= 0:
        raise ValueError(f"max_padding must be a number >= 0 (a share of a prompt's length), got {max_padding!r}")
    lengths = [_checks.check_model(model).prepare_tokens(prompt).shape[-1] for prompt in prompts]
    for group in length_groups(lengths, batch_size, max_padding):  # a group's models are made when it runs
        replacements = [ReplacementModel(model, transcoders, prompts[k], exclude_special_tokens) for k in group]
        logits = [salient_logits(r.logits[-1], max_n_logits, desired_logit_prob) for r in replacements]
        yield group, replacements, logits


def length_groups(lengths: list[int], batch_size: int, max_padding: float = PADDING) -> list[list[int]]:
    """The prompts' indices in groups that share passes: at most ``batch_size`` prompts each, by length, and none
    padded by more than ``max_padding`` of its own length (padded positions cost as much as the prompt's own)."""
    groups: list[list[int]] = []
    for k in sorted(range(len(lengths)), key=lambda k: lengths[k]):
        group = groups[-1] if groups else None
        if group and len(group) < batch_size and lengths[k] <= (1 + max_padding) * lengths[group[0]]:
            group.append(k)
        else:
            groups.append([k])
    return groups


def _target_counts(replacements, logits) -> list[int]:
    return [r.n_features + len(tokens) for r, (tokens, _) in zip(replacements, logits)]


def rows_per_prompt(counts: list[int], batch_size: int) -> list[int]:
    """Each prompt's rows of a pass, for ``counts[k]`` targets each, so that the passes are fewest (module
    docstring); at most ``batch_size`` rows in all, and as few as that number of passes needs."""
    if len(counts) > batch_size:
        raise ValueError(f"{len(counts)} prompts cannot share passes of {batch_size} rows: at most one row each")
    low, high = 1, max(counts)  # passes: a row per prompt always fits, so high does
    while low < high:
        middle = (low + high) // 2
        if sum(-(-count // middle) for count in counts) <= batch_size:
            high = middle
        else:
            low = middle + 1
    return [-(-count // low) for count in counts]


def _group_graphs(replacements, logits, batch_size, memory_budget, transcoders, progress) -> list[AttributionGraph]:
    if len(replacements) == 1:  # alone: attribute's passes, which broadcast one frozen pattern over every row
        (replacement,), ((tokens, probabilities),) = replacements, logits
        batch = min(batch_size, replacement.n_features + len(tokens))
        if memory_budget is not None:
            check_budget(plan_for(replacement, batch_size=batch, n_logits=len(tokens)), memory_budget)
        return [_build(replacement, tokens, probabilities, batch, progress)]
    targets = [_targets(r, tokens) for r, (tokens, _) in zip(replacements, logits)]
    padded = PaddedPrompts(replacements, rows_per_prompt(_target_counts(replacements, logits), batch_size))
    if memory_budget is not None:
        check_budget(padded.plan(transcoders, [len(tokens) for tokens, _ in logits]), memory_budget)
    n_sources = [r.n_features + (r.n_layers + 1) * r.n_pos for r in replacements]
    adjacency = [
        torch.zeros(n + len(tokens), n + len(tokens), dtype=r.embed.dtype)
        for r, n, (tokens, _) in zip(replacements, n_sources, logits)
    ]
    target_nodes = [
        list(range(r.n_features)) + list(range(n, n + len(tokens)))
        for r, n, (tokens, _) in zip(replacements, n_sources, logits)
    ]
    n_passes = max(-(-len(t) // rows) for t, rows in zip(targets, padded.rows))
    rank, world = _group()
    with padded.backward_pass() as grads:
        for step in tqdm(range(n_passes)[rank::world], desc="attribution", disable=not progress or rank > 0):
            chunks = [t[step * rows : (step + 1) * rows] for t, rows in zip(targets, padded.rows)]
            for k, edges in padded.edges(grads, chunks):
                first = step * padded.rows[k]
                nodes = target_nodes[k][first : first + len(chunks[k])]
                adjacency[k][nodes, : n_sources[k]] = edges.cpu()
    graphs = []
    for r, n, matrix, (tokens, probabilities) in zip(replacements, n_sources, adjacency, logits):
        _sum_across_ranks(matrix, r.embed.device)
        bias, values = _bias_and_values(r, tokens, n)
        graphs.append(_graph(r, tokens, probabilities, values, matrix, bias))
    return graphs


def _left_pad(tensor: Tensor, pad: int, dims: tuple[int, ...], value: float) -> Tensor:
    """``tensor`` with ``pad`` entries of ``value`` before its own along each of ``dims``."""
    for dim in dims:
        shape = list(tensor.shape)
        shape[dim] = pad
        tensor = torch.cat([tensor.new_full(shape, value), tensor], dim=dim)
    return tensor


class PaddedPrompts:
    """Prompts' replacement models run as one pass, left-padded to the longest, prompt ``k`` on ``rows[k]``
    consecutive rows (module docstring)."""

    def __init__(self, replacements: list[ReplacementModel], rows: list[int]):
        if len(rows) != len(replacements) or min(rows) < 1:
            raise ValueError(f"each of {len(replacements)} prompts needs at least one row, got rows {rows}")
        self.replacements, self.rows = replacements, rows
        self.n_pos = max(r.n_pos for r in replacements)
        self.pads = [self.n_pos - r.n_pos for r in replacements]
        starts = torch.tensor([0] + rows).cumsum(0).tolist()
        self.blocks = [slice(start, start + n) for start, n in zip(starts, rows)]

    def _stacked(self, values: list[Tensor], dims: tuple[int, ...], value: float) -> Tensor:
        """Each prompt's ``values[k]`` (one row, no batch axis), padded along ``dims`` and repeated on its rows."""
        padded = [_left_pad(v, pad, dims, value) for v, pad in zip(values, self.pads)]
        return torch.cat([v.expand(n, *v.shape) for v, n in zip(padded, self.rows)])

    def _frozen(self) -> dict[str, Tensor]:
        """Each frozen hook's value on every row: patterns zero at padded queries and keys, the rest (queries,
        keys, norm scales: ``[batch, pos, ...]``) 1 at padded positions."""
        first = self.replacements[0]
        frozen = {}
        for name in first.frozen_names:
            dims, value = ((1, 2), 0.0) if name in first.pattern_names else ((0,), 1.0)
            frozen[name] = self._stacked([r.frozen[name][0] for r in self.replacements], dims, value)
        return frozen

    @contextlib.contextmanager
    def backward_pass(self) -> Iterator[Gradients]:
        """The replacement models run once, each on its rows, with the sources as leaves (``backward_pass`` of
        ``ReplacementModel``, for several prompts)."""
        first = self.replacements[0]
        outputs = [r.mlp_outputs() for r in self.replacements]
        embed = self._stacked([r.embed for r in self.replacements], (0,), 0.0).requires_grad_(True)
        outs = [
            self._stacked([out[o] for out in outputs], (0,), 0.0).requires_grad_(True) for o in range(first.n_layers)
        ]
        tokens = self._stacked([r.tokens for r in self.replacements], (0,), 0)  # only the shape is read

        def mlp_out(layer: int, x: Tensor) -> Tensor:
            skip = first.layers[layer].skip_term(x)
            return outs[layer] if skip is None else outs[layer] + (skip - skip.detach())

        with torch.enable_grad(), first._frozen_forward(embed, mlp_out, self._frozen()) as inputs:
            normed = first._forward(sum(self.rows), tokens)
            with Gradients(embed, outs, [inputs[o] for o in range(first.n_layers)], normed) as grads:
                yield grads

    def edges(self, grads: Gradients, chunks: list[list]) -> Iterator[tuple[int, Tensor]]:
        """``(k, [len(chunks[k]), n_sources_k])`` for each prompt with targets: the edges into ``chunks[k]`` (its
        targets, as ``attribute`` lists them), read on its block of rows at its own positions."""
        items = [
            (layer, block.start + row, pos + pad, direction)
            for chunk, block, pad in zip(chunks, self.blocks, self.pads)
            for row, (layer, pos, direction) in enumerate(chunk)
        ]
        g_embed, g_outs = grads.of(group_reads(items))
        for k, (r, chunk, block, pad) in enumerate(zip(self.replacements, chunks, self.blocks, self.pads)):
            if chunk:
                edges = source_edges(r, g_embed[block, pad:], [g[block, pad:] for g in g_outs])
                yield k, edges[: len(chunk)]

    def plan(self, transcoders, n_logits: list[int]) -> MemoryPlan:
        """The planned peak of the shared passes: each prompt's own adjacency and held tensors (``plan_for``), the
        frozen values repeated on every row, and the retained graph and working sets of ``sum(rows)`` rows at the
        padded length (``plan_memory``, measured there)."""
        first = self.replacements[0]
        rows, pos = sum(self.rows), self.n_pos
        alone = [plan_for(r, batch_size=1, n_logits=n) for r, n in zip(self.replacements, n_logits)]
        features = max(r.n_features for r in self.replacements)
        at_length = plan_memory(first.model, transcoders, n_pos=pos, n_features=features, batch_size=rows)
        per_row = sum(
            t[0].numel() // first.n_pos**2 * pos**2
            if name in first.pattern_names
            else t[0].numel() // first.n_pos * pos
            for name, t in first.frozen.items()
        )
        return MemoryPlan(
            n_pos=pos,
            n_features=sum(r.n_features for r in self.replacements),
            n_logits=sum(n_logits),
            batch_size=rows,
            adjacency=sum(p.adjacency for p in alone),
            prompt=sum(p.prompt for p in alone) + rows * per_row * first.embed.element_size(),
            graph=at_length.graph,
            backward=at_length.backward,
            accelerator=at_length.accelerator,
        )


__all__ = ["PaddedPrompts", "attribute_prompts", "length_groups", "plan_prompts", "rows_per_prompt"]
