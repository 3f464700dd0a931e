"""The graph edge attribution runs on: which nodes write to the residual stream, which readers read it.

It asks each block's writers (``components.writers``), never the family's name:

- **Upstream nodes** (writers). The input (the stream entering block 0), then per block each
  writer split as exactly as its part allows:

  =====================================  ===============================  ====================
  the writer                             its nodes                        a node's write
  =====================================  ===============================  ====================
  attention (heads, no output norm)      ``L3H5`` per head                ``z_h W_O[h]``
  cross-attention (heads)                ``L3C5`` per head                ``z_h W_O[h]``
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
  shared by its query heads, nothing ungrouped), every cross-attention head's query input
  (``L3C5.q``), every MLP's input (``MLP3``), and the readers at the stream's end (``end``): the
  logits. Where an MLP's input is reached (``BlockPlan.mlp_reads``, asked of its norm and part):

  =================  ========================================================================
  ``"norm"``         its norm's output hook (``hook_normalized``)
  ``"projections"``  no norm output to hook (no norm, or ``NoNorm``, the identity): its input
                     projections' hooks (``input_hooks()``: ``x W + b`` per ``input_weights()``)
  ``"part"``         neither (a mixture of experts reading the stream itself or through
                     ``NoNorm``): the part run again on its stream (``BlockPlan.mlp_write_from``)
  =================  ========================================================================
- **Edges**: a node to every reader after it in the stream. A sequential block's MLP reads its
  own block's attention; a parallel block's does not.
- **Stream norms** (a post-norm block's ``ln1``/``ln2``, which renormalize the stream itself):
  events of the stream too (``BlockPlan.events``, in forward order with the reads and writes).
  A write reaches a later reader through every stream norm between them, so an edge's score
  pulls the reader's gradient back through each of their Jacobians, and ``run_circuit`` carries
  each reader's own stream through them.

**An encoder-decoder** has two streams (``EncoderDecoderGraph``), each a ``Graph`` of its own
stack. The encoder's nodes and readers are named as above behind ``enc.`` (``enc.input``,
``enc.L0H1``, ``enc.L0K1.v``, ``enc.MLP0``); its readers at the end are every cross-attention
key/value head's key and value inputs (``L2CK1.k``, ``L2CK1.v``), which read the encoder's final
stream through its final norm. The decoder's stream holds the target's input, the self- and
cross-attention heads and the MLPs, read by their queries, keys, values and inputs and by the
logits. An encoder node reaches every encoder reader after it and every cross-attention key and
value; a decoder node every decoder reader after it; nothing goes from the decoder to the encoder.

Refused with the reason (``ValueError``): writers other than attention, cross-attention and MLPs; a
stream norm that does not say which hook holds its input, or has no hook on its output; cross-attention
in a parallel block.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import einops
import torch
from torch import Tensor, nn

from interp_transformer.parts.writers import Writer

Reader = Callable[[str], Tensor]  # an activation by hook name
SIDES = {"attn": "attn", "cross_attn": "cross", "mlp": "mlp"}  # a writer's sublayer -> the side its nodes are on
STREAM_AFTER = {"attn": "hook_resid_mid", "cross_attn": "hook_resid_mid_cross"}  # the block's hook after that write


@dataclass(frozen=True)
class WriterNodes:
    """One writer's upstream nodes: ``writes(at)`` gives ``[node, batch, pos, d_model]`` from the activations
    at ``hooks``; ``output`` is the writer's output hook, which fires after all of them."""

    names: tuple[str, ...]
    side: str  # "attn", "cross" or "mlp": the sublayer the nodes belong to
    hooks: tuple[str, ...]
    output: str
    writes: Callable[[Reader], Tensor]


@dataclass(frozen=True)
class BlockPlan:
    """One block's attention, cross-attention (None without) and MLP parts, the norms their inputs pass (None: a
    part reads the stream as it is, as in a post-norm block), their nodes, the block's steps in forward order
    (``events``) and the hook holding the stream where each part reads it, before its own norm (``reads_at``)."""

    attn: nn.Module
    attn_norm: nn.Module | None
    mlp: nn.Module | None
    mlp_norm: nn.Module | None
    sequential: bool  # the MLP reads the stream after this block's attention
    attn_nodes: WriterNodes
    mlp_nodes: WriterNodes | None
    events: tuple  # ("read", "attn"|"cross"|"mlp"), ("write", WriterNodes), ("norm", StreamNorm)
    reads_at: dict[str, str] = field(default_factory=dict)
    cross: nn.Module | None = None  # cross-attention: its queries read this stream, its keys and values another
    cross_norm: nn.Module | None = None
    cross_nodes: WriterNodes | None = None
    mlp_reads: str | None = None  # where the MLP's input is reached (module docstring); None without an MLP
    mlp_output_norm: nn.Module | None = None  # the norm the MLP's output passes before the stream (Gemma 2)

    def mlp_write_from(self, stream: Tensor) -> Tensor:
        """What the MLP adds to the stream when it reads ``stream`` (the stream before its own norm): the part run
        again, its norms recomputed (its own hooks fire again)."""
        x = stream if self.mlp_norm is None else self.mlp_norm.normalize(stream)
        out = self.mlp(x)
        return out if self.mlp_output_norm is None else self.mlp_output_norm.normalize(out)

    def nodes(self) -> list[WriterNodes]:
        """The writers' nodes in forward order."""
        return [nodes for nodes in (self.attn_nodes, self.cross_nodes, self.mlp_nodes) if nodes is not None]

    @property
    def stream_norms(self) -> list:
        return [payload for kind, payload in self.events if kind == "norm"]


@dataclass(frozen=True)
class End:
    """The readers at the end of a stream. Without ``projections``: the logits (``names = ("logits",)``), whose
    gradient is taken at the final stream itself. With them: ``norm`` applied to the final stream, then each
    ``(hook, W [group, d_model, d_head], b, names)`` read by one reader per group (a cross-attention's keys or
    values of the encoder's output)."""

    names: tuple[str, ...]
    norm: nn.Module | None = None
    projections: tuple = ()


LOGITS = End(("logits",))


@dataclass(frozen=True)
class Graph:
    """One stream's plan per block, its upstream nodes and readers as ``(name, layer, kind)``, and what each node
    reads; ``input_hook`` holds the stream entering block 0 (the input's write), ``final_hook`` the stream after the
    last block, which the readers at the end (``end``) read.

    ``kind`` of a node is its side (``input``, ``attn``, ``cross``, ``mlp``); of a reader ``attn``, ``cross``,
    ``mlp`` or ``end``. ``reads[node]`` are the readers through which the node reads a stream (a head's ``.q`` and
    its key/value head's ``.k``/``.v``; an MLP's or expert's input)."""

    plan: list[BlockPlan]
    upstream: list[tuple[str, int, str]]
    readers: list[tuple[str, int, str]]
    reads: dict[str, tuple[str, ...]]
    input_hook: str
    final_hook: str
    end: End = LOGITS

    @property
    def streams(self) -> tuple["Graph", ...]:
        return (self,)

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
        for name in self.end.names:
            reader_at[reader_index[name]] = timeline[-1][0] + 1
        return upstream_at, reader_at

    def stream_at_read(self, model, layer: int, side: str) -> str:
        """The hook holding the stream where block ``layer``'s attention, cross-attention or MLP reads it (before
        its own norm); the plan knows it, ``model`` is not read."""
        return self.plan[layer].reads_at[side]

    def block_readers(self, layer: int, side: str) -> list[str]:
        """The readers of block ``layer``'s attention (``side="attn"``), cross-attention or MLP, in order."""
        return [name for name, at, kind in self.readers if at == layer and kind == side]

    def edge_mask(self) -> Tensor:
        """``[upstream, reader]``: True where the node writes before the reader reads."""
        upstream_at, reader_at = self.order()
        return torch.tensor(upstream_at)[:, None] < torch.tensor(reader_at)[None, :]

    def write_hooks(self) -> list[str]:
        """Every hook the nodes' writes are computed from."""
        names = [self.input_hook]
        for block in self.plan:
            for nodes in block.nodes():
                names += list(nodes.hooks)
        return list(dict.fromkeys(names))

    def writes(self, cache) -> Tensor:
        """Every node's write ``[upstream, batch, pos, d_model]`` from a run's activations."""
        rows = [cache[self.input_hook][None]]  # the stream entering block 0: the input's write
        for block in self.plan:
            rows += [nodes.writes(cache.__getitem__) for nodes in block.nodes()]
        return torch.cat(rows)

    def writer_groups(self) -> list[tuple[str, slice]]:
        """``(output hook, slice of upstream nodes)`` per writer, the input first."""
        groups, start = [(self.input_hook, slice(0, 1))], 1
        for block in self.plan:
            for nodes in block.nodes():
                groups.append((nodes.output, slice(start, start + len(nodes.names))))
                start += len(nodes.names)
        return groups


@dataclass(frozen=True)
class EncoderDecoderGraph:
    """An encoder-decoder's two streams (module docstring): upstream nodes and readers are the encoder's, then the
    decoder's; an edge joins a node only to readers of its own stream."""

    encoder: Graph
    decoder: Graph

    @property
    def streams(self) -> tuple[Graph, Graph]:
        return (self.encoder, self.decoder)

    @property
    def upstream(self) -> list[tuple[str, int, str]]:
        return self.encoder.upstream + self.decoder.upstream

    @property
    def readers(self) -> list[tuple[str, int, str]]:
        return self.encoder.readers + self.decoder.readers

    @property
    def reads(self) -> dict[str, tuple[str, ...]]:
        return {**self.encoder.reads, **self.decoder.reads}

    @property
    def has_stream_norms(self) -> bool:
        return self.encoder.has_stream_norms or self.decoder.has_stream_norms

    def edge_mask(self) -> Tensor:
        """``[upstream, reader]``: each stream's mask on the diagonal, False between the streams."""
        return torch.block_diag(self.encoder.edge_mask(), self.decoder.edge_mask())


def _heads(name: str, units, side: str, output: str) -> WriterNodes:
    def writes(at: Reader) -> Tensor:
        return einops.rearrange(units.writes(at(units.hook)), "b p h d -> h b p d")

    names = tuple(f"{name}{units.letter}{h}" for h in range(units.weight.shape[0]))
    return WriterNodes(names, side, (units.hook,), output, writes)


def _whole(name: str, side: str, output: str) -> WriterNodes:
    return WriterNodes((name,), side, (output,), output, lambda at: at(output)[None])


def _experts(name: str, part, output: str) -> WriterNodes:
    names = [f"{name}.E{e}" for e in range(part.n_experts)]
    names += [f"{name}.shared"] if part.shared_expert is not None else []
    return WriterNodes(tuple(names), "mlp", tuple(part.expert_hooks()), output, part.expert_writes)


def _writer_nodes(prefix: str, layer: int, writer) -> WriterNodes:
    side = SIDES[writer.sublayer]
    whole = f"{prefix}MLP{layer}" if side == "mlp" else f"{prefix}L{layer}.{writer.sublayer}"
    if writer.output_norm is not None:
        return _whole(whole, side, writer.output)
    if writer.routes_tokens:
        return _experts(whole, writer.part, writer.output)
    units = writer.units
    if side != "mlp" and units is not None and units.kind == "head":
        return _heads(f"{prefix}L{layer}", units, side, writer.output)
    return _whole(whole, side, writer.output)


def _check(blocks, stack: str) -> None:
    for layer, block in enumerate(blocks):
        for writer in block.writers():
            if writer.sublayer not in SIDES or (writer.sublayer == "cross_attn") != writer.reads_source:
                raise ValueError(
                    f"{stack} block {layer} has a {writer.sublayer!r} writer; edges are built for attention, "
                    "cross-attention and MLPs"
                )
        norms = [step for step in block.stream() if not isinstance(step, Writer)]
        for step in norms:
            if step.reads is None:
                raise ValueError(
                    f"{stack} block {layer}'s stream norm {step.name!r} does not say which hook holds its input; "
                    "edges through it cannot be followed"
                )
            if getattr(step.norm, "hook_normalized", None) is None:
                raise ValueError(
                    f"{stack} block {layer}'s stream norm {step.name!r} ({type(step.norm).__name__}) has no "
                    "hook_normalized holding its output; the parts after it read a stream no hook holds"
                )
        if block.writer("cross_attn") is not None and not hasattr(block, STREAM_AFTER["attn"]):
            raise ValueError(f"{stack} block {layer}: cross-attention in a parallel block is not supported")


def _events(block, sequential: bool, nodes: dict[str, WriterNodes]) -> tuple[tuple, dict[str, str]]:
    """The block's steps in forward order (reads before the part reading, writes, stream norms), and the hook
    holding the stream where each part reads it."""
    stream = block.hook_resid_pre.name  # the hook holding the stream as it is at each step
    events, reads_at = [("read", "attn")], {"attn": stream}
    if "mlp" in nodes and not sequential:
        events.append(("read", "mlp"))
        reads_at["mlp"] = stream
    for step in block.stream():
        if not isinstance(step, Writer):
            events.append(("norm", step))
            stream = step.norm.hook_normalized.name
            continue
        side = SIDES[step.sublayer]
        if side != "attn" and sequential:
            events.append(("read", side))
            reads_at[side] = stream
        events.append(("write", nodes[side]))
        after = getattr(block, STREAM_AFTER.get(step.sublayer, ""), None)
        stream = None if after is None else after.name
    return tuple(events), reads_at


def _mlp_reads(norm: nn.Module | None, part: nn.Module) -> str:
    """Where an MLP's input is reached (module docstring): asked of its norm's hooks and its part's."""
    if getattr(norm, "hook_normalized", None) is not None:
        return "norm"
    return "projections" if callable(getattr(part, "input_hooks", None)) else "part"


def _plan(prefix: str, layer: int, block) -> BlockPlan:
    writers = {SIDES[writer.sublayer]: writer for writer in block.writers()}
    parts = {side: writer.part for side, writer in writers.items()}
    readers = block.norm_readers() if hasattr(block, "norm_readers") else []  # post-norm: parts read the stream
    norms = {side: next((norm for norm, read in readers if read is part), None) for side, part in parts.items()}
    nodes = {side: _writer_nodes(prefix, layer, writer) for side, writer in writers.items()}
    sequential = hasattr(block, STREAM_AFTER["attn"])
    events, reads_at = _events(block, sequential, nodes)
    mlp_reads = _mlp_reads(norms["mlp"], parts["mlp"]) if "mlp" in parts else None
    return BlockPlan(
        parts["attn"], norms["attn"], parts.get("mlp"), norms.get("mlp"), sequential, nodes["attn"],
        nodes.get("mlp"), events, reads_at, parts.get("cross"), norms.get("cross"), nodes.get("cross"),
        mlp_reads, writers["mlp"].output_norm if "mlp" in writers else None,
    )  # fmt: skip


def _attention_readers(prefix: str, layer: int, attn, letter: str) -> tuple[list[str], dict[str, list[str]]]:
    """The query readers (one per head) and key/value readers (one per key/value head) of an attention part."""
    queries = [f"{prefix}L{layer}{letter}{h}.q" for h in range(attn.n_heads)]
    kv = "K" if letter == "H" else f"{letter}K"
    groups = {x: [f"{prefix}L{layer}{kv}{g}.{x}" for g in range(attn.n_key_value_heads)] for x in ("k", "v")}
    return queries, groups


def _stack_graph(blocks, prefix: str, stack: str, final_hook: str, end: End) -> Graph:
    """The graph of one stack of blocks (module docstring), its nodes and readers named behind ``prefix``."""
    _check(blocks, stack)
    plan = [_plan(prefix, layer, block) for layer, block in enumerate(blocks)]
    upstream, readers, reads = [(f"{prefix}input", -1, "input")], [], {f"{prefix}input": ()}
    for layer, block in enumerate(plan):
        queries, groups = _attention_readers(prefix, layer, block.attn, "H")
        readers += [(name, layer, "attn") for name in queries + groups["k"] + groups["v"]]
        reading = {"attn": (queries, groups, block.attn.n_heads // block.attn.n_key_value_heads)}
        if block.cross is not None:
            cross_queries, cross_groups = _attention_readers("", layer, block.cross, "C")  # keys: another stream's
            readers += [(f"{prefix}{name}", layer, "cross") for name in cross_queries]
            per_group = block.cross.n_heads // block.cross.n_key_value_heads
            reading["cross"] = ([prefix + name for name in cross_queries], cross_groups, per_group)
        for nodes in block.nodes():
            upstream += [(name, layer, nodes.side) for name in nodes.names]
            for h, name in enumerate(nodes.names):
                if nodes.side == "mlp":
                    reads[name] = (f"{prefix}MLP{layer}",)
                    continue
                queries, groups, per_group = reading[nodes.side]
                if nodes.hooks == (nodes.output,):  # the whole sublayer (under an output norm)
                    reads[name] = tuple(queries + groups["k"] + groups["v"])
                else:
                    reads[name] = (queries[h], groups["k"][h // per_group], groups["v"][h // per_group])
        if block.mlp is not None:
            readers.append((f"{prefix}MLP{layer}", layer, "mlp"))
    readers += [(name, len(plan), "end") for name in end.names]
    return Graph(plan, upstream, readers, reads, blocks[0].hook_resid_pre.name, final_hook, end)


def _cross_keys_and_values(decoder: Graph, ln_final: nn.Module) -> End:
    """The encoder stream's readers at its end: each cross-attention key/value head's key and value inputs."""
    projections, names = [], []
    for layer, block in enumerate(decoder.plan):
        if block.cross is None:
            continue
        _, groups = _attention_readers("", layer, block.cross, "C")
        for x in ("k", "v"):
            weight, bias = block.cross.stored(f"W_{x.upper()}"), block.cross.stored(f"b_{x.upper()}")
            projections.append((getattr(block.cross, f"hook_{x}").name, weight, bias, tuple(groups[x])))
            names += groups[x]
    return End(tuple(names), ln_final, tuple(projections))


def build_graph(model):
    """The model's graph (module docstring), asking each block's writers: a ``Graph``, or an encoder-decoder's
    ``EncoderDecoderGraph``."""
    if not model.writers_that("reads_source"):
        final = model.hook_names.final_residual_name(model.cfg.n_layers)
        return _stack_graph(list(model.blocks), "", "the model's", final, LOGITS)
    decoder_blocks, encoder_blocks = list(model.decoder.blocks), list(model.encoder.blocks)
    final = model.hook_names.final_residual_name(len(decoder_blocks))
    decoder = _stack_graph(decoder_blocks, "", "decoder", final, LOGITS)
    last = encoder_blocks[-1]  # its output: after its own stream norm in a post-norm stack
    encoder_final = getattr(last, "hook_normalized_resid_post", last.hook_resid_post).name
    end = _cross_keys_and_values(decoder, model.encoder.ln_final)
    return EncoderDecoderGraph(_stack_graph(encoder_blocks, "enc.", "encoder", encoder_final, end), decoder)


__all__ = ["BlockPlan", "EncoderDecoderGraph", "End", "Graph", "WriterNodes", "build_graph"]
