"""Attention patterns, attention entropy and head detectors.

A head detector asks, for every head, how much of its attention lands where a
*target pattern* says it should. A target is a ``[query_pos, key_pos]`` (or
``[batch, query_pos, key_pos]``) mask ``T`` with values in ``[0, 1]``; the score
of head ``(layer, head_index)`` is the mean, over the query rows that have any
target, of the attention mass on the target::

    score = mean_{batch, query_pos : sum_k T[q, k] > 0}  sum_{key_pos} pattern[q, k] * T[q, k]

A head that attends only to its targets scores 1; a uniform head scores about
``1 / (q + 1)`` per target. Built-in targets:

- previous token: ``T[q, k] = 1`` if ``k = q - 1``;
- next token (encoders only): ``T[q, k] = 1`` if ``k = q + 1``;
- duplicate token: ``T[q, k] = 1`` if ``k < q`` and ``tokens[k] == tokens[q]``
  (``k != q`` for an encoder, which sees copies on both sides);
- induction: ``T[q, k] = 1`` if ``1 <= k <= q`` and ``tokens[k - 1] == tokens[q]``
  (attend to the token after an earlier copy of the current one), measured on
  repeated random token sequences from ``repeated_random_tokens``.

Bidirectional models (``model.capabilities.causal`` False: encoders) attend in both
directions, so their targets may mark later keys. A padded batch needs its ``attention_mask`` ``[batch, pos]`` (1 real,
0
padding): padding query rows leave the mean, and target entries on padding keys are
dropped (the padding id repeats, so a duplicate-token target would otherwise reward
padding attending to padding).

How this differs from TransformerLens' ``detect_head``: rows without any target
are left out of the mean (TransformerLens divides by every row, so a perfect
previous-token head scores ``(pos - 1) / pos`` there and exactly 1 here), and
targets that point at future keys, which causal attention can never reach, are
an error for a decoder rather than a silent zero.
"""

import numbers

import einops
import torch
from jaxtyping import Float, Int, Shaped
from torch import Tensor

from interp_transformer import ActivationCache
from interp_transformer.core.shape_checks import shape_checked

from .. import _checks


def pattern_hook_names(model: _checks.AnyModel, layers=None) -> list[str]:
    """The ``hook_pattern`` names of ``layers`` (default: all): the ``names_filter`` detectors need."""
    return [model.act_name("pattern", layer) for layer in _checks.layer_list(model, layers)]


def _patterns(cache: ActivationCache, analysis: str):
    """Yield ``(layer, pattern [batch, head_index, query_pos, key_pos])`` for every layer."""
    _checks.check_cache(cache)
    names = pattern_hook_names(cache.model)
    _checks.require_hooks(cache, names, analysis)
    for layer, name in enumerate(names):
        yield layer, _checks.cached(cache, name)


def attention_pattern(
    cache: ActivationCache, layer: int, head: int | None = None
) -> Float[Tensor, "batch head_index query_pos key_pos"] | Float[Tensor, "batch query_pos key_pos"]:
    """The attention pattern of ``layer`` (all heads) or of one ``head``, with a batch axis.

    ``pattern[b, h, q, k]`` is the softmax weight query position ``q`` puts on key position ``k``.
    """
    _checks.check_cache(cache)
    layer = _checks.layer_index(cache.model, layer)
    name = cache.model.act_name("pattern", layer)
    _checks.require_hooks(cache, [name], "attention_pattern")
    pattern = _checks.cached(cache, name)
    return pattern if head is None else pattern[:, _checks.head_index(cache.model, head)]


def attention_entropy(
    cache: ActivationCache, per_position: bool = False
) -> Float[Tensor, "layer head_index *query_pos"]:
    """Entropy (nats) of each head's attention distribution, ``-sum_k p[q, k] log p[q, k]``.

    Averaged over batch and query positions: ``[layer, head_index]``; with
    ``per_position=True`` averaged over batch only: ``[layer, head_index, query_pos]``.
    In a decoder query ``q`` sees ``q + 1`` keys, so its entropy lies in ``[0, log(q + 1)]``;
    in an encoder every query sees every real key (``[0, log(n_real)]``). Padding query
    rows are averaged like any other: use an unpadded cache for a clean number.
    """
    entropies = []
    for _, pattern in _patterns(cache, "attention_entropy"):
        # xlogy gives 0 log 0 = 0 for the masked (future) keys
        entropy = -torch.special.xlogy(pattern, pattern).sum(dim=-1)  # [batch, head_index, query_pos]
        entropies.append(entropy.mean(dim=0) if per_position else entropy.mean(dim=(0, 2)))
    return torch.stack(entropies)


# ---- target patterns -------------------------------------------------------------------


def _check_tokens(tokens) -> Tensor:
    if not isinstance(tokens, Tensor) or tokens.is_floating_point() or tokens.dtype == torch.bool:
        raise TypeError(f"tokens must be an integer tensor [batch, pos], got {type(tokens).__name__}")
    if tokens.ndim == 1:
        tokens = tokens.unsqueeze(0)
    if tokens.ndim != 2:
        raise ValueError(f"tokens must have shape [batch, pos] (or [pos]), got {tuple(tokens.shape)}")
    return tokens


def previous_token_target(n_pos: int) -> Float[Tensor, "query_pos key_pos"]:
    """``T[q, k] = 1`` where ``k = q - 1``."""
    if isinstance(n_pos, bool) or not isinstance(n_pos, numbers.Integral) or n_pos < 1:
        raise ValueError(f"n_pos must be a positive int, got {n_pos!r}")
    return torch.diag(torch.ones(n_pos - 1), diagonal=-1)


def next_token_target(n_pos: int) -> Float[Tensor, "query_pos key_pos"]:
    """``T[q, k] = 1`` where ``k = q + 1``: a later key, which only an encoder's attention reaches."""
    return previous_token_target(n_pos).T.contiguous()


def duplicate_token_target(
    tokens: Int[Tensor, "batch pos"], bidirectional: bool = False
) -> Float[Tensor, "batch query_pos key_pos"]:
    """``T[b, q, k] = 1`` where ``k < q`` (``k != q`` if ``bidirectional``) and ``tokens[b, k] == tokens[b, q]``."""
    tokens = _check_tokens(tokens)
    same = tokens[:, :, None] == tokens[:, None, :]
    n_pos = tokens.shape[1]
    if bidirectional:
        allowed = ~torch.eye(n_pos, dtype=torch.bool, device=tokens.device)
    else:
        allowed = torch.ones(n_pos, n_pos, dtype=torch.bool, device=tokens.device).tril(-1)
    return (same & allowed).float()


def induction_target(tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch query_pos key_pos"]:
    """``T[b, q, k] = 1`` where ``1 <= k <= q`` and ``tokens[b, k - 1] == tokens[b, q]``."""
    tokens = _check_tokens(tokens)
    n_pos = tokens.shape[1]
    target = torch.zeros(tokens.shape[0], n_pos, n_pos, device=tokens.device)
    # key k follows token k-1; it is a target when that token equals the query's token
    target[:, :, 1:] = (tokens[:, :, None] == tokens[:, None, :-1]).float()
    return target * torch.ones(n_pos, n_pos, device=tokens.device).tril()


def repeated_random_tokens(
    model: _checks.AnyModel,
    seq_len: int,
    batch: int = 1,
    seed: int = 0,
    bos: int | None = None,
    eos: int | None = None,
) -> Int[Tensor, "batch pos"]:
    """``[bos?, x_1 .. x_n, x_1 .. x_n, eos?]``: ``n = seq_len`` uniform random tokens, repeated.

    The same ``seed`` gives the same tokens. With ``bos`` set, that id is prepended and
    never drawn among the random tokens; ``eos`` likewise, appended (an encoder's
    ``[CLS] ... [SEP]``). ``pos = 2 * seq_len`` (+ 1 for each of ``bos`` and ``eos``).
    """
    _checks.check_model(model)
    for name, value in (("seq_len", seq_len), ("batch", batch)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    n_pos = 2 * seq_len + (bos is not None) + (eos is not None)
    if n_pos > model.cfg.n_ctx:
        extra = "".join(f" + 1 ({name})" for name, value in (("bos", bos), ("eos", eos)) if value is not None)
        raise ValueError(f"2*seq_len{extra} = {n_pos} exceeds n_ctx={model.cfg.n_ctx}")
    d_vocab = model.cfg.d_vocab
    for name, value in (("bos", bos), ("eos", eos)):
        if value is not None and (
            isinstance(value, bool) or not (isinstance(value, numbers.Integral) and 0 <= value < d_vocab)
        ):
            raise ValueError(f"{name} must be a token id in [0, d_vocab={d_vocab}), got {value!r}")
    excluded = sorted({int(value) for value in (bos, eos) if value is not None})
    generator = torch.Generator().manual_seed(seed)
    half = torch.randint(0, d_vocab - len(excluded), (batch, seq_len), generator=generator)
    for token_id in excluded:  # ascending, so each shift skips one excluded id
        half = half + (half >= token_id).long()
    parts = [half, half]
    if bos is not None:
        parts.insert(0, torch.full((batch, 1), bos))
    if eos is not None:
        parts.append(torch.full((batch, 1), eos))
    return torch.cat(parts, dim=1).to(model.W_E.device)


# ---- detectors ------------------------------------------------------------------------


def _check_target(target: Tensor, batch: int, n_pos: int, causal: bool) -> Tensor:
    if not isinstance(target, Tensor):
        raise TypeError(
            f"target must be a tensor [query_pos, key_pos] or [batch, query_pos, key_pos], got {type(target).__name__}"
        )
    target = target.float()
    if target.ndim == 2:
        target = target.unsqueeze(0)
    if target.ndim != 3 or target.shape[-2:] != (n_pos, n_pos) or target.shape[0] not in (1, batch):
        raise ValueError(
            f"target must have shape [{n_pos}, {n_pos}] or [{batch}, {n_pos}, {n_pos}] to match the cached "
            f"patterns [batch, head_index, query_pos, key_pos], got {tuple(target.shape)}"
        )
    if target.min() < 0 or target.max() > 1:
        raise ValueError(f"target values must lie in [0, 1], got range [{float(target.min())}, {float(target.max())}]")
    future = torch.ones(n_pos, n_pos, dtype=torch.bool, device=target.device).triu(1)
    if causal and target[:, future].any():
        raise ValueError(
            "target marks key positions after the query (key_pos > query_pos), which causal attention never reaches"
        )
    return target


def _check_mask(attention_mask, batch: int, n_pos: int) -> Tensor | None:
    """``attention_mask`` ``[batch, pos]`` of 0/1 (or bool) as a bool tensor; ``None`` stays ``None``."""
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, Tensor) or attention_mask.is_floating_point():
        raise TypeError(f"attention_mask must be an integer or bool tensor [batch, pos], got {attention_mask!r:.80}")
    if attention_mask.shape != (batch, n_pos):
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)}, the cached patterns need [{batch}, {n_pos}]"
        )
    if attention_mask.dtype != torch.bool and not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
        raise ValueError("attention_mask must hold 1 (real token) or 0 (padding) only")
    return attention_mask.bool()


@shape_checked
def detect_head(
    cache: ActivationCache,
    target: Shaped[Tensor, "*batch query_pos key_pos"],
    exclude_bos: bool = False,
    exclude_current_token: bool = False,
    attention_mask: Tensor | None = None,
) -> Float[Tensor, "layer head_index"]:
    """Score every head against a target pattern (see the module docstring for the formula).

    ``exclude_bos`` drops key position 0 from the target; ``exclude_current_token`` drops
    the diagonal ``k = q``. ``attention_mask`` (1 real, 0 padding) drops padding queries
    and padding keys. A decoder's target may not mark later keys; an encoder's may.
    Needs ``hook_pattern`` of every layer in the cache.
    """
    patterns = [pattern for _, pattern in _patterns(cache, "detect_head")]
    batch, _, n_pos, _ = patterns[0].shape
    causal = cache.model.capabilities.causal
    target = _check_target(target, batch, n_pos, causal).to(patterns[0].device).expand(batch, n_pos, n_pos)
    is_real = _check_mask(attention_mask, batch, n_pos)
    if is_real is not None:
        is_real = is_real.to(target.device)
        target = target * (is_real[:, :, None] & is_real[:, None, :])
    if exclude_bos:
        target = target.clone()
        target[..., 0] = 0
    if exclude_current_token:
        target = target * (1 - torch.eye(n_pos, device=target.device))
    rows = (target.sum(dim=-1) > 0).float()  # [batch, query_pos]: the queries that have a target
    if rows.sum() == 0:
        raise ValueError("the target pattern marks no position: every score would be 0/0")
    scores = []
    for pattern in patterns:
        mass = einops.einsum(pattern, target.to(pattern.dtype), "batch head_index q k, batch q k -> batch head_index q")
        scores.append(
            einops.einsum(mass, rows.to(mass.dtype), "batch head_index q, batch q -> head_index") / rows.sum()
        )
    return torch.stack(scores)


def previous_token_scores(
    cache: ActivationCache, attention_mask: Tensor | None = None
) -> Float[Tensor, "layer head_index"]:
    """Mean attention from each query to the key just before it (queries ``q >= 1``)."""
    n_pos = next(_patterns(cache, "previous_token_scores"))[1].shape[-1]
    return detect_head(cache, previous_token_target(n_pos), attention_mask=attention_mask)


def next_token_scores(
    cache: ActivationCache, attention_mask: Tensor | None = None
) -> Float[Tensor, "layer head_index"]:
    """Mean attention from each query to the key just after it: encoders only (a decoder never sees it)."""
    _checks.check_cache(cache)
    if cache.model.capabilities.causal:
        raise ValueError(
            "next_token_scores: causal attention never reaches the next token; this needs bidirectional attention"
        )
    n_pos = next(_patterns(cache, "next_token_scores"))[1].shape[-1]
    return detect_head(cache, next_token_target(n_pos), attention_mask=attention_mask)


def _tokens_and_mask(tokens, attention_mask) -> tuple[Tensor, Tensor | None]:
    """A tokenizer result (``TokensAndMask``, ``EncoderTokens``) brings its own mask; plain ids take
    ``attention_mask`` (default: no padding)."""
    if isinstance(tokens, tuple) and hasattr(tokens, "attention_mask"):
        if attention_mask is not None:
            raise ValueError(
                f"tokens is a {type(tokens).__name__}, which carries its own attention_mask: pass no other"
            )
        return tokens.tokens, tokens.attention_mask
    return tokens, attention_mask


def _tokens_of_cache(cache: ActivationCache, tokens) -> Tensor:
    tokens = _check_tokens(tokens)
    pattern = next(_patterns(cache, "token-based head detectors"))[1]
    if tokens.shape != (pattern.shape[0], pattern.shape[-1]):
        raise ValueError(
            f"tokens have shape {tuple(tokens.shape)} but the cache holds patterns of batch={pattern.shape[0]}, "
            f"pos={pattern.shape[-1]}: pass the tokens the cache was computed on"
        )
    return tokens.to(pattern.device)


def duplicate_token_scores(
    cache: ActivationCache,
    tokens: Int[Tensor, "batch pos"] | tuple,
    attention_mask: Tensor | None = None,
    bidirectional: bool | None = None,
) -> Float[Tensor, "layer head_index"]:
    """Mean attention to other copies of the query's token, over queries that have one.

    ``tokens`` must be the ``[batch, pos]`` ids the cache was computed on (or the model's
    tokenizer result, mask included). ``bidirectional`` (default: as the model attends,
    True for an encoder) counts later copies too; a decoder counts earlier ones only.
    """
    tokens, attention_mask = _tokens_and_mask(tokens, attention_mask)
    if bidirectional is None:
        bidirectional = not _checks.check_cache(cache).model.capabilities.causal
    target = duplicate_token_target(_tokens_of_cache(cache, tokens), bidirectional)
    return detect_head(cache, target, attention_mask=attention_mask)


def induction_scores(
    cache: ActivationCache, tokens: Int[Tensor, "batch pos"] | tuple, attention_mask: Tensor | None = None
) -> Float[Tensor, "layer head_index"]:
    """Mean attention to the token after an earlier copy of the query's token.

    ``tokens`` must be the ``[batch, pos]`` ids the cache was computed on (or the
    ``EncoderTokens``); repeated random sequences (``repeated_random_tokens``) give every
    query of the second half a target. On an encoder the target is the same (earlier
    copies only), although its attention could also reach later ones.
    """
    tokens, attention_mask = _tokens_and_mask(tokens, attention_mask)
    return detect_head(cache, induction_target(_tokens_of_cache(cache, tokens)), attention_mask=attention_mask)


def induction_head_scores(
    model: _checks.AnyModel, seq_len: int = 20, batch: int = 4, seed: int = 0, bos: int | None = None
) -> Float[Tensor, "layer head_index"]:
    """Run ``model`` on ``repeated_random_tokens(model, seq_len, batch, seed, bos)`` and score induction."""
    tokens = repeated_random_tokens(model, seq_len, batch, seed, bos)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=pattern_hook_names(model))
    return induction_scores(cache, tokens)
