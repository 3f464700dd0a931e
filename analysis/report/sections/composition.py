"""Composition scores between heads of different layers (Q-, K- and V-composition)."""

from dataclasses import dataclass

from torch import Tensor

from ... import plots
from ...readouts import circuits
from ..context import ReportContext, ReportSection, SectionData, head_name, ranked_heads, sized, square_figure

MAX_ALL_PAIRS_HEADS = 144  # above this many heads, only the heads the detectors name are readers
NAMED_SCORE = 0.4  # the interpretation's threshold


@dataclass
class CompositionData(SectionData):
    scores: dict[str, Tensor] | None  # kind -> [layer, head_index, layer, head_index]; None with one layer
    readers: list[tuple[int, int]] | None = None  # the reader heads computed (None: all; the others are NaN)


def detector_heads(ctx: ReportContext) -> list[tuple[int, int]]:
    """Every head a detector names (score >= NAMED_SCORE on repeated random tokens), or its best head, in layer
    order."""
    heads = set()
    for scores in ctx.sections["detectors"].data.random.values():
        if scores is not None:
            ranked = ranked_heads(scores)
            heads |= {(layer, head) for layer, head, score in [r for r in ranked if r[2] >= NAMED_SCORE] or ranked[:1]}
    return sorted(heads)


def composition_section(ctx: ReportContext) -> ReportSection:
    model = ctx.model
    section = ReportSection("composition", "Composition scores", data=CompositionData(scores=None))
    if model.cfg.n_layers < 2:
        section.paragraphs.append("The model has one layer: no head can compose with another.")
        return section
    section.paragraphs.append(
        "How much a head in a later layer reads what a head in an earlier layer writes: ||W_A W_B||_F / (||W_A||_F "
        "||W_B||_F) "
        "with W_A the writer's W_OV and W_B the reader's W_QK (Q-composition), W_QK^T (K-composition) or W_OV "
        "(V-composition). An induction head K-composes with a previous-token head."
    )
    if model.capabilities.norm_placement == "post":
        section.paragraphs.append(
            "In this post-norm model a head's output passes through its block's ln1 and ln2 (and every later block's) "
            "before another head reads it; the scores, like the circuits, leave the norms out."
        )
    scores = {}
    n_heads = model.cfg.n_layers * model.cfg.n_heads
    readers = None if n_heads <= MAX_ALL_PAIRS_HEADS else detector_heads(ctx)
    if readers is not None:
        section.paragraphs.append(
            f"This model has {n_heads} heads, so the scores are computed into the {len(readers)} heads the detectors "
            f"name ({', '.join(head_name(*head) for head in readers)}), from every earlier head: all pairs would take "
            "minutes."
        )
    for kind in circuits.COMPOSITION_KINDS:
        scores[kind] = circuits.composition_scores(model, kind, readers)
        fig = plots.plot_composition_scores(scores[kind], kind=kind, readers=readers)
        section.figures.append(
            square_figure(fig, n_heads)
            if readers is None
            else sized(fig, min(900, 200 + 4 * n_heads), min(1100, 300 + 40 * len(readers)))
        )
    section.data = CompositionData(scores=scores, readers=readers)
    return section
