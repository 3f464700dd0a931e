"""Checked encoder inputs: token ids, the padding mask, segment ids, and text -> all three.

Every check raises ``TypeError``/``ValueError`` naming what was expected and what
came. Tensors on the ``meta`` device (``hook_shapes``) are checked for shape only.
"""

from typing import NamedTuple

import torch
from jaxtyping import Int
from torch import Tensor

from interp_transformer.core.token_checks import as_id_tensor, check_attention_mask, check_like_tokens, check_token_ids
from interp_transformer.families.bert.recipe import EncoderConfig
from interp_transformer.text.methods import padded_rows_problem


class EncoderTokens(NamedTuple):
    """Tokenized text for an encoder: ids, the padding mask (1 real, 0 padding) and segment ids."""

    tokens: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"]
    token_type_ids: Int[Tensor, "batch pos"]


def check_tokens(tokens, cfg: EncoderConfig, allow_meta: bool = False) -> Int[Tensor, "batch pos"]:
    """``tokens`` as int64 ``[batch, pos]`` (a ``[pos]`` tensor is a batch of one), ids in ``[0, d_vocab)``."""
    return check_token_ids(as_id_tensor(tokens), cfg.d_vocab, cfg.n_ctx, allow_meta=allow_meta)


def check_token_type_ids(token_type_ids, tokens: Tensor, cfg: EncoderConfig) -> Int[Tensor, "batch pos"]:
    """Segment ids shaped like ``tokens``, in ``[0, n_token_types)``."""
    token_type_ids = check_like_tokens(token_type_ids, tokens, "token_type_ids", allow_bool=False)
    if not token_type_ids.is_meta:
        low, high = int(token_type_ids.min()), int(token_type_ids.max())
        if low < 0 or high >= cfg.n_token_types:
            raise ValueError(
                f"token_type_ids must lie in [0, n_token_types={cfg.n_token_types}), got {low if low < 0 else high}"
            )
    return token_type_ids.long()


def encode(tokenizer, text: str | list, text_pair: str | list | None, n_ctx: int) -> EncoderTokens:
    """Tokenize with the tokenizer's own special tokens (BERT: ``[CLS] a [SEP] b [SEP]``), right-padded."""
    for name, value in (("text", text), ("text_pair", text_pair)):
        if value is None and name == "text_pair":
            continue
        if not (
            isinstance(value, str) or (isinstance(value, list) and value and all(isinstance(t, str) for t in value))
        ):
            raise TypeError(f"{name} must be a str or a non-empty list of str, got {value!r:.80}")
    if text_pair is not None and (
        type(text) is not type(text_pair) or (isinstance(text, list) and len(text) != len(text_pair))
    ):
        raise ValueError("text_pair must match text: both str, or lists of the same length")
    encoded = tokenizer(
        text,
        text_pair,
        padding=True,
        truncation=False,
        add_special_tokens=True,
        return_attention_mask=True,
        return_token_type_ids=True,
        return_tensors="pt",
        verbose=False,
    )
    length = encoded["input_ids"].shape[1]
    if length > n_ctx:
        raise ValueError(f"text is {length} tokens long (special tokens included), more than n_ctx={n_ctx}")
    return EncoderTokens(encoded["input_ids"], encoded["attention_mask"], encoded["token_type_ids"])


class EncoderText:
    """An encoder's text: texts or text pairs with the tokenizer's special tokens (``text_methods``)."""

    def encode(self, tokenizer, text, n_ctx: int, text_pair=None) -> EncoderTokens:
        """``[CLS] text [SEP]`` (``[CLS] a [SEP] b [SEP]`` for pairs), right-padded; never truncated."""
        return encode(tokenizer, text, text_pair, n_ctx)

    def why_not_ids_alone(self, encoded: EncoderTokens, text_pair=None) -> str | None:
        if bool(encoded.token_type_ids.any()):
            return "a text pair has segment ids, which ids alone would lose: use to_tokens_and_mask(text, text_pair)"
        return padded_rows_problem(encoded.attention_mask)

    def str_tokens(self, model, tokens_or_text) -> list[str] | list[list[str]]:
        """WordPiece strings, e.g. ``['[CLS]', 'hello', 'world', '[SEP]']``; text without its padding, ids as given."""
        tokenizer = model._require_tokenizer()
        if isinstance(tokens_or_text, EncoderTokens):
            tokens_or_text = tokens_or_text.tokens
        if isinstance(tokens_or_text, list) and tokens_or_text and not all(isinstance(t, str) for t in tokens_or_text):
            tokens_or_text = torch.tensor(tokens_or_text)
        if isinstance(tokens_or_text, (str, list)):
            encoded = model.to_tokens_and_mask(tokens_or_text)
            rows = [ids[mask.bool()].tolist() for ids, mask in zip(encoded.tokens, encoded.attention_mask, strict=True)]
            pieces = [tokenizer.convert_ids_to_tokens(row) for row in rows]
            return pieces[0] if isinstance(tokens_or_text, str) else pieces
        ids = check_tokens(tokens_or_text, model.cfg)
        pieces = [tokenizer.convert_ids_to_tokens(row) for row in ids.tolist()]
        return pieces[0] if len(pieces) == 1 else pieces

    def decode(self, tokenizer, tokens: Tensor, cfg) -> str | list[str]:
        """Special tokens kept."""
        texts = tokenizer.batch_decode(check_tokens(tokens, cfg).tolist(), skip_special_tokens=False)
        return texts[0] if tokens.ndim == 1 else texts


__all__ = ["EncoderText", "EncoderTokens", "check_attention_mask", "check_token_type_ids", "check_tokens", "encode"]
