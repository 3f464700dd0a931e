"""Documents -> fixed-length contexts of token ids, with a global, deterministic index.

The convention
--------------
1. Each document becomes token ids: text through the tokenizer with
   ``add_special_tokens=False``, or the document's own ids. Documents that give
   no tokens are skipped.
2. The documents are joined into one stream, in corpus order, with the separator
   token between consecutive documents: the tokenizer's EOS (its BOS if it has
   no EOS), or ``separator_token_id``. For GPT-2 this is ``<|endoftext|>``, as in
   its training data.
3. The stream is cut into consecutive pieces of ``body = context_length - 1``
   tokens when ``prepend_bos`` (``context_length`` otherwise), and the BOS token
   is put in front of each piece, so every context holds exactly
   ``context_length`` tokens and position 0 is the BOS:
   ``context[i] = [BOS] + stream[i * body : (i + 1) * body]``.
   This matches SAELens' ``context_size``, which also counts the BOS.
4. The tokens left after the last full context are dropped (their number is
   recorded in the manifest).

Context ``i`` is the same context whatever the batch size or the number of
processes, so the index is global: shards, datasets and exports all use it.

>>> contexts = make_contexts([[5, 6, 7], [8, 9]], context_length=3, bos_token_id=0, separator_token_id=1)
>>> contexts.token_ids.tolist()   # stream 5 6 7 1 8 9 -> [0,5,6] [0,7,1] [0,8,9]
[[0, 5, 6], [0, 7, 1], [0, 8, 9]]
"""

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import einops
import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor
from tqdm.auto import tqdm

from interp_transformer.harvest.corpus import Document

TOKENIZE_BATCH = 256  # documents sent to the tokenizer at once


@dataclass(frozen=True)
class SpecialTokens:
    """The ids the convention uses: BOS (None when ``prepend_bos=False``) and the document separator."""

    bos_token_id: int | None
    separator_token_id: int


@dataclass
class Contexts:
    """``token_ids [context, pos]`` (int32; ``pos`` runs over ``context_length``) and what the cut left out."""

    token_ids: Int[Tensor, "context pos"]
    n_documents: int
    n_stream_tokens: int  # tokens in the joined stream, separators included, BOS not
    dropped_tokens: int  # stream tokens after the last full context


def special_tokens(
    tokenizer, prepend_bos: bool, bos_token_id: int | None, separator_token_id: int | None
) -> SpecialTokens:
    """Resolve the BOS and separator ids: given ids first, then the tokenizer's, else a ``ValueError``."""
    if tokenizer is not None:
        eos, bos = getattr(tokenizer, "eos_token_id", None), getattr(tokenizer, "bos_token_id", None)
        if bos is None:
            bos = getattr(tokenizer, "cls_token_id", None)
        bos_token_id = bos if bos_token_id is None else bos_token_id
        separator_token_id = (eos if eos is not None else bos) if separator_token_id is None else separator_token_id
    elif separator_token_id is None:
        separator_token_id = bos_token_id
    if prepend_bos and bos_token_id is None:
        raise ValueError(
            "prepend_bos=True needs a BOS token: the model has no tokenizer (or its tokenizer no BOS), so pass "
            "bos_token_id (--bos-token-id), or prepend_bos=False"
        )
    if separator_token_id is None:
        raise ValueError(
            "no token to put between documents: the model has no tokenizer, so pass separator_token_id "
            "(--separator-token-id) or bos_token_id"
        )
    return SpecialTokens(bos_token_id if prepend_bos else None, separator_token_id)


def tokenize_documents(
    documents: Iterable[Document], tokenizer, d_vocab: int, progress: bool = False
) -> Iterator[np.ndarray]:
    """Token ids of each document (int64 arrays), checked to lie in ``[0, d_vocab)``."""
    pending: list[tuple[int, str]] = []
    bar = tqdm(desc="tokenizing", unit="doc", disable=not progress, leave=False)
    try:
        for index, document in enumerate(documents):
            bar.update(1)
            if isinstance(document, str):
                if tokenizer is None:
                    raise ValueError(
                        f"document {index} is text, but the model has no tokenizer: give token ids "
                        '(a list of ints per document, e.g. JSONL {"text": [0, 5, 9]}) or a model with a tokenizer'
                    )
                pending.append((index, document))
                if len(pending) == TOKENIZE_BATCH:
                    yield from _tokenize_batch(pending, tokenizer, d_vocab)
                    pending = []
                continue
            yield from _tokenize_batch(pending, tokenizer, d_vocab)
            pending = []
            yield _check_ids(document, index, d_vocab)
        yield from _tokenize_batch(pending, tokenizer, d_vocab)
    finally:
        bar.close()


def _tokenize_batch(pending: list[tuple[int, str]], tokenizer, d_vocab: int) -> Iterator[np.ndarray]:
    if not pending:
        return
    encoded = tokenizer([text for _, text in pending], add_special_tokens=False, verbose=False)["input_ids"]
    for (index, _), ids in zip(pending, encoded, strict=True):
        yield _check_ids(ids, index, d_vocab)


def _check_ids(ids, index: int, d_vocab: int) -> np.ndarray:
    if not isinstance(ids, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise TypeError(f"document {index} must be a str or a list of int token ids, received {str(ids)[:80]}")
    array = np.asarray(ids, dtype=np.int64)
    if array.size and (array.min() < 0 or array.max() >= d_vocab):
        bad = int(array.min()) if array.min() < 0 else int(array.max())
        raise ValueError(f"document {index} holds the token id {bad}, outside [0, d_vocab={d_vocab})")
    return array


def make_contexts(
    documents_ids: Iterable, context_length: int, bos_token_id: int | None, separator_token_id: int
) -> Contexts:
    """Join documents with the separator and cut the stream into contexts (see the module docstring)."""
    pieces: list[np.ndarray] = []
    separator = np.asarray([separator_token_id], dtype=np.int64)
    n_documents = 0
    for ids in documents_ids:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size == 0:
            continue
        if n_documents:
            pieces.append(separator)
        pieces.append(ids)
        n_documents += 1
    stream = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    body = context_length - (1 if bos_token_id is not None else 0)
    n_contexts = len(stream) // body
    _check_enough(n_documents, len(stream), n_contexts, context_length, body)
    cut = torch.from_numpy(stream[: n_contexts * body].copy())
    token_ids = einops.rearrange(cut, "(context pos) -> context pos", context=n_contexts)
    if bos_token_id is not None:
        bos = torch.full((n_contexts, 1), bos_token_id, dtype=token_ids.dtype)
        token_ids = torch.cat([bos, token_ids], dim=1)
    return Contexts(
        token_ids.to(torch.int32).contiguous(), n_documents, int(len(stream)), int(len(stream) - n_contexts * body)
    )


def iter_contexts(
    documents_ids: Iterable, context_length: int, bos_token_id: int | None, separator_token_id: int
) -> Iterator[np.ndarray]:
    """The contexts of ``make_contexts``, one ``[context_length]`` int64 array at a time, as the documents stream in.

    Same convention, same contexts in the same order (and the same tail dropped), but
    memory holds one document and one context, whatever the corpus' size. Raises
    ``ValueError``, as ``make_contexts`` does, when the corpus gives no full context.

    >>> [c.tolist() for c in iter_contexts(iter([[5, 6, 7], [8, 9]]), 3, bos_token_id=0, separator_token_id=1)]
    [[0, 5, 6], [0, 7, 1], [0, 8, 9]]
    """
    body = context_length - (1 if bos_token_id is not None else 0)
    if body < 1:
        raise ValueError(f"context_length={context_length} leaves no room for tokens after the BOS")
    prefix = np.asarray([] if bos_token_id is None else [bos_token_id], dtype=np.int64)
    separator = np.asarray([separator_token_id], dtype=np.int64)
    pending, n_documents, n_tokens, n_contexts = np.zeros(0, dtype=np.int64), 0, 0, 0
    for ids in documents_ids:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size == 0:
            continue
        piece = np.concatenate([separator, ids]) if n_documents else ids
        n_documents, n_tokens = n_documents + 1, n_tokens + len(piece)
        pending = np.concatenate([pending, piece])
        n_full = len(pending) // body
        for i in range(n_full):
            yield np.concatenate([prefix, pending[i * body : (i + 1) * body]])
        pending, n_contexts = pending[n_full * body :], n_contexts + n_full
    _check_enough(n_documents, n_tokens, n_contexts, context_length, body)


def _check_enough(n_documents: int, n_tokens: int, n_contexts: int, context_length: int, body: int) -> None:
    if n_documents == 0:
        raise ValueError("the corpus is empty: it gives no tokens at all")
    if n_contexts == 0:
        raise ValueError(
            f"the corpus gives {n_tokens} tokens ({n_documents} documents), fewer than the {body} one context of "
            f"context_length={context_length} needs; give more text or a shorter context_length"
        )
