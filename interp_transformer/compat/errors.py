"""Errors of the compatibility layer: ours, and also the ``AssertionError`` TransformerLens raises for bad input.

TransformerLens checks its input with ``assert``; this library raises ``ValueError`` or
``KeyError`` naming what was expected and what came (DESIGN section 7). Code written for
TransformerLens catches ``AssertionError``, so the compatibility layer raises classes that
are both, with our messages:

>>> issubclass(CompatValueError, (ValueError, AssertionError)), issubclass(CompatKeyError, (KeyError, AssertionError))
(True, True)

The core API keeps its own types. Where the compatibility layer hands a call to the core
(hook names, ``FactoredMatrix`` products, the cache), ``assertion_compatible`` turns the
core's plain ``ValueError``/``KeyError`` into these, keeping message and traceback.
Subclasses with a meaning of their own (``CheckpointError``, ``ProcessingMismatch``) pass
through unchanged.
"""

import functools
import inspect
from collections.abc import Callable, Iterable

from interp_transformer.core.errors import CompatKeyError, CompatValueError  # defined below compat: parts raise them

CONVERSIONS = {ValueError: CompatValueError, KeyError: CompatKeyError}


def assertion_compatible(function: Callable) -> Callable:
    """``function``, raising ``CompatValueError``/``CompatKeyError`` where it raises a plain ``ValueError``/
    ``KeyError`` (same message, same traceback)."""

    @functools.wraps(function)
    def converted(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except (ValueError, KeyError) as error:
            kind = CONVERSIONS.get(type(error))
            if kind is None:  # already compatible, or a subclass with a meaning of its own
                raise
            raise kind(*error.args).with_traceback(error.__traceback__) from None

    return converted


def assertion_compatible_methods(cls: type, names: Iterable[str]) -> type:
    """Wrap each named method or property of ``cls`` (its own or inherited) with ``assertion_compatible``, on ``cls``
    only."""
    for name in names:
        method = inspect.getattr_static(cls, name)
        if isinstance(method, (classmethod, staticmethod)):
            setattr(cls, name, type(method)(assertion_compatible(method.__func__)))
        elif isinstance(method, property):
            if method.fget is None:
                raise TypeError(f"{cls.__name__}.{name} is a property without a getter: there is nothing to wrap")
            setattr(cls, name, property(assertion_compatible(method.fget), method.fset, method.fdel, method.__doc__))
        elif isinstance(method, functools.cached_property):
            cached = functools.cached_property(assertion_compatible(method.func))
            cached.__set_name__(cls, name)
            setattr(cls, name, cached)
        elif callable(method):
            setattr(cls, name, assertion_compatible(method))
        else:
            raise TypeError(f"{cls.__name__}.{name} is a {type(method).__name__}, expected a method")
    return cls


__all__ = ["CompatKeyError", "CompatValueError", "assertion_compatible", "assertion_compatible_methods"]
