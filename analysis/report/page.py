"""The report as one self-contained HTML page: plotly's JavaScript embedded once, nothing fetched."""

import html
from dataclasses import dataclass, field
from pathlib import Path

import plotly.io as pio
from plotly.offline import get_plotlyjs

from .. import _checks
from ..views import library_script
from .context import ReportSection

PLOT_CONFIG = {"displaylogo": False, "responsive": True}


def figure_div(fig, div_id: str, default_height: int) -> str:
    """The figure as a ``<div class="figure">`` for a page that loads plotly.js once (the report, the dashboards):
    its own height, else ``default_height`` pixels."""
    height = fig.layout.height or default_height
    div = pio.to_html(
        fig,
        full_html=False,
        include_plotlyjs=False,
        include_mathjax=False,
        div_id=div_id,
        config=PLOT_CONFIG,
        default_height=f"{height}px",
    )
    return f'<div class="figure">{div}</div>'


STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0 auto; max-width: 1200px;
       padding: 1em 2em; color: #222; }
h1 { border-bottom: 2px solid #2166ac; padding-bottom: .2em; }
h2 { margin-top: 2em; border-bottom: 1px solid #ccc; }
nav a { margin-right: 1em; }
table.kv th { text-align: left; padding-right: 2em; font-weight: 600; }
table.kv td { font-family: ui-monospace, Menlo, Consolas, monospace; }
.tokens { line-height: 1.8; }
.tok { display: inline-block; border: 1px solid #9ab; border-radius: 3px; padding: 0 4px; margin: 2px; white-space: pre;
       font-family: ui-monospace, Menlo, Consolas, monospace; background: #f4f8fb; }
.tok sub { color: #888; margin-right: 3px; }
ul.summary li { margin: .3em 0; }
.figures { display: flex; flex-wrap: wrap; gap: 1em; }
.figure { flex: 0 1 auto; }
"""


@dataclass
class Report:
    """A built report: its sections (with numbers and figures) and the written summary."""

    title: str
    sections: list[ReportSection]
    summary: list[str] = field(default_factory=list)

    def __getitem__(self, key: str) -> ReportSection:
        return _checks.find(self.sections, "key", key, f"no section {key!r} in this report; sections")

    @property
    def figures(self) -> list:
        """Every figure, in page order."""
        return [fig for section in self.sections for fig in section.figures]

    def to_html(self) -> str:
        """The whole page as one string: plotly.js inline in ``<head>``, one ``<div>`` per figure."""
        nav = " ".join(f'<a href="#{s.key}">{html.escape(s.title)}</a>' for s in self.sections)
        body, figure_index = [], 0
        for section in self.sections:
            parts = [f'<section id="{section.key}"><h2>{html.escape(section.title)}</h2>']
            if section.key == "interpretation":
                items = "".join(f"<li>{html.escape(line)}</li>" for line in section.paragraphs[:-1])
                parts.append(
                    f'<ul class="summary">{items}</ul><p><small>{html.escape(section.paragraphs[-1])}</small></p>'
                )
            else:
                parts += [f"<p>{html.escape(text)}</p>" for text in section.paragraphs]
            parts.append(section.html)
            figures = []
            for fig in section.figures:
                figures.append(figure_div(fig, f"figure-{figure_index}", 450))
                figure_index += 1
            if figures:
                parts.append(f'<div class="figures">{"".join(figures)}</div>')
            body.append("".join(parts) + "</section>")
        title = html.escape(self.title)
        return (
            f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<style>{STYLE}</style>\n<script "
            f'type="text/javascript">{get_plotlyjs()}</script>\n{library_script()}\n</head>\n'
            f"<body><h1>{title}</h1><nav>{nav}</nav>\n" + "\n".join(body) + "\n</body></html>\n"
        )

    def save(self, path: str | Path) -> Path:
        """Write ``to_html()`` to ``path`` (parent directories are created); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_html(), encoding="utf-8")
        return path
