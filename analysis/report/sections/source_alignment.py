"""The alignment detector: how closely each cross-attention head follows the alignment, and the best head's heatmap.

With a known alignment (the tokenizer's task provides it) a head scores the mean attention
it puts on the aligned source word; otherwise its attention within one source position of
the proportional diagonal (``analysis.readouts.cross_attention``).
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from ... import plots
from ...plots import cross_attention as plots_cross_attention
from ...readouts import cross_attention
from ..context import ReportContext, ReportSection, SectionData, head_figure, ranked_heads, sized


@dataclass
class AlignmentData(SectionData):
    scores: Tensor  # [layer, head_index]
    kind: str  # "known alignment" or "diagonal"
    best: tuple[int, int, float]  # (layer, head, score)
    best_per_layer: list[tuple[int, int, float]]
    pattern: Tensor  # the best head's [query_pos, key_pos]
    alignment: list[int] | None


def alignment_section(ctx: ReportContext) -> ReportSection:
    alignment = ctx.sections["translation"].data.alignment
    usable = alignment is not None and any(a >= 0 for a in alignment)
    if usable:
        scores, kind = cross_attention.alignment_scores(ctx.cache, torch.tensor([alignment])), "known alignment"
    else:
        scores, kind = cross_attention.diagonality_scores(ctx.cache), "diagonal"
    layer, head, score = ranked_heads(scores)[0]
    pattern = cross_attention.cross_attention_patterns(ctx.cache)[layer, 0, head]
    data = AlignmentData(
        scores, kind, (layer, head, score), cross_attention.best_heads(scores), pattern, alignment if usable else None
    )
    section = ReportSection("alignment", "Alignment: which heads read the word being translated", data=data)
    if usable:
        section.paragraphs.append(
            "Score: mean attention a head puts on the source word the next target token comes from (circled), over the "
            f"aligned target positions. The best head, L{layer}C{head}, scores {score:.2f}."
        )
    else:
        section.paragraphs.append(
            "No known alignment for this source: score is each head's attention within one source position of the "
            f"proportional diagonal (reading the source in step with the target). Best: L{layer}C{head}, {score:.2f}."
        )
    scores_fig = plots.plot_head_scores(
        scores, title=f"alignment score per cross-attention head<br><sup>{kind}</sup>", colorbar_title="score"
    )
    section.figures.append(head_figure(scores_fig, *scores.shape, unit_range=True))
    heatmap = plots_cross_attention.plot_cross_attention(
        pattern,
        ctx.str_tokens,
        ctx.target_str_tokens,
        torch.tensor(alignment) if usable else None,
        title=f"alignment heatmap: cross-attention of L{layer}C{head} (source x target)",
    )
    side = min(640, 200 + 22 * max(len(ctx.str_tokens), len(ctx.target_str_tokens)))
    section.figures.append(sized(heatmap, side + 60, side + 160))
    return section
