"""Each feature's activation histogram, counted while streaming, in memory independent of the amount of text.

A feature is mostly zero; its histogram is of the nonzero activations, and the zeros are
counted apart (``n_zero``; the firing rate is ``1 - n_zero / n_total``). The range is not
known before the data is seen, so each feature's bins are aligned to a width ``w`` (a power
of two): bin ``i`` covers ``[(lo + i) w, (lo + i + 1) w)`` with ``lo = 0`` (``n_bins`` bins
from 0) or, once a negative value is seen, ``lo = -n_bins / 2`` (symmetric around 0). When a
value falls outside, ``w`` doubles and each pair of neighbouring bins merges into one: the
new edges are old edges, so every count stays exact. The result is the histogram of every
nonzero value with the final edges, as if all values had been kept.
"""

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor


@dataclass
class FeatureHistograms:
    """``counts [feature, n_bins]`` of nonzero activations between ``edges [feature, n_bins + 1]``; zeros apart."""

    features: Int[Tensor, "feature"]
    edges: Float[Tensor, "feature edge"]
    counts: Int[Tensor, "feature bin"]
    n_zero: Int[Tensor, "feature"]
    n_total: int

    @property
    def firing_rate(self) -> Float[Tensor, "feature"]:
        """The fraction of positions where each feature is nonzero."""
        return 1 - self.n_zero.double() / max(self.n_total, 1)


class StreamingHistogram:
    """Histograms of nonzero values per feature with doubling, aligned bins (module docstring)."""

    def __init__(self, features: Tensor, n_bins: int = 40):
        if isinstance(n_bins, bool) or not isinstance(n_bins, int) or n_bins < 4 or n_bins % 4:
            raise ValueError(f"n_bins must be a positive multiple of 4, got {n_bins!r}")
        n = len(features)
        self.features, self.n_bins = features, n_bins
        self.log2_width = torch.full((n,), -1000, dtype=torch.long)  # w = 2 ** log2_width; -1000: nothing seen yet
        self.lo = torch.zeros(n, dtype=torch.long)
        self.counts = torch.zeros(n, n_bins, dtype=torch.long)
        self.n_zero = torch.zeros(n, dtype=torch.long)
        self.n_total = 0

    def _width(self) -> Tensor:
        return torch.pow(2.0, self.log2_width.double())

    def _double(self, which: Tensor, to_signed: Tensor) -> None:
        """Double the width of the features in ``which`` (those in ``to_signed`` also become symmetric), merging
        bins."""
        old_k = self.lo[which, None] + torch.arange(self.n_bins)  # left edges in units of the old width
        new_lo = torch.where(to_signed[which], torch.full_like(self.lo[which], -self.n_bins // 2), self.lo[which])
        new_index = torch.div(old_k, 2, rounding_mode="floor") - new_lo[:, None]
        merged = torch.zeros_like(self.counts[which]).scatter_add_(1, new_index, self.counts[which])
        self.counts[which], self.lo[which] = merged, new_lo
        self.log2_width[which] += 1

    def update(self, values: Float[Tensor, "n feature"]) -> None:
        """Count ``values`` (rows of the followed features' activations, in order)."""
        values = values.detach().cpu().double()
        nonzero = values != 0
        self.n_total += values.shape[0]
        self.n_zero += (~nonzero).sum(dim=0)
        if not bool(nonzero.any()):
            return
        highest = values.clamp(min=0).max(dim=0).values
        lowest = values.clamp(max=0).min(dim=0).values
        largest = torch.maximum(highest, -lowest)
        negative = lowest < 0
        fresh = (self.log2_width == -1000) & (largest > 0)
        # a first width just below what the bins need; the loop below doubles it as far as needed
        self.log2_width[fresh] = torch.floor(torch.log2(largest[fresh] / self.n_bins)).long() - 1
        while True:
            width = self._width()
            to_signed = negative & (self.lo == 0) & (largest > 0)
            too_small = (highest >= (self.lo + self.n_bins) * width) | (lowest < self.lo * width)
            grow = (to_signed | too_small) & (largest > 0)
            if not bool(grow.any()):
                break
            self._double(grow, to_signed)
        index = torch.floor(values / self._width()).long() - self.lo
        rows, columns = nonzero.nonzero(as_tuple=True)
        self.counts.index_put_((columns, index[rows, columns]), torch.ones_like(rows), accumulate=True)

    def result(self) -> FeatureHistograms:
        width = self._width().masked_fill(self.log2_width == -1000, 1.0)
        edges = (self.lo[:, None] + torch.arange(self.n_bins + 1)) * width[:, None]
        return FeatureHistograms(self.features, edges.float(), self.counts.clone(), self.n_zero.clone(), self.n_total)


__all__ = ["FeatureHistograms", "StreamingHistogram"]
