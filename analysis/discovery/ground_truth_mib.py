"""Edge scores written in MIB's submission format (the circuit localization track), one folder per task and model.

MIB (Mueller et al., 2025) takes, per method, a folder per ``<task>_<model>`` (e.g. ``ioi_gpt2``) holding
either one file of importance scores or nine circuits; we write the first kind, as EAP-IG's
``Graph.to_json`` writes it::

    <out>/<method>/<task>_<model>/importances.json
    {"cfg": {"n_layers": .., "n_heads": .., "parallel_attn_mlp": false, "d_model": .., ...},
     "nodes": {"input": {"in_graph": true}, "a0.h1": {...}, "m0": {...}, "logits": {...}},
     "edges": {"input->a0.h1<v>": {"score": 0.12, "in_graph": true}, "a0.h1->m0": {...}, ...}}

Names follow MIB's graph: the input ``input``, head ``h`` of layer ``l`` ``a{l}.h{h}``, the MLP
``m{l}``, the logits ``logits``; an edge into a head's query, key or value input ends in ``<q>``,
``<k>``, ``<v>``. ``score`` is the mean signed score over prompts. ``in_graph`` marks the ``k``
strongest edges, ``k`` the known circuit's size (MIB's evaluation re-selects circuits from the
scores; the flags only say what this method would call the circuit), and the nodes they touch.

Two parts of our graphs MIB's has no name for, written as extensions (MIB's loader, built for
TransformerLens models, does not read them): a mixture's expert ``e`` as ``m{l}.e{e}``, and under
grouped-query attention a key/value head ``g`` shared by several query heads as ``a{l}.kv{g}``
(``<k>``/``<v>``); ``cfg`` then holds ``n_key_value_heads`` and ``n_experts``. Without grouping, key/value
head ``g`` is head ``g`` (``a{l}.h{g}<k>``), exactly MIB's edge.
"""

import json
from pathlib import Path

import torch

from .edges import EdgeScores
from .ground_truth_types import GroundTruth
from .selection import top_edges


def _node(name: str) -> str:
    """Our upstream node's MIB name (module docstring)."""
    if name == "input":
        return name
    if name.startswith("MLP"):
        layer, _, expert = name[3:].partition(".")
        return f"m{layer}" + (f".e{expert[1:]}" if expert else "")
    layer, _, head = name[1:].partition("H")
    return f"a{layer}.h{head}"


def _reader(name: str, grouped: bool) -> tuple[str, str]:
    """Our reader's MIB node and its ``<q>``/``<k>``/``<v>`` suffix ("" for an MLP and the logits)."""
    if name == "logits" or name.startswith("MLP"):
        return (name if name == "logits" else f"m{name[3:]}"), ""
    unit, _, qkv = name.partition(".")
    if "K" in unit:
        layer, _, group = unit[1:].partition("K")
        return (f"a{layer}.kv{group}" if grouped else f"a{layer}.h{group}"), f"<{qkv}>"
    layer, _, head = unit[1:].partition("H")
    return f"a{layer}.h{head}", f"<{qkv}>"


def mib_graph(gt: GroundTruth, scores: EdgeScores) -> dict:
    """``scores`` on ``gt``'s model as MIB's importance-score JSON (module docstring)."""
    cfg = gt.model.cfg
    n_kv = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
    experts = getattr(cfg, "experts", None)
    grouped = n_kv != cfg.n_heads
    kept = top_edges(scores, int(gt.known().sum()))
    mean = scores.mean
    edges, touched = {}, set()
    for i, j in scores.edge.nonzero().tolist():
        parent = _node(scores.upstream[i])
        child, qkv = _reader(scores.readers[j], grouped)
        in_graph = bool(kept[i, j])
        edges[f"{parent}->{child}{qkv}"] = {"score": float(mean[i, j]), "in_graph": in_graph}
        if in_graph:
            touched |= {parent, child}
    nodes = {_node(name): {"in_graph": _node(name) in touched} for name in scores.upstream}
    nodes["logits"] = {"in_graph": "logits" in touched}
    header = {"n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "parallel_attn_mlp": False, "d_model": cfg.d_model}
    if grouped:
        header["n_key_value_heads"] = n_kv
    if experts is not None:
        header["n_experts"] = experts.n_experts
    return {"cfg": header, "nodes": nodes, "edges": edges}


def write_mib(directory: str | Path, method: str, gt: GroundTruth, scores: EdgeScores) -> Path:
    """Writes ``<directory>/<method>/<task>_<model>/importances.json`` (module docstring); returns its path."""
    folder = Path(directory) / method / f"{gt.task}_{gt.name}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "importances.json"
    with torch.no_grad():
        path.write_text(json.dumps(mib_graph(gt, scores), indent=1), encoding="utf-8")
    return path


__all__ = ["mib_graph", "write_mib"]
