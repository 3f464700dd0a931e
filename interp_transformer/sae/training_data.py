"""The activations an SAE is trained and measured on: from a model run over token batches, or from a harvest folder.

Contexts are split by their index: context ``i`` is held out for the metrics when
``i % eval_every == eval_every - 1``, and trains otherwise, so the split does not
depend on the batch size. Positions holding an excluded token (the BOS and document
separator of a corpus) are left out of both. Training vectors stop being read once
``max_tokens`` are held; everything read is kept in memory, ``[n, d_in]`` float32.
"""

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from interp_transformer.sae.data import TokenBatches, activation_at, keep_mask


@dataclass
class TrainingActivations:
    """Activation vectors at one hook: ``train [n, d_in]``, ``eval [m, d_in]`` (held-out contexts).

    ``eval_tokens [context, pos]``: the held-out contexts' token ids, for the CE loss
    (None when the contexts differ in length). ``excluded_ids``: the token ids whose
    positions were left out.
    """

    hook_name: str
    train: Float[Tensor, "n d_in"]
    eval: Float[Tensor, "m d_in"]
    eval_tokens: Int[Tensor, "context pos"] | None
    excluded_ids: tuple[int, ...]
    description: str

    @property
    def d_in(self) -> int:
        return self.train.shape[-1]


def _check_split(eval_every: int, max_tokens: int | None) -> None:
    if isinstance(eval_every, bool) or not isinstance(eval_every, int) or eval_every < 2:
        raise ValueError(
            f"eval_every must be an int >= 2 (every eval_every-th context is held out), got {eval_every!r}"
        )
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise ValueError(f"max_tokens must be a positive int or None, got {max_tokens!r}")


def _vectors(activation: Tensor, hook_name: str) -> None:
    if activation.ndim != 3:
        raise ValueError(
            f"the SAE trainer reads one vector per position, [batch, pos, d]; {hook_name} holds shape "
            f"{tuple(activation.shape)} (per-head hooks such as hook_z are not supported)"
        )


def _split(
    contexts: Iterator[tuple[Tensor, Tensor]],
    hook_name: str,
    excluded: Sequence[int],
    eval_every: int,
    max_tokens: int | None,
    description: str,
) -> TrainingActivations:
    """Fill the train and eval sets from ``(activation [pos, d], token_ids [pos])`` per context, in context order."""
    train, held_out, eval_tokens, n_train = [], [], [], 0
    for index, (activation, tokens) in enumerate(contexts):
        kept = activation[keep_mask(tokens[None], excluded)[0]].float()
        if index % eval_every == eval_every - 1:
            held_out.append(kept)
            eval_tokens.append(tokens)
            continue
        train.append(kept)
        n_train += len(kept)
        if max_tokens is not None and n_train >= max_tokens:
            break
    if not train or not held_out:
        raise ValueError(
            f"{description} gives {len(train)} training and {len(held_out)} held-out contexts; the trainer holds out "
            f"every {eval_every}-th context and needs at least one of each: give more text or a smaller eval_every"
        )
    lengths = {len(t) for t in eval_tokens}
    return TrainingActivations(
        hook_name=hook_name,
        train=torch.cat(train)[:max_tokens],
        eval=torch.cat(held_out),
        eval_tokens=torch.stack(eval_tokens).long() if len(lengths) == 1 else None,
        excluded_ids=tuple(excluded),
        description=description,
    )


def from_model(
    model,
    batches: TokenBatches,
    hook_name: str,
    *,
    eval_every: int = 8,
    max_tokens: int | None = None,
    exclude_special_tokens: bool = True,
    progress: bool = False,
) -> TrainingActivations:
    """Run ``model`` over ``batches`` (only the blocks the hook needs) and split its activations at ``hook_name``."""
    _check_split(eval_every, max_tokens)
    excluded = batches.special_token_ids if exclude_special_tokens else ()

    def contexts() -> Iterator[tuple[Tensor, Tensor]]:
        for batch in tqdm(batches, desc=f"activations at {hook_name}", unit="batch", disable=not progress, leave=False):
            activation = activation_at(model, batch, hook_name)
            _vectors(activation, hook_name)
            yield from zip(activation, batch, strict=True)

    return _split(contexts(), hook_name, excluded, eval_every, max_tokens, batches.description)


def from_harvest(
    folder: str | Path,
    hook_name: str,
    *,
    eval_every: int = 8,
    max_tokens: int | None = None,
    exclude_special_tokens: bool = True,
    progress: bool = False,
) -> TrainingActivations:
    """The activations at ``hook_name`` stored in a harvest folder (``interp_transformer.harvest``), split by
    context."""
    from interp_transformer.harvest.dataset import ActivationShards

    _check_split(eval_every, max_tokens)
    shards = ActivationShards(folder, hooks=[hook_name])
    fingerprint = shards.manifest.fingerprint
    ids = [fingerprint.get("separator_token_id")] + (
        [fingerprint.get("bos_token_id")] if fingerprint.get("prepend_bos") else []
    )
    excluded = tuple(sorted({i for i in ids if i is not None})) if exclude_special_tokens else ()
    if len(shards.manifest.hook_shape(hook_name)) != 2 or shards.manifest.hook_pos_axes(hook_name) != (0,):
        raise ValueError(
            f"the SAE trainer reads one vector per position; {hook_name} is stored with shape "
            f"{shards.manifest.hook_shape(hook_name)} per context"
        )

    def contexts() -> Iterator[tuple[Tensor, Tensor]]:
        try:
            for index in tqdm(
                range(len(shards)), desc=f"reading {hook_name}", unit="context", disable=not progress, leave=False
            ):
                item = shards[index]
                yield item[hook_name], item["token_ids"].long()
        finally:
            shards.close()

    return _split(contexts(), hook_name, excluded, eval_every, max_tokens, f"harvest {folder}")


__all__ = ["TrainingActivations", "from_harvest", "from_model"]
