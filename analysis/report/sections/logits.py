"""The logit lens and direct logit attribution of the model's prediction at the last position.

Both need logits read linearly from an additive residual stream (``capabilities.linear_logits``);
other models leave this section out and say why (``analysis.report.sections.omitted``).
"""

import html
from dataclasses import dataclass

from torch import Tensor

from ... import plots
from ...readouts import attribution
from ...readouts.attribution import LogitAttribution
from ..context import ReportContext, ReportSection, SectionData, head_figure, sized

MAX_CELL_TEXT_POSITIONS = 40  # logit-lens cells show their top token only up to this many positions


@dataclass
class LogitsData(SectionData):
    predicted: int  # the top token at the last position
    predicted_prob: float
    logit: float
    lens_next_token_prob: Tensor | None = None  # [layer + 1, pos - 1]: p(actual next token) per read-out
    attribution: LogitAttribution | None = None
    attribution_total: float | None = None


def logits_section(ctx: ReportContext) -> ReportSection:
    model = ctx.model
    section = ReportSection("attribution", "Logit lens and direct logit attribution")
    probs = ctx.logits[0, -1].float().softmax(-1)
    predicted = int(probs.argmax())
    lens, layer_labels = attribution.logit_lens(ctx.cache, return_labels=True)  # [layer+1, 1, pos, d_vocab]
    lens_probs = lens[:, 0].float().softmax(-1)
    data = LogitsData(
        predicted=predicted, predicted_prob=float(probs[predicted]), logit=float(ctx.logits[0, -1, predicted])
    )
    if ctx.n_pos >= 2:
        next_tokens = ctx.tokens[0, 1:]
        # probability each layer's read-out gives the token that actually comes next
        next_prob = lens_probs[:, :-1].gather(-1, next_tokens.view(1, -1, 1).expand(lens_probs.shape[0], -1, 1))[..., 0]
        cell_text = None
        if ctx.n_pos <= MAX_CELL_TEXT_POSITIONS:
            top = lens_probs[:, :-1].argmax(-1)
            cell_text = [[ctx.token_label(int(t)) for t in row] for row in top]
        pos_labels = [f"{a}→{b}" for a, b in zip(ctx.str_tokens[:-1], ctx.str_tokens[1:])]
        fig = plots.plot_logit_lens(
            next_prob,
            layer_labels,
            pos_labels,
            cell_text=cell_text,
            colorbar_title="p(next token)",
            title="logit lens: p(actual next token) per layer",
        )
        fig.update_traces(zmin=0.0, zmax=1.0)
        section.figures.append(sized(fig, min(700, 200 + 36 * len(layer_labels)), min(1100, 300 + 60 * ctx.n_pos)))
        section.paragraphs.append(
            "Logit lens: the residual stream entering each block (and the final one) read out through the final norm "
            "and W_U. Colour: probability given to the token that actually comes next; text: the top token of each "
            "read-out."
        )
        data.lens_next_token_prob = next_prob
    else:
        section.paragraphs.append("The prompt has one token: there is no next token for the logit lens to score.")
    attr = attribution.direct_logit_attribution(ctx.cache, predicted, pos=-1)
    data.attribution = attr
    data.attribution_total = float(attr.total()[0])
    label = ctx.token_label(predicted)
    capped = (
        f" The model soft-caps its logits (cap * tanh(logit / cap), cap = {attr.logit_softcap:g}), which is not "
        f"linear: what is split is the logit before the cap, {data.attribution_total:.3g}, of which the cap makes "
        f"{data.logit:.3g}."
        if attr.logit_softcap is not None
        else ""
    )
    section.paragraphs.append(
        f"At the last position the model predicts {label!r} (p = {data.predicted_prob:.2f}, logit {data.logit:.3g}). "
        f"Direct logit attribution splits that logit over the components that write to the residual stream, with the "
        f"final norm's scale frozen; the parts sum to {data.attribution_total:.3g}.{capped}"
    )
    target = f"<sup>to {html.escape(repr(label))}</sup>"
    heads_fig = plots.plot_head_scores(
        attr.heads[..., 0], title=f"direct logit attribution of heads<br>{target}", signed=True, colorbar_title="logit"
    )
    section.figures.append(head_figure(heads_fig, model.cfg.n_layers, model.cfg.n_heads))
    lines = {"attention": attr.attn[:, 0]}
    if attr.mlp is not None:
        lines["mlp"] = attr.mlp[:, 0]
    layer_fig = plots.plot_layer_attribution(lines, title=f"direct logit attribution of layers<br>{target}")
    layer_fig.update_xaxes(dtick=1)
    section.figures.append(sized(layer_fig, 360, 520))
    section.data = data
    return section
