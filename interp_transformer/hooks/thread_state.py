"""What a tool changes for one call in the thread running it, and how it is undone even after a Ctrl-C.

A tool such as an attribution graph changes more than hook points for the length of a call: it opens
``model.hooks(...)`` blocks, gives attentions their patterns (``Attention.pattern_given``), attaches torch hooks to
parts (an MLP run on one row), switches the gradient mode, reads the weights detached. Each belongs to the thread
making it, so another thread using the same model meanwhile sees none of it:

- ``hook_frames()``: this thread's open ``hooks()`` blocks;
- ``thread_table(name)``: this thread's table of one kind of per-part state (``"given patterns"``), keyed by part;
- ``attach_forward_hooks(stack, module, before, after)``: torch forward (pre-)hooks that run in this thread only,
  detached when ``stack`` closes;
- ``with_parameters_detached(model, fn)``: ``fn()`` reading every parameter of ``model`` as its detached view, in
  this thread only (no ``requires_grad`` is switched on the shared weights).

A ``with`` block cannot promise its exit runs: a ``KeyboardInterrupt`` landing after a context manager made its
change but before the block is entered (inside ``__enter__``, or between a registration and the line recording
its removal) skips it, and a generator-based block's cleanup then waits for a finaliser that the traceback a REPL
keeps never lets run. ``restores_thread_state`` closes that gap for a whole call: it records this thread's state
before the call does anything and puts it back in a ``finally``, every part of it even if one is interrupted.
``HookedRootModule.reset_hooks`` removes the per-part state and the torch hooks tools attached as well.
"""

import contextlib
import functools
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

_THREAD = threading.local()  # .frames: open hooks() blocks; .tables: {name: {part: state}}; .tool_hooks: [ToolHook]

_Fn = TypeVar("_Fn", bound=Callable)


def hook_frames() -> list:
    """This thread's open ``hooks()`` blocks, innermost last."""
    frames = getattr(_THREAD, "frames", None)
    if frames is None:
        frames = _THREAD.frames = []
    return frames


def thread_table(name: str) -> dict:
    """This thread's table ``name``: per-part state a tool sets for one call (``{part: value}``)."""
    tables = _THREAD.__dict__.setdefault("tables", {})
    table = tables.get(name)
    if table is None:
        table = tables[name] = {}
    return table


def _tool_hooks() -> list:
    return _THREAD.__dict__.setdefault("tool_hooks", [])


class ToolHook:
    """A torch forward pre-hook (``before(module, args)``) and/or forward hook (``after(module, args, output)``) that
    a tool attaches to ``module`` for one call: it runs in the thread that attached it only (elsewhere the part runs
    as it is) and ``reset_hooks`` removes it."""

    def __init__(self, module: nn.Module, before: Callable | None = None, after: Callable | None = None):
        self.module, self.before, self.after = module, before, after
        self.thread = threading.current_thread()
        self.record: list = []  # its thread's record of attached tool hooks, once attached

    def _pre(self, module, args):
        if threading.current_thread() is not self.thread:
            return None
        return self.before(module, args)

    def _post(self, module, args, output):
        if threading.current_thread() is not self.thread:
            return None
        return self.after(module, args, output)

    def attach(self) -> None:
        self.record = _tool_hooks()
        self.record.append(self)  # recorded first: restores_thread_state finds it from here on
        if self.before is not None:
            self.module.register_forward_pre_hook(self._pre)
        if self.after is not None:
            self.module.register_forward_hook(self._post)

    def detach(self) -> None:
        """Off the module (whatever of it was attached) and out of its thread's record; again changes nothing."""
        for hooks in (self.module._forward_pre_hooks, self.module._forward_hooks):
            for key in [key for key, fn in hooks.items() if getattr(fn, "__self__", None) is self]:
                hooks.pop(key, None)
                self.module._forward_hooks_with_kwargs.pop(key, None)
                self.module._forward_hooks_always_called.pop(key, None)
                self.module._forward_pre_hooks_with_kwargs.pop(key, None)
        if self in self.record:
            self.record.remove(self)


def attach_forward_hooks(
    stack: contextlib.ExitStack, module: nn.Module, before: Callable | None = None, after: Callable | None = None
) -> ToolHook:
    """``before``/``after`` on ``module`` in this thread until ``stack`` closes (``ToolHook``). The removal is on the
    stack before anything is attached, so no interrupt can leave the hooks without it."""
    hook = ToolHook(module, before, after)
    stack.callback(hook.detach)
    hook.attach()
    return hook


def remove_tool_hooks(modules: Iterable[nn.Module]) -> None:
    """Every ``ToolHook`` on ``modules`` attached by this thread, or by a thread that has ended."""
    current = threading.current_thread()
    for module in modules:
        for hooks in (module._forward_pre_hooks, module._forward_hooks):
            for fn in list(hooks.values()):
                owner = getattr(fn, "__self__", None)
                if isinstance(owner, ToolHook) and (owner.thread is current or not owner.thread.is_alive()):
                    owner.detach()


def forget_parts(modules: Iterable[nn.Module]) -> None:
    """This thread's per-part state (``thread_table``) of ``modules``: gone."""
    parts = set(map(id, modules))
    for table in getattr(_THREAD, "tables", {}).values():
        for part in [part for part in table if id(part) in parts]:
            del table[part]


class _DetachedParameters(TorchFunctionMode):
    """Every torch function called in this thread reads each of ``params`` as its detached view, until ``finish()``:
    then it passes every call through unchanged (were torch to push it back late, as an interrupt inside torch's own
    mode handling can make it, it would change nothing)."""

    def __init__(self, params: Iterable[torch.Tensor]) -> None:
        super().__init__()
        self.detached = {id(p): p.detach() for p in params if p.requires_grad}

    def finish(self) -> None:
        self.detached = {}

    def _swap(self, value):
        """``value`` with each of the parameters in it (also inside lists and tuples, as ``torch.cat`` takes them)
        replaced by its detached view."""
        if isinstance(value, torch.Tensor):
            return self.detached.get(id(value), value)
        if type(value) in (list, tuple):
            return type(value)(self._swap(item) for item in value)
        return value

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.detached:
            args, kwargs = self._swap(args), {key: self._swap(value) for key, value in kwargs.items()}
        return func(*args, **kwargs)


def _function_modes() -> int:
    return torch._C._len_torch_function_stack()


def _pop_function_modes(depth: int) -> None:
    while _function_modes() > depth:
        torch._C._pop_torch_function_stack()


def with_parameters_detached(model: nn.Module, fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)`` with every parameter of ``model`` read as its detached view, in this thread only:
    autograd keeps nothing for the weights' gradients, and another thread training the same model meanwhile is
    untouched (no ``requires_grad`` is switched on the shared parameters). Without gradient mode autograd records
    nothing anyway: ``fn`` runs as it is."""
    if not torch.is_grad_enabled():
        return fn(*args, **kwargs)
    mode = _DetachedParameters(model.parameters())
    depth = _function_modes()
    try:
        torch._C._push_on_torch_function_stack(mode)
        return fn(*args, **kwargs)
    finally:
        mode.finish()
        _pop_function_modes(depth)  # back to the depth it found, whatever came off or stayed on meanwhile


@dataclass
class _State:
    grad_enabled: bool
    frames: list
    tables: dict
    tool_hooks: int
    function_modes: int


def _snapshot() -> _State:
    tables = getattr(_THREAD, "tables", {})
    return _State(
        torch.is_grad_enabled(),
        list(hook_frames()),
        {name: dict(table) for name, table in tables.items()},
        len(_tool_hooks()),
        _function_modes(),
    )


def _restore_frames(frames: list) -> None:
    hook_frames()[:] = frames


def _restore_tables(tables: dict) -> None:
    for name, table in getattr(_THREAD, "tables", {}).items():
        table.clear()
        table.update(tables.get(name, {}))


def _detach_tool_hooks(since: int) -> None:
    for hook in reversed(_tool_hooks()[since:]):
        hook.detach()


def _restore(state: _State) -> None:
    """Every part put back, also when one step is interrupted (the rest still run; the interrupt is raised after)."""
    with contextlib.ExitStack() as undo:  # callbacks run last first: the gradient mode is set back last
        if torch.is_grad_enabled() != state.grad_enabled:
            undo.callback(torch.set_grad_enabled, state.grad_enabled)
        undo.callback(_pop_function_modes, state.function_modes)
        undo.callback(_restore_tables, state.tables)
        undo.callback(_restore_frames, state.frames)
        undo.callback(_detach_tool_hooks, state.tool_hooks)


def restores_thread_state(fn: _Fn) -> _Fn:
    """``fn`` leaving this thread as it found it whether it returns, raises or is interrupted: its hook blocks, the
    per-part state tools set, the torch hooks they attached, the gradient mode and any torch function mode."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        state = _snapshot()
        try:
            return fn(*args, **kwargs)
        finally:
            _restore(state)

    return wrapper  # type: ignore[return-value]


__all__ = [
    "ToolHook",
    "attach_forward_hooks",
    "forget_parts",
    "hook_frames",
    "remove_tool_hooks",
    "restores_thread_state",
    "thread_table",
    "with_parameters_detached",
]
