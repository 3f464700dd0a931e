"""Figures of an encoder-decoder: cross-attention as source x target heatmaps, alignment, and source-position effects.

Rows are target positions (``query_pos``, labelled with the decoder's input tokens),
columns source positions (``key_pos``, labelled with the source tokens); the cell at
``(t, s)`` is how much target position ``t`` reads source word ``s``. A known alignment is
drawn on top as open circles (one per aligned target position).
"""

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from jaxtyping import Float, Int
from torch import Tensor

from . import base

TARGET_AXIS = "query_pos (target)"
SOURCE_AXIS = "key_pos (source)"


def _alignment_trace(alignment, n_target: int, n_source: int) -> go.Scatter:
    aligned = base.to_numpy(alignment).astype(int).reshape(-1)
    if aligned.shape != (n_target,):
        raise ValueError(
            f"alignment must hold one source position per target position ({n_target}), got {aligned.shape[0]}"
        )
    if aligned.max(initial=-1) >= n_source or aligned.min(initial=0) < -1:
        raise ValueError(f"alignment entries must lie in [-1, {n_source}), got {aligned.min()}..{aligned.max()}")
    rows = np.nonzero(aligned >= 0)[0]
    return go.Scatter(
        x=aligned[rows].tolist(),
        y=rows.tolist(),
        mode="markers",
        name="known alignment",
        marker=dict(symbol="circle-open", size=16, color="#d6604d", line=dict(width=2)),
        hovertemplate="target %{y} comes from source %{x}<extra>known alignment</extra>",
    )


def _target_by_source(source_tokens, target_tokens) -> dict:
    """The axes of every figure here: target positions down, source positions across, labelled by their tokens."""
    return dict(x_title=SOURCE_AXIS, y_title=TARGET_AXIS, x_labels=source_tokens, y_labels=target_tokens)


def plot_cross_attention(
    pattern: Float[Tensor, "query_pos key_pos"],
    source_tokens: Sequence[str] | None = None,
    target_tokens: Sequence[str] | None = None,
    alignment: Int[Tensor, "query_pos"] | None = None,
    title: str | None = None,
) -> go.Figure:
    """One cross-attention head's pattern: target rows, source columns, token labels; ``alignment`` circled.

    >>> import torch
    >>> pattern, alignment = torch.eye(3)[:, :2].softmax(-1), torch.tensor([0, 1, -1])
    >>> fig = plot_cross_attention(pattern, ["drei", "</s>"], ["<s>", "3", "</s>"], alignment)
    >>> fig.layout.xaxis.title.text, fig.layout.yaxis.title.text, [trace.type for trace in fig.data]
    ('key_pos (source)', 'query_pos (target)', ['heatmap', 'scatter'])
    """
    array = base.check_ndim(pattern, 2, "query_pos, key_pos", "plot_cross_attention")
    fig = base.pattern_heatmap(array, "plot_cross_attention", title, **_target_by_source(source_tokens, target_tokens))
    if alignment is not None:
        fig.add_trace(_alignment_trace(alignment, *array.shape))
        fig.update_layout(legend=dict(orientation="h", y=-0.15))
    return fig


def plot_source_effects(
    effects: Float[Tensor, "key_pos pos"],
    source_tokens: Sequence[str] | None = None,
    target_tokens: Sequence[str] | None = None,
    title: str | None = None,
    colorbar_title: str = "logit change",
) -> go.Figure:
    """Source position x target position effects (corrupting or patching source words), transposed to the
    cross-attention layout: target rows, source columns, RdBu centred at 0."""
    array = base.check_ndim(effects, 2, "key_pos, pos", "plot_source_effects").T
    axes = _target_by_source(source_tokens, target_tokens)
    return base.heatmap(
        array, signed=True, title=title, colorbar_title=colorbar_title, what="plot_source_effects", **axes
    )


def plot_cross_attention_heads(
    patterns: Float[Tensor, "layer head_index query_pos key_pos"],
    source_tokens: Sequence[str] | None = None,
    target_tokens: Sequence[str] | None = None,
    alignment: Int[Tensor, "query_pos"] | None = None,
    initial: tuple[int, int] = (0, 0),
) -> go.Figure:
    """Every cross-attention head's pattern in one figure; a menu shows one head at a time (``initial`` first)."""
    array = base.check_ndim(patterns, 4, "layer, head_index, query_pos, key_pos", "plot_cross_attention_heads")
    n_layers, n_heads = array.shape[:2]
    names = [f"L{layer}C{head}" for layer in range(n_layers) for head in range(n_heads)]
    first = initial[0] * n_heads + initial[1]
    fig = plot_cross_attention(
        array[initial], source_tokens, target_tokens, alignment, title=f"cross-attention of {names[first]}"
    )
    template = fig.data[0]
    traces = []
    for index, name in enumerate(names):
        trace = go.Heatmap(template)
        trace.update(z=array[index // n_heads, index % n_heads].round(4).tolist(), visible=index == first, name=name)
        traces.append(trace)
    extra = list(fig.data[1:])  # the alignment circles stay on whichever head is shown
    fig = go.Figure(traces + extra, layout=fig.layout)
    buttons = [
        dict(
            label=name,
            method="update",
            args=[
                {"visible": [other == index for other in range(len(names))] + [True] * len(extra)},
                {"title.text": f"cross-attention of {name}"},
            ],
        )
        for index, name in enumerate(names)
    ]
    fig.update_layout(
        updatemenus=[
            dict(buttons=buttons, active=first, direction="down", x=1.0, xanchor="right", y=1.12, yanchor="bottom")
        ]
    )
    return fig


__all__ = ["plot_cross_attention", "plot_cross_attention_heads", "plot_source_effects"]
