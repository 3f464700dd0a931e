"""The command line's training commands: ``train CONFIG`` (mounted from ``interp_transformer.training.cli``),
``train-induction``, ``train-translation`` and ``train-sae``, options and runners."""

import argparse
import dataclasses
import inspect
import math
import sys
from pathlib import Path

from . import options
from .common import EXIT_OK, UserError, load_model, positive_int


def add_training_parsers(commands) -> None:
    """Mount the training commands on the command line's subparsers: ``train CONFIG`` (the general trainer,
    ``interp_transformer.training``) and the three of the shipped models and SAEs."""
    from interp_transformer.training.cli import add_train_parser

    add_train_parser(commands)
    _add_retrain_parser(
        commands, "train-induction", cmd_train_induction, "induction-2l", "induction model", "sequences"
    )
    _add_retrain_parser(
        commands,
        "train-translation",
        cmd_train_translation,
        "translate-tiny",
        "translation model (translate-tiny)",
        "numbers",
    )
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


def _retrain(shipped: str, train, args: argparse.Namespace):
    """``(training, out_dir)``: the shipped model trained again by ``train`` with its recorded settings, overridden by
    the options given, and the folder to save it in."""
    settings = _training_settings(shipped, train, args)
    out_dir = Path(args.out_dir) if args.out_dir is not None else Path.cwd() / f"{shipped}-retrained"
    print(f"training {shipped} with {settings or 'the default settings'}", file=sys.stderr)
    return train(**settings, progress=True), out_dir


def cmd_train_induction(args: argparse.Namespace) -> int:
    """Train the 2-layer attention-only model on repeated random tokens (deterministic for a seed) and save it as
    induction-2l. Options left out take the shipped model's recorded settings."""
    from interp_transformer.pretrained import save_shipped
    from interp_transformer.pretrained.induction import train_induction_model

    training, out_dir = _retrain("induction-2l", train_induction_model, args)
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
    """Train the encoder-decoder that translates spelled-out numbers into digits (deterministic for a seed; a few
    minutes on a CPU) and save it as translate-tiny with its model card. Options left out take the shipped model's
    recorded settings."""
    from interp_transformer.pretrained import save_shipped
    from interp_transformer.pretrained.translation import train_translation_model

    from ..report.translation_card import translation_model_card

    training, out_dir = _retrain("translate-tiny", train_translation_model, args)
    card = translation_model_card(training)
    weights, meta = save_shipped(training.model, "translate-tiny", card, directory=out_dir)
    print(
        f"held-out exact match {card['held_out']['exact_match']:.3f}; best alignment score per decoder layer "
        f"{[head['score'] for head in card['alignment']['best_head_per_layer']]}"
    )
    print(f"saved {weights} and {meta}")
    return EXIT_OK


def cmd_train_sae(args: argparse.Namespace) -> int:
    """Train a standard or top-k sparse autoencoder on the activations at one hook, from text (run through the model)
    or from a harvest folder; hold out every --eval-every-th context and report L0, variance explained, dead features
    and the CE loss recovered with the SAE spliced in; save it in SAELens' format. A small trainer for a CPU budget,
    not a replacement for SAELens' training."""
    from interp_transformer.sae.data import token_batches
    from interp_transformer.sae.train import SAETrainingConfig, train_sae

    if (args.corpus is None) == (args.harvest is None):
        raise UserError("give the activations' source once: --corpus FILE ... (with --model) or --harvest DIR")
    if args.corpus is not None and args.model is None:
        raise UserError("--corpus needs --model SOURCE: the model runs over the text to give the activations")
    corpus = options.read_corpus(args)
    model = load_model(args.model)[0] if args.model is not None else None
    config = options.config_from(args, SAETrainingConfig, hook_name=args.hook)
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
    lines = [f"held out: {trained.metrics.summary()}", f"training: {trained.train_metrics.summary()}"]
    return options.report_saved(
        trained, args.out, lines, "SAELens' format; load it with interp_transformer.sae.SAE.load"
    )


def _add_retrain_parser(commands, command: str, run, shipped: str, what: str, unit: str) -> None:
    """Mount ``interp-transformer COMMAND``: ``run`` retrains the shipped model ``shipped`` (its docstring says how);
    ``what`` names it in the list of commands, ``unit`` the examples of a batch."""
    parser = options.add_command(commands, command, run, f"retrain the shipped {what}")
    parser.add_argument("--steps", type=positive_int, help="training steps")
    parser.add_argument("--seed", type=int, help="seed of the weights and the data")
    parser.add_argument("--lr", type=float, help="peak learning rate")
    parser.add_argument("--batch", type=positive_int, help=f"{unit} per step")
    parser.add_argument(
        "--out-dir",
        type=Path,
        metavar="DIR",
        help=f"where to save {shipped}.safetensors and .json (default: ./{shipped}-retrained; the shipped copy is "
        "never overwritten; load yours with --weights-dir DIR)",
    )


def add_train_sae_parser(commands) -> None:
    from interp_transformer.sae.train import TRAINABLE, SAETrainingConfig

    default = SAETrainingConfig(hook_name="")
    sae = options.add_command(
        commands, "train-sae", cmd_train_sae, "train a small SAE on a model's activations at one hook"
    )
    options.add_model_option(
        sae, "induction-2l, a Hugging Face model directory, or a hub name in the local cache", False
    )
    options.add_corpus_option(sae, ".txt files (one document each) or .jsonl files")
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
    options.add_setting(sae, default, "architecture", type=None, choices=TRAINABLE)
    options.add_setting(sae, default, "k", "top-k: features active per token")
    options.add_setting(sae, default, "l1_coefficient", "standard: sparsity penalty", float)
    sae.add_argument(
        "--d-sae", type=positive_int, metavar="N", help="number of features (default: --expansion-factor x d_in)"
    )
    options.add_setting(sae, default, "expansion_factor", metavar="N")
    options.add_setting(sae, default, "steps")
    options.add_setting(sae, default, "batch_size", "activation vectors per step")
    options.add_setting(sae, default, "lr", "Adam's learning rate", float)
    options.add_setting(sae, default, "seed", type=int)
    sae.add_argument(
        "--context-length",
        type=positive_int,
        metavar="N",
        help="tokens per context cut from --corpus, the BOS included (default: the model's n_ctx, at most 128)",
    )
    options.add_setting(sae, default, "eval_every", "hold out every N-th context for the metrics", metavar="N")
    sae.add_argument("--max-tokens", type=positive_int, metavar="N", help="stop reading after N training tokens")
    sae.add_argument("--bos-token-id", type=int, metavar="ID", help="the BOS id, for a model without a tokenizer")
    options.add_text_field_option(sae)
    options.add_progress_option(sae)


__all__ = ["add_training_parsers", "cmd_train_induction", "cmd_train_sae", "cmd_train_translation"]
