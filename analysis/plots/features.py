"""Figures of SAE features (re-exported by ``analysis.plots``)."""

import numpy as np
import plotly.graph_objects as go
from jaxtyping import Float, Int
from torch import Tensor

from . import base


def plot_feature_histogram(
    edges: Float[Tensor, "edge"],
    counts: Int[Tensor, "bin"],
    title: str | None = None,
    x_title: str = "activation",
) -> go.Figure:
    """One feature's histogram: ``counts[i]`` values in ``[edges[i], edges[i + 1])`` (``len(edges) = len(counts) + 1``),
    drawn as bars of the bins' widths (e.g. ``FeatureHistograms``' nonzero activations)."""
    edges = base.check_ndim(edges, 1, "edge", "plot_feature_histogram")
    counts = base.check_ndim(counts, 1, "bin", "plot_feature_histogram")
    if len(edges) != len(counts) + 1 or not bool(np.all(np.diff(edges) > 0)):
        raise ValueError(
            f"plot_feature_histogram needs increasing edges, one more than counts: got {len(edges)} edges, "
            f"{len(counts)} counts"
        )
    fig = go.Figure(
        go.Bar(
            x=(edges[:-1] + edges[1:]) / 2,
            y=counts,
            width=np.diff(edges),
            marker_color="#2166ac",
            customdata=np.stack([edges[:-1], edges[1:]], axis=1),
            hovertemplate="[%{customdata[0]:.4g}, %{customdata[1]:.4g}): %{y}<extra></extra>",
        )
    )
    occupied = np.nonzero(counts)[0]
    if len(occupied):  # bins double as values arrive, so the outer ones are often empty: show the occupied range
        fig.update_xaxes(range=[float(edges[occupied[0]]), float(edges[occupied[-1] + 1])])
    fig.update_xaxes(title_text=x_title)
    fig.update_yaxes(title_text="count")
    fig.update_layout(title=dict(text=title), bargap=0)
    return fig
