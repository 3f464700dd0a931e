"""``interp-transformer patch``: which sites carry the difference between a clean and a corrupted prompt.

    interp-transformer patch --model SOURCE --clean TEXT --corrupted TEXT --answer TOKEN --wrong TOKEN
                             [--component heads] [--each-position] [--method patch|atp|eap|eap-ig] [--out FILE]

The metric is ``logit(answer) - logit(wrong)`` at the last position. ``--method patch`` patches
each site clean into the corrupted run (many sites per forward, ``analysis.discovery.patch_sites``);
``--method atp`` estimates every site at once from one forward and one backward pass
(attribution patching); ``--method eap`` / ``eap-ig`` scores every edge between the input, the
heads and MLPs and their readers instead. It prints the clean and corrupted metrics and what
moves the metric most, and writes the figure as a self-contained HTML file.
"""

import argparse
from pathlib import Path

import torch

from .. import _checks
from ..discovery import (
    COMPONENTS,
    attribution_patching,
    edge_attribution_patching,
    logit_diff_per_row,
    patch_sites,
    patching_figure,
    sites,
)
from . import options
from .common import EXIT_OK, UserError, load_model, prompt_tokens

DEFAULT_OUT = "interp_transformer_patching.html"


def _token_id(model, text: str, what: str) -> int:
    if model.tokenizer is None:
        if not text.strip().isdigit() or not 0 <= int(text) < model.cfg.d_vocab:
            raise UserError(
                f"{model.cfg.name} has no tokenizer: --{what} must be a token id in [0, {model.cfg.d_vocab})"
            )
        return int(text)
    from interp_transformer.text.tokens import single_token_id

    return single_token_id(model.tokenizer, text)


def cmd_patch(args: argparse.Namespace) -> int:
    _checks.count(args.top, "--top", minimum=1)  # a larger count than there are sites prints them all
    model, _ = load_model(args.model, torch.float32, None)
    clean, corrupted = prompt_tokens(model, args.clean), prompt_tokens(model, args.corrupted)
    if clean.shape != corrupted.shape:
        raise UserError(
            f"the clean prompt is {clean.shape[1]} tokens and the corrupted one {corrupted.shape[1]}: positions must "
            "line up, so both must have the same token length"
        )
    answer, wrong = _token_id(model, args.answer, "answer"), _token_id(model, args.wrong, "wrong")
    metric = logit_diff_per_row(answer, wrong)
    prompt = torch.arange(1)
    with torch.no_grad():
        clean_value = float(metric(model(clean), prompt)[0])
        corrupted_value = float(metric(model(corrupted), prompt)[0])
    print(f"logit({args.answer!r}) - logit({args.wrong!r}): clean {clean_value:+.3f}, corrupted {corrupted_value:+.3f}")
    if args.method in ("eap", "eap-ig"):
        return _edges(model, clean, corrupted, metric, args)
    chosen = sites(model, args.component, positions="each" if args.each_position else None, n_pos=clean.shape[1])
    if args.method == "patch":
        effect = patch_sites(model, clean, corrupted, metric, chosen) - corrupted_value
    else:
        effect = attribution_patching(model, clean, corrupted, metric, chosen)
    order = effect[:, 0].abs().argsort(descending=True)[: args.top]
    print(f"sites that move it most ({args.method}: change from the corrupted run):")
    for index in order.tolist():
        print(f"  {chosen[index].label:>24}  {float(effect[index, 0]):+.3f}")
    what = "patched clean" if args.method == "patch" else "attribution patching (first order)"
    fig = patching_figure(effect, chosen, title=f"{args.model}: change of the logit difference, {what}")
    return _write_figure(fig, args.out)


def _write_figure(fig, out: Path) -> int:
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(str(out), include_plotlyjs=True, full_html=True)  # plotly.js inline: opens offline
    print(f"wrote {out}")
    return EXIT_OK


def _edges(model, clean, corrupted, metric, args: argparse.Namespace) -> int:
    method = "EAP" if args.method == "eap" else "EAP-IG"
    edges = edge_attribution_patching(model, clean, corrupted, metric, method=method, steps=args.steps)
    print(f"edges that move it most ({method}, first order):")
    for upstream, reader, score in edges.top(args.top):
        print(f"  {upstream:>8} -> {reader:<10}  {score:+.3f}")
    return _write_figure(edges.figure(max(args.top, 10)), args.out)


def add_patch_parser(commands) -> None:
    summary = "find the sites that carry the difference between a clean and a corrupted prompt"
    patch = options.add_command(commands, "patch", cmd_patch, summary, __doc__, verbatim=True, model=True)
    patch.add_argument(
        "--clean", required=True, metavar="TEXT", help="the clean prompt (token ids without a tokenizer)"
    )
    patch.add_argument("--corrupted", required=True, metavar="TEXT", help="the corrupted prompt, of the same length")
    patch.add_argument("--answer", required=True, metavar="TOKEN", help="the token the clean prompt predicts")
    patch.add_argument("--wrong", required=True, metavar="TOKEN", help="the token the corrupted prompt predicts")
    patch.add_argument("--component", choices=COMPONENTS, default="heads", help="what to patch (default: heads)")
    patch.add_argument("--each-position", action="store_true", help="one site per position (default: all at once)")
    patch.add_argument(
        "--method",
        choices=("patch", "atp", "eap", "eap-ig"),
        default="patch",
        help="patch sites, estimate them (AtP), or score every edge (EAP, EAP-IG) (default: patch)",
    )
    patch.add_argument("--steps", type=int, default=5, metavar="N", help="EAP-IG's interpolations (default: 5)")
    patch.add_argument(
        "--top", type=int, default=10, metavar="N", help="how many sites to print, at least 1 (default: 10)"
    )
    patch.add_argument("--out", type=Path, default=Path(DEFAULT_OUT), metavar="FILE", help="the HTML figure")


CIRCUIT_DOC = """interp-transformer circuit: find a task's circuit by edge attribution and check it, on one page.

    interp-transformer circuit --task ioi --model smollm2-135m [--prompts 20] [--method eap-ig] [--steps 5]
                               [--edges 50 | --fraction 0.05] [--sizes 50,200,1%,5%] [--selection top|greedy]
                               [--ablation corrupted|mean] [--threads N] [--out FILE]

``--task``: ioi, greater-than, induction, or a CSV/JSON file of clean,corrupted,answer,wrong rows; for an
encoder-decoder (e.g. ``--model translate-tiny``) a CSV/JSON file of source,corrupted_source,target,answer,wrong
rows (``analysis.discovery.seq2seq_tasks``).
It scores every edge, keeps the ``--edges`` strongest (default 50: a graph a person can read; or ``--fraction``
of them), pruned of nodes with no path to the logits, runs that circuit with every other edge ablated, and
prints the metric clean, corrupted and in the circuit (its faithfulness), MIB's CPR and CMD over the circuit
sizes ``--sizes`` (default MIB's: 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50 and 100% of the edges), the smallest of
those sizes reaching faithfulness 0.8, and the circuit's nodes. Every size of the curve runs in batched
forwards. The page holds the circuit as a graph (click a head for its attention), node and edge heatmaps and
the faithfulness curve, and links every edge's score, written next to it as CSV (``--scores-out``).

On SmolLM2-135M IOI with the defaults it takes about a minute and a half on two cores (docs/analysis.md).
"""


def _task(model, args: argparse.Namespace):
    from ..discovery import greater_than_metric, greater_than_task, induction_task, ioi_task, load_task
    from ..discovery.seq2seq_tasks import load_seq2seq_task

    if model.writers_that("reads_source"):  # (source, target) pairs: a file of the user's
        if not Path(args.task).is_file():
            raise UserError(
                f"--task {args.task!r}: an encoder-decoder's task is a CSV/JSON file of "
                "source,corrupted_source,target,answer,wrong rows (the built-in tasks are for decoders)"
            )
        return load_seq2seq_task(model, Path(args.task)), None
    if args.task == "ioi":
        return ioi_task(model, args.prompts, seed=args.seed), None
    if args.task == "greater-than":
        task = greater_than_task(model, args.prompts, seed=args.seed)
        return task, greater_than_metric(model, task)
    if args.task == "induction":
        return induction_task(model, args.prompts, args.seq_len, seed=args.seed), None
    path = Path(args.task)
    if not path.is_file():
        raise UserError(f"--task must be ioi, greater-than, induction or a CSV/JSON file; {args.task!r} is none")
    return load_task(model, path), None


def cmd_circuit(args: argparse.Namespace) -> int:
    from ..discovery.report import circuit_report, circuit_sizes, write_edge_scores

    if args.threads is not None:  # every option is checked before the model loads
        torch.set_num_threads(_checks.count(args.threads, "--threads", minimum=1))
    if args.edges is not None and args.fraction is not None:
        raise UserError(f"give the circuit's size once: --edges {args.edges} or --fraction {args.fraction}")
    if args.edges is not None:
        circuit_sizes([args.edges])
    if args.sizes is not None:
        circuit_sizes(args.sizes)
    model, _ = load_model(args.model, torch.float32, None)
    task, metric = _task(model, args)
    method = "EAP" if args.method == "eap" else "EAP-IG"
    scores_out = args.scores_out or args.out.with_name(args.out.stem + "_edges.csv")
    link = scores_out.name if scores_out.parent.resolve() == args.out.parent.resolve() else str(scores_out.resolve())
    report = circuit_report(
        model, task, metric=metric, method=method, steps=args.steps, ig_on=args.ig_on, edges=args.edges,
        fraction=args.fraction, sizes=args.sizes, selection=args.selection, ablation=args.ablation,
        title=f"{args.model}: the {task.name} circuit", scores_file=link, progress=True,
    )  # fmt: skip
    for line in report.summary:
        print(line)
    data = report["circuit"].data
    print("nodes of the circuit:", ", ".join(data.nodes[:30]) + (" ..." if len(data.nodes) > 30 else ""))
    print(f"wrote {report.save(args.out)}")
    print(f"wrote {write_edge_scores(data.scores, data.kept, scores_out)} (every edge's score)")
    return EXIT_OK


def add_circuit_parser(commands) -> None:
    summary = "find a task's circuit (EAP/EAP-IG), run it and write the graph, heatmaps and faithfulness curve"
    circuit = options.add_command(commands, "circuit", cmd_circuit, summary, CIRCUIT_DOC, verbatim=True, model=True)
    circuit.add_argument(
        "--task", required=True, metavar="TASK", help="ioi, greater-than, induction or a CSV/JSON file (see below)"
    )
    circuit.add_argument(
        "--prompts", type=int, default=20, metavar="N", help="prompts of a built-in task (default: 20)"
    )
    circuit.add_argument("--seq-len", type=int, default=8, metavar="N", help="induction's repeated half (default: 8)")
    circuit.add_argument("--seed", type=int, default=0, help="the built-in task's seed (default: 0)")
    circuit.add_argument("--method", choices=("eap", "eap-ig"), default="eap-ig", help="edge scores (default: eap-ig)")
    circuit.add_argument("--steps", type=int, default=5, metavar="N", help="EAP-IG's interpolations (default: 5)")
    circuit.add_argument("--ig-on", choices=("inputs", "activations"), default="inputs", help="EAP-IG interpolates")
    circuit.add_argument(
        "--edges", type=int, default=None, metavar="N",
        help="edges in the drawn circuit, before pruning (default: 50, a graph a person can read)",
    )  # fmt: skip
    circuit.add_argument(
        "--fraction",
        type=float,
        default=None,
        help="share of the graph's edges in the drawn circuit, instead of --edges",
    )
    circuit.add_argument(
        "--sizes", default=None, metavar="LIST",
        help="the faithfulness curve's circuit sizes: a comma list of edge counts or percentages of the edges, "
        "e.g. 50,200,1%%,5%% (default: MIB's 0.1,0.2,0.5,1,2,5,10,20,50,100%%)",
    )  # fmt: skip
    circuit.add_argument("--selection", choices=("top", "greedy"), default="top", help="how edges are chosen")
    circuit.add_argument("--ablation", choices=("corrupted", "mean"), default="corrupted", help="left-out edges get")
    circuit.add_argument(
        "--threads", type=int, default=None, metavar="N",
        help="CPU threads torch may use (torch.set_num_threads; default: torch's choice). On a machine shared with "
        "other work one thread can be faster than several: threads waiting for busy cores stall each other",
    )  # fmt: skip
    circuit.add_argument("--out", type=Path, default=Path("interp_transformer_circuit.html"), metavar="FILE")
    circuit.add_argument(
        "--scores-out", type=Path, default=None, metavar="FILE",
        help="every edge's score as CSV (default: next to --out, FILE_edges.csv), linked from the page",
    )  # fmt: skip


__all__ = ["add_circuit_parser", "add_patch_parser", "cmd_circuit", "cmd_patch"]
