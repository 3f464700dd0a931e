"""Every analysis tool's identity over random builder specs: one table of specs tried, held, refused by reason, failed.

    python benchmarks/sweep_tool_identities.py --n 500 --seed 0

draws ``--n`` specs with ``tests/spec_generator.py`` (decoders with every builder part, experts
included, encoders, encoder-decoders; float64, weights perturbed), runs each tool's documented
identity on each (``tests/tool_identities.py``) and prints the table: per tool, how many specs it
was tried on, how many held, were refused (each refusal a named error, grouped by its message),
were not applicable, and failed, with the first failing spec's one-line repro. The exit code is 1
if anything failed. The table is also written into ``docs/tool_identities.md`` between its marker
comments, with the command that made it (``--no-docs``: print only).
"""

import argparse
import collections
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")  # the tools' own progress bars; the sweep's bar is switched on by hand

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.spec_generator import draw_specs  # noqa: E402
from tests.tool_identities import TOOLS, Outcome, check, make_case  # noqa: E402

DOC = ROOT / "docs" / "tool_identities.md"
START, END = "<!-- sweep table: start -->", "<!-- sweep table: end -->"


def sweep(n: int, seed: int, tools: list[str]) -> tuple[dict, collections.Counter, list]:
    """``results[tool]``: a list of (spec, Outcome) in spec order; the kinds of spec drawn."""
    specs = draw_specs(n, seed)
    results: dict[str, list] = {tool: [] for tool in tools}
    for drawn in tqdm(specs, desc="specs", unit="spec", disable=False, file=sys.stderr):
        try:
            case = make_case(drawn)
        except Exception as error:  # a spec the builder accepts must build: a failure of every tool
            outcome = Outcome("failed", f"building the model: {type(error).__name__}: {error}")
            for tool in tools:
                results[tool].append((drawn, outcome))
            continue
        for tool in tools:
            results[tool].append((drawn, check(tool, drawn, case)))
    return results, collections.Counter(drawn.kind for drawn in specs), specs


def coverage(specs) -> str:
    """What the drawn specs hold: kinds, and how many decoders have each of the parts that change a tool's path."""
    decoders = [s.fields for s in specs if s.kind == "decoder"]
    parts = {
        "norm-free": sum(f["norm"] == "none" for f in decoders),
        "post-norm": sum(f["placement"] == "post" for f in decoders),
        "experts": sum(f["experts"] is not None for f in decoders),
        "post-norm experts": sum(f["experts"] is not None and f["placement"] == "post" for f in decoders),
        "gated MLP": sum(f["gated_mlp"] for f in decoders),
        "attention-only": sum(f["d_mlp"] is None for f in decoders),
        "bidirectional": sum(not f["causal"] for f in decoders),
        "without a final norm": sum(not f["final_norm"] for f in decoders),
    }
    for field in ("n_key_value_heads", "parallel_residual", "qk_norm", "sliding_window", "attn_softcap",
                  "final_softcap", "post_norms", "rotary_dim", "rotary_base_local"):  # fmt: skip
        count = sum(f.get(field) not in (None, False) for f in decoders)
        if any(field in f for f in decoders):
            parts[field] = count
    kinds = collections.Counter(s.kind for s in specs)
    described = ", ".join(f"{count} {name}" for name, count in parts.items())
    return (
        f"{len(specs)} specs: {kinds['decoder']} decoders ({described}), {kinds['encoder']} encoders, "
        f"{kinds['encoder_decoder']} encoder-decoders"
    )


def table(results: dict, specs, command: str, seconds: float) -> str:
    """The markdown the sweep prints and writes into the docs."""
    lines = [
        f"`{command}` ({seconds / 60:.1f} min): {coverage(specs)}.",
        "",
        "| tool | tried | held | refused | not applicable | failed |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    refusals, failures = [], []
    for tool, outcomes in results.items():
        count = collections.Counter(outcome.status for _, outcome in outcomes)
        tried = count["held"] + count["refused"] + count["failed"]
        row = [tried, count["held"], count["refused"], count["n/a"], count["failed"]]
        lines.append(f"| `{tool}` | " + " | ".join(str(value) for value in row) + " |")
        reasons = collections.Counter(outcome.reason for _, outcome in outcomes if outcome.status == "refused")
        refusals += [f"| `{tool}` | {count} | {reason.replace('|', '/')} |" for reason, count in reasons.most_common()]
        failed = [(drawn, outcome) for drawn, outcome in outcomes if outcome.status == "failed"]
        if failed:
            drawn, outcome = failed[0]
            failures.append(
                f"- `{tool}`: {len(failed)} failed; the first, spec seed {drawn.seed}: {outcome.reason}\n"
                f"  `perturb_trainable({drawn.repro}, seed={drawn.seed + 1})`"
            )
    lines += ["", "Refusals, each a named error at the call, by reason (numbers blanked):", ""]
    lines += ["| tool | specs | reason |", "|---|---:|---|"] + refusals if refusals else ["none"]
    lines += ["", "Failures:", ""] + (failures or ["none"])
    return "\n".join(lines)


def write_docs(text: str) -> None:
    """Replace what lies between the markers of ``docs/tool_identities.md`` with ``text``."""
    page = DOC.read_text()
    if START not in page or END not in page:
        raise ValueError(f"{DOC} must hold the markers {START!r} and {END!r} around the sweep's table")
    head, rest = page.split(START, 1)
    DOC.write_text(head + START + "\n" + text + "\n" + END + rest.split(END, 1)[1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100, help="specs to draw (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="the seed of the draw (default 0)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: the models are tiny)")
    parser.add_argument("--tools", default=",".join(TOOLS), help=f"comma-separated, of {', '.join(TOOLS)}")
    parser.add_argument("--no-docs", action="store_true", help=f"print the table only, leave {DOC.name} alone")
    args = parser.parse_args(argv)
    tools = [tool for tool in args.tools.split(",") if tool]
    unknown = [tool for tool in tools if tool not in TOOLS]
    if unknown or args.n < 1 or args.threads < 1:
        parser.error(f"--tools must name tools of {list(TOOLS)}, --n and --threads be >= 1; got {args}")
    torch.set_num_threads(args.threads)
    command = f"python benchmarks/sweep_tool_identities.py --n {args.n} --seed {args.seed}"
    if args.tools != ",".join(TOOLS):
        command += f" --tools {args.tools}"
    start = time.perf_counter()
    results, _, specs = sweep(args.n, args.seed, tools)
    text = table(results, specs, command, time.perf_counter() - start)
    print(text)
    if not args.no_docs:
        write_docs(text)
    failed = any(outcome.status == "failed" for outcomes in results.values() for _, outcome in outcomes)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
