"""The HTML of feature dashboards: one page per feature, and an index; self-contained, nothing fetched.

A feature page holds plotly's JavaScript once (``<head>``, as the report does) and the
views' library once (``analysis.views.library_script``); its figures are ``<div>`` s drawn
by that script, its examples ``activation_view`` fragments without their own copy of the
library. Every number a reader sees is also in the DOM as data (``data-value``,
``data-token-id``), which is what the browser tests read back.
"""

import html
from collections.abc import Callable, Sequence

from plotly.offline import get_plotlyjs

from ..report.page import STYLE, figure_div
from ..views import library_script

EXTRA_STYLE = """
table.logits { border-collapse: collapse; margin-right: 2em; }
table.logits td, table.logits th { padding: 2px 10px; text-align: left; }
table.logits td.value { text-align: right; font-family: ui-monospace, Menlo, Consolas, monospace; }
.example { margin: 1em 0; padding-top: .3em; border-top: 1px solid #eee; }
.example p { margin: .2em 0; color: #444; }
table.index { border-collapse: collapse; }
table.index td, table.index th { padding: 3px 12px; text-align: left; border-bottom: 1px solid #eee; vertical-align:
top; }
.hit { font-weight: 700; background: #fdd49e; }
"""


def _quote(token: str) -> str:
    return html.escape(repr(token)[1:-1])  # newlines and tabs visible, as in the views


def _number(value: float) -> str:
    return f"{value:.4g}"


def _logits_table(rows: Sequence[tuple[str, int, float]], table_id: str, caption: str) -> str:
    body = "".join(
        f'<tr data-token-id="{token_id}" data-value="{value!r}"><td><span class="tok">{_quote(token)}</span></td>'
        f'<td class="value">{_number(value)}</td></tr>'
        for token, token_id, value in rows
    )
    return (
        f'<table class="logits" id="{table_id}"><caption>{html.escape(caption)}</caption>'
        f"<tr><th>token</th><th>logit effect</th></tr>{body}</table>"
    )


def _summary(dashboard) -> str:
    rows = [
        ("SAE hook", dashboard.hook_name),
        ("feature", f"{dashboard.feature} of {dashboard.d_sae}"),
        ("firing rate", f"{dashboard.firing_rate:.4%} of {dashboard.n_tokens} tokens"),
        ("largest activation", _number(dashboard.max_activation)),
        ("corpus", dashboard.description),
    ]
    cells = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
    return f'<section id="summary"><table class="kv">{cells}</table></section>'


def _logits_section(dashboard) -> str:
    parts = ['<section id="logits"><h2>Direct logit effect</h2>']
    if not dashboard.promoted:
        parts.append(f"<p>{html.escape(dashboard.logits_note or 'Not computed.')}</p></section>")
        return "".join(parts)
    parts.append(
        "<p>What one unit of this feature's activation adds to each token's logit through the final norm (its scale "
        "taken as 1) and the unembedding alone, ignoring every later layer.</p>"
        '<div class="figures">'
        + _logits_table(dashboard.promoted, "promoted", "promoted most")
        + _logits_table(dashboard.suppressed, "suppressed", "suppressed most")
        + "</div>"
    )
    parts.append(figure_div(dashboard.logits_figure(), "logits-plot", 380) + "</section>")
    return "".join(parts)


def _examples_section(dashboard) -> str:
    parts = ['<section id="examples"><h2>Top activations</h2>']
    if not dashboard.examples:
        parts.append("<p>The feature never fired on the text read.</p>")
    for rank, (example, view) in enumerate(zip(dashboard.examples, dashboard.views())):
        token = example.tokens[example.hit]
        parts.append(
            f'<div class="example" data-rank="{rank}" data-value="{example.value!r}" data-text="{example.text_index}" '
            f'data-position="{example.position}" data-hit="{example.hit}">'
            f'<p>{rank + 1}. activation {_number(example.value)} on <span class="tok">{_quote(token)}</span>, '
            f"text {example.text_index}, position {example.position}</p>"
            f"{view.to_html(include_script=False)}</div>"
        )
    return "".join(parts) + "</section>"


def _page(title: str, body: str, scripts: bool) -> str:
    head_scripts = f'<script type="text/javascript">{get_plotlyjs()}</script>\n{library_script()}\n' if scripts else ""
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<style>{STYLE}{EXTRA_STYLE}</style>\n{head_scripts}</head>\n<body>{body}\n</body></html>\n"
    )


def feature_page(dashboard, index_link: str | None = None) -> str:
    """One feature's page (see ``dashboard.FeatureDashboard``)."""
    nav = ["<nav>"]
    if index_link is not None:
        nav.append(f'<a href="{html.escape(index_link)}">all features</a>')
    nav += [
        '<a href="#histogram">histogram</a>',
        '<a href="#logits">logits</a>',
        '<a href="#examples">examples</a></nav>',
    ]
    body = (
        f"<h1>{html.escape(dashboard.title)}</h1>{''.join(nav)}{_summary(dashboard)}"
        '<section id="histogram"><h2>Activation histogram</h2>'
        f"<p>Nonzero activations over the text read; the feature is zero on the other "
        f"{_number(100 * (1 - dashboard.firing_rate))}% of tokens.</p>"
        f"{figure_div(dashboard.histogram_figure(), 'histogram-plot', 380)}</section>"
        f"{_logits_section(dashboard)}{_examples_section(dashboard)}"
    )
    return _page(dashboard.title, body, scripts=True)


def _snippet(example) -> str:
    pieces = [
        f'<span class="hit">{_quote(t)}</span>' if i == example.hit else _quote(t) for i, t in enumerate(example.tokens)
    ]
    return f'<span class="tok">{"".join(pieces)}</span>'


def index_page(dashboards: Sequence, page_name: Callable[[int], str]) -> str:
    """A table of every feature with its firing rate, largest activation, top example and top tokens, each linked."""
    rows = []
    for d in dashboards:
        top = _snippet(d.examples[0]) if d.examples else "(never fired)"
        promoted = " ".join(f'<span class="tok">{_quote(token)}</span>' for token, _, _ in d.promoted[:5])
        rows.append(
            f'<tr data-feature="{d.feature}"><td><a href="{html.escape(page_name(d.feature))}">feature '
            f"{d.feature}</a></td>"
            f"<td>{d.firing_rate:.3%}</td><td>{_number(d.max_activation)}</td><td>{top}</td><td>{promoted}</td></tr>"
        )
    hook = dashboards[0].hook_name if dashboards else ""
    title = f"{len(dashboards)} features of the SAE at {hook}"
    body = (
        f'<h1>{html.escape(title)}</h1><table class="index"><tr><th>feature</th><th>firing rate</th>'
        f"<th>largest activation</th><th>top example</th><th>promotes</th></tr>{''.join(rows)}</table>"
    )
    return _page(title, body, scripts=False)


__all__ = ["feature_page", "index_page"]
