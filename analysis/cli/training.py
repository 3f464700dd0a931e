"""The command line's training commands: ``train CONFIG`` (mounted from ``interp_transformer.training.cli``),
``train-induction``, ``train-translation`` and ``train-sae``, options and runners."""

import argparse
import dataclasses
import inspect
import math
import sys
from pathlib import Path

from .common import EXIT_OK, UserError, load_model, positive_int


def add_training_parsers(commands) -> None:
    """Mount the training commands on the command line's subparsers: ``train CONFIG`` (the general trainer,
    ``interp_transformer.training``) and the three of the shipped models and SAEs."""
    from interp_transformer.training.cli import add_train_parser

    add_train_parser(commands)
    add_train_induction_parser(commands)
    add_train_translation_parser(commands)
    add_train_sae_parser(commands)


def _training_settings(name: str, train, args: argparse.Namespace) -> dict:
    """The shipped model's recorded training settings (so a retrain reproduces it), overridden by the options given."""
    from interp_transformer.pretrained import load_shipped_metadata

    settings = {}
    try:
        recorded = load_shipped_metadata(name).get("training") or {}
        accepted = inspect.signature(train).parameters
        settings = {key: value for key, value in recorded.items() if key in accepted and key != "progress"}
    except FileNotFoundError:
        pass
    overrides = {"steps": args.steps, "seed": args.seed, "lr": args.lr, "batch": args.batch}
    settings.update({key: value for key, value in overrides.items() if value is not None})
    for key in ("steps", "batch"):
        if key in settings and settings[key] < 1:
            raise UserError(f"--{key} must be a positive int, got {settings[key]}")
    if "lr" in settings and not (math.isfinite(settings["lr"]) and settings["lr"] > 0):
        raise UserError(f"--lr must be a finite positive number, got {settings['lr']}")
    return settings


def cmd_train_induction(args: argparse.Namespace) -> int:
    from interp_transformer.pretrained import save_shipped
    from interp_transformer.pretrained.induction import train_induction_model

    settings = _training_settings("induction-2l", train_induction_model, args)
    out_dir = Path(args.out_dir) if args.out_dir is not None else Path.cwd() / "induction-2l-retrained"
    print(f"training induction-2l with {settings or 'the default settings'}", file=sys.stderr)
    training = train_induction_model(**settings, progress=True)
    metadata = {"training": training.settings, "curve": dataclasses.asdict(training.curve)}
    weights, meta = save_shipped(training.model, "induction-2l", metadata, directory=out_dir)
    curve = training.curve
    print(
        f"final loss: first half {curve.first_half_loss[-1]:.3f}, repeated half {curve.repeated_half_loss[-1]:.3f} "
        "(nats)"
    )
    print(f"saved {weights} and {meta}")
    return EXIT_OK


def cmd_train_translation(args: argparse.Namespace) -> int:
    from interp_transformer.pretrained import save_shipped
    from interp_transformer.pretrained.translation import train_translation_model

    from ..report.translation_card import translation_model_card

    settings = _training_settings("translate-tiny", train_translation_model, args)
    out_dir = Path(args.out_dir) if args.out_dir is not None else Path.cwd() / "translate-tiny-retrained"
    print(f"training translate-tiny with {settings or 'the default settings'}", file=sys.stderr)
    training = train_translation_model(**settings, progress=True)
    card = translation_model_card(training)
    weights, meta = save_shipped(training.model, "translate-tiny", card, directory=out_dir)
    print(
        f"held-out exact match {card['held_out']['exact_match']:.3f}; best alignment score per decoder layer "
        f"{[head['score'] for head in card['alignment']['best_head_per_layer']]}"
    )
    print(f"saved {weights} and {meta}")
    return EXIT_OK


def cmd_train_sae(args: argparse.Namespace) -> int:
    from interp_transformer.harvest.corpus import as_corpus
    from interp_transformer.sae.data import token_batches
    from interp_transformer.sae.train import SAETrainingConfig, train_sae

    if (args.corpus is None) == (args.harvest is None):
        raise UserError("give the activations' source once: --corpus FILE ... (with --model) or --harvest DIR")
    if args.corpus is not None and args.model is None:
        raise UserError("--corpus needs --model SOURCE: the model runs over the text to give the activations")
    # the files through the harvest's reader, as train-transcoders reads them; checked before the model loads
    corpus = as_corpus(list(args.corpus), args.text_field, allow_empty_files=False) if args.corpus else None
    model = load_model(args.model)[0] if args.model is not None else None
    config = SAETrainingConfig(
        hook_name=args.hook,
        architecture=args.architecture,
        d_sae=args.d_sae,
        expansion_factor=args.expansion_factor,
        k=args.k,
        l1_coefficient=args.l1_coefficient,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        context_length=args.context_length,
        eval_every=args.eval_every,
        max_tokens=args.max_tokens,
    )
    data = args.harvest
    if corpus is not None:
        data = token_batches(
            model,
            corpus,
            batch_size=config.model_batch_size,
            context_length=args.context_length,
            bos_token_id=args.bos_token_id,
            text_field=args.text_field,
            progress=not args.no_progress,
        )
    if args.harvest is not None and not (args.harvest / "manifest.json").is_file():
        raise UserError(
            f"--harvest {args.harvest} is not a harvest folder (no manifest.json): run interp-transformer harvest first"
        )
    print(f"training a {config.architecture} SAE at {config.hook_name}", file=sys.stderr)
    trained = train_sae(model, data, config, progress=not args.no_progress)
    folder = trained.save(args.out)
    print(f"held out: {trained.metrics.summary()}")
    print(f"training: {trained.train_metrics.summary()}")
    print(f"saved {folder.resolve()} (SAELens' format; load it with interp_transformer.sae.SAE.load)")
    return EXIT_OK


def add_train_induction_parser(commands) -> None:
    """Mount ``interp-transformer train-induction``."""
    train = commands.add_parser(
        "train-induction",
        help="retrain the shipped induction model",
        description="Train the 2-layer attention-only model on repeated random tokens (deterministic for a seed) and "
        "save it as induction-2l. Options left out take the shipped model's recorded settings.",
    )
    train.add_argument("--steps", type=positive_int, help="training steps")
    train.add_argument("--seed", type=int, help="seed of the weights and the data")
    train.add_argument("--lr", type=float, help="peak learning rate")
    train.add_argument("--batch", type=positive_int, help="sequences per step")
    train.add_argument(
        "--out-dir",
        type=Path,
        metavar="DIR",
        help="where to save induction-2l.safetensors and .json (default: ./induction-2l-retrained; "
        "the model shipped inside the package is never overwritten; load a retrained one with "
        "--weights-dir DIR)",
    )
    train.set_defaults(run=cmd_train_induction)


def add_train_translation_parser(commands) -> None:
    """Mount ``interp-transformer train-translation`` on the command line's subparsers."""
    translation = commands.add_parser(
        "train-translation",
        help="retrain the shipped translation model (translate-tiny)",
        description="Train the encoder-decoder that translates spelled-out numbers into digits (deterministic for a "
        "seed; a few minutes on a CPU) and save it as translate-tiny with its model card. Options left out take "
        "the shipped model's recorded settings.",
    )
    translation.add_argument("--steps", type=positive_int, help="training steps")
    translation.add_argument("--seed", type=int, help="seed of the weights and the data")
    translation.add_argument("--lr", type=float, help="peak learning rate")
    translation.add_argument("--batch", type=positive_int, help="numbers per step")
    translation.add_argument(
        "--out-dir",
        type=Path,
        metavar="DIR",
        help="where to save translate-tiny.safetensors and .json (default: "
        "./translate-tiny-retrained; "
        "the shipped copy is never overwritten; load yours with --weights-dir DIR)",
    )
    translation.set_defaults(run=cmd_train_translation)


def add_train_sae_parser(commands) -> None:
    from interp_transformer.sae.train import TRAINABLE, SAETrainingConfig

    default = SAETrainingConfig(hook_name="")
    sae = commands.add_parser(
        "train-sae",
        help="train a small SAE on a model's activations at one hook",
        description="Train a standard or top-k sparse autoencoder on the activations at one hook, from text (run "
        "through the model) or from a harvest folder; hold out every --eval-every-th context and report L0, variance "
        "explained, dead features and the CE loss recovered with the SAE spliced in; save it in SAELens' "
        "format. A small trainer for a CPU budget, not a replacement for SAELens' training.",
    )
    sae.add_argument(
        "--model",
        metavar="SOURCE",
        help="induction-2l, a Hugging Face model directory, or a hub name in the local cache",
    )
    sae.add_argument(
        "--corpus", nargs="+", type=Path, metavar="PATH", help=".txt files (one document each) or .jsonl files"
    )
    sae.add_argument(
        "--harvest",
        type=Path,
        metavar="DIR",
        help="a folder written by interp-transformer harvest (instead of --corpus)",
    )
    sae.add_argument(
        "--hook", required=True, metavar="NAME", help="the hook to read and reconstruct, e.g. blocks.6.hook_resid_pre"
    )
    sae.add_argument("--out", required=True, type=Path, metavar="DIR", help="where to save the SAE")
    sae.add_argument("--architecture", choices=TRAINABLE, default=default.architecture, help="default: %(default)s")
    sae.add_argument(
        "--k", type=positive_int, default=default.k, help="top-k: features active per token (default: %(default)s)"
    )
    sae.add_argument(
        "--l1-coefficient",
        type=float,
        default=default.l1_coefficient,
        help="standard: sparsity penalty (default: %(default)s)",
    )
    sae.add_argument(
        "--d-sae", type=positive_int, metavar="N", help="number of features (default: --expansion-factor x d_in)"
    )
    sae.add_argument(
        "--expansion-factor",
        type=positive_int,
        default=default.expansion_factor,
        metavar="N",
        help="default: %(default)s",
    )
    sae.add_argument("--steps", type=positive_int, default=default.steps, help="default: %(default)s")
    sae.add_argument(
        "--batch-size",
        type=positive_int,
        default=default.batch_size,
        help="activation vectors per step (default: %(default)s)",
    )
    sae.add_argument("--lr", type=float, default=default.lr, help="Adam's learning rate (default: %(default)s)")
    sae.add_argument("--seed", type=int, default=default.seed, help="default: %(default)s")
    sae.add_argument(
        "--context-length",
        type=positive_int,
        metavar="N",
        help="tokens per context cut from --corpus, the BOS included (default: the model's n_ctx, at most 128)",
    )
    sae.add_argument(
        "--eval-every",
        type=positive_int,
        default=default.eval_every,
        metavar="N",
        help="hold out every N-th context for the metrics (default: %(default)s)",
    )
    sae.add_argument("--max-tokens", type=positive_int, metavar="N", help="stop reading after N training tokens")
    sae.add_argument("--bos-token-id", type=int, metavar="ID", help="the BOS id, for a model without a tokenizer")
    sae.add_argument("--text-field", default="text", help="the JSONL field holding each document (default: text)")
    sae.add_argument("--no-progress", action="store_true", help="no progress bars")
    sae.set_defaults(run=cmd_train_sae)


__all__ = ["add_training_parsers", "cmd_train_induction", "cmd_train_sae", "cmd_train_translation"]
