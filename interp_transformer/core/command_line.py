"""The package's own commands (``harvest``, ``train``): mounted on another command line, or run on their own.

``mount(subparsers, ...)`` adds one as a subcommand of another command line (``interp-transformer harvest``)
and sets ``run=`` on its parsed arguments; ``standalone_parser(prog, ...)`` builds its parser for
``python -m interp_transformer.<command>``, and ``run_standalone(...)`` runs it there: bad input is one line
on stderr and exit code 2.
"""

import argparse
import sys
from collections.abc import Callable, Sequence

EXIT_OK, EXIT_USAGE = 0, 2
Configure = Callable[[argparse.ArgumentParser], object]
Run = Callable[[argparse.Namespace], int]


def _texts(description: str, epilog: str) -> dict:
    return {"description": description, "epilog": epilog, "formatter_class": argparse.RawDescriptionHelpFormatter}


def mount(
    subparsers, name: str, summary: str, description: str, epilog: str, configure: Configure, run: Run
) -> argparse.ArgumentParser:
    """Add the command ``name`` to another command line's ``subparsers``; its parsed arguments carry ``run``."""
    parser = subparsers.add_parser(name, help=summary, **_texts(description, epilog))
    configure(parser)
    parser.set_defaults(run=run)
    return parser


def standalone_parser(prog: str, description: str, epilog: str, configure: Configure) -> argparse.ArgumentParser:
    """The command's own parser, for ``python -m``."""
    parser = argparse.ArgumentParser(prog=prog, **_texts(description, epilog))
    configure(parser)
    return parser


def one_line(error: BaseException) -> str:
    """The error's message on one line (a ``KeyError``'s without the quotes ``str`` adds)."""
    message = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
    return " ".join(message.split()) or type(error).__name__


def run_standalone(name: str, parser: argparse.ArgumentParser, run: Run, argv: Sequence[str] | None) -> int:
    """Parse ``argv`` and run; bad input is reported as ``<name>: error: ...`` in one line, with exit code 2."""
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (ValueError, KeyError, TypeError, OSError) as error:
        print(f"{name}: error: {one_line(error)}", file=sys.stderr)
        return EXIT_USAGE


__all__ = ["EXIT_OK", "EXIT_USAGE", "mount", "one_line", "run_standalone", "standalone_parser"]
