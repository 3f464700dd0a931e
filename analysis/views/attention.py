"""``attention_view``: a text coloured by how much a head attends from, or to, one of its tokens."""

from collections.abc import Sequence

import numpy as np
from jaxtyping import Float
from torch import Tensor

from . import colours, inputs
from .view import View


def attention_view(
    tokens: Sequence[str],
    pattern: Float[Tensor, "head_index query_pos key_pos"] | Float[Tensor, "query_pos key_pos"] | np.ndarray,
    head_names: Sequence[str] | None = None,
    *,
    initial_head: int = 0,
    initial_token: int = -1,
) -> View:
    """The text, coloured by one head's attention weights around the active token.

    ``tokens`` are the ``pos`` strings (``model.to_str_tokens``); ``pattern`` is
    ``[head_index, query_pos, key_pos]`` (e.g. ``cache["pattern", layer][0]``) or one
    head's ``[query_pos, key_pos]``, post-softmax weights in ``[0, 1]``. With active
    token ``a`` and head ``h``, token ``p`` is coloured by

    - ``pattern[h, a, p]`` in "from" mode (row ``a``: where ``a`` looks), or
    - ``pattern[h, p, a]`` in "to" mode (column ``a``: who looks at ``a``),

    on the sequential scale over ``[0, 1]``. Hovering or focusing a token makes it
    active; clicking it, Enter or Space keeps it. A menu picks the head; "all heads"
    adds one small coloured copy of the text per head. ``head_names`` label the heads
    (default ``H0, H1, ...``); ``initial_head`` and ``initial_token`` (default the
    last, which sees every earlier token) say what shows first.

    >>> import torch
    >>> pattern = torch.tensor([[[1.0, 0.0], [0.25, 0.75]]])
    >>> view = attention_view(["The", " cat"], pattern)
    >>> view
    <View attention: 1 head over 2 tokens>
    >>> view.data["pattern"], view.data["initialToken"]
    ([[[1, 0], [0.25, 0.75]]], 1)
    """
    what = "attention_view"
    tokens = inputs.str_tokens(tokens, what)
    patterns = inputs.attention_patterns(pattern, len(tokens), what)
    n_heads = patterns.shape[0]
    names = inputs.labels(head_names, n_heads, "head", "H")
    data = {
        "tokens": tokens,
        "heads": names,
        "pattern": inputs.rounded(patterns, 4),
        "initialHead": inputs.index(initial_head, n_heads, "initial_head", "heads"),
        "initialToken": inputs.index(initial_token, len(tokens), "initial_token", "tokens"),
        "scale": colours.sequential_scale(1.0),
    }
    heads = "1 head" if n_heads == 1 else f"{n_heads} heads"
    return View("attention", data, fallback="".join(tokens), description=f"{heads} over {len(tokens)} tokens")
