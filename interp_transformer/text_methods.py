"""What a decoder does with text: tokenize, decode, generate, test a prompt (mixed into ``DemoTransformer``).

Each method is a thin front to ``interp_transformer.tokens``, ``generate`` or ``prompts``
with the model's tokenizer and device; the model class keeps only its composition and forward.
"""

from jaxtyping import Int
from torch import Tensor


class TextMethods:
    """Tokenizer conveniences and generation for a model with ``tokenizer``, ``W_E`` and ``_require_tokenizer``."""

    def generate(self, tokens_or_text, *args, **kwargs):
        """Sample a continuation; see ``interp_transformer.generate.generate``."""
        from .generate import generate

        return generate(self, tokens_or_text, *args, **kwargs)

    def test_prompt(self, prompt: str, answer: str, **kwargs):
        """Rank and probability of ``answer`` after ``prompt``; see ``interp_transformer.prompts.test_prompt``."""
        from .prompts import test_prompt

        return test_prompt(self, prompt, answer, **kwargs)

    def to_tokens(self, text, prepend_bos: bool = True, padding_side: str = "right") -> Int[Tensor, "batch pos"]:
        """Text (or a list of texts, right-padded) to ``[batch, pos]`` ids; BOS prepended by default.

        Ids alone carry no padding mask. Right padding is harmless to the real tokens of a
        causal model (padding comes after them); left padding would shift every position of
        the shorter texts, so texts that need it raise ``ValueError``: use
        ``to_tokens_and_mask(texts, padding_side="left")`` and pass its mask, or give the
        model the texts themselves (``model(texts)`` pads on the left, with the mask).
        """
        from . import tokens as tok

        encoded = tok.to_tokens_and_mask(
            self._require_tokenizer(), text, prepend_bos=prepend_bos, padding_side=padding_side
        )
        if padding_side == "left" and not bool(encoded.attention_mask.all()):
            raise ValueError(
                "left-padded ids without their attention mask would shift every position of the shorter texts: use "
                "to_tokens_and_mask(texts, padding_side='left') and pass attention_mask=, or pass the texts to the "
                "model"
            )
        return encoded.tokens.to(self.W_E.device)

    def to_tokens_and_mask(self, text, prepend_bos: bool = True, padding_side: str = "right"):
        """Text (or a list of texts, padded on ``padding_side``) to ``TokensAndMask(tokens, attention_mask)``.

        Pass both to the model, ``model(tokens, attention_mask=attention_mask)``, or the
        pair whole to tools that take it; the mask is 1 on real tokens, 0 on padding.
        """
        from . import tokens as tok

        encoded = tok.to_tokens_and_mask(
            self._require_tokenizer(), text, prepend_bos=prepend_bos, padding_side=padding_side
        )
        return tok.TokensAndMask(*(t.to(self.W_E.device) for t in encoded))

    def to_str_tokens(self, tokens_or_text, prepend_bos: bool = True):
        from . import tokens as tok

        return tok.to_str_tokens(self._require_tokenizer(), tokens_or_text, prepend_bos=prepend_bos)

    def to_string(self, tokens):
        from . import tokens as tok

        return tok.to_string(self._require_tokenizer(), tokens)

    def get_token_position(self, single_token, tokens_or_text, mode: str = "first", prepend_bos: bool = True) -> int:
        from . import tokens as tok

        return tok.get_token_position(
            self._require_tokenizer(), single_token, tokens_or_text, mode=mode, prepend_bos=prepend_bos
        )
