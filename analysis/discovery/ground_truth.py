"""Models whose circuits are known by construction, and the circuits themselves: the entry point.

``ground_truth(name)`` builds one of ``GROUND_TRUTHS`` (``ground_truth_models``); the ``GroundTruth`` type, the edge
checks and readers live in ``ground_truth_types``, the floor the models and the scoring stand on.
"""

import torch

from .ground_truth_models import BUILDERS
from .ground_truth_types import GROUND_TRUTHS, GroundTruth, check_names, known_mask, read_edges


def ground_truth(name: str, *, dtype: torch.dtype = torch.float64, seed: int = 0) -> GroundTruth:
    """The ground-truth model ``name`` (``GROUND_TRUTHS``), built afresh: its background weights from ``seed``."""
    (name,) = check_names([name], GROUND_TRUTHS, "ground-truth model")
    return BUILDERS[name](dtype=dtype, seed=seed)


__all__ = ["GROUND_TRUTHS", "GroundTruth", "check_names", "ground_truth", "known_mask", "read_edges"]
