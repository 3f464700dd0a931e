"""The ``train-translation`` command's options (its runner, ``cmd_train_translation``, lives with the others in ``analysis.cli``)."""

from pathlib import Path
from typing import Callable


def add_train_translation_parser(commands, run: Callable, positive_int: Callable) -> None:
    """Mount ``interp-transformer train-translation`` on the command line's subparsers."""
    translation = commands.add_parser(
        "train-translation", help="retrain the shipped translation model (translate-tiny)",
        description="Train the encoder-decoder that translates spelled-out numbers into digits (deterministic for a seed; "
                    "a few minutes on a CPU) and save it as translate-tiny with its model card. Options left out take "
                    "the shipped model's recorded settings.")
    translation.add_argument("--steps", type=positive_int, help="training steps")
    translation.add_argument("--seed", type=int, help="seed of the weights and the data")
    translation.add_argument("--lr", type=float, help="peak learning rate")
    translation.add_argument("--batch", type=positive_int, help="numbers per step")
    translation.add_argument("--out-dir", type=Path, metavar="DIR",
                             help="where to save translate-tiny.safetensors and .json (default: ./translate-tiny-retrained; "
                                  "the shipped copy is never overwritten; load yours with --weights-dir DIR)")
    translation.set_defaults(run=run)


__all__ = ["add_train_translation_parser"]
