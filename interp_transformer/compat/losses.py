"""TransformerLens' loss, accuracy, attention-mask and sampling helpers (exported by ``compat.utils``).

>>> import torch
>>> logits = torch.zeros(1, 3, 5)
>>> float(lm_cross_entropy_loss(logits, torch.tensor([[1, 2, 3]]))) == float(torch.log(torch.tensor(5.0)))
True
"""

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from interp_transformer.compat.errors import CompatValueError


def lm_cross_entropy_loss(
    logits: Float[Tensor, "batch pos d_vocab"],
    tokens: Int[Tensor, "batch pos"],
    attention_mask: Int[Tensor, "batch pos"] | None = None,
    per_token: bool = False,
) -> Tensor:
    """Next-token cross-entropy: position ``p`` predicts ``tokens[:, p + 1]``.

    With ``attention_mask`` a prediction counts only where both its position and the next
    are real (1), and the mean is over those. ``per_token``: ``[batch, pos - 1]`` (masked
    predictions are 0).
    """
    if logits.shape[:-1] != tokens.shape:
        raise CompatValueError(f"logits {tuple(logits.shape)} and tokens {tuple(tokens.shape)} must share [batch, pos]")
    log_probs = F.log_softmax(logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits, dim=-1)
    predicted = log_probs[..., :-1, :].gather(dim=-1, index=tokens[..., 1:, None].to(logits.device))[..., 0]
    if attention_mask is not None:
        if attention_mask.shape != tokens.shape:
            raise CompatValueError(
                f"attention_mask {tuple(attention_mask.shape)} must have the tokens' shape {tuple(tokens.shape)}"
            )
        mask = attention_mask.to(predicted.device)
        next_token_mask = torch.logical_and(mask[:, :-1], mask[:, 1:])
        predicted = predicted * next_token_mask
        n_tokens: Tensor | int = next_token_mask.sum()
    else:
        n_tokens = predicted.numel()
    if per_token:
        return -predicted
    return -predicted.sum() / n_tokens


def lm_accuracy(
    logits: Float[Tensor, "batch pos d_vocab"], tokens: Int[Tensor, "batch pos"], per_token: bool = False
) -> Tensor | Float[Tensor, ""]:
    """Top-1 next-token accuracy: the fraction of positions whose argmax is the next token (``per_token``: the
    booleans)."""
    correct = logits.argmax(dim=-1)[:, :-1] == tokens[:, 1:].to(logits.device)
    return correct if per_token else correct.sum() / correct.numel()


def get_cumsum_along_dim(tensor: Tensor, dim: int, reverse: bool = False) -> Tensor:
    """Cumulative sum along ``dim`` (from the end with ``reverse``)."""
    if reverse:
        tensor = tensor.flip(dims=(dim,))
    cumsum = tensor.cumsum(dim=dim)
    return cumsum.flip(dims=(dim,)) if reverse else cumsum


def get_attention_mask(
    tokenizer, tokens: Int[Tensor, "batch pos"], prepend_bos: bool, padding_side: str | None = None
) -> Tensor:
    """The mask TransformerLens infers from pad tokens: 0 on the leading (left padding) or trailing (right padding)
    pads.

    ``padding_side`` defaults to the tokenizer's. Only pads at the padded end count; with
    left padding, when the pad token is the BOS token and ``prepend_bos``, the last leading
    pad of each row is its BOS and stays 1. Without a tokenizer, every position is real.
    """
    mask = torch.ones_like(tokens)
    if tokenizer is None:
        return mask
    side = tokenizer.padding_side if padding_side is None else padding_side
    is_not_pad = tokens.ne(tokenizer.pad_token_id)
    if side == "right":
        mask[get_cumsum_along_dim(is_not_pad, -1, reverse=True) == 0] = 0
    else:
        is_leading_pad = get_cumsum_along_dim(is_not_pad, -1) == 0
        mask[is_leading_pad] = 0
        if prepend_bos and tokenizer.bos_token_id == tokenizer.pad_token_id:
            bos_positions = is_leading_pad.sum(-1) - 1
            rows = torch.arange(mask.shape[0], device=mask.device)
            has_bos = bos_positions >= 0
            mask[rows[has_bos], bos_positions[has_bos]] = 1
    return mask


def sample_logits(
    final_logits: Float[Tensor, "batch d_vocab"],
    top_k: int | None = None,
    top_p: float | None = None,
    temperature: float = 1.0,
    freq_penalty: float = 0.0,
    tokens: Int[Tensor, "batch pos"] | None = None,
    generator: torch.Generator | None = None,
) -> Int[Tensor, "batch"]:
    """One token per row: greedy at ``temperature=0``, else sampled from ``softmax(logits / temperature)``.

    ``freq_penalty`` subtracts ``freq_penalty * count`` of each token in ``tokens`` (needed
    then); ``top_k`` keeps the ``k`` most likely tokens, else ``top_p`` the most likely ones
    whose probabilities first reach ``top_p`` (at least one), as TransformerLens does.
    """
    if temperature == 0.0:
        return final_logits.argmax(dim=-1)
    final_logits = final_logits.float() / temperature
    if freq_penalty > 0:
        if tokens is None or tokens.ndim != 2:
            raise CompatValueError("a frequency penalty needs the tokens so far, [batch, pos]")
        counts = torch.stack(
            [torch.bincount(row, minlength=final_logits.shape[-1]) for row in tokens.to(final_logits.device)]
        )
        final_logits = final_logits - freq_penalty * counts[:, : final_logits.shape[-1]]
    if top_k is not None:
        if top_k <= 0:
            raise CompatValueError(f"top_k has to be greater than 0, got {top_k}")
        kth = final_logits.topk(min(top_k, final_logits.shape[-1]), dim=-1).values[..., -1:]
        final_logits = final_logits.masked_fill(final_logits < kth, float("-inf"))
    elif top_p is not None:
        if not 0.0 < top_p <= 1.0:
            raise CompatValueError(f"top_p has to be in (0, 1], got {top_p}")
        sorted_logits, order = final_logits.sort(descending=True)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative > top_p
        drop[..., 1:] = drop[..., :-1].clone()
        drop[..., 0] = False
        final_logits = final_logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return torch.multinomial(final_logits.softmax(dim=-1), num_samples=1, generator=generator).squeeze(-1)


__all__ = ["get_attention_mask", "get_cumsum_along_dim", "lm_accuracy", "lm_cross_entropy_loss", "sample_logits"]
