"""``run_with_cache`` and the cache-size estimate: keep exactly the activations asked for, each buffer once.

A model that mixes in ``CachingMixin`` (beside ``HookedRootModule``) gets
``run_with_cache``, ``hook_shapes`` and ``estimate_cache_bytes``. What is kept of each
activation is decided by ``_ActivationKeeper``; ``held_bytes`` counts the memory it holds.
"""

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from interp_transformer.cache.activations import ActivationCache, held_bytes, storage_id
from interp_transformer.hooks import HookFn, HookPoint, NameFilter


def check_storage_dtype(dtype: torch.dtype | None) -> torch.dtype | None:
    """``dtype`` if it can store activations: a floating torch dtype (or None, keep each one's own)."""
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(
            f"dtype must be a floating torch dtype (e.g. torch.bfloat16) or None, got {dtype!r}: "
            "storing activations as integers would truncate every value"
        )
    return dtype


def check_device(device) -> torch.device | None:
    """``device`` as a ``torch.device`` (None stays None); ``ValueError`` naming what came for anything else."""
    if device is None:
        return None
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device must be a torch device or its name (e.g. 'cpu', 'cuda:0'), got {device!r}") from error


class _ActivationKeeper:
    """What ``run_with_cache`` keeps of each activation, and nothing more.

    An activation is kept without a copy when it is exactly its buffer; it is copied
    when ``device`` or ``dtype`` asks for it, or when it is a view into a larger buffer
    or a broadcast view. A buffer seen under several hook
    names (``blocks.0.hook_resid_post`` is ``blocks.1.hook_resid_pre``) is copied once
    and shared, so converting a cache never duplicates storage.
    """

    def __init__(self, device, dtype: torch.dtype | None, remove_batch_dim: bool, force_copy: bool = False):
        self.device = check_device(device)
        self.dtype = check_storage_dtype(dtype)
        self.remove_batch_dim = remove_batch_dim
        self.force_copy = force_copy  # the meta-device dry run of a copy to another device
        self.kept: dict[str, torch.Tensor] = {}
        # view -> (source, copy); the source is held so that no new buffer reuses its address mid-run
        self._copies: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def hook(self, suffix: str) -> HookFn:
        def keep(tensor: torch.Tensor, hook: HookPoint) -> None:
            self.kept[hook.name + suffix] = self._keep(tensor, hook.name)

        return keep

    def _keep(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        kept = tensor.detach()
        if self.remove_batch_dim:
            if kept.shape[0] != 1:
                raise ValueError(f"remove_batch_dim=True needs a batch of one, {name} has batch {kept.shape[0]}")
            kept = kept[0]
        dtype = self.dtype if (self.dtype is not None and kept.is_floating_point()) else kept.dtype
        device = self.device if self.device is not None else kept.device
        # a view that is not exactly its buffer is copied: a slice would keep a larger buffer
        # alive, and a broadcast view of a weight (the positional embedding) would change
        # with the weight instead of recording this run
        owns_buffer = kept.untyped_storage().nbytes() == kept.numel() * kept.element_size()
        if owns_buffer and not self.force_copy and dtype == kept.dtype and device == kept.device:
            return kept
        view = (storage_id(kept), kept.storage_offset(), tuple(kept.shape), kept.stride(), kept.dtype)
        if view not in self._copies:
            self._copies[view] = (kept, kept.to(device=device, dtype=dtype, copy=True))
        return self._copies[view][1]


class CachingMixin:
    """``run_with_cache`` and the cache-size estimate, for a ``HookedRootModule`` model."""

    if TYPE_CHECKING:  # a mixin of the model class: it reads that class's attributes and calls its forward

        def __getattr__(self, name: str) -> Any: ...

        def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    cache_class = ActivationCache  # what run_with_cache returns (the compatibility layer's keeps TransformerLens' ways)

    def run_with_cache(
        self,
        *model_args,
        names_filter: NameFilter = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        remove_batch_dim: bool = False,
        incl_bwd: bool = False,
        backward_metric: Callable[[torch.Tensor], torch.Tensor] | None = None,
        **model_kwargs,
    ):
        """Run the model and keep the activations ``names_filter`` selects.

        Returns ``(output, cache)``. Only the selected activations are kept, each
        buffer once (see ``_ActivationKeeper``): ``device`` and ``dtype`` choose where
        and how the cache stores them (e.g. ``dtype=torch.bfloat16`` halves a float32
        run's cache). With ``incl_bwd`` the run calls backward on
        ``backward_metric(output)`` (default: the mean next-token loss) and also caches
        gradients as ``<name>_grad``.
        """
        names = self.resolve_hook_names(names_filter)
        keeper = _ActivationKeeper(device, dtype, remove_batch_dim)
        fwd = [(name, keeper.hook("")) for name in names]
        bwd = [(name, keeper.hook("_grad")) for name in names] if incl_bwd else []
        with self.hooks(fwd, bwd):
            if incl_bwd:
                with torch.enable_grad():
                    output = self(*model_args, **model_kwargs)
                    metric = (
                        backward_metric(output)
                        if backward_metric is not None
                        else self.default_backward_metric(output, model_args)
                    )
                    if not isinstance(metric, torch.Tensor) or not metric.requires_grad:
                        raise TypeError(
                            "backward_metric must return a scalar tensor computed from the output (so that it "
                            f"can be differentiated), got {type(metric).__name__} {metric!r:.60}"
                        )
                    if metric.numel() != 1:
                        raise ValueError(f"backward_metric must return a scalar, got shape {tuple(metric.shape)}")
                    # gradients flow into the hooked activations only: the model's .grad stay as they were
                    params = [p for p in self.parameters() if p.requires_grad]
                    grads_before = [p.grad for p in params]
                    metric.backward()
                    for param, grad in zip(params, grads_before, strict=True):
                        param.grad = grad
                output = output.detach()
            else:
                output = self(*model_args, **model_kwargs)
        store = keeper.kept
        ordered = {name + s: store[name + s] for s in ("", "_grad") for name in names if name + s in store}
        return output, self.cache_class(ordered, self, has_batch_dim=not remove_batch_dim)

    def _meta_forward(self, batch: int, pos: int, hooks: list) -> None:
        """Run the model with ``hooks`` on PyTorch's ``meta`` device: shapes only, no compute."""
        params = {name: torch.empty_like(p, device="meta") for name, p in self.named_parameters()}
        buffers = {name: torch.empty_like(b, device="meta") for name, b in self.named_buffers()}
        tokens = torch.zeros(batch, pos, dtype=torch.long, device="meta")
        with self.hooks(hooks):
            torch.func.functional_call(self, {**params, **buffers}, (tokens,))  # type: ignore[arg-type]  # an nn.Module

    def hook_shapes(self, batch: int, pos: int) -> dict[str, tuple[int, ...]]:
        """Shape of every hook's activation for a ``[batch, pos]`` input, in forward order.

        Found by running the model on PyTorch's ``meta`` device: exact, and no compute.
        """
        shapes: dict[str, tuple[int, ...]] = {}

        def record(tensor: torch.Tensor, hook: HookPoint) -> None:
            shapes[hook.name] = tuple(tensor.shape)

        self._meta_forward(batch, pos, [(lambda name: True, record)])
        return shapes

    def estimate_cache_bytes(
        self,
        batch: int,
        pos: int,
        names_filter: NameFilter = None,
        dtype: torch.dtype | None = None,
        device: str | torch.device | None = None,
        remove_batch_dim: bool = False,
    ) -> int:
        """Bytes ``run_with_cache`` will hold for a ``[batch, pos]`` input, before running it.

        Exact: the same keeping rules run on PyTorch's ``meta`` device, and the result
        equals ``cache.nbytes()`` of the real run with the same arguments.
        """
        names = self.resolve_hook_names(names_filter)
        moves = device is not None and check_device(device) != next(self.parameters()).device
        keeper = _ActivationKeeper(None, dtype, remove_batch_dim, force_copy=moves)
        self._meta_forward(batch, pos, [(name, keeper.hook("")) for name in names])
        return held_bytes(keeper.kept.values())
