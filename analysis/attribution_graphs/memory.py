"""How much memory an attribution graph takes, planned before it is spent.

At its peak ``attribute`` holds, with ``s`` the model's bytes per value, ``L`` layers, ``pos`` positions,
``F`` active features, ``n = F + (L + 1) pos + n_logits`` nodes and ``B`` targets per backward pass:

=============  ============================================================================================
``adjacency``  the ``[n, n]`` matrix: ``n^2 s``; with ``max_feature_nodes = K < F``, the ``[n_logits + K, F +
               (L + 1) pos]`` rows of the visited targets (``rows``)
``prompt``     what the replacement model holds for the prompt: the frozen patterns, queries, keys and
               scales, each layer's input, the features' writes (laid out by position), the error
               nodes, the embeddings, the prompt's logits, and each target's direction (``F d_model s``)
``graph``      the batched forward's retained graph, ``B`` times what one row adds: measured on a two-
               and a three-row run of the replacement model (the tensors autograd still holds once the
               forward is done, the leaves, the tensors the targets read), so it holds for any
               architecture without a formula of its own
``backward``   ``B`` times the larger of two working sets: the forward's at one layer (the query-sized
               tensors attention makes and drops; no scores, as each attention takes its frozen pattern
               whole) and a backward pass's (the
               sources' gradients, ``(L + 1) pos d_model s``, plus autograd's gradient of the stream on its
               way or the tensors that turn gradients into edges: a row of edges, one ``[pos, d_model]``
               product, the ``[pos, n]`` products of the features at each position)
``influence``  with ``K < F``: the rows' normalized copy, made between passes to order the visit (``rows``)
``assembly``   with ``K < F``: the kept graph's ``[n_K, n_K]`` matrix, made once the passes have freed
               their graph
=============  ============================================================================================

The peak is ``prompt + adjacency + max(graph + max(backward, influence), assembly)``. The adjacency, its rows and
the kept matrix live in host memory; with the model on an accelerator the device holds ``prompt + graph +
backward`` (``device_peak``), and that is the ``peak`` a budget is checked against.

``plan_memory`` gives the estimate for a prompt length, a feature count and a target batch;
``attribute(..., memory_budget=...)`` refuses a run whose estimate exceeds the budget before it
allocates its graph (``MemoryBudgetError``, naming both). Weights are not counted: they exist already.
On the shapes ``tests/test_attribution_graphs.py`` and ``benchmarks/bench_attribution_graph.py`` measure, the
plan is within 5% of the peak of resident memory; on an H200 (``benchmarks/attribution_on_device.py``, 1,024 to
4,096 tokens) ``device_peak`` was within 2% of the device's peak of allocated memory when every row still made
its attention scores (two ``[head, pos, pos]`` per row, counted then).
"""

import weakref
from dataclasses import dataclass

import torch

from interp_transformer.harvest.budget import format_bytes

from .replacement import ReplacementModel

FORWARD_QUERIES = 7  # query-sized tensors one attention forward holds at once, at most (see plan_for)
BACKWARD_STREAMS = 2  # [pos, d_model] gradients autograd holds at once in a backward pass of the frozen model


class MemoryBudgetError(ValueError):
    """An attribution graph whose planned peak memory exceeds the budget it was given."""


@dataclass(frozen=True)
class MemoryPlan:
    """An attribution graph's planned peak memory, in bytes, by part (module docstring)."""

    n_pos: int
    n_features: int
    n_logits: int
    batch_size: int
    adjacency: int
    prompt: int
    graph: int
    backward: int
    n_selected: int | None = None  # max_feature_nodes, where it keeps fewer features than are active
    influence: int = 0  # the visited rows' normalized copy (max_feature_nodes)
    assembly: int = 0  # the kept graph's matrix, made after the passes (max_feature_nodes)
    accelerator: bool = False  # the model is on an accelerator: the device holds prompt, graph and backward

    @property
    def host_peak(self) -> int:
        """The peak with everything in one memory (the model on the CPU)."""
        passes = self.graph + max(self.backward, self.influence)
        return self.prompt + self.adjacency + max(passes, self.assembly)

    @property
    def device_peak(self) -> int:
        """What an accelerator holding the model holds at the peak: the adjacency stays in host memory."""
        return self.prompt + self.graph + self.backward

    @property
    def peak(self) -> int:
        """The peak of the memory the model is in: ``device_peak`` on an accelerator, else ``host_peak``."""
        return self.device_peak if self.accelerator else self.host_peak

    def __str__(self) -> str:
        names = ("adjacency", "prompt", "graph", "backward") + (("influence", "assembly") if self.assembly else ())
        parts = ", ".join(f"{name} {format_bytes(getattr(self, name))}" for name in names)
        where = f" on the device, {format_bytes(self.host_peak - self.device_peak)} more on the host"
        return (
            f"{format_bytes(self.peak)}{where if self.accelerator else ''} for {self.n_pos} positions, "
            f"{self.n_features} features"
            + ("" if self.n_selected is None else f" ({self.n_selected} visited)")
            + f", {self.n_logits} logits, {self.batch_size} targets per pass ({parts})"
        )


def check_budget(plan: MemoryPlan, memory_budget: int) -> None:
    """``MemoryBudgetError`` when ``plan.peak`` exceeds ``memory_budget`` bytes."""
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, int) or memory_budget <= 0:
        raise ValueError(f"memory_budget must be a positive number of bytes, got {memory_budget!r}")
    if plan.peak > memory_budget:
        raise MemoryBudgetError(
            f"the attribution graph is estimated to need {format_bytes(plan.peak)} ({plan.peak} bytes), above the "
            f"budget of {format_bytes(memory_budget)} ({memory_budget} bytes): {plan}. A smaller batch_size shrinks "
            "the graph and backward parts; fewer positions or features shrink the adjacency"
        )


def plan_memory(
    model,
    transcoders,
    *,
    n_pos: int,
    n_features: int,
    batch_size: int,
    n_logits: int = 10,
    max_feature_nodes: int | None = None,
) -> MemoryPlan:
    """The planned peak of ``attribute`` on a prompt of ``n_pos`` tokens with ``n_features`` active features,
    ``batch_size`` targets per backward pass, ``n_logits`` logit nodes and ``max_feature_nodes`` (module docstring).

    It runs the replacement model of a prompt of ``n_pos`` tokens on two and three rows to measure what one row
    keeps (a few forward passes; nothing of ``batch_size`` is allocated).
    """
    for name, value in (("n_pos", n_pos), ("n_features", n_features), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "n_features" else 1):
            raise ValueError(
                f"{name} must be a {'non-negative' if name == 'n_features' else 'positive'} int, got {value!r}"
            )
    replacement = ReplacementModel(model, transcoders, torch.zeros(n_pos, dtype=torch.long), False)
    n_selected = None if max_feature_nodes is None else min(max_feature_nodes, n_features)
    return plan_for(replacement, batch_size=batch_size, n_logits=n_logits, n_features=n_features, n_selected=n_selected)


def plan_for(
    replacement: ReplacementModel,
    *,
    batch_size: int,
    n_logits: int,
    n_features: int | None = None,
    n_selected: int | None = None,
) -> MemoryPlan:
    """The plan for ``replacement``'s prompt (its own feature count unless ``n_features`` is given)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    cfg = replacement.model.cfg
    itemsize = replacement.embed.element_size()
    L, pos, d = replacement.n_layers, replacement.n_pos, cfg.d_model
    stream = pos * d * itemsize  # one [pos, d_model] tensor
    F = replacement.n_features if n_features is None else n_features
    n_nodes = F + (L + 1) * pos + n_logits
    writes = sum(w.writes.numel() for w in replacement.writes) * itemsize
    if n_features is not None:  # a planned count: writes scale with it, per feature as on this prompt
        n_out = sum(layer.decoders.shape[1] for layer in replacement.layers) / L
        writes = int(F * n_out * d * itemsize)
    held = list(replacement.frozen.values()) + replacement.inputs
    held += [replacement.errors, replacement.embed, replacement.logits]
    prompt = sum(t.numel() for t in held) * itemsize + writes + F * d * itemsize
    graph = batch_size * _graph_per_row(replacement)
    # the forward's working set at one layer, per row: the query-, key- and value-sized tensors attention makes and
    # drops (projections, rotations, values repeated per query head): FORWARD_QUERIES at most, measured on GPT-2 (4)
    # and Llama with grouped keys and rotary (7). No [head, pos, pos] scores: each attention takes its frozen
    # pattern whole (``Attention.pattern_given``) and makes none
    queries = max((t[0].numel() for name, t in replacement.frozen.items() if name.endswith(("_q", "_k"))), default=0)
    forward_work = FORWARD_QUERIES * queries * itemsize
    # a backward pass: the sources' gradients, and the larger of autograd's working set (the stream's gradient on
    # its way, BACKWARD_STREAMS of them) and of turning gradients into edges: a row of edges, one [pos, d_model]
    # product, and the [pos, n] products of the features at each position
    per_position = max((w.writes.shape[1] for w in replacement.writes), default=0)
    if n_features is not None:
        per_position = -(-F // max(L * pos, 1))
    edges_work = (F + (L + 1) * pos) * itemsize + stream + pos * per_position * itemsize
    backward_work = (L + 1) * stream + max(BACKWARD_STREAMS * stream, edges_work)
    backward = batch_size * max(forward_work, backward_work)
    adjacency, influence, assembly = n_nodes * n_nodes * itemsize, 0, 0
    if n_selected is not None and n_selected < F:
        adjacency = influence = (n_logits + n_selected) * (F + (L + 1) * pos) * itemsize
        kept = n_selected + (L + 1) * pos + n_logits
        assembly = kept * kept * itemsize
    else:
        n_selected = None
    accelerator = replacement.embed.device.type != "cpu"
    return MemoryPlan(
        pos, F, n_logits, batch_size, adjacency, prompt, graph, backward, n_selected, influence, assembly, accelerator
    )


def _graph_per_row(replacement: ReplacementModel) -> int:
    """Bytes the batched forward keeps per row: what a three-row run holds beyond a two-row run (the tensors autograd
    still saves once the forward is done, the leaves, and the tensors the targets read), counted once per storage."""
    held = []
    for rows in (2, 3):  # from two rows on, every per-row tensor has storage of its own
        packed: list[weakref.ref] = []

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            saved = tensor.detach()  # no grad_fn: the probe adds no reference cycle that would keep a node alive
            packed.append(weakref.ref(saved))  # noqa: B023 (pack runs within this iteration's backward pass)
            return saved

        with (
            torch.autograd.graph.saved_tensors_hooks(pack, lambda saved: saved),
            replacement.backward_pass(rows) as grads,
        ):
            tensors = [grads.embed, grads.normed] + grads.outs + grads.inputs
            tensors += [tensor for tensor in (ref() for ref in packed) if tensor is not None]
            storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
        held.append(sum(storages.values()))
    return max(held[1] - held[0], 0)


__all__ = ["MemoryBudgetError", "MemoryPlan", "check_budget", "plan_for", "plan_memory"]
