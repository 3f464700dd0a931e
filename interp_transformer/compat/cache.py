"""TransformerLens' ``ActivationCache``: ours, with TransformerLens' remainder at ``layer=0`` and its error classes.

``HookedTransformer.run_with_cache`` returns this cache (``HookedTransformer.cache_class``).
It is the core ``ActivationCache`` (``interp_transformer.cache.activations``) with two of
TransformerLens' conventions:

- ``stack_head_results(layer=0, incl_remainder=True)`` and ``stack_neuron_results(layer=0,
  incl_remainder=True)``: TransformerLens takes the remainder of ``resid_post`` at ``layer - 1``,
  which for ``layer=0`` wraps to the last block's output, so the stack is
  ``["remainder"]`` = the final residual stream (the core cache's remainder there is the input
  of block 0, the embeddings). For every ``layer >= 1`` the two agree;
- bad input raises ``CompatValueError``/``CompatKeyError`` (also ``AssertionError``, as
  TransformerLens asserts), with the core's messages (``compat.errors``).
"""

from torch import Tensor

from interp_transformer.cache.activations import RESIDUAL_TOOLS
from interp_transformer.cache.activations import ActivationCache as CoreActivationCache
from interp_transformer.cache.residual_stacks import ResidualStacks
from interp_transformer.compat.errors import assertion_compatible_methods


class TransformerLensStacks(ResidualStacks):
    """The residual-stream tools with TransformerLens' remainder: ``layer=0`` completes the final residual stream."""

    def _remainder_of(self, layer: int) -> Tensor:
        # TransformerLens reads resid_post at layer - 1: layer 0 wraps to the last block's output
        return self._residual_at(self.model.cfg.n_layers if layer == 0 else layer)


class ActivationCache(CoreActivationCache):
    """The core ``ActivationCache`` with TransformerLens' conventions (see the module docstring)."""

    stacks_class = TransformerLensStacks


assertion_compatible_methods(
    ActivationCache,
    ["__getitem__", "remove_batch_dim", "apply_slice_to_batch_dim", "compute_head_results", "to"]
    + [tool.__name__ for tool in RESIDUAL_TOOLS],
)

__all__ = ["ActivationCache", "TransformerLensStacks"]
