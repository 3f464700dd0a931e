"""Head detection with TransformerLens' ``detect_head`` (``transformer_lens.head_detector``): its arguments and scores.

``detect_head(model, seq, detection_pattern)`` compares every head's attention pattern on
``seq`` with a detection pattern ``[pos, pos]`` (lower triangular) and returns
``[layer, head_index]`` scores:

- ``error_measure="mul"`` (default): ``sum(pattern * detection) / sum(pattern)``, the share
  of the head's attention on the detection pattern's entries;
- ``error_measure="abs"``: ``1 - round(mean(|pattern - detection|) * pos, 3)``, in ``(-1, 1]``.

``exclude_bos`` ignores attention to position 0, ``exclude_current_token`` the diagonal.
``detection_pattern`` is a tensor or one of ``HEAD_NAMES`` (built from the tokens:
``get_previous_token_head_detection_pattern`` and friends); a list of texts gives the mean
of their scores. ``heads`` (a list of ``(layer, head)`` or a dict ``layer -> heads``)
scores only those (the others are -1). For our own detectors (batched, masked, with
plots) see ``analysis.readouts.attention``.
"""

import logging
from collections import defaultdict
from typing import Literal

import torch
from torch import Tensor

from interp_transformer.compat.errors import CompatValueError
from interp_transformer.compat.utils_tensors import is_lower_triangular, is_square

HeadName = Literal["previous_token_head", "duplicate_token_head", "induction_head"]
HEAD_NAMES: list[str] = ["previous_token_head", "duplicate_token_head", "induction_head"]
ErrorMeasure = Literal["abs", "mul"]
LayerHeadTuple = tuple[int, int]
LayerToHead = dict[int, list[int]]

SEQ_LEN_ERR = "The sequence must be non-empty and must fit within the model's context window."
DET_PAT_NOT_SQUARE_ERR = (
    "The detection pattern must be a lower triangular matrix of shape (sequence_length, "
    "sequence_length); "
    "sequence_length=%d; got detection pattern of shape %s"
)


def detect_head(
    model,
    seq: str | list[str],
    detection_pattern: Tensor | str,
    heads: list[LayerHeadTuple] | LayerToHead | None = None,
    cache=None,
    *,
    exclude_bos: bool = False,
    exclude_current_token: bool = False,
    error_measure: str = "mul",
) -> Tensor:
    """Scores ``[layer, head_index]`` of every head (or of ``heads``) against ``detection_pattern`` (module
    docstring)."""
    if error_measure not in ("abs", "mul"):
        raise CompatValueError(f"Invalid error_measure={error_measure!r}; valid values are ('abs', 'mul')")
    if isinstance(detection_pattern, str):
        if detection_pattern not in HEAD_NAMES:
            raise CompatValueError(
                f"detection_pattern must be a Tensor or one of head names: {HEAD_NAMES}; got {detection_pattern!r}"
            )
        if isinstance(seq, list):
            scores = [
                detect_head(
                    model,
                    text,
                    detection_pattern,
                    heads,
                    exclude_bos=exclude_bos,
                    exclude_current_token=exclude_current_token,
                    error_measure=error_measure,
                )
                for text in seq
            ]
            return torch.stack(scores).mean(0)
        tokens = model.to_tokens(seq)
        detection_pattern = PATTERN_BUILDERS[detection_pattern](tokens.cpu())
    elif not isinstance(detection_pattern, Tensor):
        raise TypeError(
            f"detection_pattern must be a Tensor or one of {HEAD_NAMES}, got {type(detection_pattern).__name__}"
        )
    else:
        tokens = model.to_tokens(seq)
    seq_len = tokens.shape[-1]
    if not 1 < seq_len < model.cfg.n_ctx:
        raise CompatValueError(f"{SEQ_LEN_ERR} Got {seq_len} tokens, n_ctx={model.cfg.n_ctx}.")
    detection_pattern = detection_pattern.detach().cpu()
    if not (is_lower_triangular(detection_pattern) and seq_len == detection_pattern.shape[0]):
        raise CompatValueError(DET_PAT_NOT_SQUARE_ERR % (seq_len, tuple(detection_pattern.shape)))
    if error_measure == "mul" and not set(detection_pattern.unique().tolist()) <= {0, 1}:
        logging.warning("Using detection pattern with values other than 0 or 1 with error_measure 'mul'")
    if cache is None:
        _, cache = model.run_with_cache(
            tokens, remove_batch_dim=True, names_filter=lambda name: name.endswith("hook_pattern")
        )
    matches = -torch.ones(model.cfg.n_layers, model.cfg.n_heads)
    for layer, layer_heads in _layer_to_heads(heads, model.cfg.n_layers, model.cfg.n_heads).items():
        patterns = cache["pattern", layer]
        patterns = patterns[0] if patterns.ndim == 4 else patterns
        for head in layer_heads:
            matches[layer, head] = compute_head_attention_similarity_score(
                patterns[head].detach().cpu().float(),
                detection_pattern.float(),
                exclude_bos=exclude_bos,
                exclude_current_token=exclude_current_token,
                error_measure=error_measure,
            )
    return matches


def _layer_to_heads(heads, n_layers: int, n_heads: int) -> dict:
    if heads is None:
        return {layer: list(range(n_heads)) for layer in range(n_layers)}
    if isinstance(heads, dict):
        return heads
    layer_to_heads = defaultdict(list)
    for layer, head in heads:
        layer_to_heads[layer].append(head)
    return layer_to_heads


def get_previous_token_head_detection_pattern(tokens: Tensor) -> Tensor:
    """1 where a query attends to the token just before it: ``[pos, pos]``."""
    pos = tokens.shape[-1]
    pattern = torch.zeros(pos, pos)
    pattern[1:, :-1] = torch.eye(pos - 1)
    return torch.tril(pattern)


def get_duplicate_token_head_detection_pattern(tokens: Tensor) -> Tensor:
    """1 where a query attends to an earlier occurrence of its own token: ``[pos, pos]``."""
    ids = tokens.reshape(-1)
    same = (ids[:, None] == ids[None, :]).float()
    same.fill_diagonal_(0)  # a token is always a duplicate of itself: not counted
    return torch.tril(same)


def get_induction_head_detection_pattern(tokens: Tensor) -> Tensor:
    """1 where a query attends to the token after an earlier occurrence of its own token: ``[pos, pos]``."""
    duplicate = get_duplicate_token_head_detection_pattern(tokens)
    shifted = torch.roll(duplicate, shifts=1, dims=1)
    return torch.tril(torch.cat([torch.zeros(duplicate.shape[0], 1), shifted[:, 1:]], dim=1))


PATTERN_BUILDERS = {
    "previous_token_head": get_previous_token_head_detection_pattern,
    "duplicate_token_head": get_duplicate_token_head_detection_pattern,
    "induction_head": get_induction_head_detection_pattern,
}


def get_supported_heads() -> None:
    """Print the names of the built-in detection patterns."""
    print(f"Supported heads: {HEAD_NAMES}")


def compute_head_attention_similarity_score(
    attention_pattern: Tensor,
    detection_pattern: Tensor,
    *,
    exclude_bos: bool,
    exclude_current_token: bool,
    error_measure: str,
) -> float:
    """The score of one head's pattern ``[query_pos, key_pos]`` against ``detection_pattern`` (module docstring)."""
    if not is_square(attention_pattern):
        raise CompatValueError(f"Attention pattern is not square; got shape {tuple(attention_pattern.shape)}")
    attention_pattern = attention_pattern.clone()  # the cache's pattern stays as it is
    if error_measure == "mul":
        if exclude_bos:
            attention_pattern[:, 0] = 0
        if exclude_current_token:
            attention_pattern.fill_diagonal_(0)
        return ((attention_pattern * detection_pattern).sum() / attention_pattern.sum()).item()
    abs_diff = (attention_pattern - detection_pattern).abs()
    if exclude_bos:
        abs_diff[:, 0] = 0
    if exclude_current_token:
        abs_diff.fill_diagonal_(0)
    return 1 - round((abs_diff.mean() * len(abs_diff)).item(), 3)


__all__ = [
    "HEAD_NAMES",
    "ErrorMeasure",
    "HeadName",
    "compute_head_attention_similarity_score",
    "detect_head",
    "get_duplicate_token_head_detection_pattern",
    "get_induction_head_detection_pattern",
    "get_previous_token_head_detection_pattern",
    "get_supported_heads",
]
