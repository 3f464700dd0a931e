"""The text a lens is trained and judged on: a corpus cut into contexts by the harvest's convention, then split.

``lens_contexts`` reads any corpus ``interp_transformer.harvest`` reads (``.txt``/``.jsonl`` files, a list of
documents, a ``datasets`` folder) into contexts of ``context_length`` tokens, the BOS first, documents joined by
the separator (``harvest.contexts``); a ``[context, pos]`` tensor of ids is taken as the contexts themselves.
``split_contexts`` holds out every ``held_out_every``-th context (contexts ``every-1, 2*every-1, ...``), so the
split depends on nothing but the corpus and the number. ``lens train`` and ``lens eval`` on the same corpus and
number therefore judge the lens on text it was not trained on.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from interp_transformer.harvest.contexts import make_contexts, special_tokens, tokenize_documents
from interp_transformer.harvest.corpus import as_corpus

from .. import _checks


@dataclass
class LensContexts:
    """``tokens [context, pos]`` and ``first_position``: 1 when a BOS was put in front of every context (its
    residual is the same in every context, so it teaches nothing and is left out of the loss), else 0."""

    tokens: Tensor
    first_position: int
    description: str

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def n_tokens(self) -> int:
        """The positions the lens is trained or judged on."""
        return len(self) * (int(self.tokens.shape[1]) - self.first_position)


def lens_contexts(
    model,
    corpus,
    context_length: int | None = None,
    *,
    bos_token_id: int | None = None,
    separator_token_id: int | None = None,
    text_field: str = "text",
    max_contexts: int | None = None,
    progress: bool = False,
) -> LensContexts:
    """``corpus`` as contexts for ``model`` (module docstring); ``ValueError`` when it gives none."""
    if max_contexts is not None:
        _checks.count(max_contexts, "max_contexts", minimum=1)
    if isinstance(corpus, Tensor):
        if corpus.ndim != 2 or corpus.shape[0] == 0 or corpus.shape[1] == 0:
            raise ValueError(
                f"contexts of token ids must be a non-empty [context, pos] tensor, received shape {tuple(corpus.shape)}"
            )
        tokens = model.prepare_tokens(corpus)  # integer ids in [0, d_vocab), at most n_ctx positions
        tokens = tokens[:max_contexts] if max_contexts is not None else tokens
        return LensContexts(tokens, 0, f"{tuple(tokens.shape)} token ids")
    if context_length is None:
        context_length = min(model.cfg.n_ctx, 128)
    _checks.count(context_length, "context_length", minimum=2)
    if context_length > model.cfg.n_ctx:
        raise ValueError(f"context_length={context_length} is longer than the model reads (n_ctx={model.cfg.n_ctx})")
    corpus = as_corpus(corpus, text_field, allow_empty_files=False)
    special = special_tokens(model.tokenizer, True, bos_token_id, separator_token_id)
    ids = tokenize_documents(corpus, model.tokenizer, model.cfg.d_vocab, progress=progress)
    contexts = make_contexts(ids, context_length, special.bos_token_id, special.separator_token_id)
    tokens = contexts.token_ids.long()
    if max_contexts is not None:
        tokens = tokens[:max_contexts]
    return LensContexts(tokens, 1, f"{corpus.description}: {len(tokens)} contexts of {context_length} tokens")


def split_contexts(contexts: LensContexts, held_out_every: int) -> tuple[LensContexts, LensContexts]:
    """``(train, held_out)``: every ``held_out_every``-th context held out; ``ValueError`` if either is empty."""
    _checks.count(held_out_every, "held_out_every", minimum=2)
    index = torch.arange(len(contexts))
    held = (index % held_out_every) == held_out_every - 1
    if not held.any() or held.all():
        raise ValueError(
            f"{len(contexts)} contexts cannot be split with held_out_every={held_out_every}: it takes at least "
            f"{held_out_every} contexts to hold one out and train on the rest; give more text or a smaller number"
        )

    def part(mask: Tensor, name: str) -> LensContexts:
        return LensContexts(contexts.tokens[mask], contexts.first_position, f"{contexts.description}, {name}")

    return part(~held, "train"), part(held, f"held out (every {held_out_every}th context)")


__all__ = ["LensContexts", "lens_contexts", "split_contexts"]
