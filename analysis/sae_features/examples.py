"""The top-activating examples of each feature, kept while streaming, each with a window of context.

``StreamingTopExamples`` is ``analysis.readouts.neurons.StreamingTopK`` with a payload: beside the
``k`` largest activations of each feature and where they occurred (text, position), it keeps
the tokens of a window around each (``left`` tokens before, ``right`` after, within the
same text) and the feature's activation on every token of that window. Each ``update``
merges one batch's own top ``k`` into the running top ``k``: memory is
``O(features * k * window)`` plus one batch, whatever the amount of text; the result equals
a top-``k`` over the whole activation tensor (up to the order of ties).
"""

from dataclasses import dataclass

import einops
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

PAD = -1  # token id of a window slot outside its text


@dataclass
class FeatureExamples:
    """Each feature's ``k`` top examples, largest first (``[feature, k]``; windows ``[feature, k, window]``).

    ``values[i, j]`` is the activation of feature ``features[i]`` at position ``position[i, j]``
    of text ``text_index[i, j]`` (counted over every batch fed in). ``window_tokens[i, j]`` are
    the token ids of positions ``position - left .. position + right`` (``PAD = -1`` outside
    the text) and ``window_acts[i, j]`` the feature's activation on each (0 outside). Slots a
    feature never filled (fewer eligible positions than ``k``) have value ``-inf``.
    """

    features: Int[Tensor, "feature"]
    values: Float[Tensor, "feature k"]
    text_index: Int[Tensor, "feature k"]
    position: Int[Tensor, "feature k"]
    window_tokens: Int[Tensor, "feature k window"]
    window_acts: Float[Tensor, "feature k window"]
    left: int
    right: int

    def row(self, feature: int) -> int:
        """Index into the ``feature`` axis of ``feature`` (a feature number, as in ``features``)."""
        match = (self.features == feature).nonzero()
        if len(match) == 0:
            raise KeyError(f"feature {feature} was not followed; followed features: {self.features.tolist()[:20]}")
        return int(match[0, 0])


class StreamingTopExamples:
    """Keep the ``k`` largest activations per feature, with their windows, over any number of batches."""

    def __init__(self, k: int, features: Tensor, left: int = 8, right: int = 4):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        for name, value in (("left", left), ("right", right)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} (window tokens) must be an int >= 0, got {value!r}")
        self.k, self.features, self.left, self.right = k, features, left, right
        n, window = len(features), left + right + 1
        self.values = torch.empty(n, 0)
        self.text_index = torch.empty(n, 0, dtype=torch.long)
        self.position = torch.empty(n, 0, dtype=torch.long)
        self.window_tokens = torch.empty(n, 0, window, dtype=torch.long)
        self.window_acts = torch.empty(n, 0, window)
        self.n_texts = 0

    def update(
        self,
        acts: Float[Tensor, "batch pos feature"],
        tokens: Int[Tensor, "batch pos"],
        eligible: Bool[Tensor, "batch pos"] | None = None,
    ) -> None:
        """Merge the next ``batch`` texts: their feature activations (the followed features, in order) and tokens.

        Positions where ``eligible`` is False (the BOS, say) are never chosen, but still
        show in windows.
        """
        batch, n_pos, n_features = acts.shape
        if n_features != len(self.features) or tuple(tokens.shape) != (batch, n_pos):
            raise ValueError(
                f"acts {tuple(acts.shape)} must be [batch, pos, {len(self.features)}] with tokens [batch, pos], "
                f"got tokens {tuple(tokens.shape)}"
            )
        acts, tokens = acts.detach().cpu().float(), tokens.cpu().long()
        ranked = acts if eligible is None else acts.masked_fill(~eligible.cpu()[..., None], float("-inf"))
        flat = einops.rearrange(ranked, "batch pos feature -> feature (batch pos)")
        top = flat.topk(min(self.k, flat.shape[1]), dim=1)
        text, position = top.indices // n_pos, top.indices % n_pos
        offsets = torch.arange(-self.left, self.right + 1)
        window_pos = position[..., None] + offsets  # [feature, k, window]
        inside = (window_pos >= 0) & (window_pos < n_pos)
        clamped = window_pos.clamp(0, n_pos - 1)
        window_tokens = tokens[text[..., None], clamped].masked_fill(~inside, PAD)
        feature = torch.arange(n_features)[:, None, None]
        window_acts = acts[text[..., None], clamped, feature].masked_fill(~inside, 0.0)
        self._merge(top.values, text + self.n_texts, position, window_tokens, window_acts)
        self.n_texts += batch

    def _merge(self, values, text_index, position, window_tokens, window_acts) -> None:
        values = torch.cat([self.values, values], dim=1)
        best = values.topk(min(self.k, values.shape[1]), dim=1).indices
        pick = lambda old, new: torch.cat([old, new], dim=1).gather(1, best)  # noqa: E731
        pick_window = lambda old, new: torch.cat([old, new], dim=1).gather(  # noqa: E731
            1, best[..., None].expand(-1, -1, new.shape[-1])
        )
        self.values = values.gather(1, best)
        self.text_index, self.position = pick(self.text_index, text_index), pick(self.position, position)
        self.window_tokens = pick_window(self.window_tokens, window_tokens)
        self.window_acts = pick_window(self.window_acts, window_acts)

    def result(self) -> FeatureExamples:
        if self.n_texts == 0:
            raise ValueError("StreamingTopExamples.result(): no activations were fed in")
        return FeatureExamples(
            self.features,
            self.values,
            self.text_index,
            self.position,
            self.window_tokens,
            self.window_acts,
            self.left,
            self.right,
        )


__all__ = ["FeatureExamples", "PAD", "StreamingTopExamples"]
