"""The sweep as one offline page (``analysis.report.page.Report``: plotly.js embedded once, nothing fetched): the
figure with the prompt baseline beside it, the numbers as a table, and the continuations of the first prompt."""

import html
import math

from ..report.context import ReportSection
from ..report.page import Report
from .evaluate import Measured, SteeringSweep
from .figure import sweep_figure


def _number(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.4g}"


def _row(name: str, strength: str, measured: Measured) -> str:
    cells = [name, strength] + [
        _number(getattr(measured, metric)) for metric in ("concept", "similarity", "perplexity", "kl")
    ]
    first = measured.continuations[0] if measured.continuations else ""
    return "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells + [repr(first)]) + "</tr>"


def summary_lines(sweep: SteeringSweep) -> list[str]:
    """What the sweep found, in words: the best steering setting within twice the unsteered perplexity, beside the
    prompt baseline, on each concept score measured."""
    lines = []
    metric = "similarity" if sweep.baseline.similarity is not None else "concept"
    found = sweep.best(metric)
    if found is None:
        lines.append(
            "no steering setting keeps perplexity within 2x the unsteered model's and KL on the neutral prompts "
            "within 1 nat: see the table for what each one does"
        )
    else:
        v, s = found
        best = sweep.results[v][s]
        lines.append(
            f"best steering (by {metric}) within 2x the unsteered perplexity and 1 nat of KL on neutral prompts: "
            f"{sweep.labels[v]} at strength {sweep.strengths[s]:g} (perplexity {best.perplexity:.3g}, KL "
            f"{best.kl:.3g})"
        )
        for metric, name in (("similarity", "MiniLM similarity"), ("concept", "target log-probability")):
            steered, prompted = getattr(best, metric), getattr(sweep.baseline, metric)
            if steered is None or math.isnan(steered):
                continue
            winner = "steering" if steered > prompted else "prompting"
            lines.append(
                f"{name}: steering {steered:.4g}, prompt baseline {prompted:.4g}, unsteered "
                f"{getattr(sweep.unsteered, metric):.4g}: {winner} moves it more"
            )
    lines.append(
        f"prompt baseline: perplexity {sweep.baseline.perplexity:.3g}, KL on neutral prompts {sweep.baseline.kl:.3g}; "
        f"unsteered perplexity {sweep.unsteered.perplexity:.3g}"
    )
    return lines


def sweep_report(sweep: SteeringSweep, title: str, metadata: dict | None = None) -> Report:
    """The page: the summary, the figure, the table of every setting (with the first prompt's continuation)."""
    summary = summary_lines(sweep)
    overview = ReportSection(
        "sweep",
        "Sweep: concept, fluency and side effects by strength",
        paragraphs=summary
        + [
            f"Prompt baseline prefix: {sweep.prefix!r}. Concept: the target tokens' log-probability under the steered "
            "model (and, where measured, MiniLM's cosine of the continuation to the positive texts minus to the "
            "negative ones); fluency: the unsteered model's perplexity of the continuation after the plain prompt; "
            "side effects: KL(unsteered || steered) of the next token after each neutral prompt."
        ],
        figures=[sweep_figure(sweep, title)],
    )
    header = ["setting", "strength", "concept (log p)", "similarity", "perplexity", "KL", "first continuation"]
    rows = [_row("unsteered", "0", sweep.unsteered), _row("prompt baseline", "-", sweep.baseline)]
    for label, results in zip(sweep.labels, sweep.results):
        rows += [_row(label, f"{strength:g}", measured) for strength, measured in zip(sweep.strengths, results)]
    table = (
        '<table class="kv"><tr>'
        + "".join(f"<th>{html.escape(h)}</th>" for h in header)
        + "</tr>"
        + "".join(rows)
        + "</table>"
    )
    numbers = ReportSection("numbers", "Every setting", html=table)
    settings = {**(metadata or {}), **sweep.settings, "targets": sweep.targets}
    kv = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in settings.items())
    about = ReportSection("settings", "Settings", html=f'<table class="kv">{kv}</table>')
    return Report(title, [overview, numbers, about], summary)


__all__ = ["summary_lines", "sweep_report"]
