"""Every analysis figure: functions that take tensors and labels and return a plotly ``go.Figure``.

None of them calls ``.show()``: display the figure in a notebook, save it with
``fig.write_html(path)`` or embed it with ``fig.to_html(include_plotlyjs=False)``.
Signed values use the diverging ``RdBu`` scale centred on zero; axis titles use the
axis glossary (``layer``, ``head_index``, ``query_pos``, ``key_pos``, ``pos``,
``d_vocab``, ``neuron``). Labels must match the axis they label (one per entry),
else ``ValueError``.

=============================  ==========================================================
attention                      ``plot_attention_pattern``, ``plot_attention_heads``
per-head scores                ``plot_head_scores`` (detectors, entropy, DLA, copying)
circuits                       ``plot_circuit``, ``plot_composition_scores``
neurons                        ``plot_token_activations``, ``plot_neuron_summary``,
                               ``plot_token_values``
logit lens and attribution     ``plot_logit_lens``, ``plot_layer_attribution``
patching                       ``plot_residual_patching``, ``plot_head_patching``
mixtures of experts            ``plot_expert_usage``, ``plot_token_routing``,
                               ``plot_expert_attribution``
SAE features                   ``plot_feature_histogram``
=============================  ==========================================================
"""

from .activations import (
    plot_head_patching,
    plot_layer_attribution,
    plot_logit_lens,
    plot_neuron_summary,
    plot_residual_patching,
    plot_token_activations,
    plot_token_values,
)
from .attention import (
    plot_attention_heads,
    plot_attention_pattern,
    plot_circuit,
    plot_composition_scores,
    plot_head_scores,
)
from .experts import plot_expert_attribution, plot_expert_usage, plot_token_routing
from .features import plot_feature_histogram

__all__ = [
    "plot_attention_heads",
    "plot_attention_pattern",
    "plot_circuit",
    "plot_composition_scores",
    "plot_expert_attribution",
    "plot_expert_usage",
    "plot_feature_histogram",
    "plot_head_patching",
    "plot_head_scores",
    "plot_layer_attribution",
    "plot_logit_lens",
    "plot_neuron_summary",
    "plot_residual_patching",
    "plot_token_activations",
    "plot_token_routing",
    "plot_token_values",
]
