"""``interp-transformer circuit-benchmark``: every discovery method scored against circuits known by construction.

    interp-transformer circuit-benchmark [--methods NAME ...] [--models NAME ...] [--sizes PCT ...] [--steps N]
                                         [--seed S] [--out page.html] [--mib-out DIR] [--threads N]

The models (``analysis.discovery.ground_truth``) are small decoders whose circuit weights are set
by hand: induction by K-composition, a copy under grouped-query attention, a two-step computation
through a mixture of experts, and a copy beside two cancelling heads. Each method
(``analysis.discovery.ground_truth_scoring``) scores every edge; the command prints, per method and
model, the edge-level AUROC against the known circuit, the precision among the strongest ``k``
edges (``k`` the known circuit's size) and MIB's CPR and CMD over ``--sizes`` (percent of edges,
MIB's by default), and writes an offline page with the table, the AUROC by method and model and
the faithfulness curves. ``--mib-out DIR`` also writes every method's scores in MIB's submission
layout, ``DIR/<method>/<task>_<model>/importances.json``. Runs on CPU in a few minutes.
"""

import argparse
import html
import sys
from pathlib import Path

from . import options
from .common import EXIT_OK, UserError, positive_int

DEFAULT_OUT = "interp_transformer_benchmark.html"


def _sizes(texts) -> tuple:
    from ..discovery.ground_truth_scoring import MIB_PERCENTAGES, check_sizes

    if texts is None:
        return MIB_PERCENTAGES
    values = []
    for text in texts:
        try:
            values.append(float(text))
        except ValueError:
            raise UserError(f"--sizes takes percentages of the graph's edges in (0, 100], got {text!r}") from None
    return check_sizes(values)


def _auroc_figure(results):
    import plotly.graph_objects as go

    models = list(dict.fromkeys(r.model for r in results))
    fig = go.Figure()
    for model in models:
        rows = [r for r in results if r.model == model]
        fig.add_trace(go.Bar(name=model, x=[r.method for r in rows], y=[r.auroc for r in rows]))
    fig.add_hline(y=0.5, line_dash="dot", annotation_text="chance")
    fig.update_layout(
        barmode="group", title=dict(text="edge-level AUROC against the known circuit"), yaxis_title="AUROC",
        yaxis_range=[0, 1.05], xaxis_title="method", legend_title="ground-truth model", width=1000,
    )  # fmt: skip
    return fig


def _curve_figure(results, model: str):
    import plotly.graph_objects as go

    fig = go.Figure()
    for r in (r for r in results if r.model == model):
        fig.add_trace(go.Scatter(x=list(r.percentages), y=r.faithfulness, mode="lines+markers", name=r.method))
    fig.update_layout(
        title=dict(text=f"{model}: faithfulness of the strongest edges"), xaxis_type="log",
        xaxis_title="edges kept (% of the graph)", yaxis_title="(m - m_corrupt) / (m_clean - m_corrupt)", width=640,
    )  # fmt: skip
    return fig


def _table_html(results) -> str:
    models = list(dict.fromkeys(r.model for r in results))
    methods = list(dict.fromkeys(r.method for r in results))
    by = {(r.method, r.model): r for r in results}
    head = "".join(f"<th>{html.escape(m)}<br><small>AUROC / P@k / CPR / CMD</small></th>" for m in models)
    rows = []
    for method in methods:
        cells = []
        for model in models:
            r = by.get((method, model))
            cells.append(
                "<td></td>" if r is None else f"<td>{r.auroc:.2f} / {r.precision:.2f} / {r.cpr:.2f} / {r.cmd:.2f}</td>"
            )
        rows.append(f"<tr><th>{html.escape(method)}</th>{''.join(cells)}</tr>")
    return f'<table class="kv"><tr><th>method</th>{head}</tr>{"".join(rows)}</table>'


def benchmark_page(results, models, title: str = "circuit discovery against known circuits"):
    """The offline page (``analysis.report.page.Report``): the table, AUROC by method and model, the faithfulness
    curves, and each model's known circuit with why it is what it is."""
    from ..report.context import ReportSection
    from ..report.page import Report

    intro = [
        "Each cell: edge-level AUROC (1: every known edge outranks every other edge), precision among the k strongest "
        "edges (k: the known circuit's size), MIB's CPR (area under the faithfulness curve, higher is better) and "
        "CMD (area under |1 - faithfulness|, lower is better) over the circuit sizes."
    ]
    circuits = []
    for gt in models:
        edges = ", ".join(f"{up} -> {reader}" for up, reader in gt.edges)
        circuits.append(f"{gt.name} (task {gt.task}): {edges}. {gt.notes}")
    sections = [
        ReportSection("results", "Results", intro, [], None, _table_html(results)),
        ReportSection("auroc", "AUROC by method and model", [], [_auroc_figure(results)]),
        ReportSection(
            "faithfulness",
            "Faithfulness curves",
            ["The circuits of the strongest edges, MIB's sizes."],
            [_curve_figure(results, gt.name) for gt in models],
        ),  # fmt: skip
        ReportSection("circuits", "The known circuits", circuits),
    ]
    return Report(title, sections, intro)


def cmd_circuit_benchmark(args: argparse.Namespace) -> int:
    from ..discovery.ground_truth import GROUND_TRUTHS, check_names, ground_truth
    from ..discovery.ground_truth_scoring import METHODS, results_table, run_benchmark

    methods = check_names(args.methods or list(METHODS), METHODS, "method")  # names before any model is built
    models = check_names(args.models or list(GROUND_TRUTHS), GROUND_TRUTHS, "ground-truth model")
    sizes = _sizes(args.sizes)
    options.set_threads(args.threads)
    results = run_benchmark(
        methods, models, percentages=sizes, steps=args.steps, seed=args.seed, mib_out=args.mib_out, progress=True
    )
    print("AUROC / precision at the known size / CPR / CMD")
    print(results_table(results))
    page = benchmark_page(results, [ground_truth(name, seed=args.seed) for name in models])
    print(f"wrote {page.save(args.out)}")
    if args.mib_out is not None:
        print(f"MIB importance files under {args.mib_out}/<method>/<task>_<model>/importances.json")
    sys.stdout.flush()
    return EXIT_OK


def add_benchmark_parser(commands) -> None:
    from ..discovery.ground_truth import GROUND_TRUTHS
    from ..discovery.ground_truth_scoring import METHODS

    summary = "score every circuit-discovery method against models whose circuits are known by construction"
    parser = options.add_command(commands, "circuit-benchmark", cmd_circuit_benchmark, summary, __doc__, verbatim=True)
    parser.add_argument("--methods", nargs="+", metavar="NAME", help=f"default all: {', '.join(METHODS)}")
    parser.add_argument("--models", nargs="+", metavar="NAME", help=f"default all: {', '.join(GROUND_TRUTHS)}")
    parser.add_argument("--sizes", nargs="+", metavar="PCT", help="circuit sizes, %% of edges (default: MIB's)")
    parser.add_argument("--steps", type=positive_int, default=5, metavar="N", help="EAP-IG's interpolations")
    parser.add_argument("--seed", type=int, default=0, help="background weights, prompts and random scores")
    parser.add_argument("--out", type=Path, default=Path(DEFAULT_OUT), metavar="FILE", help="the HTML page")
    parser.add_argument("--mib-out", type=Path, metavar="DIR", help="also write MIB's submission files here")
    options.add_threads_option(parser, "torch threads (one is often fastest)")


__all__ = ["add_benchmark_parser", "benchmark_page", "cmd_circuit_benchmark"]
