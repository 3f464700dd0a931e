"""Checks of the inputs every model takes: token ids and the ``stop_at_layer`` index.

Each raises ``TypeError``/``ValueError`` naming what was expected and what was received.
Tensors on the ``meta`` device (``hook_shapes``) are checked for shape only.
"""

import torch
from jaxtyping import Int
from torch import Tensor


def check_stop_at_layer(stop_at_layer: int | None, n_layers: int) -> int:
    """How many blocks to run: ``n_layers`` for None, else ``stop_at_layer`` (negative counts from the end)."""
    if stop_at_layer is None:
        return n_layers
    if (
        not isinstance(stop_at_layer, int)
        or isinstance(stop_at_layer, bool)
        or not -n_layers <= stop_at_layer <= n_layers
    ):
        raise ValueError(f"stop_at_layer must be an int in [{-n_layers}, {n_layers}], got {stop_at_layer!r}")
    return stop_at_layer % n_layers if stop_at_layer < 0 else stop_at_layer


def is_text(value) -> bool:
    """A str, or a non-empty list/tuple of str: input to tokenize."""
    return isinstance(value, str) or (
        isinstance(value, (list, tuple)) and len(value) > 0 and all(isinstance(item, str) for item in value)
    )


def as_id_tensor(tokens):
    """Token ids given as a list of ints, a list of such lists or a numpy array, as an int64 tensor; anything else as
    is.

    Ids too large for int64 raise ``ValueError`` (they are no token id of any vocabulary).
    """
    if isinstance(tokens, Tensor):
        return tokens
    if type(tokens).__module__ == "numpy" and hasattr(tokens, "dtype"):
        if tokens.dtype.kind not in "iu":
            raise TypeError(f"token ids must be integers, got a numpy array of dtype {tokens.dtype}")
        return torch.from_numpy(tokens).long()
    if isinstance(tokens, (list, tuple)) and tokens:
        rows = tokens if all(isinstance(row, (list, tuple)) for row in tokens) else [tokens]
        flat = [item for row in rows for item in row]
        if flat and all(isinstance(item, int) and not isinstance(item, bool) for item in flat):
            too_large = [item for item in flat if not -(2**63) <= item < 2**63]
            if too_large:
                raise ValueError(f"token ids must lie in [0, d_vocab), got {too_large[0]}")
            return torch.tensor(tokens, dtype=torch.long)
    return tokens


def check_token_ids(tokens, d_vocab: int, n_ctx: int, offset: int = 0, allow_meta: bool = False) -> Tensor:
    """``tokens`` as int64 ``[batch, pos]`` (a ``[pos]`` tensor is a batch of one), ids in ``[0, d_vocab)``.

    ``offset`` counts positions already processed (a key/value cache); ``offset + pos``
    must not exceed ``n_ctx``.
    """
    if not isinstance(tokens, Tensor):
        raise TypeError(
            "tokens must be token ids (an integer Tensor [batch, pos], a list of ints or a numpy array) or "
            f"text, got {type(tokens).__name__}: {tokens!r:.60}"
        )
    if tokens.is_meta and not allow_meta:
        raise ValueError("tokens are on the meta device: they hold no ids (pass real token ids)")
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise TypeError(f"tokens must be an integer tensor (torch.long), got dtype {tokens.dtype}")
    if tokens.ndim == 1:
        tokens = tokens.unsqueeze(0)
    if tokens.ndim != 2:
        raise ValueError(f"tokens must have shape [batch, pos] (or [pos]), got shape {tuple(tokens.shape)}")
    batch, pos = tokens.shape
    if batch == 0 or pos == 0:
        raise ValueError(f"tokens must be non-empty, got shape {tuple(tokens.shape)}")
    if offset + pos > n_ctx:
        cached = f" after {offset} cached positions" if offset else ""
        raise ValueError(f"sequence of {pos} tokens{cached} exceeds n_ctx={n_ctx}")
    if not tokens.is_meta:
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= d_vocab:
            raise ValueError(f"token ids must lie in [0, d_vocab={d_vocab}), got {low if low < 0 else high}")
    return tokens.long()


def check_like_tokens(value, tokens: Tensor, name: str, allow_bool: bool) -> Tensor:
    """``value`` as a tensor shaped like ``tokens`` (a ``[pos]`` tensor is a batch of one), of integers (or bools)."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a Tensor shaped like tokens {tuple(tokens.shape)}, got {type(value).__name__}")
    if value.dtype.is_floating_point or value.dtype.is_complex or (value.dtype == torch.bool and not allow_bool):
        kinds = "an integer or bool" if allow_bool else "an integer"
        raise TypeError(f"{name} must be {kinds} tensor, got dtype {value.dtype}")
    if value.ndim == 1:
        value = value.unsqueeze(0)
    if value.shape != tokens.shape:
        raise ValueError(f"{name} has shape {tuple(value.shape)}, expected the tokens' shape {tuple(tokens.shape)}")
    return value


def check_attention_mask(attention_mask, tokens: Tensor, allow_empty_rows: bool = False) -> Int[Tensor, "batch pos"]:
    """The mask shaped like ``tokens``, holding only 0 and 1, with a real token in every row.

    ``allow_empty_rows``: a row may be all padding here (its real tokens are earlier, in a
    key/value cache).
    """
    mask = check_like_tokens(attention_mask, tokens, "attention_mask", allow_bool=True)
    if not mask.is_meta:
        if not ((mask == 0) | (mask == 1)).all():
            raise ValueError(
                f"attention_mask must hold only 0 (padding) and 1 (real token), got values {mask.unique().tolist()}"
            )
        empty = (mask.sum(dim=-1) == 0).nonzero().flatten().tolist()
        if empty and not allow_empty_rows:
            raise ValueError(f"attention_mask rows {empty} have no real token: every sequence needs at least one")
    return mask


__all__ = ["check_attention_mask", "check_like_tokens", "check_stop_at_layer", "check_token_ids"]
