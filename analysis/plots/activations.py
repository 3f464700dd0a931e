"""Figures of neurons, logit lens, direct logit attribution and patching (re-exported by ``analysis.plots``)."""

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from jaxtyping import Float
from torch import Tensor

from . import base


def plot_token_activations(
    values: Float[Tensor, "pos"] | Float[Tensor, "text pos"],
    str_tokens: Sequence[str] | Sequence[Sequence[str]],
    title: str | None = None,
    colorbar_title: str = "activation",
) -> go.Figure:
    """Each token of one text (``values [pos]``, ``str_tokens`` a list of str) or of several
    (``values [text, pos]``, one token list per text) written in a cell coloured by its value
    (RdBu centred at 0): a neuron's activation over a text. Shorter texts may pad their
    values with NaN and their token lists with ``""``.
    """
    array = base.to_numpy(values)
    if array.ndim == 1:
        array, str_tokens = array[None], [str_tokens]
    if array.ndim != 2:
        raise ValueError(f"plot_token_activations expects values [pos] or [text, pos], got shape {tuple(array.shape)}")
    if isinstance(str_tokens, str) or len(str_tokens) != array.shape[0]:
        raise ValueError(f"need one token list per text: {array.shape[0]} texts, got {len(str_tokens)} token lists")
    for text, tokens in enumerate(str_tokens):
        base.labels(tokens, array.shape[1], f"pos (tokens of text {text})")
    return base.heatmap(
        array,
        x_title="pos",
        y_title="text",
        signed=True,
        title=title,
        colorbar_title=colorbar_title,
        cell_text=[[str(token) for token in tokens] for tokens in str_tokens],
        what="plot_token_activations",
    )


def plot_neuron_summary(
    values: Float[Tensor, "layer d_mlp"],
    title: str | None = None,
    signed: bool = True,
    colorbar_title: str = "activation",
) -> go.Figure:
    """One value per neuron (e.g. ``neuron_summary(cache, "max")``) as a ``layer x neuron`` heatmap."""
    return base.layer_heatmap(values, "neuron", "plot_neuron_summary", signed, title, colorbar_title)


def plot_token_values(
    values: Float[Tensor, "k"],
    token_labels: Sequence[str],
    title: str | None = None,
    x_title: str = "direct logit effect",
) -> go.Figure:
    """Horizontal bars, one per token (e.g. a neuron's most promoted and suppressed tokens),
    blue for positive and red for negative values, first token at the top."""
    array = base.check_ndim(values, 1, "k", "plot_token_values")
    tick_labels = base.labels(token_labels, len(array), "d_vocab")
    fig = go.Figure(
        go.Bar(
            x=array,
            y=list(range(len(array))),
            orientation="h",
            marker_color=["#2166ac" if value >= 0 else "#b2182b" for value in array],
        )
    )
    base.set_ticks(fig, "y", tick_labels, "d_vocab")
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title_text=x_title)
    fig.update_layout(title=dict(text=title))
    return fig


def plot_logit_lens(
    values: Float[Tensor, "layer pos"],
    layer_labels: Sequence[str] | None = None,
    pos_labels: Sequence[str] | None = None,
    cell_text: Sequence[Sequence[str]] | None = None,
    signed: bool = False,
    title: str | None = None,
    colorbar_title: str = "value",
) -> go.Figure:
    """A ``layer x pos`` heatmap of a logit-lens quantity (e.g. the probability of the next
    token read from each layer), optionally with each cell's top predicted token as text."""
    labels = dict(x_labels=pos_labels, y_labels=layer_labels, cell_text=cell_text)
    return base.layer_heatmap(values, "pos", "plot_logit_lens", signed, title, colorbar_title, **labels)


def plot_layer_attribution(
    lines: Mapping[str, Float[Tensor, "layer"]],
    title: str | None = None,
    y_title: str = "direct logit attribution",
    layer_labels: Sequence[str] | None = None,
) -> go.Figure:
    """One line per series over layers, e.g. ``{"attn": attr.attn.mean(-1), "mlp": attr.mlp.mean(-1)}``."""
    if not isinstance(lines, Mapping) or not lines:
        raise ValueError("lines must be a non-empty mapping of series name -> values [layer]")
    arrays = {
        name: base.check_ndim(values, 1, "layer", f"plot_layer_attribution[{name!r}]") for name, values in lines.items()
    }
    n_layers = {len(array) for array in arrays.values()}
    if len(n_layers) != 1:
        raise ValueError(f"every series needs the same number of layers, got lengths {sorted(n_layers)}")
    n_layers = n_layers.pop()
    tick_labels = base.labels(layer_labels, n_layers, "layer")
    fig = go.Figure(
        [
            go.Scatter(x=list(range(n_layers)), y=array, mode="lines+markers", name=name)
            for name, array in arrays.items()
        ]
    )
    base.set_ticks(fig, "x", tick_labels, "layer")
    fig.update_yaxes(title_text=y_title, zeroline=True)
    fig.update_layout(title=dict(text=title))
    return fig


def plot_residual_patching(
    values: Float[Tensor, "layer pos"],
    pos_labels: Sequence[str] | None = None,
    title: str | None = None,
    colorbar_title: str = "metric",
) -> go.Figure:
    """``patch_residual`` results as a ``layer x pos`` heatmap (RdBu centred at 0)."""
    return base.layer_heatmap(values, "pos", "plot_residual_patching", True, title, colorbar_title, x_labels=pos_labels)


def plot_head_patching(
    values: Float[Tensor, "layer head_index"], title: str | None = None, colorbar_title: str = "metric"
) -> go.Figure:
    """``patch_head_outputs`` results as a ``layer x head_index`` heatmap (RdBu centred at 0)."""
    return base.layer_heatmap(values, "head_index", "plot_head_patching", True, title, colorbar_title)
