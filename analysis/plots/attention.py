"""Figures of attention patterns, per-head scores and QK/OV circuits (re-exported by ``analysis.plots``)."""

import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from jaxtyping import Float
from plotly.subplots import make_subplots
from torch import Tensor

from . import base


def plot_attention_pattern(
    pattern: Float[Tensor, "query_pos key_pos"],
    str_tokens: Sequence[str] | None = None,
    title: str | None = None,
) -> go.Figure:
    """One head's pattern: rows ``query_pos``, columns ``key_pos``, both labelled with the tokens.

    >>> import torch
    >>> fig = plot_attention_pattern(torch.eye(3), ["a", "b", "c"], title="L0H0")
    >>> fig.data[0].type, fig.layout.xaxis.title.text, fig.layout.yaxis.title.text
    ('heatmap', 'key_pos', 'query_pos')
    """
    array = base.check_ndim(pattern, 2, "query_pos, key_pos", "plot_attention_pattern")
    if array.shape[0] != array.shape[1]:
        raise ValueError(f"an attention pattern is square [query_pos, key_pos], got shape {array.shape}")
    axes = dict(x_title="key_pos", y_title="query_pos", x_labels=str_tokens, y_labels=str_tokens)
    return base.pattern_heatmap(array, "plot_attention_pattern", title, **axes)


def plot_attention_heads(
    patterns: Float[Tensor, "head_index query_pos key_pos"],
    str_tokens: Sequence[str] | None = None,
    layer: int | None = None,
    n_cols: int = 4,
    title: str | None = None,
) -> go.Figure:
    """A grid with the pattern of every head of one layer (one shared colour scale, 0 to 1)."""
    array = base.check_ndim(patterns, 3, "head_index, query_pos, key_pos", "plot_attention_heads")
    n_heads, n_pos, n_keys = array.shape
    if n_pos != n_keys:
        raise ValueError(f"attention patterns are square [head_index, query_pos, key_pos], got shape {array.shape}")
    tick_labels = base.labels(str_tokens, n_pos, "pos")
    if isinstance(n_cols, bool) or not isinstance(n_cols, int) or n_cols < 1:
        raise ValueError(f"n_cols must be a positive int, got {n_cols!r}")
    n_cols = min(n_cols, n_heads)
    n_rows = math.ceil(n_heads / n_cols)
    prefix = f"L{layer}" if layer is not None else ""
    fig = make_subplots(rows=n_rows, cols=n_cols, subplot_titles=[f"{prefix}H{h}" for h in range(n_heads)])
    for head in range(n_heads):
        row, col = head // n_cols + 1, head % n_cols + 1
        fig.add_trace(
            go.Heatmap(
                z=array[head],
                x=list(range(n_pos)),
                y=list(range(n_pos)),
                coloraxis="coloraxis",
                hovertemplate="query_pos=%{y}<br>key_pos=%{x}<br>attention=%{z:.3f}<extra></extra>",
            ),
            row=row,
            col=col,
        )
        base.set_ticks(fig, "x", tick_labels, "key_pos", row=row, col=col)
        base.set_ticks(fig, "y", tick_labels, "query_pos", row=row, col=col)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(coloraxis=dict(colorscale=base.SEQUENTIAL, cmin=0.0, cmax=1.0), title=dict(text=title))
    return fig


def plot_head_scores(
    scores: Float[Tensor, "layer head_index"],
    title: str | None = None,
    signed: bool = False,
    colorbar_title: str = "score",
) -> go.Figure:
    """A ``layer x head_index`` heatmap: detector scores, entropies (``signed=False``) or
    attributions, copying scores and patching results (``signed=True``: RdBu centred at 0)."""
    return base.layer_heatmap(scores, "head_index", "plot_head_scores", signed, title, colorbar_title)


def plot_circuit(
    values: Float[Tensor, "rows cols"],
    row_labels: Sequence[str] | None = None,
    col_labels: Sequence[str] | None = None,
    kind: str = "qk",
    title: str | None = None,
) -> go.Figure:
    """A block of a full QK (``kind="qk"``: query x key tokens) or OV (``"ov"``: source x
    output tokens) circuit, e.g. from ``circuit_on_tokens``, with token labels (RdBu, 0-centred)."""
    roles = {"qk": ("query", "key"), "ov": ("source", "output")}
    if kind not in roles:
        raise ValueError(f"kind must be 'qk' or 'ov', got {kind!r}")
    row_role, col_role = roles[kind]
    return base.heatmap(
        values,
        x_title=f"d_vocab ({col_role} token)",
        y_title=f"d_vocab ({row_role} token)",
        x_labels=col_labels,
        y_labels=row_labels,
        signed=True,
        title=title,
        colorbar_title="attention score" if kind == "qk" else "logit effect",
        what="plot_circuit",
    )


def plot_composition_scores(
    scores: Float[Tensor, "layer head_index layer head_index"],
    kind: str = "",
    title: str | None = None,
    readers: Sequence[tuple[int, int]] | None = None,
) -> go.Figure:
    """Composition scores ``[layer, head_index, layer, head_index]`` as a writer x reader heatmap.

    Rows are writer heads ``L{layer}H{head_index}``, columns reader heads (only ``readers``,
    a list of ``(layer, head)``, when given); pairs that cannot compose (the reader is not
    in a later layer) are left blank.
    """
    array = base.check_ndim(scores, 4, "layer, head_index, layer, head_index", "plot_composition_scores")
    n_layers, n_heads = array.shape[:2]
    if array.shape != (n_layers, n_heads, n_layers, n_heads):
        raise ValueError(f"composition scores have shape [layer, head_index, layer, head_index], got {array.shape}")
    later = np.arange(n_layers)[:, None, None, None] < np.arange(n_layers)[None, None, :, None]
    flat = np.where(np.broadcast_to(later, array.shape), array, np.nan).reshape(n_layers * n_heads, n_layers * n_heads)
    head_labels = [f"L{layer}H{head}" for layer in range(n_layers) for head in range(n_heads)]
    columns = (
        list(range(n_layers * n_heads)) if readers is None else [layer * n_heads + head for layer, head in readers]
    )
    name = f"{kind.upper()}-composition" if kind else "composition"
    return base.heatmap(
        flat[:, columns],
        x_title="reader head (layer, head_index)",
        y_title="writer head (layer, head_index)",
        x_labels=[head_labels[c] for c in columns],
        y_labels=head_labels,
        signed=False,
        zmin=0.0,
        title=title or f"{name} scores",
        colorbar_title=name,
        what="plot_composition_scores",
    )
