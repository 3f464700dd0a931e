"""Checks of what the views are given, and the compact JSON form of their numbers.

Each check raises ``TypeError`` or ``ValueError`` naming the shape (or count) it
expected and the one it got. A tensor with a leading batch axis gets told how to
pick one row (``pattern[0]``), since a view shows one text.
"""

import math
import numbers
from collections.abc import Sequence

import einops
import numpy as np
from torch import Tensor


def to_array(values, name: str) -> np.ndarray:
    """A tensor, numpy array or nested sequence of real numbers as a float64 array."""
    if isinstance(values, Tensor):
        if values.is_complex():
            raise TypeError(f"{name} must hold real numbers, got a complex tensor of dtype {values.dtype}")
        return values.detach().cpu().double().numpy()
    if isinstance(values, (str, bytes)) or not isinstance(values, (np.ndarray, Sequence)):
        raise TypeError(f"{name} must be a torch.Tensor or numpy array of numbers, got {type(values).__name__}")
    try:
        array = np.asarray(values)
    except ValueError as error:  # ragged nested lists
        raise ValueError(f"{name} must be rectangular, got nested sequences of unequal lengths: {error}") from None
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{name} must hold real numbers, got an array of dtype {array.dtype}")
    return array.astype(np.float64)


def check_finite(array: np.ndarray, name: str) -> None:
    """Raise ``ValueError`` at the first NaN or infinite entry, giving its index and how many there are."""
    bad = ~np.isfinite(array)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"{name} must be finite, got {int(bad.sum())} NaN or infinite entries of {array.size} "
            f"(the first at index {list(first)}: {array[first]})"
        )


def str_tokens(tokens, what: str) -> list[str]:
    """``tokens`` as a list of str, one per position (e.g. from ``model.to_str_tokens``)."""
    if isinstance(tokens, (str, bytes)):
        raise TypeError(
            f"{what} takes tokens as a list of str, one per position, got a single {type(tokens).__name__} "
            f"{tokens[:40]!r}: split it into tokens first (model.to_str_tokens(text))"
        )
    if isinstance(tokens, Tensor) or not isinstance(tokens, Sequence):
        raise TypeError(
            f"{what} takes tokens as a list of str, one per position, got {type(tokens).__name__}: "
            "turn token ids into strings with model.to_str_tokens(tokens)"
        )
    not_str = [(pos, type(token).__name__) for pos, token in enumerate(tokens) if not isinstance(token, str)]
    if not_str:
        raise TypeError(f"{what} takes tokens as a list of str, got non-str entries (pos, type): {not_str[:5]}")
    if not tokens:
        raise ValueError(f"{what} needs at least one token, got an empty list")
    return list(tokens)


def labels(names: Sequence | None, count: int, axis: str, default_prefix: str) -> list[str]:
    """One str label per entry of ``axis``: ``names`` checked, or ``[default_prefix + i]``."""
    if names is None:
        return [f"{default_prefix}{i}" for i in range(count)]
    if isinstance(names, (str, bytes)) or not isinstance(names, Sequence):
        raise TypeError(f"{axis} names must be a sequence of str (one per {axis}), got {type(names).__name__}")
    if len(names) != count:
        raise ValueError(f"expected {count} {axis} names (one per {axis}), got {len(names)}: {list(names)[:8]}")
    return [str(name) for name in names]


def index(value, size: int, name: str, unit: str) -> int:
    """``value`` as an index in ``[0, size)``; negative values count from the end, as in Python."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if not -size <= value < size:
        raise ValueError(f"{name}={value} is out of range for {size} {unit} (valid: 0..{size - 1}, or -{size}..-1)")
    return int(value) % size


def _one_text(array: np.ndarray, what: str, name: str, forms: tuple[str, str], promote: str, note: str = ""):
    """``array`` (the argument ``name``) in one of its two ``forms`` (axes as the messages write them); the one of
    fewer axes made the fuller by the einops ``promote``. One axis more reads as a batch and is refused with a hint,
    as is any other shape."""
    fuller = max(forms, key=lambda form: form.count(","))
    ndim, shape = fuller.count(",") + 1, tuple(array.shape)
    if array.ndim == ndim + 1:
        raise ValueError(
            f"{what} shows one text: {name} must be {' or '.join(forms)}, got a {ndim + 1}-d shape {shape}, which "
            f"looks like [batch, {fuller[1:]}: choose a batch row, e.g. {name}[0]"
        )
    if array.ndim not in (ndim - 1, ndim):
        raise ValueError(f"{what}: {name} must be {' or '.join(forms)}{note}, got shape {shape}")
    return einops.rearrange(array, promote) if array.ndim == ndim - 1 else array


def attention_patterns(pattern, n_tokens: int, what: str) -> np.ndarray:
    """``pattern`` ``[head_index, query_pos, key_pos]`` or ``[query_pos, key_pos]`` as a 3-d array.

    Rejects a batch axis, a non-square pattern, a length other than ``n_tokens``,
    NaN or infinite weights and weights outside ``[0, 1]`` (a pattern is post-softmax).
    """
    array = to_array(pattern, "pattern")
    shape = tuple(array.shape)
    forms = ("[head_index, query_pos, key_pos]", "[query_pos, key_pos]")
    array = _one_text(array, what, "pattern", forms, "query_pos key_pos -> 1 query_pos key_pos")  # one head
    n_heads, n_query, n_key = array.shape
    if n_query != n_key:
        raise ValueError(
            f"{what}: pattern must be square, query_pos == key_pos (one text attending to itself), got shape {shape} "
            f"with query_pos={n_query} and key_pos={n_key}"
        )
    if n_query != n_tokens:
        hint = ""
        if len(shape) == 3 and n_heads == n_tokens:
            hint = " (is the first axis a batch axis? choose a batch row, e.g. pattern[0])"
        raise ValueError(
            f"{what}: got {n_tokens} tokens but a pattern over {n_query} positions (shape {shape}): "
            f"expected query_pos = key_pos = {n_tokens}, one position per token{hint}"
        )
    if n_heads == 0:
        raise ValueError(f"{what}: pattern has no heads (shape {shape})")
    check_finite(array, "pattern")
    low, high = float(array.min()), float(array.max())
    if low < -1e-3 or high > 1 + 1e-3:
        raise ValueError(
            f"{what} shows attention weights in [0, 1] (after softmax, hook_pattern), got values in "
            f"[{low:.4g}, {high:.4g}]: were these pre-softmax scores (hook_attn_scores)?"
        )
    return array


def activation_values(values, n_tokens: int, what: str) -> np.ndarray:
    """``values`` ``[pos]`` or ``[pos, n]`` as a 2-d ``[pos, n]`` array, checked against ``n_tokens``."""
    array = to_array(values, "values")
    shape = tuple(array.shape)
    note = " (n columns: neurons, features...)"
    array = _one_text(array, what, "values", ("[pos]", "[pos, n]"), "pos -> pos 1", note)  # one column
    if array.shape[0] != n_tokens:
        hint = ""
        if array.shape[1] == n_tokens:
            hint = " ([n, pos] or [batch, pos]? pass values.T for columns, or values[0] for one batch row)"
        raise ValueError(
            f"{what}: got {n_tokens} tokens but values of shape {shape}: expected [pos={n_tokens}] or "
            f"[pos={n_tokens}, n], one row per token{hint}"
        )
    if array.shape[1] == 0:
        raise ValueError(f"{what}: values have no columns (shape {shape})")
    check_finite(array, "values")
    return array


def decimals_for(array: np.ndarray, at_least: int = 4) -> int:
    """Decimals that keep 4 significant digits of the largest magnitude in ``array``, and at least ``at_least``."""
    largest = float(np.abs(array).max()) if array.size else 0.0
    if largest == 0.0:
        return at_least
    return max(at_least, 3 - math.floor(math.log10(largest)))


def rounded(array: np.ndarray, decimals: int = 4) -> list:
    """``array`` rounded to ``decimals`` places as nested lists (``-0.0`` written as ``0``) for compact JSON."""
    return _compact(np.round(array, decimals) + 0.0)  # + 0.0 turns -0.0 into 0.0


def _compact(array: np.ndarray) -> list:
    if array.ndim > 1:
        return [_compact(row) for row in array]
    return [_number(v) for v in array.tolist()]


def _number(value: float):
    # Whole numbers as ints: "0" and "1" instead of "0.0" and "1.0" in a pattern full of them.
    return int(value) if value.is_integer() else value
