"""The tuned lens beside the logit lens, layer by layer: KL to the final distribution and top-1 agreement."""

import plotly.graph_objects as go
from plotly.subplots import make_subplots

COLOURS = {"tuned": "#2166ac", "logit": "#b2182b"}  # the RdBu scale's two ends


def plot_lens_comparison(evaluation, title: str = "Tuned lens and logit lens, held out") -> go.Figure:
    """Two panels over ``layer`` (the residual entering each block): mean KL(final || lens) in nats (log scale),
    and the share of tokens whose top-1 token agrees with the model's; one line per lens."""
    figure = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=("KL(final || lens), nats", "top-1 agreement with the final prediction"),
        horizontal_spacing=0.12,
    )
    for kind, name in (("tuned", "tuned lens"), ("logit", "logit lens")):
        for col, values in ((1, getattr(evaluation, f"{kind}_kl")), (2, getattr(evaluation, f"{kind}_top1"))):
            figure.add_trace(
                go.Scatter(
                    x=list(evaluation.layers),
                    y=list(values),
                    mode="lines+markers",
                    name=name,
                    legendgroup=kind,
                    showlegend=col == 1,
                    line=dict(color=COLOURS[kind]),
                    hovertemplate=f"{name}<br>layer %{{x}}<br>%{{y:.4f}}<extra></extra>",
                ),
                row=1,
                col=col,
            )
    positive = [v for v in list(evaluation.tuned_kl) + list(evaluation.logit_kl) if v > 0]
    figure.update_yaxes(type="log" if positive else "linear", title_text="nats", row=1, col=1)
    figure.update_yaxes(range=[0, 1.02], title_text="share of tokens", row=1, col=2)
    figure.update_xaxes(title_text="layer")
    figure.update_layout(
        title=f"{title} ({evaluation.n_tokens} tokens)", height=420, width=1000, template="plotly_white"
    )
    return figure


__all__ = ["plot_lens_comparison"]
