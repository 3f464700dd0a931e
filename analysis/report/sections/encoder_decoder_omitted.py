"""What an encoder-decoder's report leaves out of the decoder-only report, and why."""

import html
from dataclasses import dataclass

from ..context import ReportContext, ReportSection, SectionData


@dataclass
class EncoderDecoderOmittedData(SectionData):
    parts: list[dict[str, str]]  # {"what", "why", "instead"}


def encoder_decoder_omitted_parts(ctx: ReportContext) -> list[dict[str, str]]:
    parts = [
        dict(
            what="head detectors (previous-token, duplicate, induction) and the loss on repeated random tokens",
            why="they measure in-context prediction by one causal stack; here the target is predicted from a source "
            "through cross-attention",
            instead="the alignment detector on cross-attention",
        ),
        dict(
            what="QK/OV circuits, composition scores, MLP neurons and the logit lens",
            why="not yet built for two stacks",
            instead="model.decoder.QK_cross / OV_cross give the cross-attention circuits as factored matrices",
        ),
    ]
    if not ctx.model.capabilities.linear_logits:
        parts.append(
            dict(
                what="direct logit attribution through the decoder's heads",
                why=ctx.model.capabilities.why_not_additive(),
                instead="corrupting each source word (below) shows which source words each prediction depends on",
            )
        )
    return parts


def encoder_decoder_omitted_section(ctx: ReportContext) -> ReportSection:
    parts = encoder_decoder_omitted_parts(ctx)
    items = "".join(
        f"<li><b>{html.escape(p['what'])}</b>: {html.escape(p['why'])}. Instead: {html.escape(p['instead'])}.</li>"
        for p in parts
    )
    section = ReportSection(
        "omitted", "Not in this report, and why", html=f"<ul>{items}</ul>", data=EncoderDecoderOmittedData(parts)
    )
    section.paragraphs.append("This model is an encoder-decoder: parts of the decoder-only report do not apply to it.")
    return section
