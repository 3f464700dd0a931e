"""The prompt's tokens, with their positions and ids."""

import html
from dataclasses import dataclass

from ..context import ReportContext, ReportSection, SectionData


@dataclass
class TokensData(SectionData):
    tokens: list[int]
    str_tokens: list[str]


def tokens_section(ctx: ReportContext) -> ReportSection:
    ids = ctx.tokens[0].tolist()
    spans = "".join(
        f'<span class="tok" title="pos {pos}, id {token_id}"><sub>{pos}</sub>{html.escape(label)}</span>'
        for pos, (token_id, label) in enumerate(zip(ids, ctx.str_tokens))
    )
    section = ReportSection(
        "tokens",
        "The prompt's tokens",
        html=f'<div class="tokens">{spans}</div>',
        data=TokensData(tokens=ids, str_tokens=list(ctx.str_tokens)),
    )
    section.paragraphs.append(f"{len(ids)} tokens (position, then text; hover for the id). Ids: {ids}")
    return section
