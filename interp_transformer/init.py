"""Helpers shared by every model class: weight init and layer-index checks."""

from typing import Optional

import torch
from torch import nn


def init_explicit_weights(model: nn.Module, init_range: float, seed: Optional[int] = None) -> None:
    """GPT-2/BERT init: weight matrices (``W_*``) ~ N(0, init_range^2), biases 0, LayerNorm ``w`` = 1."""
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    with torch.no_grad():
        for name, param in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf.startswith("W_"):
                param.copy_(torch.randn(param.shape, generator=generator) * init_range)
            elif leaf == "w":
                param.fill_(1.0)
            else:
                param.zero_()


def check_stop_at_layer(stop_at_layer: Optional[int], n_layers: int) -> int:
    """How many blocks to run: ``n_layers`` for None, else ``stop_at_layer`` (negative counts from the end)."""
    if stop_at_layer is None:
        return n_layers
    if not isinstance(stop_at_layer, int) or isinstance(stop_at_layer, bool) or not -n_layers <= stop_at_layer <= n_layers:
        raise ValueError(f"stop_at_layer must be an int in [{-n_layers}, {n_layers}], got {stop_at_layer!r}")
    return stop_at_layer % n_layers if stop_at_layer < 0 else stop_at_layer
