"""Cross-attention: where each target position of an encoder-decoder reads the source, and how well that follows an
alignment.

A cross-attention pattern ``[batch, head_index, query_pos, key_pos]`` has one row per target
position (the decoder's input) and one column per source position; row ``t`` is where
the decoder looks while predicting the target token after position ``t``.

**Alignment score.** Given an alignment, the source position ``a[b, t]`` each target
position should read (``-1``: none, e.g. a digit 0 that no word spells), a head scores::

    score = mean_{batch, t : a[b, t] >= 0}  pattern[b, head, t, a[b, t]]

1 when it puts all its attention on the aligned word every time; a head spreading
attention over ``n`` source words scores about ``1 / n``.

**Diagonality.** Without a known alignment, the proportional diagonal is the alignment
of two sequences read at the same pace: target position ``t`` of ``T`` reads source
position ``round(t (S - 1) / (T - 1))`` of the ``S`` real ones. ``diagonality_scores`` is
the attention mass within ``window`` source positions of it, averaged like the alignment
score: 1 for a head that reads the source in step with the target, low for one that reorders.
"""

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp_transformer import ActivationCache

from .. import _checks


def require_cross_attention(model, analysis: str) -> None:
    """``TypeError`` unless ``model`` is an encoder-decoder (``model.has_cross_attention``)."""
    if not model.writers_that("reads_source"):
        raise TypeError(
            f"{analysis} reads cross-attention, which only an encoder-decoder has; no block of this "
            f"{type(model).__name__} attends to another stack (model.has_cross_attention is False)"
        )


def cross_pattern_hook_names(model) -> list[str]:
    """The cross-attention ``hook_pattern`` of every decoder layer: the ``names_filter`` these tools need."""
    require_cross_attention(model, "cross_pattern_hook_names")
    return [model.act_name("pattern", layer, "cross") for layer in range(model.cfg.n_decoder_layers)]


def cross_attention_patterns(cache: ActivationCache) -> Float[Tensor, "layer batch head_index query_pos key_pos"]:
    """Every decoder layer's cross-attention pattern, stacked; ``query_pos`` over the target, ``key_pos`` over the
    source."""
    _checks.check_cache(cache)
    names = cross_pattern_hook_names(cache.model)
    _checks.require_hooks(cache, names, "cross_attention_patterns")
    return torch.stack([_checks.cached(cache, name) for name in names])


def _check_alignment(alignment, patterns: Tensor) -> Tensor:
    batch, n_target, n_source = patterns.shape[1], patterns.shape[3], patterns.shape[4]
    if not isinstance(alignment, Tensor):
        alignment = torch.as_tensor(alignment)
    if alignment.is_floating_point() or alignment.dtype == torch.bool:
        raise TypeError(f"alignment must hold integer source positions (-1: none), got dtype {alignment.dtype}")
    if alignment.ndim == 1:
        alignment = alignment.unsqueeze(0)
    if tuple(alignment.shape) != (batch, n_target):
        raise ValueError(
            f"alignment must be [batch, query_pos] = [{batch}, {n_target}] (one source position per target "
            f"position), got shape {tuple(alignment.shape)}"
        )
    if int(alignment.max()) >= n_source or int(alignment.min()) < -1:
        raise ValueError(
            f"alignment entries must lie in [-1, {n_source}) (source positions, -1 for none), got "
            f"{alignment.min().item()}..{alignment.max().item()}"
        )
    if not bool((alignment >= 0).any()):
        raise ValueError("alignment has no aligned position (every entry is -1): there is nothing to score")
    return alignment.to(patterns.device)


def attention_on_alignment(
    patterns: Float[Tensor, "layer batch head_index query_pos key_pos"], alignment: Int[Tensor, "batch query_pos"]
) -> Float[Tensor, "layer head_index"]:
    """The alignment score of every head, from stacked patterns (see the module docstring)."""
    alignment = _check_alignment(alignment, patterns)
    aligned = alignment >= 0
    index = alignment.clamp(min=0)[None, :, None, :, None].expand(*patterns.shape[:4], 1)
    on_target = patterns.gather(-1, index)[..., 0]  # [layer, batch, head_index, query_pos]
    weights = aligned[None, :, None, :].to(patterns.dtype)
    return (on_target * weights).sum(dim=(1, 3)) / weights.sum(dim=(1, 3))


def alignment_scores(
    cache: ActivationCache, alignment: Int[Tensor, "batch query_pos"]
) -> Float[Tensor, "layer head_index"]:
    """How much of each cross-attention head's attention lands on the aligned source word (see the module docstring)."""
    return attention_on_alignment(cross_attention_patterns(cache), alignment)


def diagonal_alignment(n_target: int, source_lengths: Int[Tensor, "batch"]) -> Int[Tensor, "batch query_pos"]:
    """The proportional diagonal: target ``t`` of ``n_target`` reads source ``round(t (S - 1) / (n_target - 1))``."""
    if isinstance(n_target, bool) or not isinstance(n_target, int) or n_target < 1:
        raise ValueError(f"n_target must be a positive int, got {n_target!r}")
    lengths = torch.as_tensor(source_lengths)
    steps = torch.arange(n_target, dtype=torch.float64) / max(n_target - 1, 1)
    return torch.round(steps[None, :] * (lengths[:, None].to(torch.float64) - 1)).long()


def diagonality_scores(
    cache: ActivationCache, attention_mask: Int[Tensor, "batch key_pos"] | None = None, window: int = 1
) -> Float[Tensor, "layer head_index"]:
    """Each head's attention mass within ``window`` source positions of the proportional diagonal (see the module
    docstring).

    ``attention_mask`` (1 real, 0 padding) gives each row's source length; without it every
    source position is real.
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"window must be an int >= 0, got {window!r}")
    patterns = cross_attention_patterns(cache)
    batch, n_target, n_source = patterns.shape[1], patterns.shape[3], patterns.shape[4]
    lengths = torch.full((batch,), n_source) if attention_mask is None else torch.as_tensor(attention_mask).sum(dim=-1)
    if lengths.shape != (batch,):
        raise ValueError(
            f"attention_mask must be [batch, key_pos] = [{batch}, {n_source}], got {tuple(attention_mask.shape)}"
        )
    centre = diagonal_alignment(n_target, lengths).to(patterns.device)  # [batch, query_pos]
    keys = torch.arange(n_source, device=patterns.device)
    # [batch, query_pos, key_pos]
    near = ((keys[None, None, :] - centre[:, :, None]).abs() <= window).to(patterns.dtype)
    mass = (patterns * near[None, :, None]).sum(dim=-1)  # [layer, batch, head_index, query_pos]
    return mass.mean(dim=(1, 3))


def best_heads(scores: Float[Tensor, "layer head_index"]) -> list[tuple[int, int, float]]:
    """``(layer, head, score)`` of the best head of each layer, in layer order."""
    return [(layer, int(row.argmax()), float(row.max())) for layer, row in enumerate(scores)]


__all__ = [
    "alignment_scores",
    "attention_on_alignment",
    "best_heads",
    "cross_attention_patterns",
    "cross_pattern_hook_names",
    "diagonal_alignment",
    "diagonality_scores",
    "require_cross_attention",
]
