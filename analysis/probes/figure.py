"""Probe accuracy and selectivity by layer (per layer sites), or by layer and head (per head outputs)."""

import plotly.graph_objects as go
from plotly.subplots import make_subplots

COLOURS = ("#2166ac", "#b2182b", "#1b7837", "#762a83", "#e08214")


def probe_figure(results) -> go.Figure:
    """Two panels: held-out accuracy (the probe's, the control task's, the majority class's) and selectivity.

    Sites of one hook and no head are lines over ``layer``; per-head sites are ``layer x head_index`` heatmaps.
    """
    probes = results.probes
    per_head = [probe for probe in probes if probe.site.head is not None]
    if per_head:
        return _head_figure(per_head, results)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("held-out accuracy", "selectivity (accuracy - control)"))
    hooks = list(dict.fromkeys(_short(probe.site.hook) for probe in probes))
    for k, hook in enumerate(hooks):
        mine = [probe for probe in probes if _short(probe.site.hook) == hook]
        x = [probe.site.layer if probe.site.layer is not None else probe.site.hook for probe in mine]
        colour = COLOURS[k % len(COLOURS)]
        lines = [("test_accuracy", f"{hook}: probe", None, True, 1)]
        if mine[0].control_accuracy is not None:
            lines += [("control_accuracy", f"{hook}: control task", "dot", True, 1)]
            lines += [("selectivity", f"{hook}: selectivity", None, False, 2)]
        for field, name, dash, legend, col in lines:
            y = [getattr(probe, field) for probe in mine]
            fig.add_trace(_line(x, y, name, colour, dash, legend), row=1, col=col)
    x = [p.site.layer if p.site.layer is not None else p.site.hook for p in probes]
    majority = _line(x, [p.majority for p in probes], "majority class", "#888", "dash", True, mode="lines")
    fig.add_trace(majority, row=1, col=1)
    fig.update_xaxes(title_text="layer")
    fig.update_yaxes(title_text="accuracy", range=[0, 1.02], row=1, col=1)
    fig.update_yaxes(title_text="selectivity", row=1, col=2)
    fig.update_layout(title=_title(results), height=450, width=1100)
    return fig


def _line(x, y, name: str, colour: str, dash, legend: bool, mode: str = "lines+markers") -> go.Scatter:
    line = {"color": colour} if dash is None else {"color": colour, "dash": dash}
    return go.Scatter(x=x, y=y, name=name, mode=mode, line=line, **({} if legend else {"showlegend": False}))


def _head_figure(probes, results) -> go.Figure:
    layers = sorted({p.site.layer for p in probes})
    heads = sorted({p.site.head for p in probes})
    accuracy = [[None] * len(heads) for _ in layers]
    selective = [[None] * len(heads) for _ in layers]
    for p in probes:
        accuracy[layers.index(p.site.layer)][heads.index(p.site.head)] = p.test_accuracy
        selective[layers.index(p.site.layer)][heads.index(p.site.head)] = p.selectivity
    fig = make_subplots(rows=1, cols=2, subplot_titles=("held-out accuracy", "selectivity (accuracy - control)"))
    fig.add_trace(
        go.Heatmap(
            z=accuracy, x=heads, y=layers, colorscale="Blues", zmin=0, zmax=1, colorbar={"x": 0.45, "title": "accuracy"}
        ),
        row=1,
        col=1,
    )
    if probes[0].control_accuracy is not None:
        fig.add_trace(
            go.Heatmap(z=selective, x=heads, y=layers, colorscale="RdBu", zmid=0, colorbar={"title": "selectivity"}),
            row=1,
            col=2,
        )
    fig.update_xaxes(title_text="head_index")
    fig.update_yaxes(title_text="layer")
    fig.update_layout(title="per head output z_h W_O[h], " + _title(results), height=450, width=1100)
    return fig


def _short(hook: str) -> str:
    parts = hook.split(".")
    return parts[-1].removeprefix("hook_") if hook.startswith("blocks.") else hook


def _title(results) -> str:
    return (
        f"probes at the {results.position} token: {results.n_rows} positions of {results.n_examples} examples, "
        f"classes {list(results.classes)}, {results.n_types} word types"
    )
