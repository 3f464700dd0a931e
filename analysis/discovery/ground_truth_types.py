"""Models whose circuits are known by construction, to score discovery methods against.

Each ``GroundTruth`` is a small decoder built with ``interp_transformer.builder.build_decoder``
whose circuit weights are written by hand (``ground_truth_models``), every other part left at
its seeded random weights (the background: nodes with small, real effects that a method must
rank below the circuit). It carries its task (clean and corrupted prompts, a logit-difference
metric) and its known circuit as edges named as ``EdgeScores`` names them: ``(upstream,
reader)``, e.g. ``("L0H0", "L1K0.k")``, the previous-token head feeding the induction head's keys.

The known circuit is what ablation says, for this task's corruption: running the model with
only those edges clean (``run_circuit``) keeps the behaviour, and ablating any one of them
breaks it (``tests/test_ground_truth_circuits.py`` checks both before any method is scored).
Edges whose writes are the same on the clean and corrupted prompts cannot matter under
patching, whatever the textbook mechanism says; they are not in the known circuit.

=======================  ==========================================================================
``induction``            K-composition: a previous-token head (L0H0) writes the previous token,
                         which the induction head's keys (L1K0.k) read; its query (L1H0.q) reads the
                         current token; its OV copies the token after the earlier match to the logits
``copy-gqa``             a copy through one head's OV under grouped-query attention (4 query heads,
                         2 key/value heads): L1H2 attends from the last position to the first word
                         by position and copies it; L1H3 shares its values (``L1K1.v``)
``mlp-moe``              a two-step computation through a mixture of experts: L0H0 moves a token to
                         the last position, expert 0 of MLP0 computes "big or small" from it
                         (ReLU features), the read-out reads that feature
``distractor``           the copy of ``copy-gqa`` (one head, L0H0) beside two heads with ten times its
                         write (L0H1, L0H2) whose outputs cancel exactly: each alone moves the metric
                         a lot, together nothing
=======================  ==========================================================================
"""

import difflib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from .graph import build_graph
from .metrics import RowMetric

Edge = tuple[str, str]


@dataclass
class GroundTruth:
    """A model, its task and its known circuit (module docstring). ``task`` names the behaviour (MIB's folder names
    are ``<task>_<model>``); ``notes`` say why the circuit is what it is."""

    name: str
    task: str
    model: object
    clean: Int[Tensor, "batch pos"]
    corrupted: Int[Tensor, "batch pos"]
    metric: RowMetric
    edges: tuple[Edge, ...]
    notes: str

    def known(self) -> Bool[Tensor, "upstream reader"]:
        """The known circuit as a mask laid out as ``EdgeScores.edge`` (``known_mask``)."""
        return known_mask(self.model, self.edges)


def _suggest(name: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(choices), n=3)
    return f"; did you mean {', '.join(map(repr, close))}?" if close else ""


def known_mask(model, edges: Iterable[Edge]) -> Bool[Tensor, "upstream reader"]:
    """``edges`` (``(upstream, reader)`` names) as a bool mask ``[upstream, reader]`` of ``model``'s graph.

    A name the graph lacks is a ``KeyError`` naming it, the nodes (or readers) there are and the closest; a pair
    that is no edge (the reader reads before the node writes) a ``ValueError``; an empty circuit a ``ValueError``."""
    graph = build_graph(model)
    upstream = [name for name, _, _ in graph.upstream]
    readers = [name for name, _, _ in graph.readers]
    mask = torch.zeros(len(upstream), len(readers), dtype=torch.bool)
    edge = graph.edge_mask()
    for pair in edges:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
            raise TypeError(f"a ground-truth edge is a pair of names (upstream, reader), got {pair!r}")
        up, reader = pair
        if up not in upstream:
            raise KeyError(
                f"ground-truth edge {up!r} -> {reader!r}: the model has no upstream node {up!r} (it has "
                f"{len(upstream)}: {', '.join(upstream)}){_suggest(up, upstream)}"
            )
        if reader not in readers:
            raise KeyError(
                f"ground-truth edge {up!r} -> {reader!r}: the model has no reader {reader!r} (it has "
                f"{len(readers)}: {', '.join(readers)}){_suggest(reader, readers)}"
            )
        i, j = upstream.index(up), readers.index(reader)
        if not bool(edge[i, j]):
            raise ValueError(f"ground-truth edge {up!r} -> {reader!r} is no edge: {reader} reads before {up} writes")
        mask[i, j] = True
    if not bool(mask.any()):
        raise ValueError("a known circuit needs at least one edge, got none")
    return mask


def read_edges(path: str | Path) -> tuple[Edge, ...]:
    """A known circuit from a JSON file: a list of ``[upstream, reader]`` pairs (checked against a model by
    ``known_mask``)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not JSON ({error.msg} at line {error.lineno})") from None
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a list of [upstream, reader] pairs, got {type(data).__name__}")
    bad = [pair for pair in data if not (isinstance(pair, list) and len(pair) == 2)]
    if bad:
        raise ValueError(f"{path}: every edge is a pair [upstream, reader]; got {bad[0]!r}")
    return tuple((str(up), str(reader)) for up, reader in data)


GROUND_TRUTHS = ("induction", "copy-gqa", "mlp-moe", "distractor")


def check_names(names: Iterable[str], known: Iterable[str], what: str) -> list[str]:
    """``names`` if each is one of ``known``, else a ``ValueError`` naming the first unknown one, the choices and the
    closest (difflib); an empty list is refused too."""
    names, known = list(names), list(known)
    if not names:
        raise ValueError(f"no {what} given: choose from {', '.join(known)}")
    for name in names:
        if name not in known:
            raise ValueError(f"unknown {what} {name!r}: choose from {', '.join(known)}{_suggest(name, known)}")
    return list(dict.fromkeys(names))


__all__ = ["GROUND_TRUTHS", "GroundTruth", "check_names", "known_mask", "read_edges"]
