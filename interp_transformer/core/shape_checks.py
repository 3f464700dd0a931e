"""Run-time shape checks: jaxtyping annotations enforced by typeguard 2.

Every public tensor argument and return in the model is annotated with
jaxtyping shapes (``Float[Tensor, "batch pos d_model"]``). ``shape_checked``
turns those annotations into checks that run on every call, binding each axis
name to one size across all arguments of the call.

Checks are on by default. Switch them off with ``set_shape_checking(False)``
(or the context manager ``shape_checking(False)``); the test suite keeps them on
and a canary test fails if they ever go quiet.

Cost. The full check (typeguard walking the signature, jaxtyping binding axis
names) takes about 0.15 ms per call, which is 5-10% of a GPT-2 small forward on a
CPU. The verdict depends only on the *types* of the arguments: the shapes and
dtypes of the tensors, the types of everything else (and the value of ints,
bools and strings, which can decide the shape of the result). So each checked
function remembers the signatures of calls that passed, with the shape and dtype
they returned; a later call with the same signature runs unchecked and its
result's shape and dtype are compared with the remembered ones. Only when they
differ (the same module class with other sizes, say) is the result checked in
full against the annotation. A call with any new shape, dtype or type gets the
full check. Arguments whose verdict could depend on their contents (lists, tuples,
dicts) always get the full check.

Entry checks. An annotation alone cannot say that ``d_model`` is 64: a part given ``[2, 12, 63]`` binds
``d_model = 63`` and fails deep inside, in a reshape. A part therefore names where its own sizes are,
``axis_sizes = {"d_model": "W_in[0]"}`` (a weight's axis, or an int attribute such as ``"d_head"``;
``"attn.W_O[-1]"`` reaches into a child), and ``shape_checked`` compares each annotated argument's axis of
that name with it at the entry, before any hook fires, checks on or off: a few int comparisons. For such a
part, an axis two arguments share (``batch`` of ``normalized`` and ``kv_input``) is compared too, and so is
an argument annotated with a class that declares ``ENTRY_AXES`` (the key/value cache: the axes of the
``entry_shape`` it holds). A mismatch raises ``ShapeError`` naming the argument, the axis and both sizes;
a failed full check is re-raised as ``ShapeError`` with the same first line, where it can be found.
"""

import collections
import contextlib
import functools
import inspect
import re
import typing
from collections.abc import Callable, Hashable, Iterator
from typing import Any, TypeVar

import torch
from jaxtyping import TypeCheckError, jaxtyped
from typeguard import typechecked

F = TypeVar("F", bound=Callable)

_enabled = True


class ShapeError(TypeCheckError, ValueError):
    """A tensor of the wrong shape at a part's entry: the message names the argument, the axis and both sizes."""


def set_shape_checking(enabled: bool) -> None:
    """Turn run-time shape checks on or off for the whole process."""
    global _enabled
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
    _enabled = enabled


def shape_checking_enabled() -> bool:
    return _enabled


@contextlib.contextmanager
def shape_checking(enabled: bool) -> Iterator[None]:
    """Temporarily turn shape checks on or off: ``with shape_checking(False): ...``."""
    previous = _enabled
    set_shape_checking(enabled)
    try:
        yield
    finally:
        set_shape_checking(previous)


MAX_REMEMBERED_SIGNATURES = 512  # per checked function; the oldest is forgotten first
_VALUE_TYPES = (int, bool, str, float, type(None))


def _describe(value: Any) -> Hashable | type | None:
    """What the check of ``value`` depends on, or None when that cannot be summarized."""
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.dtype)
    if isinstance(value, _VALUE_TYPES):
        return (type(value), value)
    if isinstance(value, (list, tuple, dict, set)):
        return None
    return type(value)


def _call_signature(args: tuple, kwargs: dict) -> Hashable | None:
    """The summary of a call's arguments, or None when one of them cannot be summarized."""
    keywords = sorted(kwargs)
    described = [(None, _describe(value)) for value in args] + [(name, _describe(kwargs[name])) for name in keywords]
    if any(d is None for _, d in described):
        return None
    return tuple(described)


def _return_checker(fn: Callable) -> Callable:
    """``check(result, args, kwargs)``: the full check of ``fn``'s annotations, for a result already computed."""
    pending: list = []

    @functools.wraps(fn)
    def echo(*args, **kwargs):
        return pending.pop()

    checked_echo = jaxtyped(typechecker=typechecked)(echo)

    def check(result, args: tuple, kwargs: dict) -> None:
        pending.append(result)
        try:
            checked_echo(*args, **kwargs)
        finally:
            pending.clear()

    return check


def _is_variadic(word: str) -> bool:
    return word == "..." or word.startswith("*")


def _is_named(word: str) -> bool:
    return word.isidentifier() and not word.startswith("_")


def _dim_words(annotation) -> tuple[str, ...] | None:
    """The axis words of a jaxtyping annotation (``Float[Tensor, "batch pos d_model"]``, or it ``| None``)."""
    for candidate in (annotation, *typing.get_args(annotation)):
        dim_str = getattr(candidate, "dim_str", None)
        if isinstance(dim_str, str) and hasattr(candidate, "dtypes"):
            return tuple(dim_str.split())
    return None


def _annotated_classes(annotation) -> tuple[type, ...]:
    """The classes an argument is annotated with: the class itself, or a union's (``None`` aside)."""
    return tuple(
        candidate
        for candidate in (annotation, *typing.get_args(annotation))
        if isinstance(candidate, type) and candidate is not type(None)
    )


def _positioned(words: tuple[str, ...], fixed: bool = False) -> list[tuple[int, str]]:
    """``(index, word)`` of each named axis (and, with ``fixed``, each size such as ``1``) whose index does not
    depend on the rank: from the front before the first variadic axis, from the back after the last (from the
    back with none)."""
    variadic = [i for i, word in enumerate(words) if _is_variadic(word)]
    out = []
    for i, word in enumerate(words):
        if not (_is_named(word) or (fixed and word.isdigit())):
            continue
        if not variadic or i > variadic[-1]:
            out.append((i - len(words), word))
        elif i < variadic[0]:
            out.append((i, word))
    return out


def _annotated_axes(fn: Callable) -> list[tuple[int, str, Any, list[tuple[Any, tuple[str, ...]]]]]:
    """``(index, name, kinds, [(class, axis words), ...])`` of each parameter annotated with an array (kinds None,
    class None), or with classes of which one declares ``ENTRY_AXES`` (kinds: every class of the annotation; one
    pair per declaring class, with the axes of its ``entry_shape``)."""
    out: list[tuple[int, str, Any, list[tuple[Any, tuple[str, ...]]]]] = []
    for index, parameter in enumerate(inspect.signature(fn).parameters.values()):
        words = _dim_words(parameter.annotation)
        if words is not None:
            out.append((index, parameter.name, None, [(None, words)]))
            continue
        classes = _annotated_classes(parameter.annotation)
        declaring = [(cls, tuple(axes.split())) for cls in classes if (axes := getattr(cls, "ENTRY_AXES", None))]
        if declaring:
            out.append((index, parameter.name, classes, declaring))
    return out


_SIZE_SPEC = re.compile(r"^([A-Za-z_][\w.]*)(?:\[(-?\d+)\])?$")


def _attribute(obj: Any, name: str) -> Any:
    """``obj.name`` (None where missing), reading a module's parameters and children from their tables: faster
    than ``nn.Module.__getattr__``, which runs only after the ordinary lookup failed."""
    namespace = getattr(obj, "__dict__", None)
    if namespace is not None:
        if name in namespace:
            return namespace[name]
        for table in ("_parameters", "_modules"):
            held = namespace.get(table)
            if held is not None and name in held:
                return held[name]
    return getattr(obj, name, None)


def _size_getter(spec: str) -> Callable[[Any], int | None]:
    """``part -> int`` for an ``axis_sizes`` entry: ``"W_in[0]"`` (an axis of a weight), ``"attn.W_O[-1]"``
    (through a child), ``"d_head"`` (an int attribute). None where the part lacks it."""
    match = _SIZE_SPEC.match(spec)
    if match is None:
        raise ValueError(f"axis_sizes entries look like 'W_in[0]', 'attn.W_O[-1]' or 'd_head', got {spec!r}")
    path, dim = match.group(1).split("."), match.group(2)
    axis = None if dim is None else int(dim)
    needed = None if axis is None else (-axis if axis < 0 else axis + 1)

    def size(part) -> int | None:
        value = _attribute(part, path[0])
        for name in path[1:]:
            value = _attribute(value, name)
        if needed is not None:
            shape = getattr(value, "shape", None)
            return None if shape is None or len(shape) < needed else shape[axis]
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    return size


def _entry_plan(owner: type, axes: list) -> tuple:
    """The entry checks of a call whose first argument is an ``owner`` (empty for an owner declaring no
    ``axis_sizes``), one group per argument: ``(index, name, kinds, checks)``, ``kinds`` the classes the argument
    must be one of (None for an array), and per annotated axis that ``axis_sizes`` fixes or that two arguments
    share, ``(class, position, needed, shared, axis, words, size getter, spec)``."""
    sizes = getattr(owner, "axis_sizes", None)
    if not sizes:
        return ()
    counts = collections.Counter(
        word for _, _, _, pairs in axes for _, words in pairs for _, word in _positioned(words)
    )
    plan = []
    for index, name, kinds, pairs in axes:
        checks = []
        for cls, words in pairs:
            for position, word in _positioned(words):
                if word not in sizes and counts[word] < 2:
                    continue
                spec = sizes.get(word)
                getter = None if spec is None else _size_getter(spec)
                needed = -position if position < 0 else position + 1  # the fewest axes that have this one
                checks.append((cls, position, needed, counts[word] > 1, word, " ".join(words), getter, spec))
        if checks or kinds is not None:
            plan.append((index, name, kinds, tuple(checks)))
    return tuple(plan)


def check_positions_fit(part: Any, name: str, pos: int, offset: int, n_ctx: int) -> None:
    """``ShapeError`` unless ``offset`` positions already seen (a cache's) and ``pos`` new ones fit in ``n_ctx``;
    ``name``: the argument holding the new positions."""
    if offset + pos > n_ctx:
        raise ShapeError(
            f"{type(part).__name__}.forward: argument {name!r} has pos = {pos}"
            f"{f' after offset {offset} (positions already cached)' if offset else ''}, "
            f"but this part holds n_ctx = {n_ctx} positions"
        )


def _shape_error(fn: Callable, owner: Any, name: str, words: str, shape, axis: str, size: int, other: str) -> None:
    where = f"{type(owner).__name__}.{fn.__name__}"
    raise ShapeError(f"{where}: argument {name!r} [{words}] has {axis} = {size} (shape {list(shape)}), but {other}")


def _check_entry(plan: tuple, fn: Callable, args: tuple, kwargs: dict) -> None:
    """Each planned axis of the arguments against the part's size of it and against the other arguments."""
    owner, seen = args[0], None
    for index, name, kinds, checks in plan:
        value = args[index] if index < len(args) else kwargs.get(name)
        if value is None:
            continue
        if kinds is not None and not isinstance(value, kinds):
            raise TypeError(
                f"{type(owner).__name__}.{fn.__name__}: argument {name!r} must be a "
                f"{', '.join(kind.__name__ for kind in kinds)} or None, got {type(value).__name__}"
            )
        for cls, position, needed, shared, axis, words, getter, spec in checks:
            if cls is None:
                shape = value.shape if isinstance(value, torch.Tensor) else None
            else:
                shape = value.entry_shape if isinstance(value, cls) else None
            if shape is None or len(shape) < needed:  # nothing held, or a wrong rank (the full check's to report)
                continue
            size = shape[position]
            if getter is not None:
                expected = getter(owner)
                if expected is not None and size != expected:
                    _shape_error(
                        fn, owner, name, words, shape, axis, size, f"this part's {axis} is {expected} ({spec})"
                    )
            if shared:
                seen = _check_shared(seen, fn, owner, name, words, shape, axis, size)


def _check_shared(seen: dict | None, fn: Callable, owner: Any, name: str, words: str, shape, axis: str, size: int):
    """``seen`` (axis -> the first argument's size, name and shape) with this argument's ``axis`` added;
    ``ShapeError`` where an earlier argument gave the axis another size."""
    if seen is None:
        seen = {}
    if axis not in seen:
        seen[axis] = (size, name, shape)
    elif size != seen[axis][0]:
        other_size, other_name, other_shape = seen[axis]
        other = f"argument {other_name!r} has {axis} = {other_size} (shape {list(other_shape)})"
        _shape_error(fn, owner, name, words, shape, axis, size, other)
    return seen


def _diagnosis(fn: Callable, args: tuple, kwargs: dict) -> str | None:
    """After a failed full check: the first argument of the wrong rank, dtype or size, named with its axis and
    both sizes; None where the arguments agree (the result is then the one at fault)."""
    try:
        arguments = inspect.signature(fn).bind(*args, **kwargs).arguments
    except TypeError:
        return None
    annotations = {p.name: p.annotation for p in inspect.signature(fn).parameters.values()}
    seen: dict = {}
    for name, value in arguments.items():
        words = _dim_words(annotations.get(name))
        if words is None or not isinstance(value, torch.Tensor):
            continue
        spelled, shape = " ".join(words), list(value.shape)
        n_fixed = sum(not _is_variadic(word) for word in words)
        if value.ndim < n_fixed or (n_fixed == len(words) and value.ndim != n_fixed):
            return f"argument {name!r} [{spelled}] has {value.ndim} axes (shape {shape}), the annotation {n_fixed}"
        annotation = next(a for a in (annotations[name], *typing.get_args(annotations[name])) if hasattr(a, "dtypes"))
        dtype = str(value.dtype).rsplit(".", 1)[-1]
        if dtype not in annotation.dtypes:
            return f"argument {name!r} [{spelled}] has dtype {dtype}, the annotation asks for {annotation.__name__}"
        for position, word in _positioned(words, fixed=True):
            size = shape[position]
            if word.isdigit():
                if size != int(word):
                    return (
                        f"argument {name!r} [{spelled}] has size {size} at axis {position} (shape {shape}), not {word}"
                    )
            elif word in seen and seen[word][0] != size:
                other = seen[word]
                return (
                    f"argument {name!r} [{spelled}] has {word} = {size} (shape {shape}), "
                    f"but argument {other[1]!r} has {word} = {other[0]} (shape {other[2]})"
                )
            else:
                seen.setdefault(word, (size, name, shape))
    return None


def shape_checked(fn: F) -> F:
    """Check ``fn``'s jaxtyping annotations on each call while checks are enabled.

    The full check runs once per call signature (see the module docstring); repeated
    calls with the same shapes and dtypes compare only the result's shape and dtype.
    """
    checked = jaxtyped(typechecker=typechecked)(fn)
    check_result = _return_checker(fn)
    passed: collections.OrderedDict[Hashable, Hashable | None] = collections.OrderedDict()
    axes = _annotated_axes(fn)
    plans: dict = {}  # per class of the first argument (the part): its entry checks, () where it declares none

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if args:
            plan = plans.get(type(args[0]))
            if plan is None:
                plan = plans[type(args[0])] = _entry_plan(type(args[0]), axes)
            if plan:
                _check_entry(plan, fn, args, kwargs)
        if not _enabled:
            return fn(*args, **kwargs)
        signature = _call_signature(args, kwargs)
        if signature is None or signature not in passed:
            try:
                result = checked(*args, **kwargs)
            except ShapeError:
                raise
            except TypeCheckError as error:
                found = _diagnosis(fn, args, kwargs)
                if found is None:
                    raise
                raise ShapeError(f"{fn.__qualname__}: {found}\n\n{error}") from error
            returned = _describe(result)
        else:
            result = fn(*args, **kwargs)
            returned = _describe(result)
            if returned == passed[signature]:
                return result
            check_result(result, args, kwargs)
        if signature is not None and returned is not None:
            passed[signature] = returned
            if len(passed) > MAX_REMEMBERED_SIGNATURES:
                passed.popitem(last=False)
        return result

    wrapper.remembered_signatures = passed  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]
