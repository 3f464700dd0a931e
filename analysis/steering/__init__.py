"""Steering vectors, applied with hooks and evaluated in one sweep (``docs/steering.md``).

- ``vectors``: difference of means, CAA (answer-token positions), ActAdd (one pair), a dictionary feature's decoder
  direction;
- ``apply``: ``steering(model, vector, hook, strength, positions)``, a context manager of this thread's hooks;
- ``evaluate``: ``steering_sweep`` over vectors (layers) x strengths, with the prompt-only baseline;
- ``figure``: ``sweep_figure``; ``page``: the offline page the command writes.
"""

from .apply import check_steering, steered_generate, steering
from .evaluate import Measured, SteeringSweep, minilm_concept_scorer, steering_sweep
from .figure import sweep_figure
from .vectors import SteeringVector, actadd_vector, caa_vector, difference_of_means, feature_vector

__all__ = [
    "Measured",
    "SteeringSweep",
    "SteeringVector",
    "actadd_vector",
    "caa_vector",
    "check_steering",
    "difference_of_means",
    "feature_vector",
    "minilm_concept_scorer",
    "steered_generate",
    "steering",
    "steering_sweep",
    "sweep_figure",
]
