"""Circuit discovery: which components and sites carry the difference between clean and corrupted prompts.

``batched``: activation patching of many sites in one forward pass, the patches laid along
the batch axis, in chunks that fit a memory budget; equal to patching one site at a time.

``metrics``: the row metric every tool scores by (``logit_diff_per_row``) and ``row_values``, where
each reads one, refusing a wrong shape or a non-finite value.

``attribution_patching``: every site's first-order patching effect (AtP) from one forward and
one backward pass; the derivative of patching.

``edge_attribution_patching``: EAP and EAP-IG over the graph of heads, MLPs and their readers
(query, key and value inputs apart), every edge from one backward pass (``steps`` for EAP-IG);
on an encoder-decoder over its two streams, from (source, target) pairs (``runs.SourceTarget``).

``run_circuit`` / ``faithfulness_curve``: the model with only a circuit's edges clean, and how
much of the behaviour the strongest ``n`` edges carry (``run_circuits``: many circuits per forward).

``tasks``: IOI, greater-than, induction and your own clean/corrupted pairs, for any tokenizer, as a
``Task`` (``task_pairs``: the pairs as ids, checked against the model they run on);
``seq2seq_tasks``: an encoder-decoder's (source, target) pairs.

``selection``: circuits from scores (top ``n``, a threshold, greedy from the logits) and pruning.
"""

from .attribution_patching import attribution_patching
from .batched import (
    COMPONENTS,
    Site,
    patch_sites,
    patch_sites_one_by_one,
    patching_figure,
    sae_feature_sites,
    sites,
)
from .edges import EdgeScores, edge_attribution_patching
from .faithfulness import FaithfulnessCurve, faithfulness_curve, run_circuit, run_circuits
from .graph import build_graph
from .metrics import logit_diff_per_row
from .runs import SourceTarget
from .selection import circuit_nodes, greedy_edges, prune, threshold_edges, top_edges
from .seq2seq_tasks import Seq2SeqTask, load_seq2seq_task
from .tasks import Task, greater_than_metric, greater_than_task, induction_task, ioi_task, load_task, write_csv

__all__ = [
    "COMPONENTS",
    "EdgeScores",
    "FaithfulnessCurve",
    "Seq2SeqTask",
    "SourceTarget",
    "Task",
    "greater_than_metric",
    "greater_than_task",
    "induction_task",
    "ioi_task",
    "load_seq2seq_task",
    "load_task",
    "write_csv",
    "build_graph",
    "circuit_nodes",
    "greedy_edges",
    "prune",
    "threshold_edges",
    "top_edges",
    "edge_attribution_patching",
    "faithfulness_curve",
    "run_circuit",
    "run_circuits",
    "attribution_patching",
    "Site",
    "logit_diff_per_row",
    "patch_sites",
    "patch_sites_one_by_one",
    "patching_figure",
    "sae_feature_sites",
    "sites",
]
