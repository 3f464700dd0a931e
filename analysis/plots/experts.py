"""Figures of mixtures of experts: expert usage per layer and per token, and experts' direct logit attribution.

Re-exported by ``analysis.plots``. Axis titles from the glossary plus ``expert`` (an expert
of a mixture) and ``layer`` (the mixtures' blocks, labelled by their block index).
"""

from collections.abc import Sequence

import plotly.graph_objects as go
from jaxtyping import Float
from torch import Tensor

from . import base


def _by_expert(values, rows: str, row_labels, what: str, signed: bool, title, colorbar_title) -> go.Figure:
    """A heatmap of an expert per column and a layer (or token) per row; unsigned values (shares, routing weights)
    on a scale from 0."""
    return base.heatmap(
        values, x_title="expert", y_title=rows, y_labels=row_labels, signed=signed, zmin=None if signed else 0.0,
        title=title, colorbar_title=colorbar_title, what=what,
    )  # fmt: skip


def plot_expert_usage(
    values: Float[Tensor, "layer expert"],
    layer_labels: Sequence | None = None,
    title: str | None = None,
    colorbar_title: str = "share of tokens",
) -> go.Figure:
    """One value per layer and expert (``ExpertUsage.fraction()``: the share of tokens routed to it) as a heatmap.

    ``layer_labels``: the block index of each row (``ExpertUsage.layers``), since a model's
    dense blocks have no row.
    """
    return _by_expert(values, "layer", layer_labels, "plot_expert_usage", False, title, colorbar_title)


def plot_token_routing(
    weights: Float[Tensor, "pos expert"],
    str_tokens: Sequence[str],
    title: str | None = None,
    colorbar_title: str = "routing weight",
) -> go.Figure:
    """Each token's routing weight for every expert of one layer (0 where not chosen): tokens down, experts across."""
    fig = _by_expert(weights, "pos", str_tokens, "plot_token_routing", False, title, colorbar_title)
    fig.update_xaxes(dtick=1)
    return fig


def plot_expert_attribution(
    values: Float[Tensor, "layer expert"],
    layer_labels: Sequence | None = None,
    title: str | None = None,
    colorbar_title: str = "logit",
) -> go.Figure:
    """Each expert's direct logit attribution (``ExpertAttribution.experts[..., b]``), signed, RdBu centred at 0."""
    return _by_expert(values, "layer", layer_labels, "plot_expert_attribution", True, title, colorbar_title)


__all__ = ["plot_expert_attribution", "plot_expert_usage", "plot_token_routing"]
