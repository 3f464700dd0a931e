"""ActivationCache: the activations of one run, addressable by full or short names.

Short keys go through the model's explicit name table (``model.hook_names``, no regular
expressions): ``cache["pattern", 0]`` is ``blocks.0.attn.hook_pattern``,
``cache["resid_pre", -1]`` the last block's input, ``cache["normalized", 0, "ln1"]`` the
first LayerNorm's output, ``cache["scale"]`` the final norm's scale. TransformerLens'
spellings work too: ``cache["k6a"]`` (``("k", 6, "a")``), ``cache["scale4ln1"]``.

``cache["result", L]`` is each head's write to the residual stream, ``z_h W_O[h]``
``[batch, pos, head_index, d_model]``, computed on demand from the cached ``z`` and the
model's ``W_O`` (or read from ``hook_result`` where a model hooks it); nothing in the
forward pass changes to provide it. ``compute_head_results()`` stores it for every layer.

The residual-stream tools (``accumulated_resid``, ``decompose_resid``, ``stack_head_results``,
``stack_neuron_results``, ``get_full_resid_decomposition``, ``apply_ln_to_stack``,
``logit_attrs``) live in ``interp_transformer.cache.residual_stacks``. What applies is decided by
the model's capabilities (``model.capabilities``), never by its class.
"""

import difflib
import functools
import logging
from collections.abc import Iterable, Iterator

import einops
import torch
from torch import Tensor

from interp_transformer.cache.residual_norms import ResidualNorms
from interp_transformer.cache.residual_stacks import ResidualStacks
from interp_transformer.hooks.names import ALIASES, split_compact_name
from interp_transformer.hooks.slices import Slice, SliceInput


def storage_id(tensor: torch.Tensor) -> int:
    # the address of the storage object; views and aliases of one buffer share it (also on "meta")
    return tensor.untyped_storage()._cdata


def held_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors``: the memory that keeping them costs.

    A tensor stored under two names, or two views of one buffer, count once; a small
    view that keeps a large buffer alive counts the whole buffer.
    """
    storages = {storage_id(t): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


class ActivationCache:
    """Activations of one forward pass, keyed by hook name, with residual-stream tools."""

    stacks_class = ResidualStacks

    def __init__(self, cache_dict: dict[str, Tensor], model, has_batch_dim: bool = True):
        self.cache_dict = cache_dict
        self.model = model
        self.has_batch_dim = has_batch_dim
        self.residual = self.stacks_class(self)  # the residual-stream tools, forwarded below by TransformerLens' names

    @property
    def has_embed(self) -> bool:
        return "hook_embed" in self.cache_dict

    @property
    def has_pos_embed(self) -> bool:
        return "hook_pos_embed" in self.cache_dict

    # --- access -----------------------------------------------------------------------
    def _full_name(self, key) -> str:
        if isinstance(key, str):
            if key in self.cache_dict or key in self.model.hook_dict:
                return key
            names = self.model.hook_names
            short = ALIASES.get(key, key)
            if short in names.global_keys or short in names.unavailable:
                return self.model.act_name(key)  # the model's table, or its advice where it lacks the key
            compact = split_compact_name(key)  # TransformerLens' "k6a", "scale4ln1"
            if compact is not None and ALIASES.get(compact[0], compact[0]) in names.layer_keys:
                return self.model.act_name(*compact)
            return key  # not a short name: reported as an unknown activation
        if isinstance(key, tuple) and 1 <= len(key) <= 3:
            if len(key) == 3 and key[2] is None:  # TransformerLens passes an explicit None layer_type
                key = key[:2]
            return self.model.act_name(*key)
        raise KeyError(f"cache keys are a hook name or (short_name, layer[, sub-layer]), got {key!r}")

    def _has_hook(self, name: str, layer: int) -> bool:
        """Whether the model has the short-named hook in block ``layer`` (an attention-only block has no MLP)."""
        return self.model.act_name(name, layer) in self.model.hook_dict

    def __getitem__(self, key) -> Tensor:
        name = self._full_name(key)
        if name in self.cache_dict:
            return self.cache_dict[name]
        layer = self._result_layer(name)
        if layer is not None:
            return self._head_results(layer)
        if name in self.model.hook_dict:
            raise KeyError(
                f"{name!r} was not cached; run_with_cache(..., names_filter=...) must include it "
                f"(cached: {len(self.cache_dict)} hooks)"
            )
        close = difflib.get_close_matches(name, list(self.cache_dict), n=3, cutoff=0.5)
        if isinstance(key, tuple) and len(key) >= 2 and isinstance(key[1], int):  # a valid name the block lacks
            block = (
                type(self.model.blocks[key[1]]).__name__
                if -len(self.model.blocks) <= key[1] < len(self.model.blocks)
                else None
            )
            if block is not None:
                raise KeyError(
                    f"this model has no {name!r}: block {key[1]} is a {block}, which computes no {key[0]!r} "
                    f"(see docs/conventions.md); closest: {close}"
                )
        raise KeyError(f"no activation named {name!r}; closest: {close}")

    def __contains__(self, key) -> bool:
        try:
            return self._full_name(key) in self.cache_dict
        except KeyError:
            return False

    def __len__(self) -> int:
        return len(self.cache_dict)

    def __iter__(self) -> Iterator[str]:
        return iter(self.cache_dict)

    def keys(self):
        return self.cache_dict.keys()

    def values(self):
        return self.cache_dict.values()

    def items(self):
        return self.cache_dict.items()

    def __repr__(self) -> str:
        return f"ActivationCache({len(self)} activations, {self.nbytes() / 2**20:.1f} MiB)"

    def nbytes(self) -> int:
        """Bytes held by the cached tensors: each buffer once, however many names share it."""
        return held_bytes(self.cache_dict.values())

    # --- per-head results, computed from z and W_O ------------------------------------------
    def _result_layer(self, name: str) -> int | None:
        """The block whose per-head results ``name`` names, when the model's table has them; else None."""
        if "result" not in self.model.hook_names.layer_keys:
            return None
        for layer in range(self.model.cfg.n_layers):
            if self.model.act_name("result", layer) == name:
                return layer
        return None

    def _head_results(self, layer: int) -> Tensor:
        """``z_h W_O[h]`` of block ``layer``: ``[batch, pos, head_index, d_model]`` (no ``b_O``)."""
        name = self.model.act_name("result", layer)
        if name in self.cache_dict:
            return self.cache_dict[name]
        z_name = self.model.act_name("z", layer)
        if z_name not in self.cache_dict:
            raise KeyError(
                f"{name!r}: the per-head results are computed from {z_name!r}, which was not cached; "
                "run_with_cache(..., names_filter=...) must include it"
            )
        W_O = self.model.blocks[layer].attn.W_O
        z = self.cache_dict[z_name]
        return einops.einsum(
            z, W_O.to(z.dtype), "... head_index d_head, head_index d_head d_model -> ... head_index d_model"
        )

    def compute_head_results(self) -> None:
        """Store ``cache["result", L]`` for every block (computed from ``z`` and ``W_O``), as TransformerLens does."""
        first = self.model.act_name("result", 0)
        if first in self.cache_dict:
            logging.warning("Tried to compute head results when they were already cached")
            return
        for layer in range(self.model.cfg.n_layers):
            self.cache_dict[self.model.act_name("result", layer)] = self._head_results(layer)

    # --- batch axis, device, dtype ------------------------------------------------------------
    def to(self, device: str | torch.device | None = None, dtype: torch.dtype | None = None) -> "ActivationCache":
        """A copy of the cache on another device and/or in another dtype."""
        moved = {k: v.to(device=device, dtype=dtype if v.is_floating_point() else None) for k, v in self.items()}
        return type(self)(moved, self.model, self.has_batch_dim)

    def remove_batch_dim(self) -> "ActivationCache":
        """Drop the batch axis of a batch of one, in place (as TransformerLens does); returns the cache itself.

        Every activation must have batch 1 (``ValueError`` otherwise, and nothing changes).
        A cache whose batch axis is already gone is left as it is.
        """
        if not self.has_batch_dim:
            logging.warning("Tried removing batch dimension after already having removed it.")
            return self
        for name, t in self.items():
            if t.shape[0] != 1:
                raise ValueError(f"remove_batch_dim needs batch size 1, {name} has batch {t.shape[0]}")
        for name in list(self.cache_dict):
            self.cache_dict[name] = self.cache_dict[name][0]
        self.has_batch_dim = False
        return self

    def apply_slice_to_batch_dim(self, batch_slice: Slice | SliceInput) -> "ActivationCache":
        """A new cache holding the batch rows ``batch_slice`` selects (an int removes the batch axis)."""
        batch_slice = Slice(batch_slice)
        if not self.has_batch_dim and batch_slice.mode != "identity":
            raise ValueError("Cannot index into a cache without a batch dim")
        kept = {name: batch_slice.apply(t, dim=0) for name, t in self.items()}
        return type(self)(kept, self.model, has_batch_dim=self.has_batch_dim and not batch_slice.removes_axis)

    def toggle_autodiff(self, mode: bool = False) -> None:
        """``torch.set_grad_enabled(mode)``: global state, as in TransformerLens (prefer ``torch.inference_mode()``)."""
        logging.warning("Changed the global state, set autodiff to %s", mode)
        torch.set_grad_enabled(mode)


def _forwarded(tool):
    """``ActivationCache.<name>``: the residual-stream tool of the same name, on this cache."""

    @functools.wraps(tool)
    def method(self, *args, **kwargs):
        holder = self.residual if tool.__qualname__.startswith("ResidualStacks.") else self.residual.norms
        return tool(holder, *args, **kwargs)

    return method


RESIDUAL_TOOLS = (
    ResidualStacks.accumulated_resid,
    ResidualStacks.decompose_resid,
    ResidualStacks.stack_head_results,
    ResidualStacks.stack_activation,
    ResidualStacks.get_neuron_results,
    ResidualStacks.stack_neuron_results,
    ResidualStacks.get_full_resid_decomposition,
    ResidualNorms.apply_ln_to_stack,
    ResidualNorms.logit_attrs,
)
for _tool in RESIDUAL_TOOLS:
    setattr(ActivationCache, _tool.__name__, _forwarded(_tool))

__all__ = ["ActivationCache", "held_bytes", "storage_id"]
