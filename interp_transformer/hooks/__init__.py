"""Hook points: named identity modules where activations can be read or replaced.

A ``HookPoint`` returns its input unchanged unless a hook replaces it. Its name is its
path in the model (``blocks.0.attn.hook_pattern``), set by ``HookedRootModule.setup()``
from ``named_modules()``. A hook function receives ``(activation, hook)`` and returns
``None`` (keep the activation) or a replacement tensor of the same shape, dtype and
device. Forward hooks run on the activation; backward hooks run on the gradient that
flows back into it and may replace that gradient.

Two kinds of hooks, one rule for each:

- hooks added with ``add_hook`` (and permanent hooks) belong to the hook point: every
  thread's forward runs them, until ``remove_hooks``/``reset_hooks``;
- hooks of a ``with model.hooks(...)`` block (and so of ``run_with_hooks`` and
  ``run_with_cache``) belong to the thread that opened the block: another thread
  running the same model at the same time neither runs nor sees them, so two threads
  can hook and cache one model at once. They appear all at once when the block opens
  and disappear all at once when it closes (also when it raises or is interrupted).

Hooks are applied by the hook point itself, not registered as torch module hooks, so
adding or removing one is a single list operation: nothing can be left half-recorded.
``reset_hooks`` also clears torch-level hooks that code registered on a hook point
directly (``register_forward_hook``), so it always leaves the point clean.

The TransformerLens spellings work too: ``hook.layer()``, ``hook.ctx``,
``add_perma_hook``, ``fwd_hooks``/``bwd_hooks``, ``remove_all_hook_fns``, ``mod_dict``,
``level`` and ``prepend`` when adding, ``reset_hooks_end`` and ``clear_contexts`` on
``hooks``/``run_with_hooks``; TransformerLens 3's ``model.list_hooks()`` (``introspection``),
``LensHandle.user_hook`` and ``HookPoint``'s repr. ``interp_transformer.hook_points`` is this
module under TransformerLens' name.
"""

import contextlib
import difflib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

# TransformerLens' hook_points names
from interp_transformer.hooks.introspection import HookIntrospectionMixin, NamesFilter  # noqa: F401
from interp_transformer.hooks.thread_state import _THREAD, forget_parts, hook_frames, remove_tool_hooks

HookFn = Callable[..., torch.Tensor | None]
NameFilter = NamesFilter  # None, a name, a list of names, or a predicate on names
Direction = Literal["fwd", "bwd"]

_frames = hook_frames  # the open ``hooks()`` blocks of this thread (``_THREAD.frames``), innermost last


@dataclass(eq=False)
class _Hook:
    """One hook function attached to one hook point."""

    fn: HookFn
    direction: Direction
    is_permanent: bool = False
    level: int | None = None  # the context level it was added at (TransformerLens' context_level)
    tensor_handles: list = field(default_factory=list)  # gradient hooks on past forwards' tensors (bwd only)

    def remove_tensor_hooks(self) -> None:
        for handle in self.tensor_handles:
            handle.remove()
        self.tensor_handles.clear()

    # TransformerLens' LensHandle spellings
    @property
    def context_level(self) -> int | None:
        return self.level

    @property
    def user_hook(self) -> HookFn:
        """The function that was added (TransformerLens 3's ``LensHandle.user_hook``)."""
        return self.fn

    def remove(self, keep_grad_hooks: bool = False) -> None:
        """Detach the gradient hooks of past forwards (unless ``keep_grad_hooks``); the hook point drops the hook."""
        if not keep_grad_hooks:
            self.remove_tensor_hooks()


class HookPoint(nn.Module):
    """An identity module with a name, where hook functions can be attached."""

    def __init__(self) -> None:
        super().__init__()
        # None until the model's setup() names it; every hook and every reader of a part's hook names comes after
        # that, so the name is typed as the str they read
        self.name: str = None  # type: ignore[assignment]
        self._hooks: list[_Hook] = []  # seen by every thread
        self.ctx: dict = {}  # free space for hook functions to share state (TransformerLens' hook.ctx)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for hook in self.active_hooks():
            x = self._run(hook, x)
        return x

    def active_hooks(self) -> list[_Hook]:
        """The hooks this thread's forward runs here, in order: the hook point's own, then its open blocks'."""
        frames = getattr(_THREAD, "frames", None)
        if not frames:
            return self._hooks
        local = [hook for frame in frames for hook in frame.get(id(self), ())]
        return self._hooks + local if local else self._hooks

    def _run(self, hook: _Hook, x: torch.Tensor) -> torch.Tensor:
        if hook.direction == "fwd":
            result = self._call(hook.fn, x)
            return x if result is None else result
        if x.requires_grad:
            hook.tensor_handles.append(x.register_hook(lambda grad: self._call(hook.fn, grad, backward=True)))
        return x

    def _call(self, fn: HookFn, tensor: torch.Tensor, backward: bool = False) -> torch.Tensor | None:
        result = fn(tensor, hook=self)
        if backward and isinstance(result, tuple) and len(result) == 1:
            result = result[0]  # TransformerLens' backward hooks may return (grad,), as torch's module hooks do
        if result is None:
            return None
        name = getattr(fn, "__name__", fn)
        if not isinstance(result, torch.Tensor):
            raise TypeError(f"hook {name!r} on {self.name} must return a Tensor or None, got {type(result).__name__}")
        if result.shape != tensor.shape:
            raise ValueError(
                f"hook {name!r} on {self.name} returned shape {tuple(result.shape)}, "
                f"expected {tuple(tensor.shape)} (a replacement must keep the activation's shape)"
            )
        if result.dtype != tensor.dtype or result.device != tensor.device:
            raise ValueError(
                f"hook {name!r} on {self.name} returned a {result.dtype} tensor on {result.device}, expected "
                f"{tensor.dtype} on {tensor.device} (a replacement must keep the activation's dtype and device)"
            )
        return result

    @staticmethod
    def _new_hook(fn: HookFn, dir: Direction, is_permanent: bool = False, level: int | None = None) -> _Hook:
        if not callable(fn):
            raise TypeError(f"a hook function must be callable, got {type(fn).__name__}")
        if dir not in ("fwd", "bwd"):
            raise ValueError(f"dir must be 'fwd' or 'bwd', got {dir!r}")
        return _Hook(fn, dir, is_permanent, level)

    def add_hook(
        self,
        fn: HookFn,
        dir: Direction = "fwd",
        is_permanent: bool = False,
        level: int | None = None,
        prepend: bool = False,
    ) -> _Hook:
        """Attach ``fn(activation, hook) -> Tensor | None`` for every thread; returns the hook (``remove_hook`` takes
        it).

        ``prepend`` runs it before the hooks already here; ``level`` tags it for
        ``remove_hooks(level=...)``.
        """
        hook = self._new_hook(fn, dir, is_permanent, level)
        self._hooks = [hook] + self._hooks if prepend else self._hooks + [hook]
        return hook

    def add_perma_hook(self, fn: HookFn, dir: Direction = "fwd") -> _Hook:
        """A hook that ``reset_hooks()`` keeps (``reset_hooks(including_permanent=True)`` removes it)."""
        return self.add_hook(fn, dir, is_permanent=True)

    def remove_hooks(
        self,
        dir: Literal["fwd", "bwd", "both"] = "both",
        including_permanent: bool = False,
        level: int | None = None,
    ) -> None:
        """Remove this point's hooks of direction ``dir`` (permanent ones only if asked; only ``level``'s if given)."""
        if dir not in ("fwd", "bwd", "both"):
            raise ValueError(f"dir must be 'fwd', 'bwd' or 'both', got {dir!r}")

        def removed(hook: _Hook) -> bool:
            return (
                dir in ("both", hook.direction)
                and (including_permanent or not hook.is_permanent)
                and (level is None or hook.level == level)
            )

        gone = [hook for hook in self._hooks if removed(hook)]
        self._hooks = [hook for hook in self._hooks if not removed(hook)]
        for hook in gone:
            hook.remove()

    def remove_hook(self, hook: _Hook, keep_grad_hooks: bool = False) -> None:
        self._hooks = [h for h in self._hooks if h is not hook]
        hook.remove(keep_grad_hooks)

    def remove_torch_hooks(self) -> None:
        """Clear hooks registered on this module through torch directly (``register_forward_hook`` and friends)."""
        for hooks in (self._forward_hooks, self._forward_pre_hooks, self._backward_hooks, self._backward_pre_hooks):
            hooks.clear()

    def has_hooks(
        self, dir: Literal["fwd", "bwd", "both"] = "both", including_permanent: bool = True, level: int | None = None
    ) -> bool:
        """Whether this thread's forward runs a hook of direction ``dir`` here (permanent ones only if asked; only
        ``level``'s if given)."""
        if dir not in ("fwd", "bwd", "both"):
            raise ValueError(f"dir must be 'fwd', 'bwd' or 'both', got {dir!r}")
        return any(
            dir in ("both", hook.direction)
            and (including_permanent or not hook.is_permanent)
            and (level is None or hook.level == level)
            for hook in self.active_hooks()
        )

    @property
    def fwd_hooks(self) -> list[_Hook]:
        return [hook for hook in self.active_hooks() if hook.direction == "fwd"]

    @property
    def bwd_hooks(self) -> list[_Hook]:
        return [hook for hook in self.active_hooks() if hook.direction == "bwd"]

    def clear_context(self) -> None:
        self.ctx = {}

    def layer(self) -> int:
        """The block index in the name (``blocks.3.attn.hook_z`` -> 3); ``ValueError`` for a hook outside the blocks."""
        parts = (self.name or "").split(".")
        index = next((i for i, part in enumerate(parts[:-1]) if part == "blocks"), None)
        if index is None or not parts[index + 1].isdigit():
            raise ValueError(f"hook point {self.name!r} is not inside a block, so it has no layer")
        return int(parts[index + 1])

    def extra_repr(self) -> str:
        """TransformerLens 3's repr: ``HookPoint(name='blocks.0.hook_resid_pre', 2 fwd)``; ``HookPoint()`` when bare."""
        counts = [f"{len(hooks)} {kind}" for kind, hooks in (("fwd", self.fwd_hooks), ("bwd", self.bwd_hooks)) if hooks]
        return ", ".join(([f"name={self.name!r}"] if self.name is not None else []) + counts)


LensHandle = _Hook  # TransformerLens' name of an attached hook (``user_hook``, ``is_permanent``, ``context_level``)


class HookedRootModule(HookIntrospectionMixin, nn.Module):
    """Base class of hooked models: finds hook points by name and attaches hooks safely.

    Call ``self.setup()`` at the end of ``__init__`` to name every ``HookPoint``.
    """

    hook_dict: dict[str, HookPoint]

    def setup(self) -> None:
        self.hook_dict = {}
        self.mod_dict = {}
        for name, module in self.named_modules():
            if name:
                self.mod_dict[name] = module
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
        name: str | Callable[[str], bool],
        fn: HookFn,
        dir: Direction = "fwd",
        is_permanent: bool = False,
        level: int | None = None,
        prepend: bool = False,
    ) -> list[_Hook]:
        """Attach ``fn`` to the hook point ``name``, or to every hook point a predicate selects (every thread runs
        it)."""
        return [
            self.hook_dict[n].add_hook(fn, dir, is_permanent, level, prepend) for n in self.resolve_hook_names(name)
        ]

    def add_perma_hook(self, name: str | Callable[[str], bool], fn: HookFn, dir: Direction = "fwd") -> list[_Hook]:
        return self.add_hook(name, fn, dir, is_permanent=True)

    def reset_hooks(
        self,
        including_permanent: bool = False,
        direction: Literal["fwd", "bwd", "both"] = "both",
        clear_contexts: bool = True,
        level: int | None = None,
    ) -> None:
        """Remove hooks from every hook point (permanent ones only if asked), and this thread's open blocks' hooks.

        With ``including_permanent`` torch-level hooks registered on a hook point directly
        are cleared too, so every point is left as built. What tools attached for one call in
        this thread (``thread_state``: a part's torch hooks, a pattern given to an attention) goes
        too, as after an interrupted call it might have stayed.
        """
        ids = {id(point) for point in self.hook_dict.values()}
        for frame in _frames():
            for key in [key for key in frame if key in ids]:
                del frame[key]
        if level is None and direction in ("both", "fwd"):
            modules = list(self.modules())
            remove_tool_hooks(modules)
            forget_parts(modules)
        for hook_point in self.hook_dict.values():
            hook_point.remove_hooks(direction, including_permanent, level)
            if including_permanent and level is None:
                hook_point.remove_torch_hooks()
            if clear_contexts:
                hook_point.clear_context()

    def remove_all_hook_fns(
        self,
        direction: Literal["fwd", "bwd", "both"] = "both",
        including_permanent: bool = False,
        level: int | None = None,
    ) -> None:
        """Remove hooks from every hook point, keeping contexts (TransformerLens' name)."""
        self.reset_hooks(including_permanent, direction, clear_contexts=False, level=level)

    def clear_contexts(self) -> None:
        for hook_point in self.hook_dict.values():
            hook_point.clear_context()

    @contextlib.contextmanager
    def hooks(
        self,
        fwd_hooks: Iterable[tuple] = (),
        bwd_hooks: Iterable[tuple] = (),
        *,
        reset_hooks_end: bool = True,
        clear_contexts: bool = False,
        keep_grad_hooks: bool = False,
    ) -> Iterator["HookedRootModule"]:
        """Attach ``(name_or_predicate, fn)`` hooks for the body of a ``with`` block, in this thread only.

        Exactly the hooks added here are removed on exit, also when the body raises.
        Backward hooks fire on a ``.backward()`` called inside the block; with
        ``keep_grad_hooks=True`` they also fire on a later backward through the tensors
        of forwards run inside the block (no forward after exit gets them). With
        ``reset_hooks_end=False`` (TransformerLens) the hooks are the model's instead, for
        every thread, and stay after the block.
        """
        frame: dict[int, list[_Hook]] = {}
        added: list[tuple[HookPoint, _Hook]] = []
        level = len(_frames())
        direction: Direction
        for direction, pairs in (("fwd", fwd_hooks), ("bwd", bwd_hooks)):
            for pair in pairs:
                if not (isinstance(pair, tuple) and len(pair) == 2):
                    raise TypeError(f"{direction}_hooks entries must be (name_or_predicate, fn) pairs, got {pair!r}")
                name, fn = pair
                for hook_name in self.resolve_hook_names(name):
                    hook_point = self.hook_dict[hook_name]
                    hook = HookPoint._new_hook(fn, direction, level=level)
                    frame.setdefault(id(hook_point), []).append(hook)
                    added.append((hook_point, hook))
        if not reset_hooks_end:
            for hook_point, hook in added:
                hook_point._hooks = hook_point._hooks + [hook]
            yield self
            return
        frames = _frames()
        frames.append(frame)  # every hook of the block appears at once ...
        try:
            yield self
        finally:
            frames[:] = [f for f in frames if f is not frame]  # ... and disappears at once
            if not keep_grad_hooks:
                for _, hook in added:
                    hook.remove_tensor_hooks()
            if clear_contexts:
                self.clear_contexts()

    def run_with_hooks(
        self,
        *model_args,
        fwd_hooks: Iterable[tuple] = (),
        bwd_hooks: Iterable[tuple] = (),
        reset_hooks_end: bool = True,
        clear_contexts: bool = False,
        **model_kwargs,
    ):
        """Run the model once with temporary hooks (this thread's only).

        Every hook point is clean when this returns. Backward hooks stay attached to the
        tensors of this one run, so they fire when you call ``.backward()`` on a loss
        computed from the returned output (and never on another run).
        """
        with self.hooks(
            fwd_hooks, bwd_hooks, reset_hooks_end=reset_hooks_end, clear_contexts=clear_contexts, keep_grad_hooks=True
        ):
            return self(*model_args, **model_kwargs)
