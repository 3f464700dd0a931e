"""An encoder-decoder report's written interpretation, from the numbers of its other sections.

``ALIGNED_THRESHOLD = 0.5``: a cross-attention head is said to follow the alignment when at
least half its attention lands on the aligned source word on average (a head spreading
its attention over a 10-word source scores about 0.1).
"""

from dataclasses import dataclass

from ..context import ReportContext, ReportSection, SectionData

ALIGNED_THRESHOLD = 0.5


@dataclass
class EncoderDecoderInterpretationData(SectionData):
    lines: list[str]
    aligned_heads: list[tuple[int, int, float]]


def encoder_decoder_interpretation_section(ctx: ReportContext) -> ReportSection:
    translation = ctx.sections["translation"].data
    predicted = " ".join(ctx.token_label(t) for t in ctx.logits[0].argmax(dim=-1).tolist())
    lines = [f"The decoder reads {' '.join(translation.target_tokens)!r} and predicts {predicted!r}"]
    alignment = ctx.sections["alignment"].data
    aligned = [(layer, head, score) for layer, head, score in alignment.best_per_layer if score >= ALIGNED_THRESHOLD]
    for layer, head, score in alignment.best_per_layer:
        verdict = "follows" if score >= ALIGNED_THRESHOLD else "does not clearly follow"
        lines.append(
            f"Layer {layer}'s best cross-attention head L{layer}C{head} {verdict} the {alignment.kind}: score "
            f"{score:.2f}"
        )
    if "attribution" in ctx.sections:
        layer, head, value = ctx.sections["attribution"].data.top_cross_head
        lines.append(
            f"Directly, L{layer}C{head} writes the most to the predicted logits of all cross-attention heads "
            f"(mean |contribution| {value:.2f})"
        )
    patching = ctx.sections["patching"].data
    if translation.alignment is not None:
        aligned_positions = [t for t, s in enumerate(translation.alignment) if s >= 0]
        agree = sum(patching.most_affected_source[t] == translation.alignment[t] for t in aligned_positions)
        lines.append(
            f"Corrupting source words: at {agree} of {len(aligned_positions)} aligned target positions the word "
            "whose corruption moves the prediction most is the aligned one"
        )
    omitted = "; ".join(part["what"] for part in ctx.sections["omitted"].data.parts)
    lines.append(f"Not shown for an encoder-decoder (see 'Not in this report'): {omitted}")
    section = ReportSection(
        "interpretation",
        "What the numbers say",
        paragraphs=list(lines),
        data=EncoderDecoderInterpretationData(lines, aligned),
    )
    section.paragraphs.append(f"Threshold: a head follows the alignment when its score is >= {ALIGNED_THRESHOLD}.")
    return section
