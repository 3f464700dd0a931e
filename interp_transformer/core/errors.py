"""Errors that are also the ``AssertionError`` TransformerLens raises for the same bad input.

TransformerLens checks its input with ``assert``; this library raises ``ValueError`` or ``KeyError``
naming what was expected and what came (DESIGN section 7). Where a part takes TransformerLens' own
call (``Attention(split_inputs=True)``'s ``query_input=``) or the compatibility layer hands a call on
(``interp_transformer.compat.errors``), it raises these, so code written for TransformerLens that
catches ``AssertionError`` still does.
"""


class CompatValueError(ValueError, AssertionError):
    """A ``ValueError`` that is also the ``AssertionError`` TransformerLens raises for the same input."""


class CompatKeyError(KeyError, AssertionError):
    """A ``KeyError`` that is also the ``AssertionError`` TransformerLens raises for the same input."""


__all__ = ["CompatKeyError", "CompatValueError"]
