"""The source, the target the decoder read, and (when the tokenizer knows its task) the alignment between them."""

import html
from dataclasses import dataclass

from ..context import ReportContext, ReportSection, SectionData


@dataclass
class TranslationData(SectionData):
    source: list[int]
    source_tokens: list[str]
    target: list[int]  # the decoder's input, from the start token
    target_tokens: list[str]
    alignment: list[int] | None  # per target position, the source position its next token comes from (-1: none)


def _tokens_html(ids: list[int], labels: list[str]) -> str:
    spans = "".join(
        f'<span class="tok" title="pos {pos}, id {token_id}"><sub>{pos}</sub>{html.escape(label)}</span>'
        for pos, (token_id, label) in enumerate(zip(ids, labels))
    )
    return f'<div class="tokens">{spans}</div>'


def known_alignment(ctx: ReportContext) -> list[int] | None:
    """The task's alignment of this source and target, if the model's tokenizer knows it (``tokenizer.alignment``)."""
    answer = getattr(ctx.model.tokenizer, "alignment", None)
    if not callable(answer):
        return None
    return answer(ctx.tokens[0].tolist(), ctx.decoder_input[0].tolist())


def translation_section(ctx: ReportContext) -> ReportSection:
    source, target = ctx.tokens[0].tolist(), ctx.decoder_input[0].tolist()
    alignment = known_alignment(ctx)
    data = TranslationData(source, list(ctx.str_tokens), target, list(ctx.target_str_tokens), alignment)
    section = ReportSection(
        "translation",
        "Source and target",
        html="<p><b>source</b></p>"
        + _tokens_html(source, data.source_tokens)
        + "<p><b>target (the decoder's input)</b></p>"
        + _tokens_html(target, data.target_tokens),
        data=data,
    )
    predicted = ctx.logits[0].argmax(dim=-1).tolist()
    section.paragraphs.append(
        f"The decoder reads {len(target)} target tokens; at position t it predicts the token after t. Its predictions: "
        + " ".join(ctx.token_label(token_id) for token_id in predicted)
    )
    if alignment is not None:
        pairs = ", ".join(
            f"{data.target_tokens[t]}@{t} <- {data.source_tokens[s]}@{s}" for t, s in enumerate(alignment) if s >= 0
        )
        section.paragraphs.append(f"Known alignment (the source word each next target token comes from): {pairs}")
    return section
