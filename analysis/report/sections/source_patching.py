"""Which target predictions each source word moves: every source word corrupted in turn (``source_word_effects``)."""

from dataclasses import dataclass

from torch import Tensor

from ...patching import source_word_effects
from ...plots import cross_attention as plots_cross_attention
from ..context import ReportContext, ReportSection, SectionData, sized


@dataclass
class SourcePatchingData(SectionData):
    effects: Tensor  # [key_pos, pos]: fall of the predicted token's logit when the source word is replaced
    replacement: int
    most_affected_source: list[int]  # per target position, the source position whose corruption moves it most


def source_patching_section(ctx: ReportContext) -> ReportSection:
    model = ctx.model
    replacement = model.cfg.pad_token_id
    effects = source_word_effects(model, ctx.tokens, ctx.decoder_input, replacement)
    most = effects.nan_to_num(float("-inf")).argmax(dim=0).tolist()
    data = SourcePatchingData(effects, replacement, most)
    section = ReportSection("patching", "Corrupting each source word", data=data)
    section.paragraphs.append(
        f"Each source word is replaced in turn by {ctx.token_label(replacement)!r} (read as a real token) and the "
        "model rerun; "
        "a cell is how much the logit of the token predicted at that target position falls. A translation model's "
        "effects follow the alignment: each target token depends on the word it translates."
    )
    fig = plots_cross_attention.plot_source_effects(
        effects,
        ctx.str_tokens,
        ctx.target_str_tokens,
        title="logit fall of each prediction when a source word is corrupted",
        colorbar_title="logit fall",
    )
    side = min(640, 200 + 22 * max(len(ctx.str_tokens), len(ctx.target_str_tokens)))
    section.figures.append(sized(fig, side + 60, side + 160))
    return section
