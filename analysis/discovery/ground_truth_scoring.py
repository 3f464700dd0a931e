"""Every discovery method scored against the ground-truth models' known circuits (``ground_truth``).

**Methods** (``METHODS``, by command-line name), each giving an ``EdgeScores`` over the model's graph:

===========================  ====================================================================================
``patching``                 activation patching per edge: ``m(clean) - m(clean with that one edge fed its
                             corrupted value)`` (``run_circuit`` with every other edge kept), one run per edge.
                             Ablating from the clean run (noising) is how the known circuits are defined; patching
                             one edge clean into the corrupted run scores 0 for every edge of an AND (induction).
``atp`` / ``atp-star``       attribution patching of nodes (AtP; AtP* with GradDrop, ``grad_drop=True``): each
                             node's score, a mixture's expert at its hidden activations. Node methods rank edges by
                             ``min(|node score of u|, |node score of the reader's node|)`` (the logits: infinite),
                             the edges of a node circuit; they cannot tell a head's query from its key.
``eap``, ``eap-ig-inputs``,  ``edge_attribution_patching``: EAP, EAP-IG interpolating the inputs or each writer's
``eap-ig-activations``       output (``steps`` each)
``greedy``                   greedy selection from the logits (``greedy_edges``) on EAP-IG (inputs) scores: an edge
                             ranks by the step at which the greedy circuit takes it
``random``                   uniform random scores (seeded): the baseline every method must beat
===========================  ====================================================================================

**Scores** of a method on a model (``score``): every edge of the graph ranked by ``|mean score|``
against the known circuit (positives) and the rest of the graph (negatives):

- ``auroc``: the probability that a known edge outranks another edge (ties count one half; 1
  perfect, 0.5 chance, 0 reversed): ``mean over (p, n) of [s_p > s_n] + [s_p = s_n] / 2``;
- ``precision``: the share of the known circuit's edges among the ``k`` strongest, ``k`` its size;
- ``cpr``, ``cmd``: MIB's circuit performance ratio and circuit-model difference (Mueller et al.,
  2025; ``MIB_circuit_track/evaluation.py``'s ``evaluate_area_under_curve``). For each percentage ``p``
  of ``MIB_PERCENTAGES`` the circuit of the ``int(p / 100 * edges)`` strongest edges is run with
  every other edge patched to its corrupted value, its faithfulness ``f = (m - m_corrupt) /
  (m_clean - m_corrupt)`` (``m_corrupt``: no edge kept). CPR is the trapezoid area under ``f`` over
  ``x = p / 100`` (linear: MIB's default ``log_scale=False``), CMD the area under ``|1 - f|``
  (``mib_areas``). MIB prunes each circuit of nodes without a path from the input and to the
  logits; pruning never changes a patched circuit's metric (such a node writes its corrupted
  value), so the curve is computed unpruned.
"""

import math
import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .attribution_patching import attribution_patching
from .batched import Site, sites
from .edges import EdgeScores, edge_attribution_patching
from .faithfulness import faithfulness_curve, run_circuit
from .ground_truth import GROUND_TRUTHS, GroundTruth, check_names, ground_truth
from .selection import greedy_edges, top_edges

METHODS = {
    "patching": "activation patching (per edge)",
    "atp": "AtP (nodes)",
    "atp-star": "AtP* (nodes, GradDrop)",
    "eap": "EAP",
    "eap-ig-inputs": "EAP-IG (inputs)",
    "eap-ig-activations": "EAP-IG (activations)",
    "greedy": "greedy (EAP-IG inputs)",
    "random": "random",
}
MIB_PERCENTAGES = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0)  # MIB's evaluation sizes, % of edges


def check_sizes(sizes: Iterable) -> tuple[float, ...]:
    """Circuit sizes in percent of the graph's edges: each a finite number in ``(0, 100]``, returned sorted without
    repeats; anything else is a ``ValueError`` naming the value."""
    values = list(sizes) if not isinstance(sizes, (str, bytes)) else [sizes]
    if not values:
        raise ValueError("sizes must hold at least one percentage of edges in (0, 100], got none")
    for size in values:
        if isinstance(size, bool) or not isinstance(size, numbers.Real) or not 0 < size <= 100:
            raise ValueError(f"a circuit size is a percentage of the graph's edges in (0, 100], got {size!r}")
    return tuple(sorted({float(size) for size in values}))


def mib_areas(percentages: Sequence[float], faithfulness: Sequence[float]) -> tuple[float, float]:
    """``(CPR, CMD)``: the trapezoid areas of ``f`` and of ``|1 - f|`` over ``x = percentage / 100``, as MIB sums them
    (its points in the order given, sorted here by ``check_sizes``)."""
    x = [p / 100 for p in percentages]
    cpr = cmd = 0.0
    for i in range(len(x) - 1):
        width = x[i + 1] - x[i]
        cpr += width * (faithfulness[i] + faithfulness[i + 1]) / 2
        cmd += width * (abs(1 - faithfulness[i]) + abs(1 - faithfulness[i + 1])) / 2
    return cpr, cmd


def auroc(strength: Tensor, edge: Tensor, known: Tensor) -> float:
    """The probability that a known edge (``known``) outranks an edge of the graph (``edge``) outside it by
    ``strength``, ties counting one half (module docstring)."""
    positives, negatives = strength[known & edge].double(), strength[edge & ~known].double()
    if not len(positives) or not len(negatives):
        raise ValueError(
            f"AUROC needs known edges and other edges of the graph, got {len(positives)} and {len(negatives)}"
        )
    above = (positives[:, None] > negatives[None, :]).double().mean()
    tied = (positives[:, None] == negatives[None, :]).double().mean()
    return float(above + tied / 2)


def precision_at_known_size(scores: EdgeScores, known: Tensor) -> float:
    """The share of known edges among the ``k`` strongest, ``k`` the known circuit's size."""
    k = int(known.sum())
    return int((top_edges(scores, k) & known).sum()) / k


def _like(scores: EdgeScores, values: Tensor, method: str) -> EdgeScores:
    """``EdgeScores`` of the same graph holding ``values [upstream, reader]`` (0 off the edges)."""
    values = values.to(torch.float64).masked_fill(~scores.edge, 0.0)[..., None]
    return EdgeScores(scores.upstream, scores.readers, scores.edge, values, method, scores.reads)


def _node_site(model, name: str) -> Site:
    """Where a node's attribution-patching score is read: the stream entering block 0 for the input, a head's ``z``,
    an MLP's output, an expert's hidden activations."""
    if name == "input":
        return sites(model, "resid_pre", layers=[0])[0]
    if name.startswith("MLP"):
        layer, _, expert = name[3:].partition(".")
        if not expert:
            return sites(model, "mlp_out", layers=[int(layer)])[0]
        hook = model.blocks[int(layer)].mlp.experts[int(expert[1:])].hook_post.name
        return Site(hook, int(layer), (), None, name)
    layer = int(name[1:].split("H")[0])
    return next(site for site in sites(model, "heads", layers=[layer]) if site.label == name)


def _reader_nodes(reader: str, upstream: list[str], per_group: int) -> list[str]:
    """The nodes a reader belongs to: a query head's, a key/value head's query heads, an MLP's nodes."""
    if reader.startswith("MLP"):
        return [name for name in upstream if name == reader or name.startswith(reader + ".")]
    layer, _, rest = reader[1:].partition("H" if "H" in reader else "K")
    unit = int(rest.split(".")[0])
    if "K" in reader.split(".")[0]:
        return [f"L{layer}H{h}" for h in range(unit * per_group, (unit + 1) * per_group)]
    return [f"L{layer}H{unit}"]


def _node_lift(gt: GroundTruth, base: EdgeScores, grad_drop: bool) -> EdgeScores:
    model = gt.model
    node_sites = [_node_site(model, name) for name in base.upstream]
    atp = attribution_patching(model, gt.clean, gt.corrupted, gt.metric, node_sites, grad_drop=grad_drop)
    node = dict(zip(base.upstream, atp.mean(dim=-1).abs().tolist()))
    per_group = model.cfg.n_heads // (model.cfg.n_key_value_heads or model.cfg.n_heads)
    values = torch.zeros(base.edge.shape, dtype=torch.float64)
    for j, reader in enumerate(base.readers):
        after = (
            math.inf if reader == "logits" else max(node[n] for n in _reader_nodes(reader, base.upstream, per_group))
        )
        for i, up in enumerate(base.upstream):
            values[i, j] = min(node[up], after)
    return _like(base, values, METHODS["atp-star" if grad_drop else "atp"])


def _patching(gt: GroundTruth, base: EdgeScores) -> EdgeScores:
    data = (gt.model, gt.clean, gt.corrupted, gt.metric)
    clean = run_circuit(*data, base.edge.clone()).mean()
    values = torch.zeros(base.edge.shape, dtype=torch.float64)
    for i, j in base.edge.nonzero().tolist():
        kept = base.edge.clone()
        kept[i, j] = False
        values[i, j] = clean - run_circuit(*data, kept).mean()
    return _like(base, values, METHODS["patching"])


def _greedy_order(base: EdgeScores) -> EdgeScores:
    """Each edge scored by when greedy selection takes it (first: the most), 0 for edges it never reaches."""
    n_edges = int(base.edge.sum())
    values = torch.zeros(base.edge.shape, dtype=torch.float64)
    before = torch.zeros_like(base.edge)
    for n in range(1, n_edges + 1):
        now = greedy_edges(base, n)
        added = now & ~before
        if not bool(added.any()):
            break  # every edge into the circuit is taken
        values[added] = n_edges - n + 1
        before = now
    return _like(base, values, METHODS["greedy"])


def method_scores(method: str, gt: GroundTruth, *, steps: int = 5, seed: int = 0) -> EdgeScores:
    """``method``'s (``METHODS``) scores of every edge of ``gt``'s model on its task (module docstring)."""
    (method,) = check_names([method], METHODS, "method")
    data = (gt.model, gt.clean, gt.corrupted, gt.metric)
    if method in ("eap-ig-inputs", "eap-ig-activations", "greedy"):
        ig_on = "activations" if method == "eap-ig-activations" else "inputs"
        scores = edge_attribution_patching(*data, method="EAP-IG", steps=steps, ig_on=ig_on)
        return _greedy_order(scores) if method == "greedy" else scores
    base = edge_attribution_patching(*data, method="EAP")
    if method == "eap":
        return base
    if method == "random":
        generator = torch.Generator().manual_seed(seed)
        return _like(base, torch.rand(base.edge.shape, generator=generator, dtype=torch.float64), METHODS["random"])
    if method == "patching":
        return _patching(gt, base)
    return _node_lift(gt, base, grad_drop=method == "atp-star")


@dataclass
class Score:
    """One method on one ground-truth model (module docstring); ``faithfulness[i]`` at ``percentages[i]``."""

    method: str
    model: str
    auroc: float
    precision: float
    cpr: float
    cmd: float
    percentages: tuple[float, ...]
    faithfulness: list[float]
    n_edges: int
    n_known: int
    top: list[tuple[str, str, float]] = field(default_factory=list)  # the strongest edges, for the page


def score(
    scores: EdgeScores, gt: GroundTruth, percentages: Sequence[float] = MIB_PERCENTAGES, method: str | None = None
) -> Score:
    """``scores`` (a method's, on ``gt``'s model) against ``gt``'s known circuit: AUROC, precision at the known size,
    and MIB's CPR and CMD over ``percentages`` (``check_sizes``)."""
    percentages = check_sizes(percentages)
    known = gt.known()
    if known.shape != scores.edge.shape:
        raise ValueError(
            f"the scores are over a graph of {tuple(scores.edge.shape)} (upstream, reader); {gt.name}'s is "
            f"{tuple(known.shape)}: score the method on {gt.name}'s model"
        )
    n_edges = int(scores.edge.sum())
    counts = [int(p / 100 * n_edges) for p in percentages]
    curve = faithfulness_curve(gt.model, gt.clean, gt.corrupted, gt.metric, scores, counts)
    faithfulness = curve.normalized.tolist()
    cpr, cmd = mib_areas(percentages, faithfulness)
    strength = scores.strength()
    return Score(
        method or scores.method, gt.name, auroc(strength, scores.edge, known), precision_at_known_size(scores, known),
        cpr, cmd, percentages, faithfulness, n_edges, int(known.sum()), scores.top(int(known.sum()) + 3),
    )  # fmt: skip


def run_benchmark(
    methods: Sequence[str] = tuple(METHODS),
    models: Sequence[str] = GROUND_TRUTHS,
    *,
    percentages: Sequence[float] = MIB_PERCENTAGES,
    steps: int = 5,
    seed: int = 0,
    mib_out=None,
    progress: bool = False,
) -> list[Score]:
    """Every method in ``methods`` on every ground-truth model in ``models`` (names checked first, by name with the
    closest suggested; sizes by ``check_sizes``): one ``Score`` each, model by model. ``mib_out``: also write each
    method's scores in MIB's submission format there (``ground_truth_mib``)."""
    from tqdm.auto import tqdm

    from .ground_truth_mib import write_mib

    methods, models = check_names(methods, METHODS, "method"), check_names(models, GROUND_TRUTHS, "ground-truth model")
    percentages = check_sizes(percentages)
    results = []
    bar = tqdm(total=len(methods) * len(models), desc="circuit benchmark", disable=not progress, unit="run")
    with bar:
        for name in models:
            gt = ground_truth(name, seed=seed)
            for method in methods:
                bar.set_postfix_str(f"{name}: {method}")
                scores = method_scores(method, gt, steps=steps, seed=seed)
                results.append(score(scores, gt, percentages, method=method))
                if mib_out is not None:
                    write_mib(mib_out, method, gt, scores)
                bar.update()
    return results


def results_table(results: Sequence[Score]) -> str:
    """A Markdown table, one row per method and one column per model, each cell ``AUROC / P@k / CPR / CMD``."""
    methods = list(dict.fromkeys(r.method for r in results))
    models = list(dict.fromkeys(r.model for r in results))
    cell = {(r.method, r.model): f"{r.auroc:.2f} / {r.precision:.2f} / {r.cpr:.2f} / {r.cmd:.2f}" for r in results}
    lines = ["| method | " + " | ".join(models) + " |", "|---" * (len(models) + 1) + "|"]
    for method in methods:
        row = [cell.get((method, model), "") for model in models]
        lines.append(f"| {method} | " + " | ".join(row) + " |")
    return "\n".join(lines)


__all__ = [
    "METHODS",
    "MIB_PERCENTAGES",
    "Score",
    "auroc",
    "check_sizes",
    "method_scores",
    "mib_areas",
    "results_table",
    "run_benchmark",
    "score",
]
