"""Translation by an encoder-decoder: greedy search and beam search, with a key/value cache.

The source is encoded once. The decoder starts from ``decoder_start_token_id`` and adds one
token per step; with the cache (default) each step feeds only the new token, reusing the
self-attention keys and values of earlier target positions, and cross-attention's keys
and values (projections of the encoder's output) are computed at the first step only.
The ids equal Hugging Face's ``generate`` with the same settings:

- **greedy** (``num_beams=1``): ``argmax`` of each step's logits (taken in float32). A row
  that emits an EOS token is finished; its later positions hold ``pad_token_id``, and
  generation stops when every row is finished or after ``max_new_tokens``.
- **beam search** (``num_beams=k``): ``k`` running hypotheses per source, scored by their
  summed log-probabilities (float32). Each step keeps the best ``2k`` continuations over all
  beams; those ending in EOS among the top ``k`` join the finished hypotheses with score
  ``sum_logprobs / generated_length ** length_penalty``; the best ``k`` unfinished ones run
  on. A source is done when no running beam can still beat its worst finished one
  (``early_stopping=False``: judged at the current length) or, with ``early_stopping=True``,
  once it has ``k`` finished hypotheses. The best finished hypothesis is returned, rows padded
  with ``pad_token_id`` (with the first EOS id when the padding id is 0, as Hugging Face
  pads beam search).
- ``forced_eos_token_id``: at the last allowed step only that token may be chosen (BART's
  and Marian's configs ask for it).

Returned ids start with the decoder start token: ``[batch, 1 + generated]``.
"""

from collections.abc import Sequence

import torch
from jaxtyping import Int
from torch import Tensor
from tqdm.auto import tqdm

from interp_transformer.models.encoder_decoder.kv_cache import EncoderDecoderKVCache
from interp_transformer.parts.cross_attention import CrossAttentionSource

NEGATIVE = -1.0e9  # the score that takes a hypothesis out of every comparison (Hugging Face's)


def _token_ids(value, name: str, d_vocab: int) -> list[int]:
    ids = [value] if isinstance(value, int) and not isinstance(value, bool) else list(value)
    if not ids or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < d_vocab for i in ids):
        raise ValueError(f"{name} must be token id(s) in [0, d_vocab={d_vocab}), got {value!r}")
    return ids


def _check_arguments(model, max_new_tokens, num_beams, length_penalty, early_stopping) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if 1 + max_new_tokens > model.cfg.n_ctx:
        raise ValueError(
            f"the decoder start token + max_new_tokens={max_new_tokens} = {1 + max_new_tokens} target positions "
            f"exceed n_ctx={model.cfg.n_ctx}"
        )
    if isinstance(num_beams, bool) or not isinstance(num_beams, int) or num_beams < 1:
        raise ValueError(f"num_beams must be an int >= 1, got {num_beams!r}")
    if num_beams > 1 and 2 * num_beams > model.cfg.d_vocab:
        raise ValueError(
            f"num_beams={num_beams} needs a vocabulary of at least {2 * num_beams} tokens, got {model.cfg.d_vocab}"
        )
    if not isinstance(length_penalty, (int, float)) or isinstance(length_penalty, bool):
        raise TypeError(f"length_penalty must be a number, got {length_penalty!r}")
    if early_stopping not in (True, False):
        raise ValueError(f"early_stopping must be True or False, got {early_stopping!r}")


class _Decoder:
    """One decoder step after another: the whole target so far without a cache, the newest token with one."""

    def __init__(self, model, source: CrossAttentionSource, use_kv_cache: bool):
        self.model, self.source = model, source
        self.kv_cache = EncoderDecoderKVCache(model.cfg.n_decoder_layers) if use_kv_cache else None

    def next_logits(self, target: Tensor) -> Tensor:
        """float32 logits ``[rows, d_vocab]`` of the token after ``target``."""
        step_input = target[:, -1:] if self.kv_cache is not None and self.kv_cache.n_positions else target
        return self.model.decode(step_input, self.source, self.kv_cache)[:, -1].to(torch.float32)

    def reorder(self, rows: Tensor) -> None:
        if self.kv_cache is not None:
            self.kv_cache.reorder(rows)


def _force_eos(scores: Tensor, forced_eos: int | None, length: int, max_length: int) -> Tensor:
    """At the step that reaches ``max_length``, every score but ``forced_eos``'s becomes ``-inf`` (and its 0)."""
    if forced_eos is None or length != max_length - 1:
        return scores
    forced = torch.full_like(scores, float("-inf"))
    forced[:, forced_eos] = 0
    return forced


def greedy_search(
    decoder: _Decoder,
    start: Tensor,
    max_new_tokens: int,
    eos: Tensor,
    pad: int,
    forced_eos: int | None,
    progress: bool,
) -> Int[Tensor, "batch pos"]:
    """See the module docstring: argmax per step, finished rows padded."""
    target, max_length = start, 1 + max_new_tokens
    unfinished = torch.ones(start.shape[0], dtype=torch.bool, device=start.device)
    for _ in tqdm(range(max_new_tokens), desc="generating", disable=not progress):
        scores = _force_eos(decoder.next_logits(target), forced_eos, target.shape[1], max_length)
        new = torch.where(unfinished, scores.argmax(dim=-1), pad)
        target = torch.cat([target, new[:, None]], dim=1)
        unfinished &= ~torch.isin(new, eos)
        if not bool(unfinished.any()):
            break
    return target


def _gather(tensor: Tensor, index: Tensor) -> Tensor:
    """``tensor[b, index[b, j], ...]`` for ``tensor [batch, beams, ...]`` and ``index [batch, chosen]``."""
    while index.ndim < tensor.ndim:
        index = index.unsqueeze(-1)
    return torch.take_along_dim(tensor, index, dim=1)


def beam_search(
    decoder: _Decoder,
    start: Tensor,
    max_new_tokens: int,
    eos: Tensor,
    pad: int,
    num_beams: int,
    length_penalty: float,
    early_stopping: bool,
    forced_eos: int | None,
    progress: bool,
) -> Int[Tensor, "batch pos"]:
    """See the module docstring. ``start`` holds each source's start token once per beam, ``[batch * num_beams, 1]``."""
    device, max_length = start.device, 1 + max_new_tokens
    batch = start.shape[0] // num_beams
    keep = max(2, 1 + len(eos)) * num_beams  # candidates per source: enough to continue when the top ones all end
    top_beams = torch.arange(keep, device=device) < num_beams
    fill = pad if pad != 0 else int(eos[0])  # Hugging Face's `pad_token_id or eos_token_id[0]`
    running = torch.full((batch, num_beams, max_length), fill, dtype=torch.long, device=device)
    running[:, :, 0] = start.view(batch, num_beams)
    finished = running.clone()
    running_scores = torch.zeros(batch, num_beams, device=device)
    running_scores[:, 1:] = NEGATIVE  # every beam starts as the same sequence: only the first may be extended
    finished_scores = torch.full((batch, num_beams), NEGATIVE, device=device)
    is_finished = torch.zeros(batch, num_beams, dtype=torch.bool, device=device)
    can_improve = torch.ones(batch, 1, dtype=torch.bool, device=device)
    running_origin = torch.full((batch, num_beams, max_new_tokens), -1, dtype=torch.long, device=device)
    finished_origin = running_origin.clone()
    row_offset = torch.arange(batch, device=device)[:, None] * num_beams
    length = 1
    for _ in tqdm(range(max_new_tokens), desc="beam search", disable=not progress):
        logits = decoder.next_logits(running[:, :, :length].reshape(batch * num_beams, length))
        log_probs = _force_eos(logits.log_softmax(dim=-1), forced_eos, length, max_length)
        d_vocab = log_probs.shape[-1]
        totals = (log_probs.view(batch, num_beams, d_vocab) + running_scores[:, :, None]).view(
            batch, num_beams * d_vocab
        )
        # c. the best `keep` continuations over every beam of a source
        top_scores, top_index = totals.topk(keep, dim=-1)
        beam, token = top_index // d_vocab, top_index % d_vocab
        candidates = _gather(running, beam)
        candidates[:, :, length] = token
        origins = _gather(running_origin, beam)
        origins[:, :, length - 1] = beam + row_offset
        ends = torch.isin(token, eos) | (length + 1 >= max_length)
        # e. the best num_beams that go on
        going_on = top_scores + ends.to(torch.float32) * NEGATIVE
        chosen = going_on.topk(num_beams, dim=-1).indices
        running, running_scores, running_origin = (
            _gather(candidates, chosen),
            _gather(going_on, chosen),
            _gather(origins, chosen),
        )
        # f. finished hypotheses among the top num_beams, ranked with the length penalty
        just_finished = ends & top_beams[None, :]
        final_scores = top_scores / (length**length_penalty)
        final_scores = (
            final_scores + (is_finished.all(dim=-1, keepdim=True) & early_stopping).to(torch.float32) * NEGATIVE
        )
        final_scores = final_scores + (~can_improve).to(torch.float32) * NEGATIVE
        final_scores = final_scores + (~just_finished) * NEGATIVE
        merged_scores = torch.cat([finished_scores, final_scores], dim=1)
        best = merged_scores.topk(num_beams, dim=-1).indices
        finished = _gather(torch.cat([finished, candidates], dim=1), best)
        finished_scores = _gather(merged_scores, best)
        finished_origin = _gather(torch.cat([finished_origin, origins], dim=1), best)
        is_finished = _gather(torch.cat([is_finished, just_finished], dim=1), best)
        # g. the cache follows the beams that go on
        decoder.reorder(running_origin[:, :, length - 1].reshape(-1))
        length += 1
        best_running = running_scores[:, :1] / ((length - 1) ** length_penalty)
        worst_finished = torch.where(is_finished, finished_scores.min(dim=1, keepdim=True).values, NEGATIVE)
        can_improve = can_improve & (best_running > worst_finished).any(dim=-1, keepdim=True)
        if not bool(can_improve.any()) or (bool(is_finished.all()) and early_stopping) or bool(ends.all()):
            break
    best_rows, origin = finished[:, 0], finished_origin[:, 0]
    generated = int((origin + 1).bool().sum(dim=1).max())
    return best_rows[:, : 1 + generated]


@torch.no_grad()
def generate(
    model,
    tokens,
    attention_mask: Tensor | None = None,
    *,
    max_new_tokens: int | None = None,
    num_beams: int = 1,
    eos_token_id: None | int | Sequence[int] = None,
    decoder_start_token_id: int | None = None,
    pad_token_id: int | None = None,
    forced_eos_token_id: int | None = None,
    length_penalty: float = 1.0,
    early_stopping: bool = False,
    use_kv_cache: bool = True,
    verbose: bool = False,
) -> Int[Tensor, "batch pos"] | str | list[str]:
    """Translate ``tokens`` (the source: ids ``[batch, key_pos]`` with their ``attention_mask``, a ``SourceTokens``, or
    text).

    Ids in, ids out ``[batch, 1 + generated]`` (starting with the decoder start token); text in,
    text out (special tokens left out). Special tokens default to the model's config
    (``eos_token_id``, ``decoder_start_token_id``, ``pad_token_id``); ``max_new_tokens`` to 20 (Hugging Face's
    default length) or what ``n_ctx`` leaves room for. See the module docstring.
    """
    if max_new_tokens is None:
        max_new_tokens = min(20, model.cfg.n_ctx - 1)
    _check_arguments(model, max_new_tokens, num_beams, length_penalty, early_stopping)
    cfg = model.cfg
    eos = torch.tensor(
        _token_ids(cfg.eos_token_id if eos_token_id is None else eos_token_id, "eos_token_id", cfg.d_vocab)
    )
    start_id = _token_ids(
        cfg.decoder_start_token_id if decoder_start_token_id is None else decoder_start_token_id,
        "decoder_start_token_id",
        cfg.d_vocab,
    )[0]
    pad = _token_ids(cfg.pad_token_id if pad_token_id is None else pad_token_id, "pad_token_id", cfg.d_vocab)[0]
    forced = (
        None if forced_eos_token_id is None else _token_ids(forced_eos_token_id, "forced_eos_token_id", cfg.d_vocab)[0]
    )
    from_text = isinstance(tokens, str) or (
        isinstance(tokens, list) and tokens and all(isinstance(t, str) for t in tokens)
    )
    source = model.encode(tokens, attention_mask)
    batch = source.encoder_out.shape[0]
    device = source.encoder_out.device
    eos = eos.to(device)
    if num_beams == 1:
        start = torch.full((batch, 1), start_id, dtype=torch.long, device=device)
        ids = greedy_search(_Decoder(model, source, use_kv_cache), start, max_new_tokens, eos, pad, forced, verbose)
    else:
        rows = torch.arange(batch, device=device).repeat_interleave(num_beams)
        start = torch.full((batch * num_beams, 1), start_id, dtype=torch.long, device=device)
        ids = beam_search(
            _Decoder(model, source.repeat_rows(rows), use_kv_cache),
            start,
            max_new_tokens,
            eos,
            pad,
            num_beams,
            float(length_penalty),
            early_stopping,
            forced,
            verbose,
        )
    if from_text:
        texts = model.to_string(ids)
        return texts[0] if isinstance(tokens, str) else texts
    return ids


__all__ = ["beam_search", "generate", "greedy_search"]
