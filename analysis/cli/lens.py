"""``interp-transformer lens train|eval``: train a tuned lens on a corpus, or judge one beside the logit lens.

``lens train --model SOURCE --corpus PATH ... --out DIR`` trains (``analysis.lens.train_tuned_lens``), writes
``DIR/params.pt``, ``DIR/config.json`` (``tuned-lens``'s layout), ``DIR/training.json`` and the held-out page
``DIR/lens.html``. ``lens eval --model SOURCE --lens DIR --corpus PATH ...`` reads a lens (ours or
``tuned-lens``'s), evaluates it on the corpus's held-out contexts (the same split ``train`` used, by default) and
writes the page. Bad input is one line on stderr and exit code 2.
"""

import argparse
import json
from pathlib import Path

from . import options
from .common import EXIT_OK, UserError, load_model, positive_int

PAGE = "lens.html"


def _reading(args: argparse.Namespace) -> dict:
    """How the corpus is read into contexts, in training as in evaluation."""
    return dict(bos_token_id=args.bos_token_id, text_field=args.text_field, progress=not args.no_progress)


def cmd_lens_train(args: argparse.Namespace) -> int:
    """Train each layer's translator to minimise KL(final || lens) on the corpus, hold out every N-th context, and
    write the lens, training.json and an offline page of the held-out evaluation."""
    from ..lens import LensTrainingConfig, lens_page, train_tuned_lens

    options.set_threads(args.threads)
    config = options.config_from(args, LensTrainingConfig, bias=not args.no_bias)
    corpus = options.read_corpus(args)  # checked before the model loads
    if args.out.exists() and not args.out.is_dir():
        raise UserError(f"--out {args.out} is a file: a tuned lens is a folder (params.pt, config.json)")
    model, _ = load_model(args.model)
    trained = train_tuned_lens(model, corpus, config, base_model_name_or_path=args.model, **_reading(args))
    folder = trained.save(args.out)
    record = json.loads((folder / "training.json").read_text(encoding="utf-8"))
    page = lens_page(trained.held_out, f"tuned lens of {args.model}", record).save(folder / PAGE)
    print(
        f"trained on {trained.n_train_tokens} tokens in {trained.seconds:.0f} s "
        f"({trained.tokens_per_second:.1f} tokens/s)"
    )
    print(trained.held_out.table())
    print(f"saved {folder.resolve()} (params.pt, config.json: tuned-lens's layout) and the page {page.resolve()}")
    return EXIT_OK


def cmd_lens_eval(args: argparse.Namespace) -> int:
    """Per-layer KL to the final distribution and top-1 agreement of the lens and of the logit lens, on the corpus's
    held-out contexts (the split lens train used), as an offline page."""
    from ..lens import TunedLens, evaluate_lens, lens_contexts, lens_page, split_contexts

    options.set_threads(args.threads)
    if not args.lens.is_dir():
        raise UserError(
            f"--lens {args.lens} is not a folder: give the folder lens train wrote (params.pt, config.json)"
        )
    corpus = options.read_corpus(args)
    lens = TunedLens.load(args.lens)  # the files are checked before the model loads
    model, _ = load_model(args.model)
    lens.check_model(model)
    contexts = lens_contexts(model, corpus, args.context_length, max_contexts=args.max_contexts, **_reading(args))
    if not args.all_contexts:
        contexts = split_contexts(contexts, args.held_out_every)[1]
    evaluation = evaluate_lens(model, lens, contexts, batch_size=args.batch_size, progress=not args.no_progress)
    training_file = args.lens / "training.json"
    record = json.loads(training_file.read_text(encoding="utf-8")) if training_file.is_file() else None
    out = args.out if args.out is not None else args.lens / PAGE
    page = lens_page(evaluation, f"tuned lens of {args.model}", record).save(out)
    print(evaluation.table())
    print(f"page written to {page.resolve()}")
    return EXIT_OK


def _add_corpus_options(parser, default_batch: int) -> None:
    options.add_model_option(parser, "any SOURCE report takes (a decoder)")
    options.add_corpus_option(
        parser, ".txt files (one document each) or .jsonl files (one per line), read as harvest reads them", True
    )
    options.add_text_field_option(parser)
    parser.add_argument(
        "--context-length",
        type=positive_int,
        metavar="N",
        help="tokens per context, the BOS included (default: the model's n_ctx, at most 128)",
    )
    parser.add_argument("--max-contexts", type=positive_int, metavar="N", help="read at most N contexts")
    parser.add_argument(
        "--held-out-every",
        type=positive_int,
        default=5,
        metavar="N",
        help="hold out every N-th context (default: %(default)s; eval uses the same split)",
    )
    parser.add_argument(
        "--batch-size", type=positive_int, default=default_batch, help="contexts per step (default: %(default)s)"
    )
    parser.add_argument("--bos-token-id", type=int, metavar="ID", help="the BOS id, for a model without a tokenizer")
    options.add_threads_option(parser, "torch threads (default: torch's choice)")
    options.add_progress_option(parser)


def add_lens_parser(commands) -> None:
    """Mount ``interp-transformer lens train|eval`` on the command line's subparsers."""
    from ..lens.train import MATMUL_DTYPES, LensTrainingConfig

    default = LensTrainingConfig()
    lens = commands.add_parser(
        "lens",
        help="train a tuned lens, or evaluate one beside the logit lens",
        description="The tuned lens (Belrose et al. 2023): an affine translator per layer, read out through the "
        "model's own final norm and read-out, trained to match the model's final distribution. Files in "
        "tuned-lens's layout (params.pt, config.json).",
    )
    actions = lens.add_subparsers(dest="lens_command", metavar="ACTION", required=True)
    train = options.add_command(
        actions, "train", cmd_lens_train, "train a lens on a corpus and judge it on held-out contexts"
    )
    _add_corpus_options(train, default.batch_size)
    train.add_argument("--out", required=True, type=Path, metavar="DIR", help="the lens folder to write")
    options.add_setting(train, default, "epochs")
    train.add_argument("--max-steps", type=positive_int, metavar="N", help="stop after N steps")
    options.add_setting(train, default, "lr", "Adam's peak learning rate", float)
    options.add_setting(train, default, "weight_decay", type=float)
    options.add_setting(train, default, "seed", type=int)
    train.add_argument("--no-bias", action="store_true", help="translators without a bias")
    train.add_argument(
        "--matmul-dtype",
        choices=sorted(MATMUL_DTYPES),
        default=default.matmul_dtype,
        help="dtype of the two products with W_U while training (bfloat16: faster on CPUs with AMX; evaluation "
        "always reads exact logits; default: %(default)s)",
    )

    evaluate = options.add_command(
        actions, "eval", cmd_lens_eval, "evaluate a lens beside the logit lens and write the page"
    )
    _add_corpus_options(evaluate, 8)
    evaluate.add_argument(
        "--lens", required=True, type=Path, metavar="DIR", help="a lens folder (params.pt, config.json)"
    )
    evaluate.add_argument("--out", type=Path, metavar="FILE", help=f"the page (default: DIR/{PAGE})")
    evaluate.add_argument("--all-contexts", action="store_true", help="evaluate on every context, not the held-out")


__all__ = ["add_lens_parser", "cmd_lens_eval", "cmd_lens_train"]
