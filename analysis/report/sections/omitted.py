"""What this model's report leaves out, and why: read from the model's capabilities.

========================================  ===================================================
left out when                             instead
========================================  ===================================================
logits are not linear in an additive      output attribution of the sentence embedding
residual stream: no logit lens, no DLA    (bidirectional post-norm models), else nothing
attention is bidirectional: no induction  next-token heads; duplicate-token heads counting
heads, no loss on repeats                 copies on both sides
logits are not linear: no neuron direct   MLP layers' exact contributions in the output
logit effect ``W_out W_U``                attribution, where it applies
the model has no ``W_U``                  OV circuits read out with ``W_E^T``
========================================  ===================================================
"""

import html
from dataclasses import dataclass

from ..context import ReportContext, ReportSection, SectionData
from .circuits import ov_read_out


@dataclass
class OmittedData(SectionData):
    parts: list[dict[str, str]]  # {"what", "why", "instead"} per part left out


def has_output_attribution(model) -> bool:
    """The sentence-embedding attribution applies: a bidirectional post-norm model (BERT)."""
    capabilities = model.capabilities
    return not capabilities.linear_logits and capabilities.norm_placement == "post" and not capabilities.causal


def _missing_unembedding(model) -> str:
    try:
        model.W_U  # noqa: B018 (the read raises AttributeError where the model has no unembedding)
    except AttributeError as missing:
        return str(missing).split(": ", 1)[-1]
    return ""


def _two_stack_parts(ctx: ReportContext) -> list[dict[str, str]]:
    """What an encoder-decoder's report leaves out of the decoder-only report."""
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


def omitted_parts(ctx: ReportContext) -> list[dict[str, str]]:
    """What the full report shows and this one does not: ``{"what", "why", "instead"}`` per part."""
    model = ctx.model
    if model.writers_that("reads_source"):
        return _two_stack_parts(ctx)
    capabilities = model.capabilities
    parts = []
    if not capabilities.linear_logits:
        reasons = []
        if not capabilities.next_token_logits:
            reasons.append("this model predicts no next token")
        if not capabilities.additive_residual:
            reasons.append(
                "no final norm and W_U read its residual stream: post-LayerNorm blocks renormalize the stream "
                "twice per block"
            )
        missing = _missing_unembedding(model)
        if missing:
            reasons.append(f"it has no W_U ({missing})")
        elif capabilities.read_out is None:
            reasons.append("the head before W_U is non-linear (dense, activation, LayerNorm)")
        instead = (
            "output attribution: the sentence embedding's norm split exactly over every component"
            if has_output_attribution(model)
            else "none in this report"
        )
        parts.append(
            dict(
                what="next-token prediction, logit lens and direct logit attribution",
                why=", and ".join(reasons),
                instead=instead,
            )
        )
    if not capabilities.causal:
        parts.append(
            dict(
                what="induction heads and the loss on repeated random tokens",
                why="both measure in-context prediction of the next token under causal attention; this model sees the "
                "whole sequence at once and has no next-token loss",
                instead="next-token heads (which only bidirectional attention can form) and duplicate-token heads "
                "counting copies on both sides",
            )
        )
    if not capabilities.linear_logits and model.act_name("post", 0) in model.hook_dict:
        parts.append(
            dict(
                what="direct logit effect of the most active neuron (W_out W_U)",
                why="a neuron's write passes through later norms or a non-linear head before any output, so W_out W_U "
                "is no direct effect",
                instead="MLP layers' exact direct contributions in the output attribution"
                if has_output_attribution(model)
                else "none in this report",
            )
        )
    if ov_read_out(model) == "embed":
        parts.append(
            dict(
                what="OV circuits read out with W_U",
                why=f"this model has no W_U ({_missing_unembedding(model)})",
                instead="OV circuits read out against the token embeddings W_E^T (BERT's tied read-out)",
            )
        )
    return parts


def omitted_section(ctx: ReportContext) -> ReportSection:
    parts = omitted_parts(ctx)
    items = "".join(
        f"<li><b>{html.escape(part['what'])}</b>: {html.escape(part['why'])}. Instead: "
        f"{html.escape(part['instead'])}.</li>"
        for part in parts
    )
    section = ReportSection("omitted", "Not in this report, and why", html=f"<ul>{items}</ul>", data=OmittedData(parts))
    if ctx.model.writers_that("reads_source"):
        section.paragraphs.append(
            "This model is an encoder-decoder: parts of the decoder-only report do not apply to it."
        )
    else:
        kind = "a bidirectional, post-norm encoder" if not ctx.model.capabilities.causal else "not a pre-norm decoder"
        section.paragraphs.append(f"This model is {kind}: parts of the full report do not apply to it.")
    return section
