"""Shared building blocks of the analysis figures (see ``analysis.plots`` for the figures).

Conventions: signed values use the diverging ``RdBu`` scale centred on zero (red
below, blue above); non-negative values use the sequential ``Blues`` scale. Rows and
columns are placed at integer positions and labelled with tick text, so repeated
labels (the same token twice in a text) stay separate cells. Axis titles use the
axis glossary: ``layer``, ``head_index``, ``query_pos``, ``key_pos``, ``pos``,
``d_vocab``, ``neuron``.
"""

import html
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from torch import Tensor

from .. import _checks

DIVERGING = "RdBu"
SEQUENTIAL = "Blues"


def to_numpy(values) -> np.ndarray:
    """A tensor (or array-like) as a float64 numpy array, detached and on the CPU."""
    if isinstance(values, Tensor):
        values = values.detach().cpu().double().numpy()
    return np.asarray(values, dtype=np.float64)


def check_ndim(values, ndim: int, axes: str, what: str) -> np.ndarray:
    array = to_numpy(values)
    if array.ndim != ndim:
        raise ValueError(f"{what} expects values of shape [{axes}] ({ndim}-d), got shape {tuple(array.shape)}")
    return array


def display_label(label: str) -> str:
    """A label safe to show in plotly text: HTML special characters escaped, newlines made visible."""
    return html.escape(str(label).replace("\n", "\\n"), quote=False)


def labels(values: Sequence | None, size: int, axis: str) -> list[str] | None:
    """Check that there is one label per entry of ``axis`` and make them displayable."""
    checked = _checks.check_labels(values, size, axis)
    return None if checked is None else [display_label(label) for label in checked]


def colour_kwargs(signed: bool, zmin: float | None = None, zmax: float | None = None) -> dict:
    """Colour-scale keywords of a heatmap trace: RdBu centred at 0 for signed values, else Blues."""
    if signed:
        return dict(colorscale=DIVERGING, zmid=0.0)
    kwargs: dict = dict(colorscale=SEQUENTIAL)
    if zmin is not None:
        kwargs["zmin"] = zmin
    if zmax is not None:
        kwargs["zmax"] = zmax
    return kwargs


def set_ticks(fig: go.Figure, axis: str, tick_labels: list[str] | None, title: str, **where) -> None:
    """Axis title, and tick text at the integer positions when labels are given."""
    update = fig.update_xaxes if axis == "x" else fig.update_yaxes
    update(title_text=title, **where)
    if tick_labels is not None:
        update(tickmode="array", tickvals=list(range(len(tick_labels))), ticktext=tick_labels, **where)


def heatmap(
    values,
    *,
    x_title: str,
    y_title: str,
    x_labels: Sequence | None = None,
    y_labels: Sequence | None = None,
    signed: bool,
    title: str | None = None,
    colorbar_title: str | None = None,
    cell_text: Sequence[Sequence[str]] | None = None,
    zmin: float | None = None,
    zmax: float | None = None,
    what: str = "heatmap",
) -> go.Figure:
    """A 2-d heatmap ``values[row, col]`` with rows top to bottom, as ``imshow`` draws them."""
    array = check_ndim(values, 2, f"{y_title}, {x_title}", what)
    n_rows, n_cols = array.shape
    x_ticks = labels(x_labels, n_cols, x_title)
    y_ticks = labels(y_labels, n_rows, y_title)
    text = None
    if cell_text is not None:
        if len(cell_text) != n_rows or any(len(row) != n_cols for row in cell_text):
            raise ValueError(
                f"cell_text must be {n_rows} rows of {n_cols} labels, matching values of shape {array.shape}"
            )
        text = [[display_label(cell) for cell in row] for row in cell_text]
    # NaN cells are left blank (plotly draws nothing for None)
    z = np.where(np.isnan(array), None, array).tolist()
    trace = go.Heatmap(
        z=z,
        x=list(range(n_cols)),
        y=list(range(n_rows)),
        text=text,
        texttemplate="%{text}" if text is not None else None,
        colorbar=dict(title=dict(text=colorbar_title)) if colorbar_title else None,
        hovertemplate=f"{y_title}=%{{y}}<br>{x_title}=%{{x}}<br>value=%{{z:.4g}}<extra></extra>",
        **colour_kwargs(signed, zmin, zmax),
    )
    fig = go.Figure(trace)
    set_ticks(fig, "x", x_ticks, x_title)
    set_ticks(fig, "y", y_ticks, y_title)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title=dict(text=title))
    return fig


def layer_heatmap(values, columns: str, what: str, signed: bool, title, colorbar_title, **options) -> go.Figure:
    """``heatmap`` of one row per layer and ``columns`` across (neurons, heads, positions, experts): the figures that
    differ only in their columns, their colours and their labels."""
    return heatmap(
        values, x_title=columns, y_title="layer", signed=signed, title=title, colorbar_title=colorbar_title, what=what,
        **options,
    )  # fmt: skip


def pattern_heatmap(pattern, what: str, title, **axes) -> go.Figure:
    """``heatmap`` of an attention pattern, weights from 0 to 1 (self-attention's query x key positions,
    cross-attention's target x source positions): ``axes`` holds the titles and labels."""
    return heatmap(
        pattern, signed=False, zmin=0.0, zmax=1.0, title=title, colorbar_title="attention", what=what, **axes
    )
