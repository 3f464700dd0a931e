"""Attribution graphs over transcoders: which features, through which direct effects, make a prediction.

Circuit-tracer's method (Ameisen et al., 2025) on any decoder whose blocks declare their MLP:

``transcoders``
    One transcoder ``SAE`` per layer (SAELens' format: ReLU, JumpReLU or TopK, with or without a skip
    term) or a ``CrossLayerTranscoder`` (``clt``: layer ``l``'s features write to every later MLP output;
    circuit-tracer's file layout), each reading an MLP's input and replacing its output.
``ReplacementModel`` (``replacement``)
    One prompt's model made linear from its sources (active features, error nodes, token embeddings) to
    its logits: attention patterns and norm scales frozen, each MLP its transcoder plus a constant error.
    On the prompt it gives the model's logits.
``attribute`` (``attribute``)
    The ``AttributionGraph`` (``graph``): every direct effect between sources, features and the most
    probable logits, from backward passes batched over targets. Each edge equals an intervention in the
    replacement model, and each node's input edges plus its bias sum to its value.
``prune_graph``, ``graph_scores`` (``pruning``)
    Circuit-tracer's node and edge influence, pruning, and replacement and completeness scores.
``plan_memory`` (``memory``)
    The peak memory of a graph, estimated before it is spent; ``attribute(memory_budget=...)`` refuses
    a run above its budget.
``to_neuronpedia``, ``NeuronpediaGraph`` (``neuronpedia``)
    Neuronpedia's graph JSON, out and back in.
``graph_figure`` (``figure``)
    The pruned graph as a plotly figure.

See ``docs/attribution_graphs.md``.
"""

from .attribute import attribute, salient_logits
from .clt import CLTConfig, CrossLayerTranscoder
from .figure import graph_figure
from .graph import AttributionGraph
from .memory import MemoryBudgetError, MemoryPlan, plan_memory
from .neuronpedia import NeuronpediaGraph, to_neuronpedia
from .pruning import GraphScores, PruneResult, graph_scores, node_influence, prune_graph
from .replacement import ReplacementModel, ReplacementRun
from .transcoders import LayerTranscoder, random_transcoders, transcoder_layers

__all__ = [
    "AttributionGraph",
    "CLTConfig",
    "CrossLayerTranscoder",
    "GraphScores",
    "LayerTranscoder",
    "MemoryBudgetError",
    "MemoryPlan",
    "NeuronpediaGraph",
    "PruneResult",
    "ReplacementModel",
    "ReplacementRun",
    "attribute",
    "graph_figure",
    "graph_scores",
    "node_influence",
    "plan_memory",
    "prune_graph",
    "random_transcoders",
    "salient_logits",
    "to_neuronpedia",
    "transcoder_layers",
]
