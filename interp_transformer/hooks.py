"""Hook points: named identity modules where activations can be read or replaced.

A ``HookPoint`` returns its input unchanged. Its name is its path in the model
(``blocks.0.attn.hook_pattern``), set by ``HookedRootModule.setup()`` from
``named_modules()``. A hook function receives ``(activation, hook)`` and returns
``None`` (keep the activation) or a replacement tensor of the same shape.

Forward hooks run on the activation; backward hooks run on the gradient that
flows back into it and may replace that gradient.
"""

import contextlib
import difflib
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Literal, Optional, Sequence, Union

import torch
from torch import nn

HookFn = Callable[..., Optional[torch.Tensor]]
NameFilter = Union[None, str, Sequence[str], Callable[[str], bool]]
Direction = Literal["fwd", "bwd"]


@dataclass
class _Hook:
    """One hook function attached to one hook point."""

    fn: HookFn
    direction: Direction
    is_permanent: bool
    handle: torch.utils.hooks.RemovableHandle
    tensor_handles: list  # handles of per-forward gradient hooks (backward hooks only)

    def remove(self, keep_grad_hooks: bool = False) -> None:
        """Detach from the hook point. ``keep_grad_hooks`` leaves the gradient hooks already
        attached to past forwards' tensors in place (they go away with those tensors)."""
        self.handle.remove()
        if not keep_grad_hooks:
            for handle in self.tensor_handles:
                handle.remove()
        self.tensor_handles.clear()


class HookPoint(nn.Module):
    """An identity module with a name, where hook functions can be attached."""

    def __init__(self) -> None:
        super().__init__()
        self.name: Optional[str] = None
        self._hooks: list[_Hook] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def add_hook(self, fn: HookFn, dir: Direction = "fwd", is_permanent: bool = False) -> _Hook:
        """Attach ``fn(activation, hook) -> Tensor | None``; returns a handle with ``.remove()``."""
        if not callable(fn):
            raise TypeError(f"hook function for {self.name} must be callable, got {type(fn).__name__}")
        if dir not in ("fwd", "bwd"):
            raise ValueError(f"dir must be 'fwd' or 'bwd', got {dir!r}")
        tensor_handles: list = []
        if dir == "fwd":
            handle = self.register_forward_hook(lambda module, inputs, output: self._call(fn, output))
        else:

            def register_grad_hook(module, inputs, output):
                if output.requires_grad:
                    tensor_handles.append(output.register_hook(lambda grad: self._call(fn, grad)))

            handle = self.register_forward_hook(register_grad_hook)
        hook = _Hook(fn, dir, is_permanent, handle, tensor_handles)
        self._hooks.append(hook)
        return hook

    def _call(self, fn: HookFn, tensor: torch.Tensor) -> Optional[torch.Tensor]:
        result = fn(tensor, hook=self)
        if result is None:
            return None
        if not isinstance(result, torch.Tensor):
            raise TypeError(
                f"hook {getattr(fn, '__name__', fn)!r} on {self.name} must return a Tensor or None, "
                f"got {type(result).__name__}"
            )
        if result.shape != tensor.shape:
            raise ValueError(
                f"hook {getattr(fn, '__name__', fn)!r} on {self.name} returned shape {tuple(result.shape)}, "
                f"expected {tuple(tensor.shape)} (a replacement must keep the activation's shape)"
            )
        return result

    def remove_hooks(self, dir: Literal["fwd", "bwd", "both"] = "both", including_permanent: bool = False) -> None:
        keep = []
        for hook in self._hooks:
            if (dir in ("both", hook.direction)) and (including_permanent or not hook.is_permanent):
                hook.remove()
            else:
                keep.append(hook)
        self._hooks = keep

    def remove_hook(self, hook: _Hook, keep_grad_hooks: bool = False) -> None:
        hook.remove(keep_grad_hooks)
        self._hooks = [h for h in self._hooks if h is not hook]

    def has_hooks(self, dir: Literal["fwd", "bwd", "both"] = "both") -> bool:
        return any(dir in ("both", h.direction) for h in self._hooks)

    def extra_repr(self) -> str:
        return f"name={self.name!r}, hooks={len(self._hooks)}"


class HookedRootModule(nn.Module):
    """Base class of hooked models: finds hook points by name and attaches hooks safely.

    Call ``self.setup()`` at the end of ``__init__`` to name every ``HookPoint``.
    """

    hook_dict: dict[str, HookPoint]

    def setup(self) -> None:
        self.hook_dict = {}
        for name, module in self.named_modules():
            if isinstance(module, HookPoint):
                module.name = name
                self.hook_dict[name] = module

    def hook_points(self) -> list[HookPoint]:
        return list(self.hook_dict.values())

    def resolve_hook_names(self, names_filter: NameFilter) -> list[str]:
        """The hook names a filter selects: None (all), a name, a list of names, or a predicate.

        Unknown names raise ``KeyError`` with the closest valid names; a predicate or
        list that selects nothing raises ``ValueError``.
        """
        if names_filter is None:
            return list(self.hook_dict)
        if isinstance(names_filter, str):
            names_filter = [names_filter]
        if callable(names_filter):
            selected = [name for name in self.hook_dict if names_filter(name)]
            if not selected:
                raise ValueError(
                    f"the filter {getattr(names_filter, '__name__', names_filter)!r} matched no hook point; "
                    f"hook names look like {list(self.hook_dict)[:3]}"
                )
            return selected
        if not isinstance(names_filter, (list, tuple, set)):
            raise TypeError(
                f"names_filter must be None, a str, a list of str or a callable, got {type(names_filter).__name__}"
            )
        names = list(names_filter)
        if not names:
            raise ValueError("names_filter is an empty list: it would select no hook point")
        for name in names:
            self._check_hook_name(name)
        wanted = set(names)
        return [name for name in self.hook_dict if name in wanted]

    def _check_hook_name(self, name: str) -> None:
        if not isinstance(name, str):
            raise TypeError(f"hook names are str, got {type(name).__name__}: {name!r}")
        if name not in self.hook_dict:
            close = difflib.get_close_matches(name, self.hook_dict, n=3, cutoff=0.5)
            raise KeyError(f"no hook point named {name!r}; closest: {close}")

    def add_hook(
        self,
        name: Union[str, Callable[[str], bool]],
        fn: HookFn,
        dir: Direction = "fwd",
        is_permanent: bool = False,
    ) -> list[_Hook]:
        """Attach ``fn`` to the hook point ``name``, or to every hook point a predicate selects."""
        return [self.hook_dict[n].add_hook(fn, dir, is_permanent) for n in self.resolve_hook_names(name)]

    def reset_hooks(
        self, including_permanent: bool = False, direction: Literal["fwd", "bwd", "both"] = "both"
    ) -> None:
        """Remove hooks from every hook point (permanent ones only if asked)."""
        for hook_point in self.hook_dict.values():
            hook_point.remove_hooks(direction, including_permanent)

    @contextlib.contextmanager
    def hooks(
        self,
        fwd_hooks: Iterable[tuple] = (),
        bwd_hooks: Iterable[tuple] = (),
        *,
        keep_grad_hooks: bool = False,
    ) -> Iterator["HookedRootModule"]:
        """Attach ``(name_or_predicate, fn)`` hooks for the body of a ``with`` block.

        Exactly the hooks added here are removed on exit, also when the body raises.
        Backward hooks fire on a ``.backward()`` called inside the block; with
        ``keep_grad_hooks=True`` they also fire on a later backward through the tensors
        of forwards run inside the block (no forward after exit gets them).
        """
        added: list[tuple[HookPoint, _Hook]] = []
        try:
            for direction, pairs in (("fwd", fwd_hooks), ("bwd", bwd_hooks)):
                for pair in pairs:
                    if not (isinstance(pair, tuple) and len(pair) == 2):
                        raise TypeError(f"{direction}_hooks entries must be (name_or_predicate, fn) pairs, got {pair!r}")
                    name, fn = pair
                    for hook_name in self.resolve_hook_names(name):
                        hook_point = self.hook_dict[hook_name]
                        added.append((hook_point, hook_point.add_hook(fn, direction)))
            yield self
        finally:
            for hook_point, hook in added:
                hook_point.remove_hook(hook, keep_grad_hooks)

    def run_with_hooks(self, *model_args, fwd_hooks: Iterable[tuple] = (), bwd_hooks: Iterable[tuple] = (), **model_kwargs):
        """Run the model once with temporary hooks.

        Every hook point is clean when this returns. Backward hooks stay attached to the
        tensors of this one run, so they fire when you call ``.backward()`` on a loss
        computed from the returned output (and never on another run).
        """
        with self.hooks(fwd_hooks, bwd_hooks, keep_grad_hooks=True):
            return self(*model_args, **model_kwargs)
