"""``pattern_grid``: every head's attention pattern as a thumbnail; one enlarges on a click."""

from collections.abc import Sequence

import numpy as np
from jaxtyping import Float
from torch import Tensor

from . import colours, inputs
from .view import View


def pattern_grid(
    pattern: Float[Tensor, "head_index query_pos key_pos"] | Float[Tensor, "query_pos key_pos"] | np.ndarray,
    tokens: Sequence[str],
    head_names: Sequence[str] | None = None,
) -> View:
    """A thumbnail of each head's ``[query_pos, key_pos]`` pattern (rows queries, columns keys).

    ``pattern`` is one layer's ``[head_index, query_pos, key_pos]`` (e.g.
    ``cache["pattern", layer][0]``), weights in ``[0, 1]`` on the sequential scale.
    Clicking a thumbnail (or Enter / Space on it) enlarges it with the ``tokens`` on
    both axes; hovering a cell, or moving over it with the arrow keys, shows its
    query, key and weight. ``head_names`` label the heads (default ``H0, H1, ...``).

    >>> import torch
    >>> pattern_grid(torch.eye(3).expand(4, 3, 3), ["a", "b", "c"])
    <View grid: 4 heads over 3 tokens>
    """
    what = "pattern_grid"
    tokens = inputs.str_tokens(tokens, what)
    patterns = inputs.attention_patterns(pattern, len(tokens), what)
    n_heads = patterns.shape[0]
    data = {
        "tokens": tokens,
        "heads": inputs.labels(head_names, n_heads, "head", "H"),
        "pattern": inputs.rounded(patterns, 4),
        "scale": colours.sequential_scale(1.0),
    }
    heads = "1 head" if n_heads == 1 else f"{n_heads} heads"
    return View("grid", data, fallback="".join(tokens), description=f"{heads} over {len(tokens)} tokens")
