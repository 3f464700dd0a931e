"""The graph edge attribution runs on: which nodes write to the residual stream, which readers read it.

It asks each block's writers (``components.writers``), never the family's name:

- **Upstream nodes** (writers). The input (the stream entering block 0), then per block each
  writer split as exactly as its part allows:

  =====================================  ===============================  ====================
  the writer                             its nodes                        a node's write
  =====================================  ===============================  ====================
  attention (heads, no output norm)      ``L3H5`` per head                ``z_h W_O[h]``
  attention through an output norm       ``L3.attn``, the sublayer        ``hook_attn_out``
  (Gemma 2/3's ``ln1_post``)
  an MLP                                 ``MLP3``                         ``hook_mlp_out``
  a mixture of experts                   ``MLP3.E0``, ... (and            ``w_E expert_E(x)``
                                         ``MLP3.shared``)                 (routing weight)
  =====================================  ===============================  ====================

  A head's write under an output norm is not its share of the sublayer's (the norm's scale
  depends on every head), so there the sublayer is the node; likewise a mixture behind one.
  The writes of a writer's nodes sum to its output, exactly.
- **Readers.** Every query head's query input (``L3H5.q``), every key/value head's key and value
  inputs (``L3K1.k``, ``L3K1.v``: under grouped-query attention a key/value head is one reader
  shared by its query heads, nothing ungrouped), every MLP's input (``MLP3``), and the logits.
- **Edges**: a node to every reader after it in the stream. A sequential block's MLP reads its
  own block's attention; a parallel block's does not.
- **Stream norms** (a post-norm block's ``ln1``/``ln2``, which renormalize the stream itself):
  events of the stream too (``BlockPlan.events``, in forward order with the reads and writes).
  A write reaches a later reader through every stream norm between them, so an edge's score
  pulls the reader's gradient back through each of their Jacobians, and ``run_circuit`` carries
  each reader's own stream through them.

Refused with the reason: writers other than attention and MLPs, and encoder-decoders.
"""

from dataclasses import dataclass
from typing import Callable, Optional

import einops
import torch
from torch import Tensor, nn

from interp_transformer.components.writers import Writer

Reader = Callable[[str], Tensor]  # an activation by hook name


@dataclass(frozen=True)
class WriterNodes:
    """One writer's upstream nodes: ``writes(at)`` gives ``[node, batch, pos, d_model]`` from the activations
    at ``hooks``; ``output`` is the writer's output hook, which fires after all of them."""

    names: tuple[str, ...]
    side: str  # "attn" or "mlp": the sublayer the nodes belong to
    hooks: tuple[str, ...]
    output: str
    writes: Callable[[Reader], Tensor]


@dataclass(frozen=True)
class BlockPlan:
    """One block's attention and MLP parts, the norms their inputs pass (None: a part reads the stream as it is,
    as in a post-norm block), their nodes, and the block's steps in forward order (``events``)."""

    attn: nn.Module
    attn_norm: Optional[nn.Module]
    mlp: Optional[nn.Module]
    mlp_norm: Optional[nn.Module]
    sequential: bool  # the MLP reads the stream after this block's attention
    attn_nodes: WriterNodes
    mlp_nodes: Optional[WriterNodes]
    events: tuple  # ("read", "attn"|"mlp"), ("write", WriterNodes), ("norm", StreamNorm)

    def nodes(self) -> list[WriterNodes]:
        return [self.attn_nodes] + ([self.mlp_nodes] if self.mlp_nodes is not None else [])

    @property
    def stream_norms(self) -> list:
        return [payload for kind, payload in self.events if kind == "norm"]


@dataclass(frozen=True)
class Graph:
    """The plan per block, the upstream nodes and the readers as ``(name, layer, kind)``, and what each node reads.

    ``kind`` of a node is its side (``input``, ``attn``, ``mlp``); of a reader ``attn``, ``mlp`` or ``logits``.
    ``reads[node]`` are the readers through which the node reads the stream (a head's ``.q`` and its key/value
    head's ``.k``/``.v``; an MLP's or expert's input)."""

    plan: list[BlockPlan]
    upstream: list[tuple[str, int, str]]
    readers: list[tuple[str, int, str]]
    reads: dict[str, tuple[str, ...]]

    @property
    def has_stream_norms(self) -> bool:
        return any(block.stream_norms for block in self.plan)

    def timeline(self) -> list[tuple[int, int, str, object]]:
        """``(step, layer, kind, payload)`` of every block's events in forward order; step 1 is the input's write."""
        events = [(layer, kind, payload) for layer, block in enumerate(self.plan) for kind, payload in block.events]
        return [(step, layer, kind, payload) for step, (layer, kind, payload) in enumerate(events, start=2)]

    def order(self) -> tuple[list[int], list[int]]:
        """The step (``timeline``) of each upstream node's write and of each reader's read."""
        upstream_at, reader_at = [1] * len(self.upstream), [0] * len(self.readers)
        node_index = {name: i for i, (name, _, _) in enumerate(self.upstream)}
        reader_index = {name: j for j, (name, _, _) in enumerate(self.readers)}
        timeline = self.timeline()
        for step, layer, kind, payload in timeline:
            if kind == "write":
                for name in payload.names:
                    upstream_at[node_index[name]] = step
            elif kind == "read":
                for name in self.block_readers(layer, payload):
                    reader_at[reader_index[name]] = step
        reader_at[reader_index["logits"]] = timeline[-1][0] + 1
        return upstream_at, reader_at

    def stream_at_read(self, model, layer: int, side: str) -> str:
        """The hook holding the stream where block ``layer``'s attention or MLP reads it (before its own norm)."""
        block = self.plan[layer]
        if side == "attn" or not block.sequential:
            return model.act_name("resid_pre", layer)
        events = list(block.events)
        before = events[events.index(("read", "mlp")) - 1]
        return before[1].norm.hook_normalized.name if before[0] == "norm" else model.act_name("resid_mid", layer)

    def block_readers(self, layer: int, side: str) -> list[str]:
        """The readers of block ``layer``'s attention (``side="attn"``) or MLP, in the graph's order."""
        return [name for name, at, kind in self.readers if at == layer and kind == side]

    def edge_mask(self) -> Tensor:
        """``[upstream, reader]``: True where the node writes before the reader reads."""
        upstream_at, reader_at = self.order()
        return torch.tensor(upstream_at)[:, None] < torch.tensor(reader_at)[None, :]

    def write_hooks(self, model) -> list[str]:
        """Every hook the nodes' writes are computed from."""
        names = [model.act_name("resid_pre", 0)]
        for block in self.plan:
            for nodes in block.nodes():
                names += list(nodes.hooks)
        return list(dict.fromkeys(names))

    def writes(self, model, cache) -> Tensor:
        """Every node's write ``[upstream, batch, pos, d_model]`` from a run's activations."""
        rows = [cache[model.act_name("resid_pre", 0)][None]]  # the stream entering block 0: the input's write
        for block in self.plan:
            rows += [nodes.writes(cache.__getitem__) for nodes in block.nodes()]
        return torch.cat(rows)


def _heads(layer: int, units, output: str) -> WriterNodes:
    def writes(at: Reader) -> Tensor:
        return einops.rearrange(units.writes(at(units.hook)), "b p h d -> h b p d")

    n_heads = units.weight.shape[0]
    names = tuple(f"L{layer}H{h}" for h in range(n_heads))
    return WriterNodes(names, "attn", (units.hook,), output, writes)


def _whole(name: str, side: str, output: str) -> WriterNodes:
    return WriterNodes((name,), side, (output,), output, lambda at: at(output)[None])


def _experts(layer: int, part, output: str) -> WriterNodes:
    names = [f"MLP{layer}.E{e}" for e in range(part.n_experts)]
    names += [f"MLP{layer}.shared"] if part.shared_expert is not None else []
    return WriterNodes(tuple(names), "mlp", tuple(part.expert_hooks()), output, part.expert_writes)


def _writer_nodes(layer: int, writer) -> WriterNodes:
    side = "attn" if writer.sublayer == "attn" else "mlp"
    whole = f"L{layer}.attn" if side == "attn" else f"MLP{layer}"
    if writer.output_norm is not None:
        return _whole(whole, side, writer.output)
    if writer.routes_tokens:
        return _experts(layer, writer.part, writer.output)
    units = writer.units
    if side == "attn" and units is not None and units.kind == "head":
        return _heads(layer, units, writer.output)
    return _whole(whole, side, writer.output)


def _check(model) -> None:
    if model.has_cross_attention:
        raise ValueError("edge attribution runs on decoders; an encoder-decoder's cross-attention is not a graph here")
    for layer, block in enumerate(model.blocks):
        for writer in block.writers():
            if writer.sublayer not in ("attn", "mlp"):
                raise ValueError(
                    f"block {layer} has a {writer.sublayer!r} writer; edges are built for attention and MLPs"
                )
        norms = [step for step in block.stream() if not isinstance(step, Writer)]
        for step in norms:
            if step.reads is None:
                raise ValueError(
                    f"block {layer}'s stream norm {step.name!r} does not say which hook holds its input; edges "
                    "through it cannot be followed"
                )
        if norms and any(writer.routes_tokens for writer in block.writers()):
            raise ValueError(f"block {layer}: a mixture of experts behind a stream norm is not supported")


def _events(block, sequential: bool, mlp_nodes, attn_nodes) -> tuple:
    """The block's steps in forward order: reads before the part reading, writes, stream norms."""
    events = [("read", "attn")] + ([("read", "mlp")] if mlp_nodes is not None and not sequential else [])
    for step in block.stream():
        if not isinstance(step, Writer):
            events.append(("norm", step))
        elif step.sublayer == "attn":
            events.append(("write", attn_nodes))
        else:
            events += ([("read", "mlp")] if sequential else []) + [("write", mlp_nodes)]
    return tuple(events)


def build_graph(model) -> Graph:
    """The model's graph (module docstring), asking each block's writers."""
    _check(model)
    plan = []
    for layer, block in enumerate(model.blocks):
        attn_writer, mlp_writer = block.writer("attn"), block.writer("mlp")
        attn, mlp = attn_writer.part, getattr(mlp_writer, "part", None)
        readers = block.norm_readers() if hasattr(block, "norm_readers") else []  # post-norm: parts read the stream
        attn_norm = next((norm for norm, part in readers if part is attn), None)
        mlp_norm = next((norm for norm, part in readers if part is mlp), None) if mlp is not None else None
        sequential = model.act_name("resid_mid", layer) in model.hook_dict
        attn_nodes = _writer_nodes(layer, attn_writer)
        mlp_nodes = _writer_nodes(layer, mlp_writer) if mlp is not None else None
        events = _events(block, sequential, mlp_nodes, attn_nodes)
        plan.append(BlockPlan(attn, attn_norm, mlp, mlp_norm, sequential, attn_nodes, mlp_nodes, events))
    upstream, readers, reads = [("input", -1, "input")], [], {"input": ()}
    for layer, block in enumerate(plan):
        attn = block.attn
        queries = [f"L{layer}H{h}.q" for h in range(attn.n_heads)]
        groups = {x: [f"L{layer}K{g}.{x}" for g in range(attn.n_key_value_heads)] for x in ("k", "v")}
        readers += [(name, layer, "attn") for name in queries + groups["k"] + groups["v"]]
        per_group = attn.n_heads // attn.n_key_value_heads
        for nodes in block.nodes():
            upstream += [(name, layer, nodes.side) for name in nodes.names]
            for name in nodes.names:
                if nodes.side == "mlp":
                    reads[name] = (f"MLP{layer}",)
                elif name.endswith(".attn"):
                    reads[name] = tuple(queries + groups["k"] + groups["v"])
                else:
                    h = int(name.rsplit("H", 1)[1])
                    reads[name] = (queries[h], groups["k"][h // per_group], groups["v"][h // per_group])
        if block.mlp is not None:
            readers.append((f"MLP{layer}", layer, "mlp"))
    readers.append(("logits", len(plan), "logits"))
    return Graph(plan, upstream, readers, reads)


__all__ = ["BlockPlan", "Graph", "WriterNodes", "build_graph"]
