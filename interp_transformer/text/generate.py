"""Autoregressive generation with a key/value cache: greedy, temperature, top-k and top-p sampling.

Each step turns the logits at the last position into one new token per
sequence:

- ``temperature == 0``: greedy, ``argmax(logits)`` (``top_k``/``top_p`` unused);
- otherwise sample from ``softmax(logits / temperature)``, restricted to the
  ``top_k`` most likely tokens and/or the nucleus: the most likely tokens whose
  probabilities, taken in decreasing order, first reach ``top_p`` (always at
  least one token).

With ``use_kv_cache`` (default) the prompt runs once and each later step feeds
only the new token, reusing the keys and values of earlier positions
(``interp_transformer.core.kv_cache``); the result is the same as re-running the
whole sequence every step, only faster. Hooks attached to the model run during
generation: with the cache, a hook sees the prompt once, then one position per
step. A model whose rotation changes with the sequence's length (LongRoPE, past its
original context: ``rotation_thresholds()``) gets the whole sequence again, with a new
cache, at the step where a row grows past that length, as Hugging Face's Phi-3 does.
"""

import math
from collections.abc import Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from interp_transformer.core.kv_cache import KeyValueCache, crossed_thresholds
from interp_transformer.core.token_checks import check_attention_mask, is_text


def sample_next_token(
    logits: Float[Tensor, "batch d_vocab"],
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Int[Tensor, "batch"]:
    """One token per row of ``logits``; see the module docstring for the rule."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature if logits.dtype in (torch.float16, torch.bfloat16) else logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth_largest = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # probability of the strictly better-ranked tokens
        drop_sorted = mass_before >= top_p  # the first token always stays (mass_before = 0 < top_p)
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)


def _eos_ids(model, eos_token_id) -> list[int]:
    if eos_token_id is None:
        tokenizer = getattr(model, "tokenizer", None)
        eos_token_id = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    if eos_token_id is None:
        return []
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    if not all(isinstance(i, int) and 0 <= i < model.cfg.d_vocab for i in ids):
        raise ValueError(
            f"eos_token_id must be token id(s) in [0, d_vocab={model.cfg.d_vocab}), received {eos_token_id!r}"
        )
    return ids


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_arguments(max_new_tokens, temperature, top_k, top_p, seed) -> None:
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, received {max_new_tokens!r}")
    if not _is_number(temperature) or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), received {temperature!r}")
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
        raise ValueError(f"top_k must be a positive int or None, received {top_k!r}")
    if top_p is not None and not (_is_number(top_p) and 0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1] or None, received {top_p!r}")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise ValueError(f"seed must be an int or None, received {seed!r}")


def _prompt_tokens(model, tokens_or_text, prepend_bos: bool, attention_mask) -> tuple[Tensor, Tensor | None, bool, int]:
    """``[batch, pos]`` prompt ids, their padding mask (None: none), whether the input was text, BOS tokens added.

    Texts of different lengths are padded on the left with their mask, so every row's
    continuation starts right after its own last token.
    """
    if is_text(tokens_or_text):
        if attention_mask is not None:
            raise ValueError("text is tokenized with its own attention mask: pass token ids to give a mask")
        tokens, mask = model.to_tokens_and_mask(tokens_or_text, prepend_bos=prepend_bos, padding_side="left")
        return tokens, (None if bool(mask.all()) else mask), True, int(prepend_bos)
    tokens = model.prepare_tokens(tokens_or_text)
    if attention_mask is not None:
        attention_mask = check_attention_mask(attention_mask, tokens).to(tokens.device)
    return tokens, attention_mask, False, 0


def _grows_past(thresholds, tokens: Tensor, mask: Tensor | None) -> bool:
    """Whether running the last token of ``tokens`` on a cache of the others grows a row past a threshold."""
    if not thresholds:
        return False
    total = mask.sum(dim=-1) if mask is not None else torch.full(tokens.shape[:1], tokens.shape[1])
    held = mask[:, :-1].sum(dim=-1) if mask is not None else total - 1
    return bool(crossed_thresholds(thresholds, held, total))


@torch.no_grad()
def generate(
    model,
    tokens_or_text: str | Sequence[str] | Int[Tensor, "batch pos"] | Int[Tensor, "pos"],
    max_new_tokens: int = 10,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_at_eos: bool = True,
    eos_token_id: int | Sequence[int] | None = None,
    seed: int | None = None,
    use_kv_cache: bool = True,
    verbose: bool = False,
    *,
    prepend_bos: bool = True,
    attention_mask: Int[Tensor, "batch pos"] | None = None,
) -> Tensor | str | list[str]:
    """Extend ``tokens_or_text`` by up to ``max_new_tokens`` tokens.

    Tokens in (``[batch, pos]``, or ``[pos]``; a padded batch with its ``attention_mask``),
    tokens out (same number of dims), prompt included. Text in (a str, or a list of
    texts, padded on the left with their mask so each row continues its own text exactly
    as it would alone), text out: the prompt and its continuation, without the padding
    and the BOS that ``prepend_bos`` added for the model. ``temperature=0`` is greedy; ``seed``
    makes sampling reproducible (a private generator, the global RNG untouched).
    With ``stop_at_eos`` a sequence that emits the EOS token (``eos_token_id``,
    default the tokenizer's; without one nothing stops early) is finished: later
    positions are filled with EOS, and generation stops when every sequence is
    finished. ``ValueError`` if prompt + ``max_new_tokens`` exceeds ``n_ctx``.
    ``verbose`` shows a progress bar.
    """
    _check_arguments(max_new_tokens, temperature, top_k, top_p, seed)
    tokens, mask, from_text, n_bos = _prompt_tokens(model, tokens_or_text, prepend_bos, attention_mask)
    input_ndim = tokens_or_text.ndim if isinstance(tokens_or_text, Tensor) else 2
    batch, prompt_len = tokens.shape
    if prompt_len + max_new_tokens > model.cfg.n_ctx:
        raise ValueError(
            f"prompt of {prompt_len} tokens + max_new_tokens={max_new_tokens} = {prompt_len + max_new_tokens} "
            f"exceeds n_ctx={model.cfg.n_ctx}"
        )
    eos_ids = torch.tensor(_eos_ids(model, eos_token_id) if stop_at_eos else [], dtype=torch.long, device=tokens.device)
    generator = torch.Generator(device=tokens.device).manual_seed(seed) if seed is not None else None
    kv_cache = KeyValueCache(model.cfg.n_layers) if use_kv_cache else None
    finished = torch.zeros(batch, dtype=torch.bool, device=tokens.device)
    next_input, next_mask = tokens, mask
    thresholds = model.rotation_thresholds() if hasattr(model, "rotation_thresholds") else ()
    for _ in tqdm(range(max_new_tokens), disable=not verbose, desc="generating"):
        if kv_cache is not None and kv_cache.n_positions and _grows_past(thresholds, tokens, mask):
            # the cached keys were rotated for a shorter row: start again from the whole sequence
            kv_cache, next_input, next_mask = KeyValueCache(model.cfg.n_layers), tokens, mask
        logits = model(next_input, attention_mask=next_mask, kv_cache=kv_cache)[:, -1, :]
        new = sample_next_token(logits, temperature, top_k, top_p, generator)
        if len(eos_ids):
            new = torch.where(finished, eos_ids[0], new)
            finished |= torch.isin(new, eos_ids)
        tokens = torch.cat([tokens, new[:, None]], dim=1)
        if mask is not None:
            mask = torch.cat([mask, torch.ones_like(new[:, None])], dim=1)
        # with the cache only the new token runs (the cache remembers the padding); without it, everything again
        next_input, next_mask = (new[:, None], None) if use_kv_cache else (tokens, mask)
        if len(eos_ids) and bool(finished.all()):
            break
    if from_text:
        rows = tokens if mask is None else [row[keep.bool()] for row, keep in zip(tokens, mask, strict=True)]
        texts = [model.to_string(row[n_bos:]) for row in rows]
        return texts[0] if isinstance(tokens_or_text, str) else texts
    return tokens[0] if input_ndim == 1 else tokens


__all__ = ["generate", "sample_next_token"]
