"""Which source words the target's predictions depend on: corrupting source words, and patching the encoder's output.

**Corrupting one source word.** Replace source word ``s`` by another token (``replacement``)
and rerun; the effect on target position ``t`` is how much the logit of the token the
clean run predicts there falls::

    effect[s, t] = logit_clean[t, y_t] - logit_{source with word s replaced}[t, y_t],   y_t = argmax logit_clean[t]

A translation model's effects concentrate on the word each target token comes from.

**Patching the encoder's output over source positions.** Run a *corrupted* source
(``"three hundred fifty two"`` for ``"three hundred forty two"``), and at one source
position ``s`` replace the encoder's output (what cross-attention reads) with its value
on the *clean* source; the result at target position ``t`` is the patched run's
``logit[t, y_t] - logit[t, y'_t]`` (clean prediction minus corrupted prediction)::

    result[s, t] = metric_t(decoder(encoder_out_corrupted with position s := encoder_out_clean[s]))

Where patching one position restores the clean answer, that position carries what the
target token needs. Clean and corrupted sources must have the same length.
"""

import dataclasses

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from .. import _checks
from ..readouts.cross_attention import require_cross_attention


def _single(model, source, decoder_input, attention_mask) -> tuple[Tensor, Tensor, Tensor | None]:
    _checks.check_model(model)
    require_cross_attention(model, "source patching")
    tokens, key_is_real = model.prepare_source(source, attention_mask)
    if tokens.shape[0] != 1:
        raise ValueError(
            f"source patching takes one source: [key_pos] or [1, key_pos], got shape {tuple(tokens.shape)}"
        )
    if decoder_input is None:
        raise ValueError(
            "decoder_input is needed: the target positions whose logits are measured (e.g. model.generate(source))"
        )
    decoder_input = torch.as_tensor(decoder_input)
    decoder_input = decoder_input[None] if decoder_input.ndim == 1 else decoder_input
    mask = None if key_is_real is None else key_is_real.long()
    return tokens, decoder_input.to(tokens.device), mask


@torch.no_grad()
def source_word_effects(
    model,
    source: Int[Tensor, "1 key_pos"],
    decoder_input: Int[Tensor, "1 pos"],
    replacement: int,
    *,
    attention_mask: Int[Tensor, "1 key_pos"] | None = None,
    positions: list[int] | None = None,
    progress: bool = False,
) -> Float[Tensor, "key_pos pos"]:
    """``effect[s, t]``: the fall of the clean prediction's logit at target ``t`` when source word ``s`` is replaced.

    ``replacement`` is the token put in its place; ``positions`` (default: every real source
    position) are the words corrupted, one run each. Rows of other positions are NaN.
    """
    tokens, decoder_input, mask = _single(model, source, decoder_input, attention_mask)
    replacement = int(_checks.token_ids(model, replacement, 1, "replacement")[0])
    mask = torch.ones_like(tokens) if mask is None else mask  # a replacement by the padding id is still read as a word
    clean = model(tokens, decoder_input, attention_mask=mask)[0]  # [pos, d_vocab]
    predicted = clean.argmax(dim=-1)
    target_index = torch.arange(len(predicted), device=clean.device)
    clean_logit = clean[target_index, predicted]
    n_real = int(mask.sum())
    positions = list(range(n_real)) if positions is None else [int(p) for p in positions]
    effects = torch.full((tokens.shape[1], len(predicted)), float("nan"), dtype=clean.dtype)
    for position in tqdm(positions, desc="corrupting source words", disable=not progress):
        if not 0 <= position < tokens.shape[1]:
            raise ValueError(f"positions must lie in [0, {tokens.shape[1]}), got {position}")
        corrupted = tokens.clone()
        corrupted[0, position] = replacement
        logits = model(corrupted, decoder_input, attention_mask=mask)[0]
        effects[position] = (clean_logit - logits[target_index, predicted]).cpu()
    return effects


@torch.no_grad()
def patch_source_positions(
    model,
    clean_source: Int[Tensor, "1 key_pos"],
    corrupted_source: Int[Tensor, "1 key_pos"],
    decoder_input: Int[Tensor, "1 pos"],
    *,
    attention_mask: Int[Tensor, "1 key_pos"] | None = None,
    progress: bool = False,
) -> Float[Tensor, "key_pos pos"]:
    """``result[s, t]``: the clean-minus-corrupted prediction's logit difference at target ``t``, with the encoder's
    output at source position ``s`` patched from the clean run into the corrupted one (see the module docstring).

    ``decoder_input`` is read by both runs (usually the clean translation). ``attention_mask``
    applies to both sources.
    """
    clean, decoder_input, mask = _single(model, clean_source, decoder_input, attention_mask)
    corrupted, _, _ = _single(model, corrupted_source, decoder_input, attention_mask)
    if clean.shape != corrupted.shape:
        raise ValueError(
            f"clean {tuple(clean.shape)} and corrupted {tuple(corrupted.shape)} sources must have the same "
            "shape, so that positions line up"
        )
    clean_out, corrupted_out = model.encode(clean, mask), model.encode(corrupted, mask)
    clean_logits = model.decode(decoder_input, clean_out)[0]
    corrupted_logits = model.decode(decoder_input, corrupted_out)[0]
    good, bad = clean_logits.argmax(dim=-1), corrupted_logits.argmax(dim=-1)
    index = torch.arange(len(good), device=good.device)
    result = torch.empty(clean.shape[1], len(good), dtype=clean_logits.dtype)
    for position in tqdm(range(clean.shape[1]), desc="patching source positions", disable=not progress):
        patched = corrupted_out.encoder_out.clone()
        patched[:, position] = clean_out.encoder_out[:, position]
        logits = model.decode(decoder_input, dataclasses.replace(corrupted_out, encoder_out=patched))[0]
        result[position] = (logits[index, good] - logits[index, bad]).cpu()
    return result


__all__ = ["patch_source_positions", "source_word_effects"]
