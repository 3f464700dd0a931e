"""Every cross-attention head as a source x target heatmap (a menu picks one), and each head's attention entropy."""

from dataclasses import dataclass

import torch
from torch import Tensor

from ... import plots
from ...plots import cross_attention as plots_cross_attention
from ...readouts import cross_attention
from ..context import ReportContext, ReportSection, SectionData, head_figure, sized


@dataclass
class CrossAttentionData(SectionData):
    patterns: Tensor  # [layer, head_index, query_pos, key_pos] of the prompt
    entropy: Tensor  # [layer, head_index], nats


def cross_attention_section(ctx: ReportContext) -> ReportSection:
    patterns = cross_attention.cross_attention_patterns(ctx.cache)[:, 0]
    entropy = -torch.special.xlogy(patterns, patterns).sum(dim=-1).mean(dim=-1)
    alignment = ctx.sections["alignment"].data
    layer, head, _ = alignment.best
    section = ReportSection(
        "cross_attention", "Cross-attention of every head", data=CrossAttentionData(patterns, entropy)
    )
    section.paragraphs.append(
        "Pick a head from the menu (top right; L1C2 is layer 1's cross-attention head 2). Rows are target positions "
        "(the decoder's input), columns source positions; each row sums to 1 over the real source tokens. "
        f"The view opens on L{layer}C{head}, the best-aligned head."
    )
    known = None if alignment.alignment is None else torch.tensor(alignment.alignment)
    fig = plots_cross_attention.plot_cross_attention_heads(
        patterns, ctx.str_tokens, ctx.target_str_tokens, known, (layer, head)
    )
    side = min(640, 200 + 22 * max(len(ctx.str_tokens), len(ctx.target_str_tokens)))
    section.figures.append(sized(fig, side + 80, side + 160))
    entropy_fig = plots.plot_head_scores(
        entropy, title="cross-attention entropy<br><sup>on the prompt</sup>", colorbar_title="nats"
    )
    section.figures.append(head_figure(entropy_fig, *entropy.shape))
    return section
