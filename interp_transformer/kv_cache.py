"""Key/value cache for fast autoregressive generation.

Each layer keeps the keys and values of every position seen so far, so a new
token only computes its own query, key and value. Positions continue from
``n_positions`` (the positional embedding and causal mask are offset by it).
"""

from typing import Optional

import torch
from torch import Tensor


class LayerKVCache:
    """Keys and values of one attention layer: ``[batch, pos_so_far, head_index, d_head]``."""

    def __init__(self) -> None:
        self.keys: Optional[Tensor] = None
        self.values: Optional[Tensor] = None

    @property
    def n_positions(self) -> int:
        return 0 if self.keys is None else self.keys.shape[1]

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add this step's keys/values; return all keys/values so far."""
        if self.keys is None:
            self.keys, self.values = k, v
        else:
            if k.shape[0] != self.keys.shape[0]:
                raise ValueError(f"kv cache holds batch {self.keys.shape[0]}, got new keys with batch {k.shape[0]}")
            self.keys = torch.cat([self.keys, k], dim=1)
            self.values = torch.cat([self.values, v], dim=1)
        return self.keys, self.values


class KeyValueCache:
    """One ``LayerKVCache`` per block. Pass to ``model(tokens, kv_cache=cache)`` step after step.

    ``key_is_real [batch, n_positions]`` remembers which cached positions were padding
    (None while every one was real), so later steps never attend to them.
    """

    def __init__(self, n_layers: int) -> None:
        if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
            raise ValueError(f"n_layers must be a positive int (the model's cfg.n_layers), got {n_layers!r}")
        self.layers = [LayerKVCache() for _ in range(n_layers)]
        self.key_is_real: Optional[Tensor] = None

    def __getitem__(self, layer: int) -> LayerKVCache:
        return self.layers[layer]

    def __len__(self) -> int:
        return len(self.layers)

    @property
    def n_positions(self) -> int:
        return self.layers[0].n_positions if self.layers else 0

    def check_fits(self, n_layers: int) -> None:
        """``ValueError`` unless this cache has one layer per block and every layer holds the same positions."""
        if len(self.layers) != n_layers:
            raise ValueError(f"this key/value cache has {len(self.layers)} layers, the model {n_layers}: "
                             f"make it with KeyValueCache({n_layers})")
        held = {layer.n_positions for layer in self.layers}
        if len(held) > 1:
            raise ValueError(f"the layers of this key/value cache hold different numbers of positions {sorted(held)}: "
                             "it was filled by an interrupted or partial run; start a new cache")
