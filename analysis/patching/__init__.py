"""Activation patching: which activations carry the difference between two inputs.

=============================  =============================================================================
``patching.activations``       a decoder's residual stream by (layer, position) and its heads by (layer, head):
                               ``patch_residual``, ``patch_head_outputs``, ``logit_diff_metric``
``patching.source``            an encoder-decoder's source words: ``source_word_effects`` (corrupt one word),
                               ``patch_source_positions`` (patch the encoder's output at one position)
=============================  =============================================================================

Patching a whole graph of edges at once, and attribution patching, are circuit discovery: ``analysis.discovery``.
"""

from .activations import RESIDUAL_KINDS, Metric, logit_diff_metric, patch_head_outputs, patch_residual
from .source import patch_source_positions, source_word_effects

__all__ = [
    "RESIDUAL_KINDS",
    "Metric",
    "logit_diff_metric",
    "patch_head_outputs",
    "patch_residual",
    "patch_source_positions",
    "source_word_effects",
]
