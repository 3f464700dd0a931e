"""A self-contained HTML report of one model on one prompt.

``build_report(model, tokens, title=...)`` runs the model on the prompt with every
hook cached, applies the analysis tools and returns a ``Report``: a list of
``ReportSection`` (the model card, the prompt's tokens, a written interpretation,
attention patterns of every head, head-detector scores, QK/OV circuits of the
top heads, composition scores, MLP neurons, logit lens and direct logit
attribution), each holding its numbers in ``section.data`` and its plotly figures.
``report.summary`` is the interpretation as lines of text; ``report.save(path)``
writes one HTML file that opens offline: plotly's JavaScript is embedded once in
the page head, and nothing is fetched from the network (no CDN, web fonts or MathJax).

An ``EncoderTransformer`` (BERT-style) gets the same report where it applies, the
encoder's own detectors and output attribution where a decoder section would not apply,
and a section ``"omitted"`` listing what is left out and why (``analysis.report_encoder``).

>>> import torch
>>> from interp_transformer import DemoTransformer, TransformerConfig
>>> cfg = TransformerConfig(d_model=16, n_layers=2, n_heads=2, d_head=8, d_mlp=None, d_vocab=20, n_ctx=16)
>>> report = build_report(DemoTransformer(cfg, seed=0), torch.tensor([0, 3, 4, 5, 3, 4, 5]), title="tiny")
>>> [section.key for section in report.sections]  # doctest: +NORMALIZE_WHITESPACE
['model', 'tokens', 'interpretation', 'attention', 'detectors', 'circuits', 'composition', 'neurons', 'attribution']
>>> report["neurons"].paragraphs[0]
'This model is attention-only (d_mlp=None): it has no MLP neurons to show.'
"""

import html
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, Union

import plotly.io as pio
import torch
from jaxtyping import Int
from plotly.offline import get_plotlyjs
from torch import Tensor
from tqdm.auto import tqdm

from . import _checks
from .report_circuits import circuits_section, composition_section
from .report_encoder import (
    encoder_attribution_section,
    encoder_detectors_section,
    encoder_interpretation_section,
    encoder_model_section,
    omitted_section,
)
from .report_interpretation import interpretation_section
from .report_sections import (
    ReportContext,
    ReportSection,
    attention_section,
    attribution_section,
    detectors_section,
    model_section,
    neurons_section,
    tokens_section,
)

# computed in this order (later sections read earlier ones), shown in DISPLAY_ORDER
BUILDERS = (
    ("model", model_section),
    ("tokens", tokens_section),
    ("detectors", detectors_section),
    ("attention", attention_section),
    ("circuits", circuits_section),
    ("composition", composition_section),
    ("neurons", neurons_section),
    ("attribution", attribution_section),
    ("interpretation", interpretation_section),
)
DISPLAY_ORDER = ("model", "tokens", "interpretation", "attention", "detectors", "circuits", "composition", "neurons", "attribution")
ENCODER_BUILDERS = (
    ("model", encoder_model_section),
    ("tokens", tokens_section),
    ("detectors", encoder_detectors_section),
    ("attention", attention_section),
    ("circuits", circuits_section),
    ("composition", composition_section),
    ("neurons", neurons_section),
    ("attribution", encoder_attribution_section),
    ("omitted", omitted_section),
    ("interpretation", encoder_interpretation_section),
)
ENCODER_DISPLAY_ORDER = ("model", "tokens", "interpretation", "omitted", "attention", "detectors", "circuits", "composition",
                         "neurons", "attribution")
PLOT_CONFIG = {"displaylogo": False, "responsive": True}
FIRST_TOKEN = "first"  # default ``bos`` of build_report: the prompt's first token

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
        for section in self.sections:
            if section.key == key:
                return section
        raise KeyError(f"no section {key!r} in this report; sections: {[s.key for s in self.sections]}")

    @property
    def figures(self) -> list:
        """Every figure, in page order."""
        return [fig for section in self.sections for fig in section.figures]

    def summary_text(self) -> str:
        return "\n".join(self.summary)

    def to_html(self) -> str:
        """The whole page as one string: plotly.js inline in ``<head>``, one ``<div>`` per figure."""
        nav = " ".join(f'<a href="#{s.key}">{html.escape(s.title)}</a>' for s in self.sections)
        body, figure_index = [], 0
        for section in self.sections:
            parts = [f'<section id="{section.key}"><h2>{html.escape(section.title)}</h2>']
            if section.key == "interpretation":
                items = "".join(f"<li>{html.escape(line)}</li>" for line in section.paragraphs[:-1])
                parts.append(f'<ul class="summary">{items}</ul><p><small>{html.escape(section.paragraphs[-1])}</small></p>')
            else:
                parts += [f"<p>{html.escape(text)}</p>" for text in section.paragraphs]
            parts.append(section.html)
            figures = []
            for fig in section.figures:
                height = fig.layout.height or 450
                div = pio.to_html(fig, full_html=False, include_plotlyjs=False, include_mathjax=False,
                                  div_id=f"figure-{figure_index}", config=PLOT_CONFIG, default_height=f"{height}px")
                figures.append(f'<div class="figure">{div}</div>')
                figure_index += 1
            if figures:
                parts.append(f'<div class="figures">{"".join(figures)}</div>')
            body.append("".join(parts) + "</section>")
        title = html.escape(self.title)
        return (
            f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<style>{STYLE}</style>\n<script type=\"text/javascript\">{get_plotlyjs()}</script>\n</head>\n"
            f"<body><h1>{title}</h1><nav>{nav}</nav>\n" + "\n".join(body) + "\n</body></html>\n"
        )

    def save(self, path: Union[str, Path]) -> Path:
        """Write ``to_html()`` to ``path`` (parent directories are created); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_html(), encoding="utf-8")
        return path


def _prompt_tokens(model: _checks.AnyModel, tokens) -> Tensor:
    tokens = model.prepare_tokens(tokens)
    if tokens.shape[0] != 1:
        raise ValueError(f"build_report takes one prompt: a single text or tokens [pos] / [1, pos], got {tuple(tokens.shape)}")
    return tokens


def _token_labeller(model: _checks.AnyModel):
    if model.tokenizer is None:
        return lambda token_id: str(token_id)
    return lambda token_id: model.to_str_tokens(torch.tensor([token_id]))[0]


@torch.no_grad()
def build_report(
    model: _checks.AnyModel,
    tokens: Union[Int[Tensor, "pos"], Int[Tensor, "1 pos"], str],
    *,
    title: str = "interp_transformer report",
    str_tokens: Optional[Sequence[str]] = None,
    metadata: Optional[dict] = None,
    bos: Union[int, None, str] = FIRST_TOKEN,
    progress: bool = False,
) -> Report:
    """Analyse ``model`` on one prompt and return the ``Report`` (call ``.save(path)`` for the HTML).

    ``tokens``: ``[pos]`` or ``[1, pos]`` ids, or text if the model has a tokenizer.
    ``str_tokens``: one label per token (default: decoded by the tokenizer, else the ids).
    ``metadata``: extra rows for the model card (e.g. ``{"source": "gpt2"}``); a ``"curve"``
    entry with ``steps``, ``first_half_loss`` and ``repeated_half_loss`` is drawn as the
    training curve. ``bos``: token put before the repeated random sequences the head
    detectors run on (default the prompt's first token, which is BOS for text prompts;
    ``None`` for none). ``progress`` shows a progress bar over the sections.

    For an ``EncoderTransformer`` the prompt is one unpadded text (``[CLS] ... [SEP]``) or
    ids; the detectors' random sequences are framed by ``bos`` and the prompt's last token
    (``[SEP]`` for text), and the sections are those of ``ENCODER_DISPLAY_ORDER``.
    """
    _checks.check_model(model)
    encoder = _checks.is_encoder(model)
    tokens = _prompt_tokens(model, tokens)
    label = _token_labeller(model)
    if str_tokens is None:
        str_tokens = [label(token_id) for token_id in tokens[0].tolist()]
    str_tokens = _checks.check_labels(str_tokens, tokens.shape[1], "pos")
    if bos == FIRST_TOKEN:
        bos = int(tokens[0, 0])
    elif bos is not None and (isinstance(bos, bool) or not isinstance(bos, numbers.Integral)):
        raise TypeError(f"bos must be a token id, None or {FIRST_TOKEN!r}, got {bos!r}")
    eos = int(tokens[0, -1]) if encoder and tokens.shape[1] >= 2 else None
    builders, order = (ENCODER_BUILDERS, ENCODER_DISPLAY_ORDER) if encoder else (BUILDERS, DISPLAY_ORDER)
    output, cache = model.run_with_cache(tokens)
    ctx = ReportContext(model, tokens, str_tokens, cache, output, label, bos, dict(metadata or {}), eos=eos)
    for key, builder in tqdm(builders, desc="building report", disable=not progress, unit="section"):
        ctx.sections[key] = builder(ctx)
    sections = [ctx.sections[key] for key in order]
    return Report(title, sections, summary=list(ctx.sections["interpretation"].data["lines"]))
