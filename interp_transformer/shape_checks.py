"""Run-time shape checks: jaxtyping annotations enforced by typeguard 2.

Every public tensor argument and return in the model is annotated with
jaxtyping shapes (``Float[Tensor, "batch pos d_model"]``). ``shape_checked``
turns those annotations into checks that run on every call, binding each axis
name to one size across all arguments of the call.

Checks are on by default. Switch them off for speed with
``set_shape_checking(False)`` (or the context manager ``shape_checking(False)``);
the test suite keeps them on and a canary test fails if they ever go quiet.
"""

import contextlib
import functools
from typing import Callable, Iterator, TypeVar

from jaxtyping import jaxtyped
from typeguard import typechecked

F = TypeVar("F", bound=Callable)

_enabled = True


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


def shape_checked(fn: F) -> F:
    """Check ``fn``'s jaxtyping annotations on each call while checks are enabled."""
    checked = jaxtyped(typechecker=typechecked)(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if _enabled:
            return checked(*args, **kwargs)
        return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
