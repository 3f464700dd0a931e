"""The model card of every model: the config, parameters, processing, tokenizer, what it is, its training curve."""

import dataclasses
import html
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..context import ReportContext, ReportSection, SectionData, sized


@dataclass
class ModelCardData(SectionData):
    config: dict[str, Any]
    processing: list[str]


def _table(rows) -> str:
    cells = "".join(
        f"<tr><th>{html.escape(str(name))}</th><td>{html.escape(str(value))}</td></tr>" for name, value in rows
    )
    return f'<table class="kv">{cells}</table>'


def _output_norm_names(block) -> list[str]:
    """The attribute names of the norms a block's writers pass their outputs through (Gemma 2's ``ln1_post``)."""
    norms = [writer.output_norm for writer in block.writers() if writer.output_norm is not None]
    return [name for norm in norms for name, child in block.named_children() if child is norm]


def _layer_ranges(layers: list[int]) -> str:
    """``[0, 1, 2, 4]`` as ``"0-2, 4"``."""
    ranges, start = [], None
    for index, layer in enumerate(layers):
        start = layer if start is None else start
        if index + 1 == len(layers) or layers[index + 1] != layer + 1:
            ranges.append(str(start) if start == layer else f"{start}-{layer}")
            start = None
    return ", ".join(ranges)


def attention_spans(model) -> str:
    """Which layers attend locally (a sliding window of keys) and which globally, asked of each block's attention;
    empty where every layer sees every earlier key."""
    windows = {}
    for layer, block in enumerate(model.writer_blocks()):
        for writer in block.writers():
            key_window = getattr(writer.part, "key_window", None)
            if writer.sublayer == "attn" and key_window is not None:
                windows[layer] = key_window()
    local = sorted(layer for layer, window in windows.items() if window is not None)
    if not local:
        return ""
    sizes = sorted({windows[layer] for layer in local})
    span = " or ".join(f"{size:,}" for size in sizes)
    global_layers = sorted(layer for layer, window in windows.items() if window is None)
    text = f"local (each query sees its last {span} keys): layers {_layer_ranges(local)}"
    return text + (f"; global (every earlier key): layers {_layer_ranges(global_layers)}" if global_layers else "")


def _two_stacks(model) -> str:
    """What an encoder-decoder is: its two stacks, its heads, where its norms sit."""
    cfg = model.cfg
    placement = (
        "pre-norm: each sub-layer reads a normalized copy and adds to the stream, so the decoder's residual "
        "stream is the sum of every write"
        if model.capabilities.norm_placement == "pre"
        else "post-norm: the stream is renormalized after every sub-layer, so it is no sum of component outputs"
    )
    return (
        f"Encoder-decoder: {cfg.n_layers} encoder blocks (bidirectional self-attention over the source, then an "
        f"MLP) and {cfg.n_decoder_layers} decoder blocks (causal self-attention, cross-attention over the encoder's "
        f"output, an MLP), {cfg.n_heads} heads each; {placement}."
    )


def _structure(ctx: ReportContext) -> str:
    """One paragraph on what the model is: its blocks, its attention, where its norms sit, its heads."""
    model, cfg, capabilities = ctx.model, ctx.model.cfg, ctx.model.capabilities
    if model.writers_that("reads_source"):
        return _two_stacks(model)
    has_mlp = model.act_name("post", 0) in model.hook_dict
    if model.writers_that("routes_tokens"):
        parts = [
            f"Blocks with attention and a mixture of {cfg.n_experts} experts of {cfg.d_mlp} neurons each, "
            f"{cfg.experts_per_token} chosen per token by a router."
        ]
    else:
        parts = [
            "Attention-only model: its blocks have no MLP."
            if not has_mlp
            else f"Blocks with attention and an MLP of {cfg.d_mlp} neurons."
        ]
    output_norms = _output_norm_names(model.writer_blocks()[0])
    if output_norms:
        parts.append(
            "A norm before and after attention and the MLP ({}): their outputs are normalized before they are "
            "added to the residual stream.".format(", ".join(output_norms))
        )
    spans = attention_spans(model)
    if spans:
        parts.append(f"Attention is {spans}.")
    cap = None if model.read_out is None else model.read_out.softcap
    if cap is not None:
        parts.append(f"Logits soft-capped at {cap:g} (cap * tanh(logit / cap)).")
    if not capabilities.causal:
        parts.append("Bidirectional attention: every real token sees every other.")
    if capabilities.norm_placement == "post":
        parts.append(
            "Post-norm blocks (ln1 after attention, ln2 after the MLP): the residual stream is renormalized "
            "twice per block, so it is not a sum of component outputs."
        )
    heads = {"has_mlm_head": "an MLM head", "has_pooler": "a pooler"}  # output heads a config may say it has
    if any(hasattr(cfg, flag) for flag in heads):
        present = [label for flag, label in heads.items() if getattr(cfg, flag)]
        parts.append(
            f"The checkpoint has {' and '.join(present)}."
            if present
            else "The checkpoint has neither an MLM head nor a pooler."
        )
    return " ".join(parts)


def _translation_curve(curve: dict):
    """Loss and held-out exact match over training (the shipped translation model's curve)."""
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


def model_section(ctx: ReportContext) -> ReportSection:
    model, cfg = ctx.model, ctx.model.cfg
    rows = [(name, value) for name, value in dataclasses.asdict(cfg).items()]
    rows.append(("architecture", model.architecture.name))
    spans = attention_spans(model)
    if spans:
        rows.append(("attention", spans))
    rows.append(("parameters", f"{sum(p.numel() for p in model.parameters()):,}"))
    rows.append(("dtype", str(next(model.parameters()).dtype).removeprefix("torch.")))
    processing = list(model.processing)
    rows.append(("weight processing", ", ".join(processing) if processing else "none (weights as loaded)"))
    tokenizer = model.tokenizer
    rows.append(("tokenizer", type(tokenizer).__name__ if tokenizer is not None else "none: tokens are labelled by id"))
    rows += [(name, value) for name, value in ctx.metadata.items() if name != "curve"]
    section = ReportSection(
        "model",
        "Model card",
        html=_table(rows),
        data=ModelCardData(config=dataclasses.asdict(cfg), processing=processing),
    )
    section.paragraphs.append(_structure(ctx))
    curve = ctx.metadata.get("curve")
    if isinstance(curve, dict) and {"steps", "loss", "held_out_accuracy"} <= set(curve):  # translate-tiny's
        section.figures.append(_translation_curve(curve))
    elif isinstance(curve, dict) and {"steps", "first_half_loss", "repeated_half_loss"} <= set(curve):
        fig = go.Figure(
            [
                go.Scatter(
                    x=curve["steps"], y=curve["first_half_loss"], mode="lines", name="first half (unpredictable)"
                ),
                go.Scatter(x=curve["steps"], y=curve["repeated_half_loss"], mode="lines", name="repeated half"),
            ]
        )
        fig.update_layout(title=dict(text="training curve: loss per half of repeated random sequences"))
        fig.update_xaxes(title_text="training step")
        fig.update_yaxes(title_text="next-token loss (nats)")
        section.figures.append(sized(fig, 360, 640))
    return section
