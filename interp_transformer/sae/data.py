"""What SAEs are read and trained on: token batches from a corpus, and a model's activation at a hook.

``token_batches(model, source, ...)`` turns any of

- a ``[n_texts, pos]`` tensor of token ids (cut into batches of ``batch_size``),
- an iterable of ``[batch, pos]`` tensors (used as given; batches may differ in length),
- a corpus as ``interp_transformer.harvest`` reads it (``.txt`` files, ``.jsonl`` files,
  a list of strings or of token-id lists, a ``Corpus``), cut into contexts of
  ``context_length`` tokens by the harvest's convention (``harvest.contexts``: documents
  joined with the separator, the BOS in front of each context),

into ``TokenBatches``: an iterable of ``[batch, pos]`` int64 tensors that also says which
token ids are special (the BOS and separator of a cut corpus; for token ids given as
tensors, the tokenizer's special tokens). A corpus is streamed: memory holds one
document and one batch, whatever the corpus' size.

``activation_at(model, tokens, hook_name)`` runs only the blocks the hook needs.
"""

import difflib
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp_transformer.harvest.contexts import iter_contexts, special_tokens, tokenize_documents
from interp_transformer.harvest.corpus import Corpus, as_corpus
from interp_transformer.harvest.selection import stop_at_layer_for
from interp_transformer.text.special_tokens import special_token_ids

TokenSource = Int[Tensor, "n_texts pos"] | Iterable[Int[Tensor, "batch pos"]] | Corpus | str | Sequence


@dataclass
class TokenBatches:
    """``[batch, pos]`` token batches, read afresh on every iteration (once, if made from a one-shot iterator).

    ``special_token_ids``: the ids whose positions SAE tools leave out (the BOS and
    document separator); ``description`` says where the tokens come from.
    """

    make: Callable[[], Iterator[Tensor]]
    special_token_ids: tuple[int, ...]
    description: str

    def __iter__(self) -> Iterator[Tensor]:
        return self.make()


def _checked_batch(batch, index: int) -> Tensor:
    if not isinstance(batch, Tensor) or batch.is_floating_point() or batch.dtype == torch.bool:
        raise TypeError(
            f"token batch {index} must be an integer tensor [batch, pos], got "
            f"{getattr(batch, 'dtype', type(batch).__name__)}"
        )
    if batch.ndim != 2:
        raise ValueError(f"token batch {index} must have shape [batch, pos], got {tuple(batch.shape)}")
    return batch.long()


def _tensor_ids(model) -> tuple[int, ...]:
    """The tokenizer's special tokens (BOS, EOS, PAD, ...), or none for a model without a tokenizer."""
    if getattr(model, "tokenizer", None) is None:
        return ()
    try:
        return tuple(special_token_ids(model, True) or ())  # None only when nothing is excluded
    except ValueError:  # a tokenizer with no special token at all
        return ()


def _is_token_tensors(source) -> bool:
    return isinstance(source, Tensor) or (
        isinstance(source, (list, tuple)) and bool(source) and isinstance(source[0], Tensor)
    )


def token_batches(
    model,
    source: TokenSource,
    *,
    batch_size: int = 16,
    context_length: int | None = None,
    prepend_bos: bool = True,
    bos_token_id: int | None = None,
    separator_token_id: int | None = None,
    text_field: str = "text",
    progress: bool = False,
) -> TokenBatches:
    """``source`` as ``TokenBatches`` (see the module docstring).

    ``context_length`` (a corpus only; default ``min(n_ctx, 128)``) counts the BOS.
    ``bos_token_id`` / ``separator_token_id`` are needed for a corpus of token ids on a
    model without a tokenizer, as in ``harvest``.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if isinstance(source, Tensor):
        tokens = _checked_batch(source, 0)
        return TokenBatches(
            lambda: iter(tokens.split(batch_size)), _tensor_ids(model), f"{tuple(tokens.shape)} token ids"
        )
    if _is_token_tensors(source):
        batches = [_checked_batch(batch, i) for i, batch in enumerate(source)]
        return TokenBatches(lambda: iter(batches), _tensor_ids(model), f"{len(batches)} token batches")
    if isinstance(source, Iterator):  # a generator of tensors: read once, checked as it goes
        first = next(source, None)
        if first is None:
            raise ValueError("the token batches are empty: the iterator gave no batch")
        once = (_checked_batch(b, i) for i, b in enumerate(itertools.chain([first], source)))
        return TokenBatches(lambda: once, _tensor_ids(model), "an iterator of token batches")
    return _corpus_batches(
        model,
        as_corpus(source, text_field),
        batch_size,
        context_length,
        prepend_bos,
        bos_token_id,
        separator_token_id,
        progress,
    )


def _corpus_batches(
    model, corpus: Corpus, batch_size, context_length, prepend_bos, bos_token_id, separator_token_id, progress
):
    context_length = min(model.cfg.n_ctx, 128) if context_length is None else context_length
    if (
        isinstance(context_length, bool)
        or not isinstance(context_length, int)
        or not 2 <= context_length <= model.cfg.n_ctx
    ):
        raise ValueError(f"context_length must be an int in [2, n_ctx={model.cfg.n_ctx}], got {context_length!r}")
    tokenizer = getattr(model, "tokenizer", None)
    specials = special_tokens(tokenizer, prepend_bos, bos_token_id, separator_token_id)
    ids = tuple(sorted({i for i in (specials.bos_token_id, specials.separator_token_id) if i is not None}))

    def batches() -> Iterator[Tensor]:
        documents = tokenize_documents(corpus, tokenizer, model.cfg.d_vocab, progress)
        contexts = iter_contexts(documents, context_length, specials.bos_token_id, specials.separator_token_id)
        while True:
            chunk = list(itertools.islice(contexts, batch_size))
            if not chunk:
                return
            yield torch.from_numpy(np.stack(chunk))

    return TokenBatches(batches, ids, f"{corpus.description}, contexts of {context_length} tokens")


def activation_at(model, tokens: Int[Tensor, "batch pos"], hook_name: str) -> Tensor:
    """The activation at ``hook_name`` for ``tokens``, running only the blocks it needs (no gradient)."""
    if hook_name not in model.hook_dict:
        close = difflib.get_close_matches(hook_name, list(model.hook_dict), n=3, cutoff=0.5)
        raise KeyError(f"{hook_name!r} is not a hook point of this model; closest: {close}")
    stop = stop_at_layer_for(model, [hook_name])
    kwargs = {} if stop is None or stop >= model.cfg.n_layers else {"stop_at_layer": stop}
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=[hook_name], **kwargs)
    return cache[hook_name]


def sae_input(sae, activation: Tensor) -> Tensor:
    """What ``sae`` reads of a model ``activation``: all of it, or one head for an SAE with ``hook_head_index``."""
    head = sae.cfg.hook_head_index
    return activation if head is None else activation[..., head, :]


def feature_acts(sae, activation: Tensor) -> Float[Tensor, "*batch d_sae"]:
    """``sae``'s feature activations of a model ``activation`` (no hook fires, nothing is kept for ``decode``)."""
    x = sae_input(sae, activation)
    sae.check_input(x)
    with torch.no_grad():
        return sae.encode_with_state(x, hooked=False)[0]


def keep_mask(tokens: Int[Tensor, "batch pos"], excluded_ids: Sequence[int]) -> Tensor:
    """``[batch, pos]`` bool: True where the token is none of ``excluded_ids``."""
    if not excluded_ids:
        return torch.ones_like(tokens, dtype=torch.bool)
    return ~torch.isin(tokens, torch.tensor(list(excluded_ids), device=tokens.device))


__all__ = ["TokenBatches", "activation_at", "feature_acts", "keep_mask", "sae_input", "token_batches"]
