"""The forward hooks that run circuits: each reader reads its own stream (``faithfulness`` states the math).

``stream_hooks(graph, offsets)`` gives every reader of one stream its own copy of the residual stream,
``x_r = resid + offset_r`` with ``offset_r = -sum over edges u -> r left out of (current_u - corrupt_u)``,
at its projection, its MLP's input or its end, and carries each reader's offset through stream norms. What
``offset_r`` is summed from is the ``offsets`` object's business; two compute the same numbers:

- ``DenseOffsets``: one circuit per forward, every dropped edge's difference summed at every read (the
  reference, as written in the math);
- ``GroupedOffsets``: ``G`` circuits in one forward, circuit ``g`` on rows ``[g B, (g + 1) B)`` of the
  clean prompts repeated ``G`` times. A node whose every edge is dropped in circuit ``g`` (most nodes of a
  small circuit) reaches every later reader the same way, so those nodes enter one running sum per circuit,
  shared by all readers; only nodes with some edges kept and some dropped (``partial``) are summed per reader,
  from a buffer holding their differences. The cost of a read falls from every node written so far times its
  readers to the partial nodes alone.
"""

import einops
import torch
from torch import Tensor

from .graph import Graph


def mean_writes(writes: Tensor, mask: Tensor | None) -> Tensor:
    """Each node's write averaged over prompts at each position (real tokens only), for every prompt."""
    if mask is None:
        return writes.mean(dim=1, keepdim=True).expand_as(writes)
    weight = mask.to(writes.dtype)[None, :, :, None]
    mean = (writes * weight).sum(dim=1, keepdim=True) / weight.sum(dim=1, keepdim=True).clamp(min=1)
    return mean.expand_as(writes)


class DenseOffsets:
    """One circuit: ``corrupt [upstream, batch, pos, d_model]`` the ablated writes, ``dropped [upstream, reader]``
    (float) the edges fed them. The reference: each read sums every dropped edge's difference."""

    def __init__(self, corrupt: Tensor, dropped: Tensor):
        self.corrupt, self.dropped = corrupt, dropped
        self.current: list[Tensor] = []  # this run's writes, in upstream order, as they are computed
        self.carried: tuple[int, int, Tensor] | None = None  # (since, first reader, [reader, ...]) past a norm

    @property
    def done(self) -> int:
        return len(self.current)

    def write(self, writes: Tensor) -> None:
        self.current.extend(writes)

    def __call__(self, columns: list[int]):
        """``x_r - resid`` for the readers ``columns``: ``[reader, rows, pos, d_model]``."""
        since, done = (self.carried[0] if self.carried else 0), len(self.current)
        offset = 0
        if done > since:
            diff = torch.stack(self.current[since:]) - self.corrupt[since:done]
            offset = -einops.einsum(self.dropped[since:done][:, columns], diff, "u r, u b p d -> r b p d")
        if self.carried:
            _, first, value = self.carried
            offset = offset + value[[column - first for column in columns]]
        return offset

    def split(self, columns: list[int]) -> tuple[None, list[int], Tensor]:
        """As ``GroupedOffsets.split``: no shared base, every reader its own offset."""
        return None, list(range(len(columns))), self(columns)

    def carry(self, first: int, value: Tensor) -> None:
        """From now on the readers ``first, ...`` read the stream offset by ``value`` (carried through a norm)."""
        self.carried = (len(self.current), first, value)


def _exceptions(dropped: Tensor, edge: Tensor) -> tuple[Tensor, Tensor]:
    """Per circuit, the nodes summed into the shared total (``[G, upstream]``: at least as many of their edges
    dropped as kept) and each node's correction ``c [G, upstream, reader]`` to it (``GroupedOffsets``)."""
    kept = edge[None] & ~dropped
    in_total = (dropped.sum(dim=-1) >= kept.sum(dim=-1)) & edge.any(dim=-1)
    correction = torch.where(in_total[..., None], kept, dropped)
    return in_total, correction


class GroupedOffsets:
    """``G`` circuits in one forward (module docstring): ``corrupt [upstream, batch, pos, d_model]``,
    ``dropped [G, upstream, reader]`` (bool), ``steps`` the timeline step of each node's write and each reader's
    read (``Graph.order``; an edge is a node written before the reader reads).

    Circuit ``g``'s offset at reader ``r`` is ``-total_g + sum_u c[g, u, r] (current_u - corrupt_u)``: ``total_g``
    sums every node written before ``r`` whose edges are mostly dropped (``in_total``), and ``c`` puts back its
    kept edges (``+1``) or takes out a node's dropped edges where most are kept (``-1``). A reader with no ``c`` in
    any circuit reads the shared ``-total``: its norm and projection are computed once for all such readers."""

    def __init__(self, corrupt: Tensor, dropped: Tensor, steps: tuple[list[int], list[int]]):
        self.corrupt, self.groups, self.batch = corrupt, dropped.shape[0], corrupt.shape[1]
        self.upstream_at, self.reader_at = (torch.tensor(at) for at in steps)
        in_total, correction = _exceptions(dropped, self.upstream_at[:, None] < self.reader_at[None, :])
        self.in_total = in_total.to(corrupt.device, corrupt.dtype)
        self.slot_nodes = correction.flatten(2).any(dim=-1).any(dim=0).nonzero().flatten()  # a buffer slot each
        self.slot_of = torch.full((dropped.shape[1],), -1, dtype=torch.long)
        self.slot_of[self.slot_nodes] = torch.arange(len(self.slot_nodes))
        self.slot_at = self.upstream_at[self.slot_nodes]
        sign = torch.where(in_total, 1.0, -1.0)[..., None].to(corrupt.dtype)
        self.slot_weight = (correction.to(corrupt.dtype) * sign)[:, self.slot_nodes].to(corrupt.device)  # [G, slot, r]
        self.buffer: Tensor | None = None  # [G, slot, batch, pos, d_model]: the slots' differences
        self.total: Tensor | None = None  # [G, batch, pos, d_model]
        self.pending: list[tuple[int, int, Tensor, Tensor]] = []  # (first step, last step, diff, weight) not in total
        self.summed_up_to = 0  # the latest step of a node in ``total``
        self.done, self.since = 0, 0
        self.carried: tuple[int, Tensor] | None = None

    @staticmethod
    def slots_needed(dropped: Tensor, steps: tuple[list[int], list[int]]) -> int:
        """How many nodes ``GroupedOffsets`` keeps a difference of for the circuits ``dropped``."""
        upstream_at, reader_at = (torch.tensor(at) for at in steps)
        _, correction = _exceptions(dropped, upstream_at[:, None] < reader_at[None, :])
        return int(correction.flatten(2).any(dim=-1).any(dim=0).sum())

    def write(self, writes: Tensor) -> None:
        """The next nodes' writes ``[node, G * batch, pos, d_model]``, in upstream order."""
        n, start = writes.shape[0], self.done
        diff = writes.reshape(n, self.groups, self.batch, *writes.shape[2:]) - self.corrupt[start : start + n, None]
        slots = self.slot_of[start : start + n]
        stored = slots >= 0
        if bool(stored.any()):
            if self.buffer is None:
                self.buffer = diff.new_zeros(self.groups, len(self.slot_nodes), *diff.shape[2:])
            self.buffer[:, slots[stored]] = diff[stored].transpose(0, 1)
        weight = self.in_total[:, start : start + n].T  # [node, G]
        if bool(weight.any()):
            at = self.upstream_at[start : start + n]
            self.pending.append((int(at.min()), int(at.max()), diff, weight))
        self.done += n

    def _sum_up_to(self, step: int) -> None:
        """Add to ``total`` the nodes written before ``step``; a reader at ``step`` reads them all."""
        if self.summed_up_to >= step:
            raise RuntimeError(
                f"a reader at step {step} was read after nodes up to step {self.summed_up_to} were summed for later "
                "readers: the model's hooks fired out of the graph's order"
            )
        later = []
        for first, last, diff, weight in self.pending:
            if last < step:
                summed = einops.einsum(weight, diff, "n g, n g b p d -> g b p d")
                self.total = summed if self.total is None else self.total + summed
                self.summed_up_to = max(self.summed_up_to, last)
            elif first < step:
                raise RuntimeError(f"one writer's nodes were written at steps {first} to {last}, across a read")
            else:
                later.append((first, last, diff, weight))
        self.pending = later

    def split(self, columns: list[int]) -> tuple[Tensor, list[int], Tensor]:
        """The offsets of the readers ``columns``: ``(base [G * batch, pos, d_model], special, extra [special, G *
        batch, pos, d_model])``, reader ``columns[i]`` offset by ``base`` plus, where ``i`` is in ``special``, its
        row of ``extra``."""
        step = int(self.reader_at[columns].min())
        self._sum_up_to(step)
        shape = (self.groups, self.batch, *self.corrupt.shape[2:])
        base = -self.total if self.total is not None else self.corrupt.new_zeros(shape)
        parts, special = [], torch.zeros(len(columns), dtype=torch.bool)
        if self.buffer is not None:
            lo = int((self.slot_nodes < self.since).sum())
            hi = int((self.slot_nodes < self.done).sum())
            valid = (self.slot_at[lo:hi] < step).to(self.corrupt.device, self.corrupt.dtype)[None, :, None]
            weight = self.slot_weight[:, lo:hi][:, :, columns] * valid  # [G, slot, reader]
            special = weight.any(dim=1).any(dim=0).cpu() | (self.carried is not None)
            weight = weight[:, :, special]
            for g in range(self.groups):
                rows = weight[g].any(dim=1).nonzero().flatten()
                if len(rows):
                    a, b = int(rows[0]), int(rows[-1]) + 1
                    parts.append((g, weight[g, a:b], self.buffer[g, lo + a : lo + b]))
        if self.carried:  # each reader's own offset past a stream norm
            special[:] = True
        index = special.nonzero().flatten().tolist()
        extra = base.new_zeros(len(index), *shape)
        for g, weight, buffer in parts:
            extra[:, g] = einops.einsum(weight, buffer, "s r, s b p d -> r b p d")
        extra = extra.flatten(1, 2)
        if self.carried:
            first, value = self.carried
            extra = extra + value[[column - first for column in columns]]
        return base.flatten(0, 1), index, extra

    def __call__(self, columns: list[int]) -> Tensor:
        """``x_r - resid`` for the readers ``columns``: ``[reader, G * batch, pos, d_model]``."""
        base, special, extra = self.split(columns)
        offset = base[None].repeat(len(columns), *([1] * base.ndim))
        offset[special] += extra
        return offset

    def carry(self, first: int, value: Tensor) -> None:
        """From now on the readers ``first, ...`` read the stream offset by ``value`` (carried through a norm)."""
        if self.pending:
            raise RuntimeError("a stream norm was carried past nodes no reader has summed")
        self.carried, self.since, self.total, self.summed_up_to = (first, value), self.done, None, 0


def stream_hooks(graph: Graph, offsets) -> list:  # noqa: C901 (its hook makers share one run's state as closures)
    """The forward hooks that give each reader of ``graph`` its own stream (module docstring), its offsets from
    ``offsets`` (``DenseOffsets`` or ``GroupedOffsets``), which the hooks feed each node's write as it comes."""
    readers = graph.readers
    reader_index = {name: j for j, (name, _, _) in enumerate(readers)}
    reader_at = torch.tensor(graph.order()[1])
    seen: dict[str, Tensor] = {}  # activations of this run the next write or reader needs

    def reader_inputs(resid: Tensor, names: list[str]) -> Tensor:
        """``x_r`` for the readers ``names``: ``[reader, batch, pos, d_model]``."""
        return resid[None] + offsets([reader_index[name] for name in names])

    def renormalize(step: int, norm):
        def hook_fn(activation: Tensor, hook) -> None:  # a stream norm's input: carry each reader's offset through
            first = int((reader_at <= step).sum())
            ahead = list(range(first, len(readers)))
            value = norm.normalize(activation[None] + offsets(ahead)) - norm.normalize(activation)[None]  # [ahead, ...]
            offsets.carry(first, value)

        return hook_fn

    def remember(key: str):
        return lambda activation, hook: seen.__setitem__(key, activation)

    def write(nodes):
        def hook_fn(activation: Tensor, hook) -> None:  # the writer's output: its nodes' writes are all known now
            seen[hook.name] = activation
            offsets.write(nodes.writes(seen.__getitem__))

        return hook_fn

    def projection(names: list[str], norm, weight: Tensor, bias: Tensor, key: str, pattern: str):
        def hook_fn(activation: Tensor, hook) -> Tensor:  # recomputed from each reader's own stream
            x = reader_inputs(seen[key], names)
            x = x if norm is None else norm.normalize(x)
            return einops.einsum(x, weight, pattern) + (0 if bias is None else bias)

        return hook_fn

    def head_projection(names: list[str], norm, weight: Tensor, bias: Tensor, key: str):
        """One projection per reader (``weight [reader, d_model, d_head]``): the readers reading the shared stream
        (``offsets.split``) through one norm and one matmul, the others each from its own."""

        def hook_fn(activation: Tensor, hook) -> Tensor:
            resid = seen[key]
            base, special, extra = offsets.split([reader_index[name] for name in names])
            shared = sorted(set(range(len(names))) - set(special))
            out = resid.new_empty(*resid.shape[:-1], len(names), weight.shape[-1])
            for chosen, x, pattern in (
                (shared, resid + base if base is not None else resid, "b p d, r d e -> b p r e"),
                (special, resid[None] + (extra if base is None else base[None] + extra), "r b p d, r d e -> b p r e"),
            ):
                if chosen:
                    x = x if norm is None else norm.normalize(x)
                    out[..., chosen, :] = einops.einsum(x, weight[chosen], pattern)
            return out + (0 if bias is None else bias)

        return hook_fn

    def mlp_input(name: list[str], norm, key: str):
        return lambda activation, hook: norm.normalize(reader_inputs(seen[key], name)[0])

    def first(hook_fn):
        return lambda activation, hook: hook_fn(activation, hook)[0]

    def rerun(name: list[str], block, key: str):
        def hook_fn(activation: Tensor, hook) -> Tensor:  # the part run again on its own stream; its hooks fire again
            return block.mlp_write_from(reader_inputs(seen[key], name)[0])

        return hook_fn

    hooks = [(graph.input_hook, lambda activation, hook: offsets.write(activation[None]))]
    steps = {id(payload): step for step, _, kind, payload in graph.timeline() if kind == "norm"}
    for layer, block in enumerate(graph.plan):
        attn, attn_norm = block.attn, block.attn_norm
        attn_key = block.reads_at["attn"]
        hooks.append((attn_key, remember(attn_key)))
        queries = [name for name in graph.block_readers(layer, "attn") if name.endswith(".q")]
        hooks.append((attn.hook_q.name, head_projection(queries, attn_norm, attn.W_Q, attn.b_Q, attn_key)))
        for x in ("k", "v"):
            names = [name for name in graph.block_readers(layer, "attn") if name.endswith(f".{x}")]
            weight, bias = attn.stored(f"W_{x.upper()}"), attn.stored(f"b_{x.upper()}")
            hooks.append((getattr(attn, f"hook_{x}").name, head_projection(names, attn_norm, weight, bias, attn_key)))
        for step in block.stream_norms:
            hooks.append((step.reads, renormalize(steps[id(step)], step.norm)))
        if block.cross is not None:  # its queries read this stream (its keys and values: the encoder's end)
            cross, cross_key = block.cross, block.reads_at["cross"]
            hooks.append((cross_key, remember(cross_key)))
            names = graph.block_readers(layer, "cross")
            hooks.append((cross.hook_q.name, head_projection(names, block.cross_norm, cross.W_Q, cross.b_Q, cross_key)))
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
        hooks.append((hook, head_projection(list(names), end.norm, weight, bias, final)))
    return hooks


__all__ = ["DenseOffsets", "GroupedOffsets", "mean_writes", "stream_hooks"]
