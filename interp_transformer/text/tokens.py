"""Text <-> token ids: the functions behind the model's ``to_tokens`` family.

Every function takes a Hugging Face tokenizer (any ``PreTrainedTokenizerBase``)
and reads its special tokens from the tokenizer's attributes, so the same code
serves GPT-2 and BERT-family tokenizers. Token tensors are ``int64`` with axes
``batch pos``.

GPT-2's tokenizer is available offline: ``offline_gpt2_tokenizer()`` (in
``interp_transformer.text.gpt2_tokenizer``, importable from here too) builds it from the
files of OpenAI's release with pinned hashes.

The BOS convention
------------------
GPT-2 was trained without a beginning-of-sequence token: documents were simply
joined with ``<|endoftext|>`` (id 50256). Interpretability convention, set by
TransformerLens, still prepends ``<|endoftext|>`` by default: the model treats
the first position as a resting place for attention, so without a BOS the first
real token takes that role and its activations look unlike every other token's.
``prepend_bos=True`` is therefore the default everywhere here, and the BOS id is
the tokenizer's ``bos_token_id`` (for GPT-2, ``<|endoftext|>``). Tokenizers with
no BOS but a ``[CLS]`` token (BERT family) prepend ``[CLS]`` instead. Positions
returned by ``get_token_position`` count the BOS when one is prepended.

Example
-------
>>> tokenizer = offline_gpt2_tokenizer()
>>> to_tokens(tokenizer, "Hello world")
tensor([[50256, 15496,   995]])
>>> to_str_tokens(tokenizer, "Hello world")
['<|endoftext|>', 'Hello', ' world']
>>> get_token_position(tokenizer, " world", "Hello world")
2
"""

import numbers
from collections.abc import Sequence
from typing import Literal, NamedTuple, TypeGuard

import torch
from jaxtyping import Int
from torch import Tensor
from transformers import PreTrainedTokenizerBase

# GPT-2's offline tokenizer lives in its own module; its names stay importable from here
from interp_transformer.text.gpt2_tokenizer import (  # noqa: F401
    END_OF_TEXT,
    GPT2_ENCODER_JSON_SHA256,
    GPT2_N_CTX,
    GPT2_VOCAB_BPE_SHA256,
    check_sha256,
    gpt2_tokenizer_from_files,
    offline_gpt2_tokenizer,
    offline_gpt2_tokenizer_paths,
    sha256_of_file,
)

TokensLike = Int[Tensor, "pos"] | Int[Tensor, "batch pos"] | Sequence[int] | Sequence[Sequence[int]]
# Error messages list at most this many str tokens of a sequence.
_MAX_TOKENS_IN_MESSAGE = 64


class TokensAndMask(NamedTuple):
    """Padded token ids and the mask saying which positions hold real tokens (1) or padding (0)."""

    tokens: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"]


# ---------------------------------------------------------------- input checks


def _check_tokenizer(tokenizer: PreTrainedTokenizerBase) -> None:
    if not isinstance(tokenizer, PreTrainedTokenizerBase):
        raise TypeError(
            f"tokenizer must be a Hugging Face PreTrainedTokenizerBase, received {type(tokenizer).__name__}"
        )


def _first_token_id(tokenizer: PreTrainedTokenizerBase, names: tuple[str, str], missing: str) -> int:
    """The first of the tokenizer's ``names`` ids that is set; else ``ValueError``: neither ``<missing>``."""
    for name in names:
        token_id = getattr(tokenizer, name, None)
        if token_id is not None:
            return token_id
    raise ValueError(f"{type(tokenizer).__name__} has neither {missing}")


def bos_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The id prepended when ``prepend_bos=True``: ``bos_token_id``, else ``cls_token_id``."""
    missing = "a BOS nor a CLS token, so there is no BOS to prepend: pass prepend_bos=False"
    return _first_token_id(tokenizer, ("bos_token_id", "cls_token_id"), missing)


def pad_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The id used for padding: ``pad_token_id``, else ``eos_token_id``."""
    missing = (
        "a pad nor an EOS token, so texts of different lengths cannot be padded: set tokenizer.pad_token, or "
        "tokenize one text at a time"
    )
    return _first_token_id(tokenizer, ("pad_token_id", "eos_token_id"), missing)


def _as_text_list(text: str | Sequence[str]) -> list[str]:
    if isinstance(text, str):
        text = [text]
    if not isinstance(text, (list, tuple)):
        raise TypeError(f"text must be a str or a list of str, received {type(text).__name__}")
    if not text:
        raise ValueError("text is an empty list: expected at least one string")
    for index, item in enumerate(text):
        if not isinstance(item, str):
            raise TypeError(f"text[{index}] must be a str, received {type(item).__name__}: {item!r}")
        try:
            item.encode("utf-8")
        except UnicodeEncodeError as error:
            raise ValueError(
                f"text[{index}] holds {item[error.start]!r} at character {error.start}, which is no "
                "character (a lone surrogate): text must be valid Unicode"
            ) from None
    return list(text)


def _is_int(value: object) -> TypeGuard[numbers.Integral]:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _as_id_rows(
    tokenizer: PreTrainedTokenizerBase, tokens: TokensLike | list[str], name: str
) -> tuple[list[list[int]], int]:
    """Token ids as a list of rows, plus the input's number of dims (1 or 2); ids range-checked."""
    if _is_int(tokens):
        tokens = torch.tensor([int(tokens)])
    if isinstance(tokens, Tensor):
        if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
            raise TypeError(f"{name} must hold integer token ids, received a tensor of dtype {tokens.dtype}")
        if tokens.ndim == 0:  # one token id
            tokens = tokens.reshape(1)
        if tokens.ndim not in (1, 2):
            raise ValueError(f"{name} must have shape [pos] or [batch, pos], received shape {list(tokens.shape)}")
        rows, ndim = (tokens.tolist() if tokens.ndim == 2 else [tokens.tolist()]), tokens.ndim
    elif isinstance(tokens, (list, tuple)):
        if all(_is_int(item) for item in tokens):
            rows, ndim = [[int(item) for item in tokens]], 1
        elif all(isinstance(row, (list, tuple)) and all(_is_int(item) for item in row) for row in tokens):
            rows, ndim = [[int(item) for item in row] for row in tokens], 2
        else:
            raise TypeError(f"{name} must be a list of int token ids (or a list of such lists)")
    else:
        raise TypeError(
            f"{name} must be a tensor of token ids, a list of ints or a str, received {type(tokens).__name__}"
        )
    vocab_size = len(tokenizer)
    for row_index, row in enumerate(rows):
        for pos, token in enumerate(row):
            if not 0 <= token < vocab_size:
                where = f"[{row_index}, {pos}]" if ndim == 2 else f"[{pos}]"
                raise ValueError(f"{name}{where} = {token} is not a token id: expected 0 <= id < {vocab_size}")
    return rows, ndim


def _decode_each(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> list[str]:
    # Decoding ids one at a time shows each token as text (" world", not "Ġworld");
    # a token holding part of a multi-byte character decodes to "\ufffd".
    return tokenizer.batch_decode([[token] for token in ids], clean_up_tokenization_spaces=False)


def _single_token_id(tokenizer: PreTrainedTokenizerBase, single_token: str | int) -> int:
    if _is_int(single_token):
        rows, _ = _as_id_rows(tokenizer, [int(single_token)], "single_token")
        return rows[0][0]
    if not isinstance(single_token, str):
        raise TypeError(f"single_token must be a str or an int id, received {type(single_token).__name__}")
    ids = tokenizer(single_token, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise ValueError(
            f"single_token={single_token!r} is {len(ids)} tokens, {_decode_each(tokenizer, ids)}, expected exactly one"
        )
    return ids[0]


def single_token_id(tokenizer: PreTrainedTokenizerBase, single_token: str | int) -> int:
    """The id of a string that is exactly one token (or an id, range-checked); ``ValueError`` naming the pieces
    otherwise."""
    _check_tokenizer(tokenizer)
    return _single_token_id(tokenizer, single_token)


def _describe_str_tokens(str_tokens: list[str]) -> str:
    if len(str_tokens) <= _MAX_TOKENS_IN_MESSAGE:
        return repr(str_tokens)
    return f"{str_tokens[:_MAX_TOKENS_IN_MESSAGE]!r} ... ({len(str_tokens)} tokens)"


# ---------------------------------------------------------------- text -> tokens


def to_tokens_and_mask(
    tokenizer: PreTrainedTokenizerBase,
    text: str | list[str],
    prepend_bos: bool = True,
    padding_side: Literal["right", "left"] = "right",
    max_length: int | None = None,
) -> TokensAndMask:
    """Tokenize ``text`` into padded ``tokens [batch pos]`` and ``attention_mask [batch pos]``.

    A str gives batch 1; a list of str gives one row per text, padded to the longest
    with the tokenizer's pad token (its EOS if it has none) on ``padding_side``.
    ``attention_mask[b, p]`` is 1 where ``tokens[b, p]`` is a real token, 0 on padding:
    for GPT-2 the pad token is ``<|endoftext|>`` itself, so only the mask tells them apart.
    With ``prepend_bos`` each text starts with ``bos_token_id(tokenizer)`` (see the
    module docstring); the tokenizer's own special tokens are never added. A text
    longer than ``max_length`` tokens (BOS included) raises ``ValueError``.
    """
    _check_tokenizer(tokenizer)
    texts = _as_text_list(text)
    if padding_side not in ("right", "left"):
        raise ValueError(f"padding_side must be 'right' or 'left', received {padding_side!r}")
    if max_length is not None and not (_is_int(max_length) and int(max_length) >= 1):
        raise ValueError(f"max_length must be a positive int or None, received {max_length!r}")

    # add_special_tokens=False: BOS is ours to add, and e.g. BERT's [SEP] is not wanted.
    encoded = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
    if prepend_bos:
        bos = bos_token_id(tokenizer)
        encoded = [[bos, *ids] for ids in encoded]
    for index, ids in enumerate(encoded):
        if not ids:
            raise ValueError(
                f"text[{index}] = {texts[index]!r} gives no tokens; pass prepend_bos=True or a non-empty text"
            )
        if max_length is not None and len(ids) > max_length:
            bos_note = " (BOS included)" if prepend_bos else ""
            raise ValueError(f"text[{index}] is {len(ids)} tokens long{bos_note}, more than max_length={max_length}")

    longest = max(len(ids) for ids in encoded)
    needs_padding = any(len(ids) < longest for ids in encoded)
    pad = pad_token_id(tokenizer) if needs_padding else 0
    tokens = torch.full((len(encoded), longest), pad, dtype=torch.long)
    attention_mask = torch.zeros((len(encoded), longest), dtype=torch.long)
    for row, ids in enumerate(encoded):
        start = 0 if padding_side == "right" else longest - len(ids)
        tokens[row, start : start + len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, start : start + len(ids)] = 1
    return TokensAndMask(tokens, attention_mask)


def to_tokens(
    tokenizer: PreTrainedTokenizerBase,
    text: str | list[str],
    prepend_bos: bool = True,
    padding_side: Literal["right", "left"] = "right",
    max_length: int | None = None,
) -> Int[Tensor, "batch pos"]:
    """Token ids ``[batch pos]`` (int64) of ``text``; see ``to_tokens_and_mask`` for the rules.

    Use ``to_tokens_and_mask`` when the texts differ in length: the mask says
    which positions are padding.
    """
    return to_tokens_and_mask(tokenizer, text, prepend_bos, padding_side, max_length).tokens


# ---------------------------------------------------------------- tokens -> text


def to_str_tokens(
    tokenizer: PreTrainedTokenizerBase,
    tokens_or_text: str | list[str] | TokensLike,
    prepend_bos: bool = True,
) -> list[str] | list[list[str]]:
    """Each token as its own piece of text, e.g. ``['<|endoftext|>', 'Hello', ' world']``.

    Accepts a str (tokenized with ``prepend_bos``), a list of str (one list per text,
    unpadded), token ids as a 1-D tensor or list of ints, or a ``[batch pos]`` tensor:
    batch 1 gives one list, batch > 1 a list of lists. ``prepend_bos`` only applies to
    text; ids are shown as given.
    """
    _check_tokenizer(tokenizer)
    if isinstance(tokens_or_text, str):
        return _decode_each(tokenizer, to_tokens(tokenizer, tokens_or_text, prepend_bos)[0].tolist())
    if (
        isinstance(tokens_or_text, (list, tuple))
        and tokens_or_text
        and all(isinstance(item, str) for item in tokens_or_text)
    ):
        return [_decode_each(tokenizer, to_tokens(tokenizer, text, prepend_bos)[0].tolist()) for text in tokens_or_text]
    rows, ndim = _as_id_rows(tokenizer, tokens_or_text, "tokens_or_text")
    if ndim == 2 and len(rows) != 1:
        return [_decode_each(tokenizer, row) for row in rows]
    return _decode_each(tokenizer, rows[0])


def to_string(tokenizer: PreTrainedTokenizerBase, tokens: TokensLike) -> str | list[str]:
    """Decode token ids to text: ``[pos]`` (or a list of ints) gives a str, ``[batch pos]`` a list of str.

    Special tokens are kept and spaces are not "cleaned up", so for GPT-2
    ``to_string(tokenizer, to_tokens(tokenizer, text, prepend_bos=False)[0]) == text``.
    Padding is decoded like any other token: slice it off with the attention mask first.
    """
    _check_tokenizer(tokenizer)
    rows, ndim = _as_id_rows(tokenizer, tokens, "tokens")
    texts = tokenizer.batch_decode(rows, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    return texts[0] if ndim == 1 else texts


def get_token_position(
    tokenizer: PreTrainedTokenizerBase,
    single_token: str | int,
    tokens_or_text: str | TokensLike,
    mode: Literal["first", "last"] = "first",
    prepend_bos: bool = True,
) -> int:
    """Position of ``single_token`` in one sequence: its first or last occurrence.

    ``single_token`` is a token id or a str that tokenizes to exactly one token
    (mind GPT-2's leading spaces: ``" Mary"`` and ``"Mary"`` differ). A text is
    tokenized with ``prepend_bos``, and the position counts the BOS, so it indexes
    the model's ``pos`` axis directly. ``tokens_or_text`` may also be ids of shape
    ``[pos]`` or ``[1, pos]``.
    """
    _check_tokenizer(tokenizer)
    if mode not in ("first", "last"):
        raise ValueError(f"mode must be 'first' or 'last', received {mode!r}")
    token_id = _single_token_id(tokenizer, single_token)
    if isinstance(tokens_or_text, str):
        ids = to_tokens(tokenizer, tokens_or_text, prepend_bos)[0].tolist()
    else:
        rows, _ = _as_id_rows(tokenizer, tokens_or_text, "tokens_or_text")
        if len(rows) != 1:
            raise ValueError(f"tokens_or_text holds a batch of {len(rows)} sequences, expected one")
        ids = rows[0]
    positions = [pos for pos, token in enumerate(ids) if token == token_id]
    if not positions:
        raise ValueError(
            f"token {single_token!r} (id {token_id}) does not occur in the sequence "
            f"{_describe_str_tokens(_decode_each(tokenizer, ids))}"
        )
    return positions[0] if mode == "first" else positions[-1]


__all__ = [
    "END_OF_TEXT",
    "GPT2_ENCODER_JSON_SHA256",
    "GPT2_N_CTX",
    "GPT2_VOCAB_BPE_SHA256",
    "TokensAndMask",
    "bos_token_id",
    "check_sha256",
    "get_token_position",
    "gpt2_tokenizer_from_files",
    "offline_gpt2_tokenizer",
    "offline_gpt2_tokenizer_paths",
    "pad_token_id",
    "sha256_of_file",
    "single_token_id",
    "to_str_tokens",
    "to_string",
    "to_tokens",
    "to_tokens_and_mask",
]
