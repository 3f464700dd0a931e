"""Attention patterns of every head (a menu picks one), and each head's attention entropy."""

from dataclasses import dataclass

import plotly.graph_objects as go
import torch
from torch import Tensor

from ... import plots
from ...plots import base as plots_base
from ...readouts import attention
from ...views import attention_view
from ..context import ReportContext, ReportSection, SectionData, head_figure, head_name, ranked_heads, sized
from .detectors import DETECTOR_TITLES

NAMED_HEAD_SCORE = 0.4  # a head a detector names (the interpretation's threshold)
MAX_VIEW_HEADS = 8  # heads shown on the text


@dataclass
class AttentionData(SectionData):
    patterns: Tensor  # [layer, head_index, query_pos, key_pos] of the prompt
    entropy: Tensor  # [layer, head_index], nats
    view_heads: list[tuple[int, int]]  # the (layer, head) shown on the text, in the view's order


def named_heads(ctx: ReportContext) -> list[tuple[int, int]]:
    """The heads the detectors name (score >= NAMED_HEAD_SCORE on repeated random tokens), best first per detector;
    the best head of each detector when none reaches it. At most ``MAX_VIEW_HEADS``."""
    chosen: list[tuple[int, int]] = []
    for scores in ctx.sections["detectors"].data.random.values():
        if scores is None:
            continue
        ranked = ranked_heads(scores)
        for layer, head, _score in [entry for entry in ranked if entry[2] >= NAMED_HEAD_SCORE] or ranked[:1]:
            if (layer, head) not in chosen:
                chosen.append((layer, head))
    return chosen[:MAX_VIEW_HEADS]


def attention_selector(patterns: Tensor, str_tokens: list[str], initial: tuple[int, int]) -> go.Figure:
    """One heatmap per head ``patterns [layer, head_index, query_pos, key_pos]``; a dropdown shows one at a time."""
    n_layers, n_heads = patterns.shape[:2]
    names = [head_name(layer, head) for layer in range(n_layers) for head in range(n_heads)]
    first = names.index(head_name(*initial))
    template = plots.plot_attention_pattern(patterns[initial], str_tokens, title=f"attention pattern of {names[first]}")
    traces = []
    for index, name in enumerate(names):
        trace = go.Heatmap(template.data[0])
        # 4 decimals keep the page small
        values = plots_base.to_numpy(patterns[index // n_heads, index % n_heads]).round(4)
        trace.update(z=values.tolist(), visible=index == first, name=name)
        traces.append(trace)
    fig = go.Figure(traces, layout=template.layout)
    buttons = [
        dict(
            label=name,
            method="update",
            args=[
                {"visible": [other == index for other in range(len(names))]},
                {"title.text": f"attention pattern of {name}"},
            ],
        )
        for index, name in enumerate(names)
    ]
    menu = dict(buttons=buttons, active=first, direction="down", x=1.0, xanchor="right", y=1.12, yanchor="bottom")
    fig.update_layout(updatemenus=[menu])
    side = min(760, 220 + 18 * len(str_tokens))
    return sized(fig, side + 60, side + 140)


def attention_section(ctx: ReportContext) -> ReportSection:
    model = ctx.model
    patterns = torch.stack([attention.attention_pattern(ctx.cache, layer)[0] for layer in range(model.cfg.n_layers)])
    n_shown = ctx.shown_positions()
    detectors = ctx.sections["detectors"].data
    top_layer, top_head, _ = ranked_heads(detectors.random[detectors.lead])[0]
    entropy = attention.attention_entropy(ctx.cache)
    heads = named_heads(ctx)
    section = ReportSection(
        "attention", "Attention patterns of every head", data=AttentionData(patterns, entropy, heads)
    )
    view = attention_view(
        ctx.str_tokens[:n_shown],
        torch.stack([patterns[layer, head, :n_shown, :n_shown] for layer, head in heads]),
        [head_name(layer, head) for layer, head in heads],
    )
    section.html = view.to_html(include_script=False)
    section.paragraphs.append(
        "On the text: the heads the detectors name. Move over a token (or tab to the text and use the arrow keys) to "
        "colour every other token by how much the chosen head attends from it; switch to 'to' for the attention it "
        "receives, or to all heads at once."
    )
    section.paragraphs.append(
        "Pick a head from the menu (top right). Rows are query positions, columns key positions; each row sums to 1. "
        f"The view opens on {head_name(top_layer, top_head)}, the head with the highest "
        f"{DETECTOR_TITLES[detectors.lead]} score."
    )
    if n_shown < ctx.n_pos:
        section.paragraphs.append(
            f"The prompt has {ctx.n_pos} tokens; the view shows the first {n_shown} to keep the page small."
        )
    section.figures.append(
        attention_selector(patterns[..., :n_shown, :n_shown], ctx.str_tokens[:n_shown], (top_layer, top_head))
    )
    entropy_fig = plots.plot_head_scores(
        entropy, title="attention entropy<br><sup>on the prompt</sup>", colorbar_title="nats"
    )
    section.figures.append(head_figure(entropy_fig, model.cfg.n_layers, model.cfg.n_heads))
    return section
