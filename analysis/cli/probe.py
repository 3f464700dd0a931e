"""The command line's ``probe`` command: logistic probes per layer (or per head output) on labelled text, with
the control task's selectivity, written as an offline page (``analysis.probes``)."""

import argparse
import html
import json
from pathlib import Path

import torch

from . import options
from .common import EXIT_OK, UserError, load_model, positive_int

DEFAULT_PAGE = "probes.html"


def read_records(path: Path) -> tuple[list, list, list, str]:
    """``(examples, labels, types or None, position)`` from a JSON-lines file.

    Each line: ``{"text": ...}`` or ``{"tokens": [ids]}``, with ``"label"`` (read at the last token) or
    ``"labels"`` (one per token, null to skip), and optionally ``"type"`` / ``"types"`` (the control task's
    word type; default: the token id).
    """
    examples, labels, types, kinds = [], [], [], set()
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise UserError(f"{path} line {number} is not JSON: {error.msg}") from None
            if not isinstance(record, dict):
                raise UserError(f"{path} line {number}: expected an object, got {type(record).__name__}")
            source = [key for key in ("text", "tokens") if key in record]
            target = [key for key in ("label", "labels") if key in record]
            if len(source) != 1 or len(target) != 1:
                raise UserError(
                    f"{path} line {number}: expected 'text' or 'tokens', and 'label' (last token) or 'labels' (per "
                    f"token); got the fields {sorted(record)}"
                )
            kinds.add(target[0])
            examples.append(record[source[0]])
            labels.append(record[target[0]])
            types.append(record.get("types" if target[0] == "labels" else "type"))
    if not examples:
        raise UserError(f'{path} holds no records: one JSON object per line, e.g. {{"text": ..., "label": ...}}')
    if len(kinds) > 1:
        raise UserError(f"{path} mixes 'label' and 'labels' records: give one label per example, or one per token")
    given = [kind is not None for kind in types]
    if any(given) and not all(given):
        raise UserError(f"{path}: {given.count(False)} of {len(types)} records have no type: give all or none")
    return examples, labels, types if all(given) else None, "all" if kinds == {"labels"} else "last"


def cmd_probe(args: argparse.Namespace) -> int:
    """Cache the hooks' activations at the labelled tokens, fit a logistic probe per layer (or per head output, with
    --hooks result) with its L2 penalty chosen on a validation split, fit the same probes on the control task (each
    word type's label drawn at random) and write accuracy and selectivity by layer as an offline page. See
    docs/probes.md."""
    from ..probes import fit_probes

    torch.set_num_threads(args.threads)
    examples, labels, types, position = read_records(args.data)
    model, _ = load_model(args.model)
    results = fit_probes(
        model,
        examples,
        labels,
        hooks=args.hooks,
        layers=args.layers,
        heads=args.heads,
        position=position,
        types=types,
        seed=args.seed,
        batch_size=args.batch_size,
        progress=not args.no_progress,
    )
    for line in results.table():
        print(line)
    path = probe_page(results, args.model, args.data).save(args.out).resolve()
    print(f"page written to {path}")
    return EXIT_OK


def probe_page(results, model_name: str, data: Path):
    """The results as an offline page (``analysis.report.page``): the figure, then the table."""
    from ..report.context import ReportSection
    from ..report.page import Report

    best = max(results.probes, key=lambda probe: (probe.selectivity or 0.0, probe.test_accuracy))
    counts = ", ".join(f"{len(part)} {name}" for name, part in results.split.items())
    paragraphs = [
        f"{model_name} on {data}: {results.n_rows} probed positions ({results.position} token) of "
        f"{results.n_examples} examples ({counts}), classes {list(results.classes)}, {results.n_types} word types.",
        "Each site's logistic probe has its L2 penalty chosen on the validation examples; accuracy is on the test "
        "examples. The control task gives each word type a random label (Hewitt and Liang 2019); selectivity is "
        "accuracy minus the control task's accuracy.",
        f"Most selective: {best.site.label}, accuracy {best.test_accuracy:.3f}, selectivity {best.selectivity:.3f}.",
    ]
    table = "<pre>" + html.escape("\n".join(results.table())) + "</pre>"
    section = ReportSection("probes", "probes by layer", paragraphs, [results.figure()], html=table)
    return Report(f"probes: {model_name}", [section], summary=paragraphs[:1])


def _layers(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a layer index, got {text!r}") from None


def add_probe_parser(commands) -> None:
    """Mount ``interp-transformer probe``."""
    summary = "fit logistic probes per layer on labelled text, with the control task's selectivity"
    probe = options.add_command(commands, "probe", cmd_probe, summary, model="e.g. smollm2-135m")
    probe.add_argument(
        "--data",
        required=True,
        type=Path,
        metavar="FILE.jsonl",
        help='one JSON object per line: "text" (or "tokens") and "label" (read at the last token) or "labels" '
        '(one per token, null to skip); optional "type" (the control task\'s word type; default: the token id)',
    )
    probe.add_argument(
        "--hooks",
        nargs="+",
        default=["resid_post"],
        metavar="NAME",
        help="short names read at every layer (resid_post, resid_pre, attn_out, mlp_out; result: each head's "
        "output z_h W_O[h]) or full hook names (default: resid_post)",
    )
    probe.add_argument("--layers", nargs="+", type=_layers, metavar="L", help="the layers (default: all)")
    probe.add_argument("--heads", nargs="+", type=_layers, metavar="H", help="with --hooks result (default: all)")
    probe.add_argument("--out", type=Path, default=Path(DEFAULT_PAGE), metavar="FILE", help=f"default: {DEFAULT_PAGE}")
    probe.add_argument("--seed", type=int, default=0, help="the split's and the control task's seed (default: 0)")
    probe.add_argument("--batch-size", type=positive_int, default=32, metavar="N", help="examples per forward")
    probe.add_argument(
        "--threads", type=positive_int, default=torch.get_num_threads(), metavar="N", help="torch's CPU threads"
    )
    options.add_progress_option(probe, "no progress bars (on stderr)")


__all__ = ["add_probe_parser", "cmd_probe", "probe_page", "read_records"]
