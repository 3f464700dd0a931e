"""The clean and corrupted inputs edge attribution and circuits compare, for every kind of model.

A decoder (or encoder) reads ``[batch, pos]`` ids, clean and corrupted paired position by
position with one ``attention_mask`` (``batched``). An encoder-decoder reads pairs of a source and
a target, ``(source, target)`` or ``SourceTarget(source, target)``:

- ``source``: ids ``[batch, key_pos]`` (``[key_pos]``: one prompt) or texts, which the model's
  tokenizer pads with their own mask; ``attention_mask`` (1 real, 0 padding) is the source's and
  serves both runs;
- ``target``: the decoder's input ids ``[batch, pos]`` (``[pos]``: the same for every prompt;
  None: the decoder's start token alone). The metric reads the decoder's logits at its positions.

Clean and corrupted may differ in the source, the target or both, but each pair must have the same
token lengths, so that positions line up in both streams; a pair that does not is refused.
"""

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from interp_transformer.models.encoder_decoder.inputs import check_decoder_input

from .. import _checks
from .batched import _start


class SourceTarget(NamedTuple):
    """One side (clean or corrupted) of an encoder-decoder's prompts: the source and the decoder's input."""

    source: object  # ids [batch, key_pos] or texts
    target: object  # ids [batch, pos], or None: the decoder's start token


@dataclass(frozen=True)
class Runs:
    """What the model is called on: ``clean`` and ``corrupted`` positional inputs, one ``mask`` (the source's in an
    encoder-decoder) and, per stream of the graph (``graph.streams``), the mask of its positions."""

    model: object
    clean: tuple
    corrupted: tuple
    mask: Tensor | None
    stream_masks: tuple
    batch: int

    @property
    def kwargs(self) -> dict:
        return {} if self.mask is None else {"attention_mask": self.mask}

    def run(self, inputs: tuple, hooks: list) -> Tensor:
        """The logits of ``inputs`` with ``hooks``."""
        return self.model.run_with_hooks(*inputs, fwd_hooks=hooks, **self.kwargs)

    def cache(self, inputs: tuple, names: list[str]):
        """The activations ``names`` of a run on ``inputs``."""
        return self.model.run_with_cache(*inputs, names_filter=names, **self.kwargs)[1]


def _pair(value, what: str) -> SourceTarget:
    if isinstance(value, tuple) and len(value) == 2:
        return SourceTarget(*value)
    raise TypeError(
        f"{what}: an encoder-decoder reads (source, target) pairs, e.g. SourceTarget(source_ids, decoder_input); "
        f"got {type(value).__name__}"
    )


def _source(model, source, attention_mask, what: str) -> tuple[Tensor, Tensor | None]:
    texts = isinstance(source, str) or (isinstance(source, list) and bool(source) and isinstance(source[0], str))
    if texts and attention_mask is not None:
        raise ValueError(f"{what}: a source given as text is padded with its own mask; pass ids to give a mask")
    if texts:
        _checks.nonempty_texts([source] if isinstance(source, str) else source, f"{what} source")
    try:
        return model.prepare_source(source, attention_mask)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{what} source: {error}") from None


def _seq2seq(model, clean_tokens, corrupted_tokens, attention_mask) -> Runs:
    clean, corrupted = _pair(clean_tokens, "clean_tokens"), _pair(corrupted_tokens, "corrupted_tokens")
    clean_source, clean_real = _source(model, clean.source, attention_mask, "clean")
    corrupted_source, corrupted_real = _source(model, corrupted.source, attention_mask, "corrupted")
    if clean_source.shape != corrupted_source.shape:
        raise ValueError(
            f"the clean source {tuple(clean_source.shape)} and the corrupted source {tuple(corrupted_source.shape)} "
            "must have the same [batch, key_pos] shape so that positions line up"
        )
    batch = clean_source.shape[0]
    real = [torch.ones_like(clean_source, dtype=torch.bool) if r is None else r for r in (clean_real, corrupted_real)]
    unequal = (real[0] != real[1]).any(dim=1).nonzero().flatten().tolist()
    if unequal:
        raise ValueError(
            f"pair {unequal[0]}: the clean source has {int(real[0][unequal[0]].sum())} real tokens and the corrupted "
            f"{int(real[1][unequal[0]].sum())}; positions must line up, so each pair must have the same token length"
        )
    targets = []
    for name, target in (("clean", clean.target), ("corrupted", corrupted.target)):
        target = torch.as_tensor(target) if target is not None else None
        target = target[None].expand(batch, -1) if target is not None and target.ndim == 1 else target
        try:
            targets.append(check_decoder_input(target, batch, model.cfg).to(clean_source.device))
        except (TypeError, ValueError) as error:
            raise type(error)(f"the {name} target: {error}") from None
    if targets[0].shape != targets[1].shape:
        raise ValueError(
            f"the clean target {tuple(targets[0].shape)} and the corrupted target {tuple(targets[1].shape)} must have "
            "the same [batch, pos] shape so that positions line up"
        )
    mask = None if clean_real is None and corrupted_real is None else real[0].long()
    return Runs(model, (clean_source, targets[0]), (corrupted_source, targets[1]), mask, (mask, None), batch)


def start(model, clean_tokens, corrupted_tokens, metric, attention_mask) -> Runs:
    """The checked runs of a model on its clean and corrupted inputs (module docstring)."""
    _checks.check_model(model)
    if not model.writers_that("reads_source"):
        model, clean, corrupted, mask = _start(model, clean_tokens, corrupted_tokens, metric, attention_mask)
        return Runs(model, (clean,), (corrupted,), mask, (mask,), clean.shape[0])
    if not callable(metric):
        raise TypeError(f"metric must be a callable (logits, prompt) -> [rows], got {type(metric).__name__}")
    return _seq2seq(model, clean_tokens, corrupted_tokens, attention_mask)


__all__ = ["Runs", "SourceTarget", "start"]
