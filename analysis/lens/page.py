"""A lens's evaluation as one offline page (``analysis.report.page``: plotly.js embedded, nothing fetched)."""

import html

from ..report.context import ReportSection
from ..report.page import Report
from .evaluate import LensEvaluation


def _table_html(evaluation: LensEvaluation) -> str:
    head = "".join(f"<th>{name}</th>" for name in ("layer", "tuned KL", "logit KL", "tuned top-1", "logit top-1"))
    rows = []
    for i, layer in enumerate(evaluation.layers):
        cells = [str(layer)] + [
            f"{getattr(evaluation, key)[i]:.4f}" for key in ("tuned_kl", "logit_kl", "tuned_top1", "logit_top1")
        ]
        rows.append("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in cells) + "</tr>")
    return f'<table class="kv"><tr>{head}</tr>{"".join(rows)}</table>'


def summary_lines(evaluation: LensEvaluation) -> list[str]:
    wins = evaluation.layers_where_tuned_wins()
    n = len(evaluation.layers)
    mean = lambda values: sum(values) / len(values)  # noqa: E731
    return [
        f"Held out: {evaluation.n_tokens} tokens ({evaluation.description}).",
        f"Mean KL to the final distribution over the {n} layers: tuned lens {mean(evaluation.tuned_kl):.3f} nats, "
        f"logit lens {mean(evaluation.logit_kl):.3f} nats; the tuned lens is below the logit lens at {len(wins)} "
        f"of {n} layers" + ("" if len(wins) == n else f" (not at {sorted(set(evaluation.layers) - set(wins))})") + ".",
        f"Mean top-1 agreement: tuned lens {mean(evaluation.tuned_top1):.3f}, logit lens "
        f"{mean(evaluation.logit_top1):.3f}.",
    ]


def lens_page(evaluation: LensEvaluation, title: str, training: dict | None = None) -> Report:
    """The page: a summary, the figure (``plot_lens_comparison``), the per-layer table and, given ``training``
    (``training.json``'s record), how the lens was trained."""
    summary = summary_lines(evaluation)
    sections = [
        ReportSection("summary", "Summary", summary, [evaluation.figure()], evaluation),
        ReportSection(
            "layers", "Per layer", ["Mean over held-out tokens; KL in nats."], [], None, _table_html(evaluation)
        ),
    ]
    if training:
        config = training.get("config", {})
        lines = [
            f"Corpus: {training.get('corpus', '?')}; {training.get('n_train_tokens', '?')} training tokens, "
            f"{len(training.get('losses', []))} steps in {training.get('seconds', float('nan')):.0f} s.",
            "Settings: " + ", ".join(f"{key}={value}" for key, value in config.items()) + ".",
        ]
        sections.append(ReportSection("training", "Training", lines))
    return Report(title, sections, summary)


__all__ = ["lens_page", "summary_lines"]
