"""Checked encoder-decoder inputs: the source and its padding mask, the decoder's input.

Every check raises ``TypeError``/``ValueError`` naming what was expected and what came:
ids outside the vocabulary, a source or target longer than ``n_ctx``, a mask of the wrong
shape or values, a source that holds the padding id but came without a mask (its padding
would be read as text), a decoder input whose batch differs from the source's.
"""

from typing import NamedTuple

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from interp_transformer.core.token_checks import as_id_tensor, check_attention_mask, check_token_ids
from interp_transformer.text.methods import padded_rows_problem


class SourceTokens(NamedTuple):
    """Tokenized source texts: ids and the padding mask (1 real, 0 padding), both ``[batch, pos]``."""

    tokens: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"]


def source_vocab(cfg) -> int:
    """The source's vocabulary size: ``cfg.source_vocab`` where the source has a vocabulary of its own
    (``EncoderDecoderSpec(d_vocab_source=...)``), else ``cfg.d_vocab``, shared with the target."""
    return getattr(cfg, "source_vocab", cfg.d_vocab)


def check_source(
    tokens, attention_mask, cfg, allow_meta: bool = False
) -> tuple[Int[Tensor, "batch pos"], Bool[Tensor, "batch pos"] | None]:
    """``(tokens [batch, pos] int64, key_is_real [batch, pos] or None)``; see the module docstring.

    ``allow_meta``: tokens on the ``meta`` device (``hook_shapes``) are checked for shape only.
    """
    tokens = check_token_ids(as_id_tensor(tokens), source_vocab(cfg), cfg.n_ctx, allow_meta=allow_meta)
    if attention_mask is None:
        if not tokens.is_meta:
            padded = (tokens == cfg.pad_token_id).nonzero().tolist()
            if padded:
                raise ValueError(
                    f"the source holds the padding id {cfg.pad_token_id} at (row, position) {padded[:5]} but came "
                    "without attention_mask: pass attention_mask [batch, pos] (1 real, 0 padding), e.g. from "
                    "model.to_tokens_and_mask(texts), so that padding is never read as text"
                )
        return tokens, None
    mask = check_attention_mask(attention_mask, tokens).to(tokens.device)
    if mask.is_meta or bool(mask.bool().all()):
        return tokens, None
    return tokens, mask.bool()


def check_decoder_input(
    decoder_input, batch: int, cfg, offset: int = 0, allow_meta: bool = False
) -> Int[Tensor, "batch pos"]:
    """The decoder's input ids ``[batch, pos]``, ``offset + pos <= n_ctx`` (``offset``: target positions already
    cached)."""
    if decoder_input is None:
        return torch.full((batch, 1), cfg.decoder_start_token_id, dtype=torch.long)
    try:
        decoder_input = check_token_ids(
            as_id_tensor(decoder_input), cfg.d_vocab, cfg.n_ctx, offset, allow_meta=allow_meta
        )
    except ValueError as error:
        raise ValueError(f"decoder_input (the target): {error}") from None
    if decoder_input.shape[0] != batch:
        raise ValueError(f"decoder_input has batch {decoder_input.shape[0]}, the source batch {batch}")
    return decoder_input


class SourceText:
    """An encoder-decoder's source text, with the tokenizer's special tokens (``text_methods``)."""

    def encode(self, tokenizer, text, n_ctx: int) -> SourceTokens:
        """Text (or texts, right-padded) to ``SourceTokens(tokens, attention_mask)``."""
        texts = [text] if isinstance(text, str) else text
        if not (isinstance(texts, list) and texts and all(isinstance(t, str) for t in texts)):
            raise TypeError(f"text must be a str or a non-empty list of str, got {text!r:.80}")
        encoded = tokenizer(texts, padding=True, return_tensors="pt")
        tokens, mask = encoded["input_ids"], encoded["attention_mask"]
        if tokens.shape[1] > n_ctx:
            raise ValueError(
                f"text is {tokens.shape[1]} tokens long (special tokens included), more than n_ctx={n_ctx}"
            )
        return SourceTokens(tokens, mask)

    def why_not_ids_alone(self, encoded: SourceTokens) -> str | None:
        return padded_rows_problem(encoded.attention_mask)

    def str_tokens(self, model, tokens) -> list[str] | list[list[str]]:
        """``[pos]`` or ``[1, pos]`` ids (or text) give a list, ``[batch, pos]`` a list of lists."""
        tokenizer = model._require_tokenizer()
        if isinstance(tokens, str):
            tokens = model.to_tokens(tokens)
        rows = tokens[None] if tokens.ndim == 1 else tokens
        pieces = [tokenizer.convert_ids_to_tokens(row) for row in rows.tolist()]
        return pieces[0] if len(pieces) == 1 else pieces

    def decode(self, tokenizer, tokens: Tensor, cfg) -> str | list[str]:
        """Special tokens left out."""
        texts = tokenizer.batch_decode(
            (tokens[None] if tokens.ndim == 1 else tokens).tolist(), skip_special_tokens=True
        )
        return texts[0] if tokens.ndim == 1 else texts


__all__ = ["SourceText", "SourceTokens", "check_decoder_input", "check_source", "source_vocab"]
