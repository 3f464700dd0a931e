"""Every figure function: trace type, data shape, axis titles, colour scale, HTML rendering, label checks."""

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

from analysis import plots


@pytest.fixture(autouse=True)
def never_show(monkeypatch):
    def show(*args, **kwargs):
        raise AssertionError("figure functions must return the figure, never call .show()")

    monkeypatch.setattr(go.Figure, "show", show)


def check(fig, trace_type: str, shape, x_title: str, y_title: str):
    assert isinstance(fig, go.Figure)
    assert fig.data[0].type == trace_type
    if trace_type == "heatmap":
        assert np.asarray(fig.data[0].z, dtype=float).shape == shape
    assert fig.layout.xaxis.title.text == x_title
    assert fig.layout.yaxis.title.text == y_title
    html = fig.to_html(include_plotlyjs=False)
    assert trace_type in html and "<div" in html


def diverging(trace) -> bool:
    """RdBu centred at zero: starts dark red, ends dark blue, zmid 0."""
    scale = trace.colorscale
    return scale[0][1] == "rgb(103,0,31)" and scale[-1][1] == "rgb(5,48,97)" and trace.zmid == 0


generator = torch.Generator().manual_seed(0)
signed_layer_head = torch.randn(3, 4, generator=generator)
TOKENS = ["<|endoftext|>", "The", " cat", " The", " cat"]


def test_attention_pattern():
    pattern = torch.rand(5, 5, generator=generator).tril()
    fig = plots.plot_attention_pattern(pattern, TOKENS, title="L0H1")
    check(fig, "heatmap", (5, 5), "key_pos", "query_pos")
    assert list(fig.layout.xaxis.ticktext) == ["&lt;|endoftext|&gt;", "The", " cat", " The", " cat"]
    assert list(fig.layout.xaxis.tickvals) == [0, 1, 2, 3, 4]  # repeated tokens stay separate cells
    assert (fig.data[0].zmin, fig.data[0].zmax) == (0.0, 1.0)
    with pytest.raises(ValueError, match="got 4 key_pos labels for 5"):
        plots.plot_attention_pattern(pattern, TOKENS[:4])
    with pytest.raises(ValueError, match="square"):
        plots.plot_attention_pattern(torch.rand(5, 4))


def test_attention_heads_grid():
    patterns = torch.rand(6, 5, 5, generator=generator)
    fig = plots.plot_attention_heads(patterns, TOKENS, layer=2, n_cols=4)
    assert len(fig.data) == 6 and all(trace.type == "heatmap" for trace in fig.data)
    assert np.asarray(fig.data[5].z).shape == (5, 5)
    assert [a.text for a in fig.layout.annotations] == [f"L2H{h}" for h in range(6)]
    assert fig.layout.xaxis.title.text == "key_pos" and fig.layout.yaxis6.title.text == "query_pos"
    fig.to_html(include_plotlyjs=False)
    with pytest.raises(ValueError, match="pos labels"):
        plots.plot_attention_heads(patterns, TOKENS[:3])


def test_head_scores_signed_and_unsigned():
    fig = plots.plot_head_scores(signed_layer_head, title="DLA", signed=True)
    check(fig, "heatmap", (3, 4), "head_index", "layer")
    assert diverging(fig.data[0])
    unsigned = plots.plot_head_scores(signed_layer_head.abs(), title="induction")
    assert unsigned.data[0].zmid is None and unsigned.data[0].colorscale[0][1] == "rgb(247,251,255)"
    with pytest.raises(ValueError, match=r"\[layer, head_index\]"):
        plots.plot_head_scores(torch.rand(3))


def test_circuit():
    values = torch.randn(3, 4, generator=generator)
    fig = plots.plot_circuit(values, ["a", "b", "c"], ["w", "x", "y", "z"], kind="ov")
    check(fig, "heatmap", (3, 4), "d_vocab (output token)", "d_vocab (source token)")
    assert diverging(fig.data[0])
    assert plots.plot_circuit(values, kind="qk").layout.xaxis.title.text == "d_vocab (key token)"
    with pytest.raises(ValueError, match="d_vocab"):
        plots.plot_circuit(values, ["a", "b"], None)
    with pytest.raises(ValueError, match="kind"):
        plots.plot_circuit(values, kind="vo")


def test_composition_scores():
    scores = torch.rand(2, 3, 2, 3, generator=generator)
    fig = plots.plot_composition_scores(scores, kind="k")
    check(fig, "heatmap", (6, 6), "reader head (layer, head_index)", "writer head (layer, head_index)")
    z = fig.data[0].z
    assert z[0][3] == pytest.approx(float(scores[0, 0, 1, 0]))  # L0H0 -> L1H0
    assert z[0][0] is None and z[3][3] is None  # same layer: cannot compose
    assert fig.layout.yaxis.ticktext[4] == "L1H1"
    with pytest.raises(ValueError):
        plots.plot_composition_scores(torch.rand(2, 3, 3, 3))


def test_token_activations():
    values = torch.randn(5, generator=generator)
    fig = plots.plot_token_activations(values, TOKENS)
    check(fig, "heatmap", (1, 5), "pos", "text")
    assert fig.data[0].text[0][1] == "The" and fig.data[0].texttemplate == "%{text}"
    assert diverging(fig.data[0])
    two = plots.plot_token_activations(torch.randn(2, 5, generator=generator), [TOKENS, TOKENS[::-1]])
    assert np.asarray(two.data[0].z).shape == (2, 5)
    with pytest.raises(ValueError, match="got 4 pos"):
        plots.plot_token_activations(values, TOKENS[:4])
    with pytest.raises(ValueError, match="one token list per text"):
        plots.plot_token_activations(torch.randn(2, 5), [TOKENS])


def test_neuron_summary_and_token_values():
    fig = plots.plot_neuron_summary(torch.randn(2, 16, generator=generator))
    check(fig, "heatmap", (2, 16), "neuron", "layer")
    bars = plots.plot_token_values(torch.tensor([2.0, 1.0, -0.5, -3.0]), ["a", "b", "c", "d"])
    check(bars, "bar", None, "direct logit effect", "d_vocab")
    assert list(bars.data[0].x) == [2.0, 1.0, -0.5, -3.0] and bars.data[0].orientation == "h"
    with pytest.raises(ValueError, match="labels"):
        plots.plot_token_values(torch.ones(4), ["a"])


def test_logit_lens():
    values = torch.rand(3, 5, generator=generator)
    text = [[f"t{layer}{pos}" for pos in range(5)] for layer in range(3)]
    fig = plots.plot_logit_lens(values, ["0_pre", "1_pre", "final_post"], TOKENS, cell_text=text)
    check(fig, "heatmap", (3, 5), "pos", "layer")
    assert fig.data[0].text[2][4] == "t24"
    with pytest.raises(ValueError, match="cell_text"):
        plots.plot_logit_lens(values, cell_text=text[:2])
    with pytest.raises(ValueError, match="layer labels"):
        plots.plot_logit_lens(values, layer_labels=["a"])


def test_layer_attribution_lines():
    fig = plots.plot_layer_attribution({"attn": torch.randn(3), "mlp": torch.randn(3)}, title="DLA by layer")
    check(fig, "scatter", None, "layer", "direct logit attribution")
    assert [trace.name for trace in fig.data] == ["attn", "mlp"] and len(fig.data[1].y) == 3
    with pytest.raises(ValueError, match="same number of layers"):
        plots.plot_layer_attribution({"attn": torch.randn(3), "mlp": torch.randn(2)})


def test_patching_figures():
    fig = plots.plot_residual_patching(torch.randn(2, 5, generator=generator), TOKENS)
    check(fig, "heatmap", (2, 5), "pos", "layer")
    assert diverging(fig.data[0])
    heads = plots.plot_head_patching(signed_layer_head)
    check(heads, "heatmap", (3, 4), "head_index", "layer")
    assert diverging(heads.data[0])
    with pytest.raises(ValueError, match="pos labels"):
        plots.plot_residual_patching(torch.randn(2, 5), TOKENS[:2])
