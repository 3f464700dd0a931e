"""Composition scores between heads of different layers (Q-, K- and V-composition)."""

from dataclasses import dataclass
from typing import Optional

from torch import Tensor

from ... import circuits, plots
from ..context import ReportContext, ReportSection, SectionData, square_figure


@dataclass
class CompositionData(SectionData):
    scores: Optional[dict[str, Tensor]]  # kind -> [layer, head_index, layer, head_index]; None with one layer


def composition_section(ctx: ReportContext) -> ReportSection:
    model = ctx.model
    section = ReportSection("composition", "Composition scores", data=CompositionData(scores=None))
    if model.cfg.n_layers < 2:
        section.paragraphs.append("The model has one layer: no head can compose with another.")
        return section
    section.paragraphs.append(
        "How much a head in a later layer reads what a head in an earlier layer writes: ||W_A W_B||_F / (||W_A||_F ||W_B||_F) "
        "with W_A the writer's W_OV and W_B the reader's W_QK (Q-composition), W_QK^T (K-composition) or W_OV "
        "(V-composition). An induction head K-composes with a previous-token head."
    )
    if model.capabilities.norm_placement == "post":
        section.paragraphs.append(
            "In this post-norm model a head's output passes through its block's ln1 and ln2 (and every later block's) "
            "before another head reads it; the scores, like the circuits, leave the norms out.")
    scores = {}
    n_heads = model.cfg.n_layers * model.cfg.n_heads
    for kind in circuits.COMPOSITION_KINDS:
        scores[kind] = circuits.composition_scores(model, kind)
        section.figures.append(square_figure(plots.plot_composition_scores(scores[kind], kind=kind), n_heads))
    section.data = CompositionData(scores=scores)
    return section
