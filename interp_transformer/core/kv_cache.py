"""Key/value cache for fast autoregressive generation.

Each layer keeps the keys and values of every position seen so far, so a new
token only computes its own query, key and value. Positions continue from
``n_positions`` (the positional embedding and causal mask are offset by it).
"""

from collections.abc import Sequence

import torch
from torch import Tensor

KEY_AXES = "[batch, pos, n_key_value_heads, d_head]"  # how a layer's cached keys and values are laid out
KeyShape = tuple[int, int]  # (n_key_value_heads, d_head) of the keys a block caches


class LayerKVCache:
    """Keys and values of one attention layer: ``[batch, pos_so_far, head_index, d_head]``."""

    ENTRY_AXES = "batch cached_pos n_key_value_heads d_head"  # of entry_shape: what a part's entry check compares

    def __init__(self) -> None:
        self.keys: Tensor | None = None
        self.values: Tensor | None = None

    @property
    def n_positions(self) -> int:
        return 0 if self.keys is None else self.keys.shape[1]

    @property
    def entry_shape(self) -> torch.Size | None:
        """The held keys' shape (``ENTRY_AXES``), None while no position is held: what ``shape_checked`` compares
        at a part's entry with the part's ``n_key_value_heads`` and ``d_head`` and the input's ``batch``."""
        keys = self.keys
        return None if keys is None or keys.shape[1] == 0 else keys.shape

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add this step's keys/values; return all keys/values so far.

        ``ValueError`` (and nothing stored) when the new keys differ from the held ones in
        batch, ``n_key_value_heads``, ``d_head``, dtype or device: the cache was filled by
        another model, or by this one in another dtype or on another device.
        """
        if self.keys is None or self.values is None:  # both None or both set: an empty cache
            self.keys, self.values = k, v
        else:
            if k.shape[0] != self.keys.shape[0]:
                raise ValueError(f"kv cache holds batch {self.keys.shape[0]}, got new keys with batch {k.shape[0]}")
            held = self.keys
            if held.shape[2:] != k.shape[2:] or held.dtype != k.dtype or held.device != k.device:
                raise ValueError(
                    f"the key/value cache holds keys {KEY_AXES} = {list(held.shape)} ({held.dtype} on {held.device}), "
                    f"this layer computes {list(k.shape)} ({k.dtype} on {k.device}): the cache was filled by another "
                    "model (or in another dtype or on another device); start a new cache"
                )
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
        self.key_is_real: Tensor | None = None

    def __getitem__(self, layer: int) -> LayerKVCache:
        return self.layers[layer]

    def __len__(self) -> int:
        return len(self.layers)

    @property
    def n_positions(self) -> int:
        return self.layers[0].n_positions if self.layers else 0

    def check_fits(self, n_layers: int, key_shapes: Sequence[KeyShape | None] | None = None) -> None:
        """``ValueError`` unless this cache has one layer per block and every layer holds the same positions.

        ``key_shapes``: per block, the ``(n_key_value_heads, d_head)`` of the keys it caches
        (``None`` for a block not to check); a layer holding keys of another shape is refused,
        naming both (``check_key_shapes``).
        """
        if len(self.layers) != n_layers:
            raise ValueError(
                f"this key/value cache has {len(self.layers)} layers, the model {n_layers}: "
                f"make it with KeyValueCache({n_layers})"
            )
        held = {layer.n_positions for layer in self.layers}
        if len(held) > 1:
            raise ValueError(
                f"the layers of this key/value cache hold different numbers of positions {sorted(held)}: "
                "it was filled by an interrupted or partial run; start a new cache"
            )
        if key_shapes is not None:
            check_key_shapes(self.layers, key_shapes, f"KeyValueCache({n_layers})")


def check_key_shapes(layers: Sequence[LayerKVCache], key_shapes: Sequence[KeyShape | None], make: str) -> None:
    """``ValueError`` unless each layer's keys are ``[batch, pos, n_key_value_heads, d_head]`` as ``key_shapes`` says.

    ``key_shapes[i]`` is ``(n_key_value_heads, d_head)`` of block ``i`` (``None``: not
    checked); a layer holding no keys yet is not checked. ``make`` says how to build a
    cache that fits (e.g. ``"KeyValueCache(2)"``).
    """
    for index, (layer, needed) in enumerate(zip(layers, key_shapes, strict=True)):
        keys = layer.keys
        if needed is None or keys is None:
            continue
        if keys.ndim != 4 or tuple(keys.shape[2:]) != tuple(needed):
            raise ValueError(
                f"layer {index} of the key/value cache holds keys {KEY_AXES} = {list(keys.shape)}, the model's "
                f"block {index} needs [batch, pos, {needed[0]}, {needed[1]}]: the cache was filled by another model; "
                f"start a new one with {make}"
            )


def crossed_thresholds(thresholds: Sequence[int], held: Tensor, total: Tensor) -> list[int]:
    """The ``thresholds`` some row grows past: it held between 1 and ``t`` positions, it will hold more than ``t``.

    ``held`` and ``total`` are per row ``[batch]``: the real positions cached, and those after this run.
    A rotation whose angles depend on the row's length (LongRoPE, ``Rotary.length_thresholds``)
    leaves the cached keys of such a row stale.
    """
    return [t for t in thresholds if bool(((held > 0) & (held <= t) & (total > t)).any())]


def check_rotations_current(thresholds: Sequence[int], cache: "KeyValueCache", total: Tensor) -> None:
    """``ValueError`` when this run grows a row of ``cache`` past one of ``thresholds`` (``crossed_thresholds``).

    ``total [batch]``: each row's length after this run. Nothing is stored before the check.
    """
    if not thresholds or not cache.n_positions:
        return
    held = cache.key_is_real.sum(dim=-1) if cache.key_is_real is not None else torch.full_like(total, cache.n_positions)
    crossed = crossed_thresholds(thresholds, held.to(total.device), total)
    if crossed:
        raise ValueError(
            f"this run grows rows of the key/value cache from at most {crossed[0]} positions to more: the keys it "
            f"holds were rotated for rows of at most {crossed[0]} positions, and past that length every position "
            "rotates differently (LongRoPE's long factors); start a new cache and run the whole sequence "
            "(generate does this itself)"
        )


def require_kv_cache(cache, expected: type, make: str, name: str = "kv_cache") -> None:
    """``TypeError`` unless ``cache`` is an ``expected`` (e.g. a ``KeyValueCache``); ``make`` says how to build one."""
    if not isinstance(cache, expected):
        article = "an" if expected.__name__[0] in "AEIOU" else "a"
        raise TypeError(
            f"{name} must be {article} {expected.__name__}, received {type(cache).__name__}: make one with {make}"
        )
