"""TransformerLens' key/value cache: ``HookedTransformerKeyValueCache.init_cache(cfg, device, batch_size)``.

One entry per block holds ``past_keys``/``past_values`` ``[batch, pos_so_far, head_index,
d_head]``; the cache holds ``previous_attention_mask [batch, pos_so_far]`` (1 real, 0
padding), so later tokens never attend to earlier padding. ``freeze()`` keeps the cache
as it is while runs still read it (many continuations of one prefix); ``unfreeze()`` lets
runs append again. ``HookedTransformer.forward(..., past_kv_cache=cache)`` reads and fills
it; each entry's ``append(keys, values)`` is what our attention calls, so the entries plug
into our blocks directly (the same protocol as ``interp_transformer.core.kv_cache``).
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp_transformer.compat.errors import CompatValueError
from interp_transformer.core.kv_cache import KeyShape, LayerKVCache, check_key_shapes

# how to build a cache that fits a model
MAKE_CACHE = "HookedTransformerKeyValueCache.init_cache(model.cfg, device, batch_size)"


@dataclass
class HookedTransformerKeyValueCacheEntry(LayerKVCache):
    """Keys and values of one block so far; ``append`` returns them with the new ones (and keeps them unless frozen).

    A ``LayerKVCache`` (what our blocks take) holding TransformerLens' fields.
    """

    past_keys: Float[Tensor, "batch pos_so_far head_index d_head"]
    past_values: Float[Tensor, "batch pos_so_far head_index d_head"]
    frozen: bool = False

    # read-only views of TransformerLens' fields where LayerKVCache has attributes: append here writes past_keys
    @property
    def keys(self) -> Tensor:  # type: ignore[override]
        return self.past_keys

    @property
    def values(self) -> Tensor:  # type: ignore[override]
        return self.past_values

    @classmethod
    def init_cache_entry(
        cls, cfg, device: torch.device | str | None, batch_size: int = 1
    ) -> "HookedTransformerKeyValueCacheEntry":
        """An empty entry for ``cfg`` (``n_key_value_heads`` heads when set, else ``n_heads``), in ``cfg.dtype``."""
        n_heads = cfg.n_key_value_heads if getattr(cfg, "n_key_value_heads", None) is not None else cfg.n_heads
        shape = (batch_size, 0, n_heads, cfg.d_head)
        dtype = getattr(cfg, "dtype", torch.float32)
        return cls(torch.empty(shape, device=device, dtype=dtype), torch.empty(shape, device=device, dtype=dtype))

    @property
    def n_positions(self) -> int:
        return self.past_keys.shape[1]

    def append(self, new_keys: Tensor, new_values: Tensor) -> tuple[Tensor, Tensor]:
        """``[past, new]`` keys and values along ``pos``; stored unless the entry is frozen."""
        if new_keys.shape[0] != self.past_keys.shape[0]:
            raise CompatValueError(
                f"the key/value cache holds batch {self.past_keys.shape[0]}, got new keys with batch "
                f"{new_keys.shape[0]}"
            )
        keys = torch.cat([self.past_keys.to(new_keys), new_keys], dim=1)
        values = torch.cat([self.past_values.to(new_values), new_values], dim=1)
        if not self.frozen:
            self.past_keys, self.past_values = keys, values
        return keys, values


@dataclass
class HookedTransformerKeyValueCache:
    """One ``HookedTransformerKeyValueCacheEntry`` per block and the attention mask of the cached positions."""

    entries: list[HookedTransformerKeyValueCacheEntry]
    previous_attention_mask: Int[Tensor, "batch pos_so_far"]
    frozen: bool = False

    @classmethod
    def init_cache(
        cls, cfg, device: torch.device | str | None = None, batch_size: int = 1
    ) -> "HookedTransformerKeyValueCache":
        """An empty cache for a model with config ``cfg`` and ``batch_size`` sequences."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise CompatValueError(f"batch_size must be a positive int, got {batch_size!r}")
        device = device if device is not None else getattr(cfg, "device", None)
        return cls(
            entries=[
                HookedTransformerKeyValueCacheEntry.init_cache_entry(cfg, device, batch_size)
                for _ in range(cfg.n_layers)
            ],
            previous_attention_mask=torch.empty((batch_size, 0), device=device, dtype=torch.int),
        )

    def freeze(self) -> None:
        self.frozen = True
        for entry in self.entries:
            entry.frozen = True

    def unfreeze(self) -> None:
        self.frozen = False
        for entry in self.entries:
            entry.frozen = False

    def append_attention_mask(
        self, attention_mask: Int[Tensor, "batch new_tokens"]
    ) -> Int[Tensor, "batch pos_so_far_and_new"]:
        """The mask of the cached and the new positions; kept unless frozen."""
        updated = torch.cat([self.previous_attention_mask, attention_mask.to(self.previous_attention_mask)], dim=-1)
        if not self.frozen:
            self.previous_attention_mask = updated
        return updated

    def __getitem__(self, index: int) -> HookedTransformerKeyValueCacheEntry:
        return self.entries[index]

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def n_positions(self) -> int:
        """Positions already cached."""
        return self.entries[0].n_positions if self.entries else 0

    @property
    def batch_size(self) -> int:
        return self.previous_attention_mask.shape[0]

    def past_key_is_real(self) -> Tensor | None:
        """``[batch, pos_so_far]`` bools, False on cached padding; None when every cached position is real."""
        mask = self.previous_attention_mask.bool()
        return None if bool(mask.all()) else mask

    def check_fits(
        self, n_layers: int, d_head: int | None = None, key_shapes: Sequence[KeyShape | None] | None = None
    ) -> None:
        """``ValueError`` unless there is one entry per block, all holding the same positions.

        ``key_shapes``: per block, the ``(n_key_value_heads, d_head)`` its keys must have
        (``interp_transformer.core.kv_cache.check_key_shapes``).
        """
        if len(self.entries) != n_layers:
            raise CompatValueError(
                f"this key/value cache has {len(self.entries)} entries, the model {n_layers} blocks: make it with "
                "HookedTransformerKeyValueCache.init_cache(model.cfg, device, batch_size)"
            )
        held = {entry.n_positions for entry in self.entries}
        if len(held) > 1:
            raise CompatValueError(
                f"the entries of this key/value cache hold different numbers of positions {sorted(held)}: it was "
                "filled by an interrupted or partial run; start a new cache"
            )
        if d_head is not None and self.entries[0].past_keys.shape[-1] != d_head:
            raise CompatValueError(
                f"the key/value cache holds d_head={self.entries[0].past_keys.shape[-1]}, the model {d_head}"
            )
        if key_shapes is not None:
            check_key_shapes(self.entries, key_shapes, MAKE_CACHE)


def get_pos_offset(past_kv_cache: HookedTransformerKeyValueCache | None, batch_size: int) -> int:
    """Positions already in ``past_kv_cache`` (0 without one): where the new tokens' positions start."""
    if past_kv_cache is None:
        return 0
    return past_kv_cache.entries[0].past_keys.shape[1]


# TransformerLens 3's names for the same classes
TransformerLensKeyValueCache = HookedTransformerKeyValueCache
TransformerLensKeyValueCacheEntry = HookedTransformerKeyValueCacheEntry

__all__ = [
    "HookedTransformerKeyValueCache",
    "HookedTransformerKeyValueCacheEntry",
    "TransformerLensKeyValueCache",
    "TransformerLensKeyValueCacheEntry",
    "get_pos_offset",
]
