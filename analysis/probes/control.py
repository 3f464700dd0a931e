"""Hewitt and Liang's control task (2019): does the probe read the property, or learn the task itself?

Each word type gets one label drawn at random from the real labels' empirical distribution, and every
occurrence of the type carries it. The control task is fitted exactly as the real one (same sites, same
split, regularisation chosen on the same validation examples); ``selectivity = accuracy - control
accuracy``, both on held-out examples. A probe that can memorise word identity does well on the control
task and has low selectivity, however high its accuracy; a high selectivity says the representation makes
the property easy to read, beyond what the probe's capacity to memorise types gives.

The type of a position is, by default, its token id (``types`` may name it otherwise, e.g. the word
a multi-token noun ends); the control labels depend only on the type, never on the context.

>>> import torch
>>> control_targets(["cat", "cats", "cat", "dog"], torch.tensor([0, 1, 0, 0]), seed=0).tolist()  # one per type
[1, 0, 1, 0]
"""

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor


def control_targets(types: Sequence[Hashable], targets: Tensor, seed: int = 0) -> Tensor:
    """The control task's class index per row: one label per distinct type, drawn from ``targets``' frequencies.

    Types are drawn in order of first appearance, so the labels depend only on the seed and the data.
    """
    if len(types) != len(targets):
        raise ValueError(f"got {len(types)} types for {len(targets)} probed positions: give one per position")
    distinct = list(dict.fromkeys(types))
    frequencies = torch.bincount(targets).double()
    generator = torch.Generator().manual_seed(seed)
    drawn = torch.multinomial(frequencies, len(distinct), replacement=True, generator=generator)
    label_of = dict(zip(distinct, drawn.tolist()))
    return torch.tensor([label_of[kind] for kind in types])


def selectivity(accuracy: float, control_accuracy: float) -> float:
    """Hewitt and Liang's selectivity: held-out accuracy on the task minus that on the control task."""
    return accuracy - control_accuracy
