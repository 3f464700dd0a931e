"""Which hooks a harvest keeps, how deep the forward pass must go, and what each hook's activation looks like.

Hooks are chosen by exact names from ``model.hook_dict``, by glob patterns
(``blocks.*.hook_resid_post``; a substring is ``*resid_post*``), or, from Python,
by a predicate ``name -> bool``. An unknown name raises ``KeyError`` with the
closest valid names; a pattern that matches nothing raises ``KeyError`` too.
The selection is kept in the model's forward order.
"""

import difflib
import fnmatch
import inspect
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

HookSelection = str | Sequence[str] | Callable[[str], bool]
_GLOB_CHARS = set("*?[")
# Hook names of a block start with "blocks.<layer>." (DESIGN.md section 3).
_BLOCK_PREFIX = re.compile(r"^blocks\.(\d+)\.")


def select_hooks(hook_names: Sequence[str], selection: HookSelection) -> list[str]:
    """The names in ``hook_names`` that ``selection`` picks, in ``hook_names``' order."""
    names = list(hook_names)
    if callable(selection) and not isinstance(selection, str):
        picked = {name for name in names if selection(name)}
        if not picked:
            raise KeyError(
                f"the hook predicate {getattr(selection, '__name__', selection)!r} matched no hook; hooks "
                f"look like {names[:3]}"
            )
        return [name for name in names if name in picked]
    patterns = [selection] if isinstance(selection, str) else list(selection)
    if not patterns:
        raise ValueError("hooks is empty: name at least one hook (or a glob such as 'blocks.*.hook_resid_post')")
    picked = set()
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise TypeError(f"hook names and patterns are str, received {type(pattern).__name__}: {pattern!r}")
        picked.update(_match(names, pattern))
    return [name for name in names if name in picked]


def _match(names: list[str], pattern: str) -> list[str]:
    if pattern in names:
        return [pattern]
    if _GLOB_CHARS & set(pattern):
        matched = fnmatch.filter(names, pattern)
        if matched:
            return matched
        close = difflib.get_close_matches(pattern.replace("*", ""), names, n=3, cutoff=0.4)
        raise KeyError(f"the pattern {pattern!r} matches no hook point; closest names: {close}")
    close = difflib.get_close_matches(pattern, names, n=3, cutoff=0.5)
    hint = f"; or every hook containing it: '*{pattern}*'" if any(pattern in name for name in names) else ""
    raise KeyError(f"no hook point named {pattern!r}; closest: {close}{hint}")


def forward_output_bytes(model, context_length: int, stop_at_layer: int | None) -> int:
    """Bytes of what the forward returns for one context (logits, or the residual when it stops early).

    The output of every batch is held next to its cache until the batch is stored,
    so the memory budget counts it. Found by a shape-only run on the meta device.
    """
    import torch

    meta = {name: torch.empty_like(t, device="meta") for name, t in [*model.named_parameters(), *model.named_buffers()]}
    tokens = torch.zeros(1, context_length, dtype=torch.long, device="meta")
    kwargs = {} if stop_at_layer is None else {"stop_at_layer": stop_at_layer}
    with torch.no_grad():
        output = torch.func.functional_call(model, meta, (tokens,), kwargs)
    return output.numel() * output.element_size()


def stop_at_layer_for(model, hooks: Sequence[str]) -> int | None:
    """The number of blocks to run so that every hook in ``hooks`` fires, or ``None`` for the whole model.

    Hooks inside ``blocks.L`` need ``L + 1`` blocks; embedding hooks need none;
    any other hook (the final norm, for instance) needs the full forward. ``None``
    also when the model's forward takes no ``stop_at_layer``.
    """
    if "stop_at_layer" not in inspect.signature(model.forward).parameters:
        return None
    layers = []
    for name in hooks:
        match = _BLOCK_PREFIX.match(name)
        if match:
            layers.append(int(match.group(1)))
        elif name not in ("hook_embed", "hook_pos_embed"):
            return None
    return max(layers) + 1 if layers else 0


@dataclass(frozen=True)
class HookLayout:
    """One hook's activation for one context: its shape, and which of its axes run over positions."""

    name: str
    shape: tuple[int, ...]  # without the batch axis
    pos_axes: tuple[int, ...]  # indices into shape

    @property
    def per_token(self) -> bool:
        """True when the activation is ``[pos, ...]`` with no other position axis (it splits into tokens)."""
        return self.pos_axes == (0,)

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "pos_axes": list(self.pos_axes)}


def hook_layouts(model, hooks: Sequence[str], context_length: int) -> list[HookLayout]:
    """Each hook's per-context shape, and its position axes, found by two shape-only runs.

    Axes whose length follows the number of positions are the position axes:
    ``[pos, d_model]`` has one, an attention pattern ``[head_index, query_pos, key_pos]``
    has two.
    """
    other = context_length + 1 if context_length < model.cfg.n_ctx else context_length - 1
    shapes = _shapes(model, hooks, context_length)
    other_shapes = _shapes(model, hooks, other) if other >= 1 else shapes
    layouts = []
    for name in hooks:
        shape, alt = shapes[name][1:], other_shapes[name][1:]
        pos_axes = tuple(axis for axis, (a, b) in enumerate(zip(shape, alt, strict=True)) if a != b)
        layouts.append(HookLayout(name, tuple(shape), pos_axes))
    return layouts


def _shapes(model, hooks: Sequence[str], pos: int) -> dict[str, tuple[int, ...]]:
    if callable(getattr(model, "hook_shapes", None)):  # shapes only, on the meta device
        return model.hook_shapes(1, pos)
    import torch

    device = next(model.parameters()).device
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.zeros(1, pos, dtype=torch.long, device=device), names_filter=list(hooks))
    return {name: tuple(cache[name].shape) for name in hooks}
