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

Refused with the reason: post-norm models (the stream is renormalized, so it is not a sum of
writes), writers other than attention and MLPs, and encoder-decoders.
"""

from dataclasses import dataclass
from typing import Callable, Optional

import einops
import torch
from torch import Tensor, nn

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
    """One block's attention and MLP parts, the norms their inputs pass, and their nodes."""

    attn: nn.Module
    attn_norm: nn.Module
    mlp: Optional[nn.Module]
    mlp_norm: Optional[nn.Module]
    sequential: bool  # the MLP reads the stream after this block's attention
    attn_nodes: WriterNodes
    mlp_nodes: Optional[WriterNodes]

    def nodes(self) -> list[WriterNodes]:
        return [self.attn_nodes] + ([self.mlp_nodes] if self.mlp_nodes is not None else [])


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

    def edge_mask(self) -> Tensor:
        """``[upstream, reader]``: True where the node writes before the reader reads."""
        mask = torch.zeros(len(self.upstream), len(self.readers), dtype=torch.bool)
        for i, (_, layer_u, side) in enumerate(self.upstream):
            for j, (_, layer_r, kind) in enumerate(self.readers):
                same_block = layer_u == layer_r and side == "attn" and kind == "mlp" and self.plan[layer_r].sequential
                mask[i, j] = layer_u < layer_r or same_block
        return mask

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
    if not model.capabilities.additive_residual:
        raise ValueError(
            f"edge attribution needs a residual stream that is a sum of writes: {model.capabilities.why_not_additive()}"
        )
    for layer, block in enumerate(model.blocks):
        for writer in block.writers():
            if writer.sublayer not in ("attn", "mlp"):
                raise ValueError(
                    f"block {layer} has a {writer.sublayer!r} writer; edges are built for attention and MLPs"
                )


def build_graph(model) -> Graph:
    """The model's graph (module docstring), asking each block's writers."""
    _check(model)
    plan = []
    for layer, block in enumerate(model.blocks):
        attn_writer, mlp_writer = block.writer("attn"), block.writer("mlp")
        attn, mlp = attn_writer.part, getattr(mlp_writer, "part", None)
        readers = block.norm_readers()
        attn_norm = next(norm for norm, part in readers if part is attn)
        mlp_norm = next((norm for norm, part in readers if part is mlp), None) if mlp is not None else None
        sequential = model.act_name("resid_mid", layer) in model.hook_dict
        mlp_nodes = _writer_nodes(layer, mlp_writer) if mlp is not None else None
        plan.append(BlockPlan(attn, attn_norm, mlp, mlp_norm, sequential, _writer_nodes(layer, attn_writer), mlp_nodes))
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
