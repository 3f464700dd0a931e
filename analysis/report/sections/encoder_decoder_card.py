"""An encoder-decoder's model card: the config, parameters, what its stacks are, and the training curve it shipped
with."""

import dataclasses
import html
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..context import ReportContext, ReportSection, SectionData, sized


@dataclass
class EncoderDecoderCardData(SectionData):
    config: dict[str, Any]
    n_parameters: int


def _structure(model) -> str:
    cfg, capabilities = model.cfg, model.capabilities
    placement = (
        "pre-norm: each sub-layer reads a normalized copy and adds to the stream, so the decoder's residual "
        "stream is the sum of every write"
        if capabilities.norm_placement == "pre"
        else "post-norm: the stream is renormalized after every sub-layer, so it is no sum of component outputs"
    )
    return (
        f"Encoder-decoder: {cfg.n_layers} encoder blocks (bidirectional self-attention over the source, then an "
        "MLP) and "
        f"{cfg.n_decoder_layers} decoder blocks (causal self-attention, cross-attention over the encoder's output, "
        f"an MLP), {cfg.n_heads} heads each; {placement}."
    )


def _curve_figure(curve: dict):
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(
        go.Scatter(x=curve["steps"], y=curve["loss"], mode="lines", name="training loss (nats)"), secondary_y=False
    )
    fig.add_trace(
        go.Scatter(x=curve["steps"], y=curve["held_out_accuracy"], mode="lines", name="held-out exact match"),
        secondary_y=True,
    )
    fig.update_layout(title=dict(text="training curve: loss and held-out exact-match accuracy"))
    fig.update_xaxes(title_text="training step")
    fig.update_yaxes(title_text="loss (nats)", type="log", secondary_y=False)
    fig.update_yaxes(title_text="exact match", range=[0, 1.05], secondary_y=True)
    return sized(fig, 380, 700)


def encoder_decoder_card_section(ctx: ReportContext) -> ReportSection:
    model = ctx.model
    n_parameters = sum(p.numel() for p in model.parameters())
    rows = list(dataclasses.asdict(model.cfg).items()) + [
        ("architecture", model.architecture.name),
        ("parameters", f"{n_parameters:,}"),
        ("dtype", str(next(model.parameters()).dtype).removeprefix("torch.")),
        (
            "tokenizer",
            type(model.tokenizer).__name__ if model.tokenizer is not None else "none: tokens are labelled by id",
        ),
    ]
    rows += [(name, value) for name, value in ctx.metadata.items() if name != "curve"]
    cells = "".join(
        f"<tr><th>{html.escape(str(name))}</th><td>{html.escape(str(value))}</td></tr>" for name, value in rows
    )
    section = ReportSection(
        "model",
        "Model card",
        html=f'<table class="kv">{cells}</table>',
        data=EncoderDecoderCardData(config=dataclasses.asdict(model.cfg), n_parameters=n_parameters),
    )
    section.paragraphs.append(_structure(model))
    curve = ctx.metadata.get("curve")
    if isinstance(curve, dict) and {"steps", "loss", "held_out_accuracy"} <= set(curve):
        section.figures.append(_curve_figure(curve))
    return section
