"""What the command line's modules share: the exit codes, the one-line user error, model loading, option types."""

import argparse
import re
import sys
from pathlib import Path

import torch

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE = 0, 1, 2


class UserError(ValueError):
    """Bad input from the command line: printed as one line, exit code 2."""


def error_message(error: BaseException) -> str:
    # str(KeyError("x")) is "'x'" with quotes; show the message itself
    message = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
    return " ".join(message.split()) or type(error).__name__  # one line, even for multi-line messages


def is_shipped(source: str) -> bool:
    from interp_transformer.pretrained import SHIPPED_MODELS

    return source in SHIPPED_MODELS


def load_model(source: str, dtype: torch.dtype = torch.float32, weights_dir: Path | None = None):
    """``(model, metadata)``: a shipped model by name (with its training record), else ``from_pretrained``.

    ``from_pretrained`` dispatches on the checkpoint's architecture: a ``DemoTransformer``
    for GPT-2, an ``EncoderTransformer`` for BERT.
    """
    from interp_transformer.loading import from_pretrained

    if is_shipped(source):
        from interp_transformer.pretrained import PRETRAINED_DIR, load_shipped, load_shipped_metadata

        directory = Path(weights_dir) if weights_dir is not None else PRETRAINED_DIR
        model = load_shipped(source, dtype=dtype, directory=directory)
        meta = load_shipped_metadata(source, directory)
        return model, {
            "source": f"{source} (shipped, {directory})",
            "training": meta.get("training"),
            "curve": meta.get("curve"),
        }
    print(f"loading {source} ...", file=sys.stderr)
    model = from_pretrained(source, dtype=dtype)
    return model, {"source": source, "model class": type(model).__name__}


def prompt_tokens(model, prompt: str) -> torch.Tensor:
    """The prompt as ``[1, pos]`` ids: tokenized text, or ids separated by spaces/commas for a model without
    tokenizer."""
    if not prompt or not prompt.strip():
        raise UserError("the prompt is empty: give some text (or token ids, for a model without a tokenizer)")
    if model.tokenizer is not None:
        tokens = model.to_tokens(prompt)
    else:
        parts = [part for part in re.split(r"[\s,]+", prompt.strip()) if part]
        if not all(re.fullmatch(r"\d+", part) for part in parts):
            raise UserError(
                f"{model.cfg.name} has no tokenizer: give the prompt as token ids in [0, {model.cfg.d_vocab}) "
                f'separated by spaces, e.g. "0 5 9 13 5 9 13"; got {prompt!r}'
            )
        ids = [int(part) for part in parts]
        too_large = [token for token in ids if token >= model.cfg.d_vocab]
        if too_large:
            raise UserError(
                f"token id {too_large[0]} is not below d_vocab={model.cfg.d_vocab} (ids lie in [0, "
                f"{model.cfg.d_vocab}))"
            )
        tokens = torch.tensor([ids])
    # checks the ids against d_vocab and the length against n_ctx (both model kinds)
    return model.prepare_tokens(tokens)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


__all__ = [
    "EXIT_MISMATCH",
    "EXIT_OK",
    "EXIT_USAGE",
    "UserError",
    "error_message",
    "is_shipped",
    "load_model",
    "positive_int",
    "prompt_tokens",
]
