"""What the command line's commands share in building their parsers and reading their options: mounting a command,
the options several commands take (the model, a corpus, threads, progress bars), the settings a trainer's config
takes from them, and the report of a trained and saved artefact."""

import argparse
import dataclasses
from pathlib import Path

import torch

from .common import EXIT_OK, positive_int

MODEL_HELP = "a shipped model, model directory or hub name"


def add_command(
    commands,
    name: str,
    run,
    summary: str,
    description: str | None = None,
    *,
    verbatim: bool = False,
    model: str | bool = False,
    **parser_options,
):
    """Mount ``name`` on the command line's subparsers, to call ``run`` with the parsed options: ``summary`` in the
    list of commands, ``description`` (default: ``run``'s docstring, re-wrapped) atop its help, kept line for line
    with ``verbatim`` (a usage block); with ``model`` (its help; True: ``MODEL_HELP``), the command's first option
    is ``--model SOURCE``; ``parser_options`` (an epilog) go to its parser."""
    parser = commands.add_parser(
        name,
        help=summary,
        description=run.__doc__ if description is None else description,
        formatter_class=argparse.RawDescriptionHelpFormatter if verbatim else argparse.HelpFormatter,
        **parser_options,
    )
    parser.set_defaults(run=run)
    if model:
        add_model_option(parser, MODEL_HELP if model is True else model)
    return parser


def add_model_option(parser, help: str = MODEL_HELP, required: bool = True) -> None:
    parser.add_argument("--model", required=required, metavar="SOURCE", help=help)


def add_corpus_option(parser, help: str, required: bool = False) -> None:
    """``--corpus PATH ...``: text files read as ``interp_transformer.harvest.corpus.as_corpus`` reads them."""
    parser.add_argument("--corpus", required=required, nargs="+", type=Path, metavar="PATH", help=help)


def read_corpus(args: argparse.Namespace):
    """``--corpus``'s files through the harvest's reader (what ``harvest``, ``train-sae``, ``train-transcoders`` and
    ``lens`` read), checked before the model loads: a missing or empty file is one line at once. None without it."""
    from interp_transformer.harvest.corpus import as_corpus

    return as_corpus(list(args.corpus), args.text_field, allow_empty_files=False) if args.corpus else None


def add_text_field_option(parser) -> None:
    parser.add_argument("--text-field", default="text", help="the JSONL field holding each document (default: text)")


def add_threads_option(parser, help: str) -> None:
    """``--threads N`` (default: torch's choice), applied by ``set_threads``."""
    parser.add_argument("--threads", type=positive_int, metavar="N", help=help)


def set_threads(threads: int | None) -> None:
    if threads is not None:
        torch.set_num_threads(threads)


def add_progress_option(parser, help: str = "no progress bars") -> None:
    parser.add_argument("--no-progress", action="store_true", help=help)


def add_setting(parser, config, name: str, help: str = "", type=positive_int, **options) -> None:
    """``--NAME`` (``name`` with dashes) for the setting ``name`` of a trainer's config, its default ``config``'s,
    shown in the help after ``help``."""
    text = f"{help} (default: %(default)s)" if help else "default: %(default)s"
    parser.add_argument("--" + name.replace("_", "-"), type=type, default=getattr(config, name), help=text, **options)


def config_from(args: argparse.Namespace, config_class, **settings):
    """A trainer's config (a dataclass) from the options named as its fields that were given (not None), and
    ``settings``."""
    fields = {field.name for field in dataclasses.fields(config_class)}
    given = {key: value for key, value in vars(args).items() if key in fields and value is not None}
    return config_class(**given, **settings)


def report_saved(trained, out: Path, lines: list[str], how_to_load: str) -> int:
    """Save ``trained`` in the folder ``out``, print its ``lines`` (the held-out metrics), then where it was saved and
    ``how_to_load`` it."""
    folder = Path(trained.save(out))
    for line in lines:
        print(line)
    print(f"saved {folder.resolve()} ({how_to_load})")
    return EXIT_OK


__all__ = [
    "MODEL_HELP",
    "add_command",
    "add_corpus_option",
    "add_model_option",
    "add_progress_option",
    "add_setting",
    "add_text_field_option",
    "add_threads_option",
    "config_from",
    "read_corpus",
    "report_saved",
    "set_threads",
]
