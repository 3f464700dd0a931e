"""The sweep as one plotly figure: concept, fluency and side effects against strength, one line per vector (layer),
with the prompt-only baseline (dashed) and the unsteered model (dotted) beside them, as AxBench compares."""

import math

import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from .evaluate import SteeringSweep

PANELS = (
    ("concept", "concept: log p(targets), nats"),
    ("similarity", "concept: MiniLM similarity to positive - negative"),
    ("perplexity", "fluency: unsteered perplexity of the text"),
    ("kl", "side effects: KL on neutral prompts, nats"),
)


def _panels(sweep: SteeringSweep) -> list[tuple[str, str]]:
    """The panels with numbers: no concept panel without targets, no similarity panel without a scorer."""
    shown = []
    for metric, title in PANELS:
        values = sweep.grid(metric)
        if not bool(values.isnan().all()):
            shown.append((metric, title))
    return shown


def sweep_figure(sweep: SteeringSweep, title: str = "steering sweep") -> go.Figure:
    """One panel per measured metric (x: strength); lines: the vectors; dashed: prompt baseline; dotted: unsteered."""
    panels = _panels(sweep)
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[t for _, t in panels], horizontal_spacing=0.07)
    colours = qualitative.Plotly
    for col, (metric, _) in enumerate(panels, start=1):
        grid = sweep.grid(metric)
        for v, label in enumerate(sweep.labels):
            fig.add_trace(
                go.Scatter(
                    x=sweep.strengths,
                    y=grid[v].tolist(),
                    mode="lines+markers",
                    name=label,
                    legendgroup=label,
                    showlegend=col == 1,
                    line={"color": colours[v % len(colours)]},
                    hovertemplate=f"{label}<br>strength %{{x}}<br>{metric} %{{y:.4g}}<extra></extra>",
                ),
                row=1,
                col=col,
            )
        for name, measured, dash in (
            ("prompt baseline", sweep.baseline, "dash"),
            ("unsteered", sweep.unsteered, "dot"),
        ):
            value = getattr(measured, metric)
            if value is None or math.isnan(value):
                continue
            fig.add_trace(
                go.Scatter(
                    x=[min(sweep.strengths), max(sweep.strengths)],
                    y=[value, value],
                    mode="lines",
                    name=name,
                    legendgroup=name,
                    showlegend=col == 1,
                    line={"color": "#b2182b" if name == "prompt baseline" else "#666", "dash": dash},
                    hovertemplate=f"{name}<br>{metric} {value:.4g}<extra></extra>",
                ),
                row=1,
                col=col,
            )
        fig.update_xaxes(title_text="strength", row=1, col=col)
        if metric == "perplexity":
            fig.update_yaxes(type="log", row=1, col=col)
    fig.update_layout(
        title=title, height=420, width=max(420 * len(panels), 900), legend={"orientation": "h", "y": -0.25}
    )
    return fig


__all__ = ["sweep_figure"]
