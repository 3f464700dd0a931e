"""Neuronpedia's graph JSON (what circuit-tracer's ``create_graph_files`` writes): export a pruned graph, read one back.

The file is one object::

    {"metadata": {"slug", "scan", "transcoder_list", "prompt_tokens", "prompt", "node_threshold"},
     "qParams": {"pinnedIds", "supernodes", "linkType", "clickedId", "sg_pos"},
     "nodes": [...], "links": [{"source": node_id, "target": node_id, "weight": float}, ...]}

Each node has ``node_id``, ``feature``, ``layer`` (a string), ``ctx_idx`` (its position), ``feature_type``,
``token_prob``, ``is_target_logit``, ``run_idx``, ``reverse_ctx_idx``, ``jsNodeId``, ``clerp``, ``influence``
and ``activation``:

================================  ==================  ================  =========================
``feature_type``                  ``node_id``         ``layer``         ``feature``
================================  ==================  ================  =========================
``"cross layer transcoder"``      ``L_f_p``           ``"L"``           ``f`` (+ ``offset * L``)
``"mlp reconstruction error"``    ``0_L_p``           ``"L"``           -1
``"embedding"``                   ``E_v_p``           ``"E"``           ``p``
``"logit"``                       ``{n_layers+1}_v_p`` ``"n_layers+1"``  ``v`` (the token id)
================================  ==================  ================  =========================

A node's ``influence`` is its cumulative influence score (``prune_graph``), a feature's ``activation`` its
activation. Exported are the nodes pruning keeps and the edges between them that pruning keeps; a node
whose edges are all pruned is left out, tokens and logits excepted (as circuit-tracer does).

``to_neuronpedia(graph)`` builds the object, ``NeuronpediaGraph.from_dict`` reads one (checking its
layout), and ``to_dict``/``to_json`` give it back unchanged: reading and writing round-trip exactly.
``adjacency()`` rebuilds the ``[target, source]`` matrix of the exported edges. Where circuit-tracer's ids would
collide (error node ``0_L_p`` beside layer 0's feature ``L`` at position ``p``), the error node is ``err_L_p``.
"""

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from interp_transformer.core.files import atomic_write_text, read_json_object

from .graph import AttributionGraph
from .pruning import prune_graph

NODE_FIELDS = (
    "node_id",
    "feature",
    "layer",
    "ctx_idx",
    "feature_type",
    "token_prob",
    "is_target_logit",
    "run_idx",
    "reverse_ctx_idx",
    "jsNodeId",
    "clerp",
    "influence",
    "activation",
)
FEATURE_TYPES = ("cross layer transcoder", "mlp reconstruction error", "embedding", "logit")
METADATA_FIELDS = ("slug", "scan", "transcoder_list", "prompt_tokens", "prompt", "node_threshold")
Q_PARAMS = {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""}

# what each field of a node, a link and the metadata holds (``_check_fields``): a type, or "finite" for a finite
# number (an int or a float, not a bool), "finite or null", "node id" for a str naming a node, "strs" for a list
# of str; "str or null" where circuit-tracer may write null
NODE_TYPES = {
    "node_id": str,
    "feature": "int or null",
    "layer": str,
    "ctx_idx": int,
    "feature_type": str,
    "token_prob": "finite",
    "is_target_logit": bool,
    "run_idx": int,
    "reverse_ctx_idx": int,
    "jsNodeId": str,
    "clerp": "str or null",
    "influence": "finite or null",
    "activation": "finite or null",
}
LINK_TYPES = {"source": "node id", "target": "node id", "weight": "finite"}
METADATA_TYPES = {
    "slug": str,
    "scan": "str or null",
    "transcoder_list": list,
    "prompt_tokens": "strs",
    "prompt": "str or null",
    "node_threshold": "finite or null",
}


def _check_fields(record: Mapping[str, Any], types: Mapping[str, Any], name: str) -> None:
    """Each field of ``record`` (a node, a link or the metadata, called ``name`` in errors) of its type in ``types``:
    ``TypeError`` for another type, ``ValueError`` for a NaN or infinite number."""
    for field, kind in types.items():
        value = record[field]
        if value is None and isinstance(kind, str) and kind.endswith("or null"):
            continue
        if kind in ("finite", "finite or null"):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name}: {field} must be a finite number, got {type(value).__name__} {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"{name}: {field} must be a finite number, got {value}")
            continue
        if kind == "node id":
            if not isinstance(value, str):
                raise TypeError(f"{name}: {field} must be a node id (a str), got {type(value).__name__} {value!r}")
            continue
        if kind == "strs":
            if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
                raise TypeError(f"{name}: {field} must be a list of str, got {value!r}")
            continue
        expected = {"int or null": int, "str or null": str}.get(kind, kind)
        wrong = not isinstance(value, expected) or (expected is int and isinstance(value, bool))
        if wrong:
            described = {int: "an int", str: "a str", bool: "a bool", list: "a list"}[expected]
            raise TypeError(f"{name}: {field} must be {described}, got {type(value).__name__} {value!r}")


def _node(node_id: str, feature: int, layer: str, pos: int, kind: str, js: str, **fields) -> dict[str, Any]:
    node = {
        "node_id": node_id,
        "feature": feature,
        "layer": layer,
        "ctx_idx": pos,
        "feature_type": kind,
        "token_prob": 0.0,
        "is_target_logit": False,
        "run_idx": 0,
        "reverse_ctx_idx": 0,
        "jsNodeId": js,
        "clerp": "",
        "influence": None,
        "activation": None,
    }
    node.update(fields)
    return node


def _graph_node(graph: AttributionGraph, index: int, influence: float, offset: int) -> dict[str, Any]:
    kind = graph.kind(index)
    layer, pos = graph.layer_and_pos(index)
    if kind == "feature":
        feature = int(graph.active_features[index, 2])
        return _node(
            f"{layer}_{feature}_{pos}",
            feature + offset * layer,
            str(layer),
            pos,
            FEATURE_TYPES[0],
            f"{layer}_{feature}-0",
            influence=influence,
            activation=float(graph.activation_values[index]),
        )
    if kind == "error":
        return _node(f"0_{layer}_{pos}", -1, str(layer), pos, FEATURE_TYPES[1], f"{layer}_{pos}-0", influence=influence)
    if kind == "token":
        vocab = int(graph.tokens[pos])
        return _node(f"E_{vocab}_{pos}", pos, "E", pos, FEATURE_TYPES[2], f"E_{vocab}-{pos}", influence=influence)
    rank = index - graph.logits.start
    vocab, prob = int(graph.logit_tokens[rank]), float(graph.logit_probabilities[rank])
    text = graph.logit_str_tokens[rank] if graph.logit_str_tokens else str(vocab)
    return _node(
        f"{graph.n_layers + 1}_{vocab}_{pos}",
        vocab,
        str(graph.n_layers + 1),
        pos,
        FEATURE_TYPES[3],
        f"L_{vocab}-{pos}",
        token_prob=prob,
        is_target_logit=rank == 0,
        clerp=f'Output "{text}" (p={prob:.3f})',
    )


def _check_layout(data: Any) -> None:
    """The graph's four parts, with their types, and its metadata's fields."""
    if not isinstance(data, Mapping):
        raise TypeError(f"a Neuronpedia graph is a JSON object, got {type(data).__name__}")
    missing = [key for key in ("metadata", "qParams", "nodes", "links") if key not in data]
    if missing:
        raise ValueError(f"a Neuronpedia graph needs metadata, qParams, nodes and links; missing {missing}")
    for key in ("metadata", "qParams"):
        if not isinstance(data[key], Mapping):
            raise TypeError(f"a Neuronpedia graph's {key!r} must be an object, got {type(data[key]).__name__}")
    for key in ("nodes", "links"):
        if not isinstance(data[key], list):
            raise TypeError(f"a Neuronpedia graph's {key!r} must be a list of objects, got {type(data[key]).__name__}")
    absent = [key for key in METADATA_FIELDS if key not in data["metadata"]]
    if absent:
        raise ValueError(f"the graph's metadata lacks {absent} (expected {list(METADATA_FIELDS)})")
    _check_fields(data["metadata"], METADATA_TYPES, "metadata")


def _check_nodes(nodes: list) -> set:
    """Each node's fields and feature type; returns the node ids, each seen once."""
    ids = set()
    for index, node in enumerate(nodes):
        if not isinstance(node, Mapping):
            raise TypeError(f"node {index} must be an object, got {type(node).__name__}")
        name = f"node {index} ({node.get('node_id')!r})"
        lacking = [key for key in NODE_FIELDS if key not in node]
        if lacking:
            raise ValueError(f"{name} lacks {lacking} (expected {list(NODE_FIELDS)})")
        _check_fields(node, NODE_TYPES, name)
        if node["feature_type"] not in FEATURE_TYPES:
            raise ValueError(f"{name} has feature_type {node['feature_type']!r}; expected one of {list(FEATURE_TYPES)}")
        if node["node_id"] in ids:
            raise ValueError(f"node id {node['node_id']!r} appears twice: links could not say which is meant")
        ids.add(node["node_id"])
    return ids


def _check_links(links: list, ids: set) -> None:
    """Each link's fields, and both its ends among the node ids."""
    for index, link in enumerate(links):
        if not isinstance(link, Mapping):
            raise TypeError(f"link {index} must be an object, got {type(link).__name__}")
        if set(link) != {"source", "target", "weight"}:
            raise ValueError(f"link {index} must hold source, target and weight; got {sorted(link)}")
        name = f"link {index} ({link['source']!r} -> {link['target']!r})"
        _check_fields(link, LINK_TYPES, name)
        unknown = [end for end in (link["source"], link["target"]) if end not in ids]
        if unknown:
            raise ValueError(f"{name} names nodes not in the graph: {unknown}")


@dataclass
class NeuronpediaGraph:
    """A graph in Neuronpedia's JSON layout (module docstring): plain dicts and lists, as in the file."""

    metadata: dict[str, Any]
    q_params: dict[str, Any]
    nodes: list[dict[str, Any]]
    links: list[dict[str, Any]]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "NeuronpediaGraph":
        """Read the object of a graph file, checking its layout and every field's type (``_check_fields``): a missing
        part raises ``ValueError``, a field of the wrong type ``TypeError`` and a NaN or infinite number (a link
        weight, a node's influence, activation or probability) ``ValueError``, each naming the field and the node or
        link by its index in the file."""
        _check_layout(data)
        _check_links(data["links"], _check_nodes(data["nodes"]))
        copy = json.loads(json.dumps(dict(data)))  # plain, private copies
        return cls(copy["metadata"], copy["qParams"], copy["nodes"], copy["links"])

    def to_dict(self) -> dict[str, Any]:
        return {"metadata": self.metadata, "qParams": self.q_params, "nodes": self.nodes, "links": self.links}

    def to_json(self) -> str:
        """The file's text (floats written exactly: ``json`` writes the shortest repr that reads back the same)."""
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "NeuronpediaGraph":
        return cls.from_dict(json.loads(text))

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        atomic_write_text(path, self.to_json())
        return path

    @classmethod
    def load(cls, path: str | Path) -> "NeuronpediaGraph":
        return cls.from_dict(read_json_object(Path(path), "a Neuronpedia graph (a JSON object)"))

    def node_ids(self) -> list[str]:
        return [node["node_id"] for node in self.nodes]

    def adjacency(self) -> Tensor:
        """``[target, source]`` over ``nodes`` in file order: each link's weight (float64), 0 where there is none."""
        index = {node_id: i for i, node_id in enumerate(self.node_ids())}
        matrix = torch.zeros(len(self.nodes), len(self.nodes), dtype=torch.float64)
        for link in self.links:
            matrix[index[link["target"]], index[link["source"]]] = link["weight"]
        return matrix


def to_neuronpedia(
    graph: AttributionGraph,
    *,
    slug: str = "graph",
    scan: str | None = None,
    node_threshold: float = 0.8,
    edge_threshold: float = 0.98,
    transcoder_list: Sequence[str] = (),
    num_features: int | None = None,
) -> NeuronpediaGraph:
    """``graph``, pruned (``prune_graph``), in Neuronpedia's layout. ``num_features`` (a transcoder's width) makes a
    feature's ``feature`` field ``f + 10^ceil(log10(num_features)) * layer``, as for a preset scan; else ``f``.

    Circuit-tracer's ids can collide: error node ``0_L_p`` and layer 0's feature ``L`` at position ``p``. Where both
    are kept, the error node is written as ``err_L_p`` instead, so that every link names one node.
    """
    pruned = prune_graph(graph, node_threshold, edge_threshold)
    offset = 10 ** math.ceil(math.log10(num_features)) if num_features else 0
    kept = pruned.node_mask.nonzero().flatten().tolist()
    nodes = {i: _graph_node(graph, i, float(pruned.cumulative_scores[i]), offset) for i in kept}
    feature_ids = {node["node_id"] for node in nodes.values() if node["feature_type"] == FEATURE_TYPES[0]}
    for node in nodes.values():  # circuit-tracer would write one id twice: the error node takes another
        if node["feature_type"] == FEATURE_TYPES[1] and node["node_id"] in feature_ids:
            node["node_id"] = f"err_{node['layer']}_{node['ctx_idx']}"
    targets, sources = pruned.edge_mask.nonzero(as_tuple=True)
    weights = graph.adjacency_matrix[targets, sources].tolist()
    links = [
        {"source": nodes[s]["node_id"], "target": nodes[t]["node_id"], "weight": w}
        for t, s, w in zip(targets.tolist(), sources.tolist(), weights)
        if s in nodes and t in nodes
    ]
    linked = {end for link in links for end in (link["source"], link["target"])}
    used = [node for node in nodes.values() if node["node_id"] in linked or node["feature_type"] in FEATURE_TYPES[2:]]
    prompt_tokens = graph.str_tokens or [str(int(t)) for t in graph.tokens]
    metadata = {
        "slug": slug,
        "scan": scan or graph.scan or "custom",
        "transcoder_list": list(transcoder_list),
        "prompt_tokens": list(prompt_tokens),
        "prompt": graph.prompt,
        "node_threshold": node_threshold,
    }
    return NeuronpediaGraph(metadata, json.loads(json.dumps(Q_PARAMS)), used, links)


__all__ = ["FEATURE_TYPES", "NODE_FIELDS", "NeuronpediaGraph", "to_neuronpedia"]
