"""``activation_view``: a text coloured by a per-token value (a neuron, an SAE feature, any scalar)."""

from collections.abc import Sequence

import numpy as np
from jaxtyping import Float
from torch import Tensor

from . import colours, inputs
from .view import View


def column_scale(column: np.ndarray, signed: bool | None) -> dict:
    """The colour scale of one column: diverging over ``[-m, m]`` when signed, else sequential over ``[0, m]``.

    ``m`` is the column's largest magnitude (1 for an all-zero column). ``signed=None``
    decides from the data: signed when any value is negative.
    """
    largest = float(np.abs(column).max())
    vmax = largest if largest > 0 else 1.0
    if signed is None:
        signed = bool((column < 0).any())
    return colours.diverging_scale(vmax) if signed else colours.sequential_scale(vmax)


def activation_view(
    tokens: Sequence[str],
    values: Float[Tensor, "pos"] | Float[Tensor, "pos n"] | np.ndarray,
    names: Sequence[str] | None = None,
    *,
    signed: bool | None = None,
    initial_column: int = 0,
) -> View:
    """The text, each token coloured by its value in one column of ``values``.

    ``values`` is ``[pos]`` (one scalar per token) or ``[pos, n]``: ``n`` neurons
    (``cache["post", layer][0]``), SAE features, or any per-position scalars;
    ``names`` label the ``n`` columns (default ``0, 1, ...``). A menu picks the
    column; hovering or focusing a token shows its value (also in its tooltip).

    Colours: a column with a negative value is shown on the blue/orange diverging
    scale over ``[-m, m]``, white at exactly 0; otherwise on the sequential scale
    over ``[0, m]``; ``m`` is the column's largest magnitude. ``signed=True`` or
    ``False`` forces one scale for every column (``False`` refuses negative values).
    Values go into the page rounded to 4 decimals, more when a column's values are
    all small, so that 4 significant digits of its largest value survive.

    >>> import torch
    >>> view = activation_view(["a", "b", "c"], torch.tensor([[0.5, -1.0], [2.0, 0.0], [0.0, 1.0]]), ["relu", "signed"])
    >>> view
    <View activations: 2 columns over 3 tokens>
    >>> [scale["min"] for scale in view.data["scales"]]  # sequential from 0, diverging from -max
    [0.0, -1.0]
    """
    what = "activation_view"
    tokens = inputs.str_tokens(tokens, what)
    array = inputs.activation_values(values, len(tokens), what)
    n_columns = array.shape[1]
    column_names = inputs.labels(names, n_columns, "column", "")
    if signed is not None and not isinstance(signed, bool):
        raise TypeError(f"signed must be None, True or False, got {signed!r}")
    if signed is False and (array < 0).any():
        raise ValueError(
            f"signed=False asks for the sequential scale from 0, but values hold negatives (min {array.min():.4g})"
        )
    # Scales come from the rounded values, so the legend's range reads as the values do.
    decimals = [inputs.decimals_for(array[:, c]) for c in range(n_columns)]
    columns = [np.round(array[:, c], d) for c, d in enumerate(decimals)]
    data = {
        "tokens": tokens,
        "names": column_names,
        "columns": [inputs.rounded(column, d) for column, d in zip(columns, decimals)],
        "scales": [column_scale(column, signed) for column in columns],
        "initialColumn": inputs.index(initial_column, n_columns, "initial_column", "columns"),
    }
    count = "1 column" if n_columns == 1 else f"{n_columns} columns"
    return View("activations", data, fallback="".join(tokens), description=f"{count} over {len(tokens)} tokens")
