"""The ``harvest`` command line: ``python -m interp_transformer.harvest ...``, the same under ``torchrun``.

``add_harvest_parser(subparsers)`` mounts it as a subcommand of another
command line (``interp-transformer harvest``), and ``run_harvest(args)`` runs it
from the parsed arguments; ``main(argv)`` is the stand-alone entry point.
"""

import argparse
import re
from collections.abc import Sequence
from pathlib import Path

import torch

from interp_transformer.core.command_line import EXIT_OK, mount, run_standalone, standalone_parser

STORAGE_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}
PROCESSING_STEPS = ("fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases")
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}

DESCRIPTION = """\
Run a model over a corpus and store the activations of chosen hooks as sharded safetensors files,
with a manifest that records what determines them. Rerun the same command to resume a stopped
harvest. Under torchrun every process takes its share of the shards:

  torchrun --nproc_per_node 2 -m interp_transformer.harvest --model induction-2l ...
"""

EPILOG = """\
examples:
  python -m interp_transformer.harvest --model ./gpt2-dir --corpus docs/*.txt --context-length 128 \\
      --batch-size 16 --hooks 'blocks.*.hook_resid_post' --out acts/
  python -m interp_transformer.harvest --model induction-2l --corpus ids.jsonl --bos-token-id 0 \\
      --context-length 32 --memory-budget 1GiB --hooks blocks.1.attn.hook_z --out acts-z/
  python -m interp_transformer.harvest --model ./gpt2-dir --corpus data/*.jsonl --hf-loader json \\
      --context-length 128 --batch-size 16 --hooks '*hook_mlp_out' --dtype bfloat16 --out acts-mlp/

Corpus: .txt files (one document each), .jsonl files (one document per line, in --text-field: text,
or a list of token ids), a folder written by datasets' save_to_disk, or (with --hf-loader json|text)
files read by datasets.load_dataset. Hooks: names from model.hook_dict or glob patterns; a
substring is '*substring*'. Each context holds --context-length tokens, the BOS first.
"""


def parse_bytes(text: str) -> int:
    """``"512MiB"`` -> 536870912; plain integers are bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"expected a size such as 2000000, 512MiB or 2GB, got {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def _int_at_least(minimum: int, what: str):
    """An argparse type: an int >= ``minimum``, else a usage error naming ``what`` was expected."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


_positive_int = _int_at_least(1, "a positive integer")
_token_id = _int_at_least(0, "a token id (an integer >= 0)")


def configure_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the harvest options to ``parser``: the model, the corpus and contexts, then what to keep and how."""
    _model_options(parser.add_argument_group("model"))
    _corpus_options(parser.add_argument_group("corpus and contexts"))
    _run_options(parser.add_argument_group("what to keep and how"))
    return parser


def _dtype_option(group, flag: str, what: str) -> None:
    group.add_argument(flag, choices=sorted(STORAGE_DTYPES), default="float32", help=f"{what} (default: float32)")


def _model_options(model) -> None:
    model.add_argument(
        "--model",
        required=True,
        metavar="SOURCE",
        help="induction-2l (shipped), a Hugging Face model directory, or a hub name in the local cache",
    )
    _dtype_option(model, "--model-dtype", "dtype of the weights")
    model.add_argument(
        "--process",
        action="append",
        choices=PROCESSING_STEPS,
        default=[],
        metavar="STEP",
        help=f"apply a weight-processing step before harvesting (repeatable, in order): {', '.join(PROCESSING_STEPS)}",
    )


def _corpus_options(data) -> None:
    data.add_argument("--corpus", required=True, nargs="+", type=Path, metavar="PATH", help="the documents (see below)")
    data.add_argument(
        "--hf-loader", choices=("json", "text"), help="read --corpus with datasets.load_dataset(LOADER, data_files=...)"
    )
    data.add_argument(
        "--text-field", default="text", help="the JSONL field or dataset column holding each document (default: text)"
    )
    data.add_argument(
        "--context-length", required=True, type=_positive_int, metavar="N", help="tokens per context, the BOS included"
    )
    data.add_argument("--no-bos", action="store_true", help="do not put a BOS token at the start of each context")
    data.add_argument(
        "--bos-token-id", type=_token_id, metavar="ID", help="the BOS id (needed when the model has no tokenizer)"
    )
    data.add_argument(
        "--separator-token-id",
        type=_token_id,
        metavar="ID",
        help="the id placed between documents (default: the tokenizer's EOS, else the BOS)",
    )


def _run_options(run) -> None:
    run.add_argument("--hooks", required=True, nargs="+", metavar="NAME", help="hook names or glob patterns")
    _dtype_option(run, "--dtype", "storage dtype of the activations")
    run.add_argument(
        "--batch-size",
        type=_positive_int,
        metavar="N",
        help="contexts per forward pass (default: the largest --memory-budget allows)",
    )
    run.add_argument(
        "--memory-budget",
        type=parse_bytes,
        metavar="BYTES",
        help="bound on the activations held at once (one batch's cache plus one shard), e.g. 2GiB",
    )
    run.add_argument(
        "--shard-contexts",
        type=_positive_int,
        metavar="N",
        help="contexts per shard file (default: about 128 MiB per shard)",
    )
    run.add_argument(
        "--out", required=True, type=Path, metavar="DIR", help="the harvest folder (created; rerun to resume)"
    )
    run.add_argument(
        "--export-saelens",
        type=Path,
        metavar="DIR",
        help="afterwards, also write SAELens' cached-activations layout to DIR",
    )
    run.add_argument("--no-progress", action="store_true", help="no progress bars")


def add_harvest_parser(subparsers) -> argparse.ArgumentParser:
    """Mount ``harvest`` on another command line's subparsers; sets ``run=run_harvest``."""
    summary = "store activations over a corpus, sharded and resumable (torchrun-ready)"
    return mount(subparsers, "harvest", summary, DESCRIPTION, EPILOG, configure_parser, run_harvest)


def build_parser() -> argparse.ArgumentParser:
    return standalone_parser("python -m interp_transformer.harvest", DESCRIPTION, EPILOG, configure_parser)


def _corpus(args: argparse.Namespace):
    from interp_transformer.harvest.corpus import Corpus, as_corpus

    if args.hf_loader is not None:
        return Corpus.from_hf_files(args.hf_loader, args.corpus, args.text_field)
    return as_corpus(list(args.corpus), args.text_field)


def run_harvest(args: argparse.Namespace) -> int:
    """Run a harvest from parsed arguments; returns the exit code (errors propagate)."""
    from interp_transformer.harvest.run import harvest
    from interp_transformer.harvest.source import load_model
    from interp_transformer.models import processing

    if args.batch_size is None and args.memory_budget is None:
        raise ValueError("give --batch-size, or --memory-budget to choose it")
    source = args.model
    if args.process:
        model, _ = load_model(args.model, dtype=STORAGE_DTYPES[args.model_dtype], device=torch.device("cpu"))
        for step in args.process:
            getattr(processing, step)(model)
        source = model
    manifest = harvest(
        source,
        _corpus(args),
        args.out,
        hooks=args.hooks,
        context_length=args.context_length,
        batch_size=args.batch_size,
        dtype=STORAGE_DTYPES[args.dtype],
        prepend_bos=not args.no_bos,
        memory_budget_bytes=args.memory_budget,
        progress=not args.no_progress,
        shard_contexts=args.shard_contexts,
        text_field=args.text_field,
        bos_token_id=args.bos_token_id,
        separator_token_id=args.separator_token_id,
        model_dtype=STORAGE_DTYPES[args.model_dtype],
    )
    if _is_rank0():
        print(
            f"harvested {manifest.n_contexts} contexts x {manifest.context_length} tokens, {len(manifest.hooks)} "
            f"hooks, {len(manifest.shards)} shards -> {manifest.out_dir}"
        )
        if args.export_saelens is not None:
            from interp_transformer.harvest.saelens import export_saelens

            print(
                "SAELens layout -> "
                f"{export_saelens(manifest.out_dir, args.export_saelens, progress=not args.no_progress)}"
            )
    return EXIT_OK


def _is_rank0() -> bool:
    import os

    return os.environ.get("RANK", "0") == "0"


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry point: bad input is reported in one line with exit code 2."""
    return run_standalone("harvest", build_parser(), run_harvest, argv)
