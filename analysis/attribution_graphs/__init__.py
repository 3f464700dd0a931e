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
``attribute_prompts``, ``plan_prompts`` (``batched``)
    Several prompts' graphs from shared backward passes, left-padded, each equal to its prompt's graph alone.
``prune_graph``, ``graph_scores`` (``pruning``)
    Circuit-tracer's node and edge influence, pruning, and replacement and completeness scores.
``plan_memory`` (``memory``)
    The peak memory of a graph, estimated before it is spent; ``attribute(memory_budget=...)`` refuses
    a run above its budget.
``to_neuronpedia``, ``NeuronpediaGraph`` (``neuronpedia``)
    Neuronpedia's graph JSON, out and back in.
``graph_figure`` (``figure``)
    The pruned graph as a plotly figure.
``graph_view`` (``view``), ``feature_info_from`` (``feature_info``)
    The pruned graph as an offline HTML view: hover and click nodes, see a feature's top activations and logit
    effects, pin a subgraph, and predict an intervention's effect on the logits with its command line.
``qk_attribution`` (``qk``)
    One head's attention score split into query-component x key-component terms (features, errors, tokens,
    heads, biases) that sum to it, through frozen norms, RoPE and grouped keys.
``train_transcoders`` (``training``), ``transcoder_metrics``, ``save_transcoders``/``load_transcoders``
    TopK transcoders or a cross-layer transcoder trained on a model's MLPs over a corpus, and their quality.
``edit_features``, ``generate_with_edits``, ``splice_transcoders`` (``interventions``)
    Features ablated or steered in the running model, then generation; transcoders spliced in place of the MLPs.

See ``docs/attribution_graphs.md``.
"""

from .attribute import attribute, salient_logits
from .batched import attribute_prompts, plan_prompts
from .circuit_tracer_files import load_circuit_tracer, save_circuit_tracer
from .clt import CLTConfig, CrossLayerTranscoder
from .feature_info import FeatureInfo, feature_info_from
from .figure import graph_figure
from .graph import AttributionGraph
from .interventions import FeatureEdit, edit_features, generate_with_edits, parse_feature_edit, splice_transcoders
from .memory import MemoryBudgetError, MemoryPlan, plan_memory
from .neuronpedia import NeuronpediaGraph, to_neuronpedia
from .pruning import GraphScores, PruneResult, graph_scores, node_influence, prune_graph
from .qk import QKAttribution, QKTerm, StreamComponents, qk_attribution, stream_components
from .replacement import ReplacementModel, ReplacementRun
from .training import TrainedTranscoders, TranscoderTrainingConfig, reference_corpus, train_transcoders
from .transcoder_files import load_transcoders, save_transcoders, training_record
from .transcoder_metrics import TranscoderMetrics, transcoder_metrics
from .transcoders import LayerTranscoder, random_transcoders, transcoder_layers
from .view import graph_view, intervention_command, logit_path_sums, node_id

__all__ = [
    "AttributionGraph",
    "CLTConfig",
    "CrossLayerTranscoder",
    "FeatureEdit",
    "FeatureInfo",
    "GraphScores",
    "LayerTranscoder",
    "MemoryBudgetError",
    "MemoryPlan",
    "NeuronpediaGraph",
    "PruneResult",
    "QKAttribution",
    "QKTerm",
    "ReplacementModel",
    "ReplacementRun",
    "StreamComponents",
    "TrainedTranscoders",
    "TranscoderMetrics",
    "TranscoderTrainingConfig",
    "attribute",
    "attribute_prompts",
    "edit_features",
    "feature_info_from",
    "generate_with_edits",
    "graph_figure",
    "graph_scores",
    "graph_view",
    "intervention_command",
    "load_circuit_tracer",
    "load_transcoders",
    "logit_path_sums",
    "node_id",
    "node_influence",
    "parse_feature_edit",
    "plan_memory",
    "plan_prompts",
    "prune_graph",
    "qk_attribution",
    "random_transcoders",
    "reference_corpus",
    "salient_logits",
    "save_circuit_tracer",
    "save_transcoders",
    "splice_transcoders",
    "stream_components",
    "to_neuronpedia",
    "train_transcoders",
    "training_record",
    "transcoder_layers",
    "transcoder_metrics",
]
