"""What a model does with text, written once for every model class; what differs is its input kind.

``TextMethods`` (mixed into every model) gives ``to_tokens_and_mask``, ``to_tokens``,
``to_str_tokens`` and ``to_string``. Each forwards to the model's ``text_inputs``, a small
object that says what the model's text is:

==================  ===================================================================
``DecoderText``     text continued left to right: BOS prepended by default, padded on
                    either side (``interp_transformer.text.tokens``); right-padded ids alone
                    are harmless to a causal model
``EncoderText``     text, or text pairs, with the tokenizer's special tokens (BERT's
                    ``[CLS] a [SEP] b [SEP]``) and segment ids (``encoder.inputs``)
``SourceText``      an encoder-decoder's source, with the tokenizer's special tokens;
                    decoded without them (``encoder_decoder.inputs``)
==================  ===================================================================

A kind implements ``encode(tokenizer, text, n_ctx, ...)`` (a tuple whose first two fields
are ids and mask), ``why_not_ids_alone(encoded, ...)`` (None when the ids need no mask),
``str_tokens(model, tokens_or_text, ...)`` and ``decode(tokenizer, tokens, cfg)``.
``PromptMethods`` adds what only a decoder does with text: generate, test a prompt, find a token.
"""

from typing import TYPE_CHECKING, Any, Literal

from jaxtyping import Int
from torch import Tensor


class TextMethods:
    """Tokenize and decode through ``text_inputs`` (see the module docstring)."""

    text_inputs: Any = None  # each model class names its input kind (DecoderText, EncoderText, SourceText)

    def to_tokens_and_mask(self, text, *args, **kwargs):
        """Text (or a list of texts, padded) to ids and their mask (1 real, 0 padding), on the model's device.

        The options are the input kind's: a decoder's ``prepend_bos`` and ``padding_side``, an
        encoder's ``text_pair``. Pass both to the model, or the tuple whole to tools that take it.
        """
        encoded = self.text_inputs.encode(self._require_tokenizer(), text, self.cfg.n_ctx, *args, **kwargs)
        return type(encoded)(*(t.to(self.W_E.device) for t in encoded))

    def to_tokens(self, text, *args, **kwargs) -> Int[Tensor, "batch pos"]:
        """Text to ``[batch, pos]`` ids alone, where ids without their mask keep their meaning; else ``ValueError``.

        A decoder's right padding is harmless (padding comes after the real tokens of a causal
        model); any other padding would let real tokens read padding, or shift positions: use
        ``to_tokens_and_mask`` for those texts, or give the model the texts themselves.
        """
        encoded = self.to_tokens_and_mask(text, *args, **kwargs)
        problem = self.text_inputs.why_not_ids_alone(encoded, *args, **kwargs)
        if problem is not None:
            raise ValueError(problem)
        return encoded[0]

    def to_str_tokens(self, tokens_or_text, *args, **kwargs):
        """Each token as its own string; text is tokenized first (and shown without its padding)."""
        return self.text_inputs.str_tokens(self, tokens_or_text, *args, **kwargs)

    def to_string(self, tokens):
        """Decode ids to text: ``[pos]`` gives a str, ``[batch, pos]`` a list."""
        return self.text_inputs.decode(self._require_tokenizer(), tokens, self.cfg)


def padded_rows_problem(attention_mask: Tensor) -> str | None:
    """Why ids alone would lose the padding of these rows, or None when every position is real."""
    if bool(attention_mask.bool().all()):
        return None
    lengths = attention_mask.sum(dim=-1).tolist()
    return (
        f"the texts have different token lengths {lengths}, so they need padding and an attention mask: "
        "use to_tokens_and_mask(texts) and pass its result to the model"
    )


class DecoderText:
    """A decoder's text (see the module docstring)."""

    def encode(
        self, tokenizer, text, n_ctx: int, prepend_bos: bool = True, padding_side: Literal["right", "left"] = "right"
    ):
        from interp_transformer.text import tokens as tok

        return tok.to_tokens_and_mask(tokenizer, text, prepend_bos=prepend_bos, padding_side=padding_side)

    def why_not_ids_alone(self, encoded, prepend_bos: bool = True, padding_side: str = "right") -> str | None:
        if padding_side == "left" and not bool(encoded.attention_mask.all()):
            return (
                "left-padded ids without their attention mask would shift every position of the shorter texts: use "
                "to_tokens_and_mask(texts, padding_side='left') and pass attention_mask=, or pass the texts to the "
                "model"
            )
        return None

    def str_tokens(self, model, tokens_or_text, prepend_bos: bool = True):
        from interp_transformer.text import tokens as tok

        return tok.to_str_tokens(model._require_tokenizer(), tokens_or_text, prepend_bos=prepend_bos)

    def decode(self, tokenizer, tokens, cfg):
        from interp_transformer.text import tokens as tok

        return tok.to_string(tokenizer, tokens)


class PromptMethods:
    """What a decoder does with a prompt: sample a continuation, rank an answer, find a token."""

    if TYPE_CHECKING:  # a mixin of the model class: it reads that class's attributes and calls its forward

        def __getattr__(self, name: str) -> Any: ...

        def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    def generate(self, tokens_or_text, *args, **kwargs):
        """Sample a continuation; see ``interp_transformer.text.generate.generate``."""
        from interp_transformer.text.generate import generate

        return generate(self, tokens_or_text, *args, **kwargs)

    def test_prompt(self, prompt: str, answer: str, **kwargs):
        """Rank and probability of ``answer`` after ``prompt``; see ``interp_transformer.text.prompts.test_prompt``."""
        from interp_transformer.text.prompts import test_prompt

        return test_prompt(self, prompt, answer, **kwargs)

    def get_token_position(
        self, single_token, tokens_or_text, mode: Literal["first", "last"] = "first", prepend_bos: bool = True
    ) -> int:
        from interp_transformer.text import tokens as tok

        return tok.get_token_position(
            self._require_tokenizer(), single_token, tokens_or_text, mode=mode, prepend_bos=prepend_bos
        )


__all__ = ["DecoderText", "PromptMethods", "TextMethods", "padded_rows_problem"]
