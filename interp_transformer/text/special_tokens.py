"""The tokenizer's structural special tokens (BOS, EOS, padding, ...), as SAELens reads them.

SAE tools leave their positions out: the splice lets them bypass the SAEs, the feature readers skip them.
"""

from collections.abc import Sequence

SpecialTokens = bool | Sequence[int]
# Tokenizer attributes of the "structural" special tokens, as SAELens reads them.
SPECIAL_TOKEN_ATTRIBUTES = ("bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id")


def special_token_ids(model, exclude: SpecialTokens) -> list[int] | None:
    """The token ids whose positions bypass the SAEs (None: no position does)."""
    if exclude is False:
        return None
    if exclude is True:
        tokenizer = getattr(model, "tokenizer", None)
        if tokenizer is None:
            raise ValueError(
                "exclude_special_tokens=True reads the special tokens from the model's tokenizer, and this model "
                "has none; pass the token ids instead, e.g. exclude_special_tokens=[0]"
            )
        ids = sorted(
            {
                getattr(tokenizer, attr)
                for attr in SPECIAL_TOKEN_ATTRIBUTES
                if getattr(tokenizer, attr, None) is not None
            }
        )
        if not ids:
            raise ValueError(
                f"exclude_special_tokens=True, but the tokenizer defines none of {list(SPECIAL_TOKEN_ATTRIBUTES)}"
            )
        return ids
    if (
        isinstance(exclude, (str, bytes))
        or not isinstance(exclude, Sequence)
        or not all(isinstance(i, int) and not isinstance(i, bool) for i in exclude)
    ):
        raise TypeError(f"exclude_special_tokens must be a bool or a list of token ids, got {exclude!r}")
    return list(exclude)
