"""Steering vectors: from contrastive prompts, from one pair, or from a dictionary feature.

Each function returns a ``SteeringVector``: the vector, the hook it was read at (where it is meant to be added)
and how it was made.

- ``difference_of_means(model, positive, negative, hook)``: ``mean_i a(positive_i) - mean_j a(negative_j)``, where
  ``a(text)`` is the activation at ``hook`` at the text's last token (``read="last"``) or averaged over its tokens
  after BOS (``read="mean"``). The sets need not be paired or of equal size.
- ``caa_vector(model, pairs, hook)``: contrastive activation addition (Rimsky et al. 2024). Each pair is
  ``(prompt, positive answer, negative answer)``; the vector is the mean over pairs of
  ``a(prompt + positive) - a(prompt + negative)``, each read at the answer's tokens (averaged over them), so the
  prompt, shared by both, cancels except through what the answer changes.
- ``actadd_vector(model, positive, negative, hook)``: ActAdd (Turner et al. 2023), from one pair: the whole
  activation difference ``a(positive)[p] - a(negative)[p]`` at every position ``p``, a ``[n, d_model]`` vector
  added at the first ``n`` positions of a prompt. The shorter text is padded with the tokenizer's space token, as
  in the paper.
- ``feature_vector(sae_or_transcoder, feature)``: a dictionary feature's decoder direction (``W_dec[feature]``),
  for an SAE at its ``hook_name`` (or ``hook_name_out``: a transcoder writes there), or for a transcoder layer
  (``analysis.attribution_graphs.transcoders.LayerTranscoder``) at the MLP output it writes.

Texts are strings (tokenized with BOS, as the model reads prompts) or 1-D token ids (for a model without a
tokenizer). Texts of different lengths run together, padded on the left with their attention mask, so each row's
last tokens sit at the same negative positions.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .apply import check_hook, check_vector

Text = str | Sequence[int] | Tensor
READS = ("last", "mean")


@dataclass(frozen=True)
class SteeringVector:
    """A steering vector, the hook to add it at, and how it was made (``method``: ``"difference of means"``,
    ``"CAA"``, ``"ActAdd"`` or ``"feature"``). ``vector`` is ``[d_model]`` (ActAdd: ``[n, d_model]``)."""

    vector: Tensor
    hook: str
    method: str

    @property
    def norm(self) -> float:
        return float(self.vector.norm())


def _ids(model, text: Text, what: str, prepend_bos: bool = True) -> Tensor:
    """One text as 1-D token ids (BOS first for a str, as prompts are read)."""
    if isinstance(text, str):
        if not text.strip():
            raise ValueError(f"{what} is empty: every contrast text needs at least one token of its own")
        if model.tokenizer is None:
            raise TypeError(f"{what} is text, but {model.cfg.name} has no tokenizer: give token ids instead")
        return model.to_tokens(text, prepend_bos=prepend_bos)[0]
    ids = torch.as_tensor(text)
    if ids.is_floating_point() or ids.dtype == torch.bool or ids.ndim != 1:
        raise TypeError(f"{what} must be a str or 1-D integer token ids, got {ids.dtype} of shape {list(ids.shape)}")
    if ids.numel() == 0:
        raise ValueError(f"{what} has no tokens: every contrast text needs at least one")
    return model.prepare_tokens(ids[None])[0]


def _texts(texts, what: str) -> list:
    if isinstance(texts, (str, Tensor)) or not isinstance(texts, Sequence):
        raise TypeError(f"the {what} set must be a list of texts (or of token id lists), got {type(texts).__name__}")
    if len(texts) == 0:
        raise ValueError(f"the {what} set is empty: a contrast needs at least one {what} text")
    return list(texts)


def _left_padded(rows: list[Tensor]) -> tuple[Tensor, Tensor]:
    """``[batch, longest]`` ids padded on the left (with the rows' first ids, masked) and their mask."""
    longest = max(len(row) for row in rows)
    tokens = torch.stack([torch.cat([row.new_full((longest - len(row),), int(row[0])), row]) for row in rows])
    mask = torch.stack([torch.arange(longest) >= longest - len(row) for row in rows]).long()
    return tokens, mask.to(tokens.device)


@torch.no_grad()
def activations(model, rows: list[Tensor], hook: str) -> tuple[Tensor, Tensor]:
    """``(acts [batch, longest, d_model], mask [batch, longest])`` at ``hook`` for the rows, padded on the left."""
    tokens, mask = _left_padded(rows)
    _, cache = model.run_with_cache(tokens, names_filter=[hook], attention_mask=mask)
    return cache[hook], mask


def _read_tail(model, rows: list[Tensor], tails: list[int], hook: str) -> Tensor:
    """``[batch, d_model]``: each row's activation averaged over its last ``tails[i]`` positions."""
    acts, _ = activations(model, rows, hook)
    longest = acts.shape[1]
    keep = torch.stack([torch.arange(longest) >= longest - tail for tail in tails]).to(acts)  # [batch, longest]
    return (acts * keep[..., None]).sum(dim=1) / keep.sum(dim=1, keepdim=True)


def _finish(model, vector: Tensor, hook: str, method: str) -> SteeringVector:
    return SteeringVector(check_vector(model, vector.to(model.W_E.dtype), f"{method} vector"), hook, method)


def difference_of_means(model, positive, negative, hook: str, read: str = "last") -> SteeringVector:
    """``mean(a(positive)) - mean(a(negative))`` at ``hook`` (module docstring); ``read``: ``"last"`` token or
    ``"mean"`` over the tokens after BOS."""
    hook = check_hook(model, hook)
    if read not in READS:
        raise ValueError(f"read must be one of {READS}, got {read!r}")
    means = []
    for what, texts in (("positive", positive), ("negative", negative)):
        rows = [_ids(model, text, f"{what} text {i}") for i, text in enumerate(_texts(texts, what))]
        bos = 1 if (read == "mean" and isinstance(texts[0], str)) else 0
        tails = [1 if read == "last" else max(len(row) - bos, 1) for row in rows]
        means.append(_read_tail(model, rows, tails, hook).mean(dim=0))
    return _finish(model, means[0] - means[1], hook, "difference of means")


def caa_vector(model, pairs: Sequence[tuple], hook: str) -> SteeringVector:
    """CAA: the mean over ``(prompt, positive answer, negative answer)`` pairs of the difference at the answers'
    tokens (module docstring)."""
    hook = check_hook(model, hook)
    pairs = _texts(pairs, "CAA pair")
    rows, tails = {"positive": [], "negative": []}, {"positive": [], "negative": []}
    for i, pair in enumerate(pairs):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 3):
            raise TypeError(f"CAA pair {i} must be (prompt, positive answer, negative answer), got {pair!r}")
        prompt = _ids(model, pair[0], f"prompt of CAA pair {i}")
        for what, answer in (("positive", pair[1]), ("negative", pair[2])):
            ids = _ids(model, answer, f"{what} answer of CAA pair {i}", prepend_bos=False)
            rows[what].append(torch.cat([prompt, ids]))
            tails[what].append(len(ids))
    positive = _read_tail(model, rows["positive"], tails["positive"], hook)
    negative = _read_tail(model, rows["negative"], tails["negative"], hook)
    return _finish(model, (positive - negative).mean(dim=0), hook, "CAA")


def _space_id(model) -> int:
    ids = model.to_tokens(" ", prepend_bos=False)[0] if model.tokenizer is not None else []
    if len(ids) != 1:
        raise ValueError(
            "ActAdd pads the shorter text with spaces, but this tokenizer has no single space token: give two texts "
            "of the same token length"
        )
    return int(ids[0])


@torch.no_grad()
def actadd_vector(model, positive: Text, negative: Text, hook: str) -> SteeringVector:
    """ActAdd from one pair: ``a(positive) - a(negative)`` at every position, ``[n, d_model]`` (module docstring)."""
    hook = check_hook(model, hook)
    rows = [_ids(model, positive, "the positive text"), _ids(model, negative, "the negative text")]
    if len(rows[0]) != len(rows[1]):
        if not all(isinstance(text, str) for text in (positive, negative)):
            raise ValueError(
                f"ActAdd subtracts position by position: the token ids have lengths {len(rows[0])} and "
                f"{len(rows[1])}; give two of the same length"
            )
        longest, space = max(len(row) for row in rows), _space_id(model)
        rows = [torch.cat([row, row.new_full((longest - len(row),), space)]) for row in rows]
    _, cache = model.run_with_cache(torch.stack(rows), names_filter=[hook])
    return _finish(model, cache[hook][0] - cache[hook][1], hook, "ActAdd")


def feature_vector(source, feature: int, hook: str | None = None, model=None) -> SteeringVector:
    """A dictionary feature's decoder direction (module docstring).

    ``source`` is an ``interp_transformer.sae.SAE`` (the direction ``W_dec[feature]``, added at ``hook_name_out``
    when the config names one, as a transcoder writes there, else at ``hook_name``) or a ``LayerTranscoder``
    (``decoders[feature, 0]``, added at the MLP output it writes). ``hook`` overrides the hook; with ``model``
    the vector is checked against it (width, dtype, finiteness) and the hook name too."""
    if hasattr(source, "W_dec") and hasattr(source, "cfg"):
        directions = source.W_dec
        default = getattr(source.cfg, "hook_name_out", None) or source.cfg.hook_name
    elif hasattr(source, "decoders") and hasattr(source, "writes"):
        directions, default = source.decoders[:, 0], source.writes
    else:
        raise TypeError(f"feature_vector takes an SAE or a LayerTranscoder, got {type(source).__name__}")
    n_features = directions.shape[0]
    if isinstance(feature, bool) or not isinstance(feature, int) or not 0 <= feature < n_features:
        raise ValueError(f"feature must be an int in [0, {n_features}) (the dictionary's features), got {feature!r}")
    vector, hook = directions[feature].detach().clone(), hook or default
    if hook is None:
        raise ValueError("the SAE's config names no hook: pass hook= (where to add the direction)")
    if model is None:
        return SteeringVector(vector, hook, "feature")
    return SteeringVector(check_vector(model, vector, "feature vector"), check_hook(model, hook), "feature")


__all__ = [
    "READS",
    "SteeringVector",
    "activations",
    "actadd_vector",
    "caa_vector",
    "difference_of_means",
    "feature_vector",
]
