"""QK and OV circuits as factored matrices, copying scores and composition scores.

With the row-vector convention of the model (``x @ W``), head ``h`` of ``layer``
scores query token ``a`` against key token ``b`` through its *full QK circuit*
and moves token ``b``'s identity into logits through its *full OV circuit*::

    full_qk = W_E W_Q[h] W_K[h]^T W_E^T      [d_vocab (query), d_vocab (key)]
    full_ov = W_E W_V[h] W_O[h] W_U          [d_vocab (source), d_vocab (output)]

Both have rank at most ``d_head`` and are returned as ``FactoredMatrix``, which
never builds the ``d_vocab x d_vocab`` product unless asked (``.AB``). Evaluate
them on token subsets with ``circuit_on_tokens`` or scan them row block by row
block with ``diagonal_ranks``. These circuits leave out LayerNorm, positional
embeddings and biases, as in "A Mathematical Framework for Transformer Circuits";
fold LayerNorm into the weights first for a closer picture of a real model.

Encoders (``EncoderTransformer``): the QK circuit is the same. The OV circuit needs an
output space: ``read_out="unembed"`` uses the model's ``W_U`` (for BERT the MLM decoder;
it leaves out the MLM head's dense + activation + LayerNorm transform, as it leaves out
LayerNorm), and a model without one (a ``BertModel`` without MLM head) raises; ``read_out="embed"`` reads the head's
output
against the token embeddings instead, ``W_E W_V W_O W_E^T`` (BERT ties its MLM decoder
to ``W_E``, so this is the tied read-out), for any model.

Composition between a head ``A`` in an earlier layer and a head ``B`` in a later
one (``W_OV = W_V W_O``, ``W_QK = W_Q W_K^T``, all ``d_model x d_model``)::

    score = ||W_A W_B||_F / (||W_A||_F ||W_B||_F)
    Q-composition: W_A = W_OV(A), W_B = W_QK(B)      (A writes what B's queries read)
    K-composition: W_A = W_OV(A), W_B = W_QK(B)^T    (A writes what B's keys read)
    V-composition: W_A = W_OV(A), W_B = W_OV(B)      (A writes what B's values read)
"""

import numbers
from collections.abc import Sequence

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp_transformer.circuits.factored_matrix import FactoredMatrix

from .. import _checks

__all__ = [
    "FactoredMatrix",
    "circuit_on_tokens",
    "composition_score",
    "composition_scores",
    "copying_scores",
    "diagonal_ranks",
    "full_ov_circuit",
    "full_qk_circuit",
    "token_writes",
]

COMPOSITION_KINDS = ("q", "k", "v")
READ_OUTS = ("unembed", "embed")
# circuit_on_tokens refuses to build more entries than this unless allow_large=True
MAX_DENSE_ENTRIES = 2**24


def _select(model: _checks.AnyModel, weight: Tensor, layer: int | None, head: int | None) -> Tensor:
    """Index a ``[layer, head_index, ...]`` weight; ``None`` keeps the axis."""
    if layer is not None:
        weight = weight[_checks.layer_index(model, layer)]
        if head is not None:
            return weight[_checks.head_index(model, head)]
        return weight
    if head is not None:
        return weight[:, _checks.head_index(model, head)]
    return weight


@torch.no_grad()
def full_qk_circuit(model: _checks.AnyModel, layer: int | None = None, head: int | None = None) -> FactoredMatrix:
    """``W_E W_Q W_K^T W_E^T`` of one head, or of all heads (``None`` keeps the layer/head axis).

    ``W_E`` here is what each token writes (``token_writes``: scaled in Gemma, normalized in BLOOM).

    Shape ``[*, d_vocab, d_vocab]``: rows are query tokens, columns key tokens. In a model
    with rotary positions (the Llama family) the real score rotates ``q`` and ``k`` by their
    positions first, so this circuit is the score of a query and key at the *same*
    position only: it leaves out how the score changes with their distance.
    """
    _checks.check_model(model)
    qk = FactoredMatrix(_select(model, model.W_Q, layer, head), _select(model, model.W_K, layer, head).mT)
    W_E = token_writes(model)
    return W_E @ qk @ W_E.T


def token_writes(model: _checks.AnyModel) -> Float[Tensor, "d_vocab d_model"]:
    """What each token writes into the residual stream: ``W_E``, or ``W_E * sqrt(d_model)`` (Gemma, Marian), ``ln(W_E)``
    (BLOOM).

    The circuits start from these rows, so that a scaled or normalized embedding reads as
    the stream sees it; a tied read-out (``read_out="embed"``) stays ``W_E^T`` as stored.
    """
    embed = getattr(model, "embed", None)
    return embed.writes() if hasattr(embed, "writes") else model.W_E


def _read_out_matrix(model: _checks.AnyModel, read_out: str) -> Tensor:
    """``W_U`` (``read_out="unembed"``) or ``W_E^T`` (``"embed"``): ``[d_model, d_vocab]``."""
    if read_out not in READ_OUTS:
        raise ValueError(f"read_out must be one of {READ_OUTS}, got {read_out!r}")
    if read_out == "embed":
        return model.W_E.T
    try:
        return model.W_U
    except AttributeError as missing:
        raise ValueError(
            f"this model has no W_U to read the OV circuit out with ({missing}): pass read_out='embed' to read it "
            "against the token embeddings W_E^T (BERT ties its MLM decoder to W_E)"
        ) from None


@torch.no_grad()
def full_ov_circuit(
    model: _checks.AnyModel, layer: int | None = None, head: int | None = None, read_out: str = "unembed"
) -> FactoredMatrix:
    """``W_E W_V W_O W_U`` of one head, or of all heads (``None`` keeps the layer/head axis).

    Shape ``[*, d_vocab, d_vocab]``: row ``s`` is the direct effect on the logits of
    attending to source token ``s``. ``read_out="embed"`` replaces ``W_U`` by ``W_E^T``
    (row ``s``: how much the head's output resembles each token's embedding), the only
    read-out of an encoder without an MLM head.
    """
    _checks.check_model(model)
    ov = FactoredMatrix(_select(model, model.W_V, layer, head), _select(model, model.W_O, layer, head))
    return token_writes(model) @ ov @ _read_out_matrix(model, read_out)


def _token_index(tokens, size: int, name: str) -> slice | Tensor:
    if tokens is None:
        return slice(None)
    if isinstance(tokens, numbers.Integral) and not isinstance(tokens, bool):
        tokens = [tokens]
    tokens = torch.as_tensor(tokens)
    if tokens.ndim != 1 or tokens.is_floating_point() or tokens.dtype == torch.bool:
        raise TypeError(f"{name} must be a 1-d sequence of token ids, got {tuple(tokens.shape)} {tokens.dtype}")
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= size):
        raise ValueError(f"{name} must lie in [0, {size}), got {tokens.tolist()}")
    return tokens.long()


def circuit_on_tokens(
    circuit: FactoredMatrix,
    row_tokens: None | int | list | Int[Tensor, "n"] = None,
    col_tokens: None | int | list | Int[Tensor, "m"] = None,
    allow_large: bool = False,
) -> Float[Tensor, "*batch n m"]:
    """The dense block ``circuit[..., row_tokens, col_tokens]`` (``None``: every token on that side).

    Refuses to build more than ``MAX_DENSE_ENTRIES`` entries unless ``allow_large=True``:
    a full GPT-2 circuit is 2.5 billion numbers per head.
    """
    if not isinstance(circuit, FactoredMatrix):
        raise TypeError(f"circuit must be a FactoredMatrix, got {type(circuit).__name__}")
    rows = _token_index(row_tokens, circuit.ldim, "row_tokens")
    cols = _token_index(col_tokens, circuit.rdim, "col_tokens")
    block = circuit.rows(rows).cols(cols)
    n_entries = block.shape.numel()
    if n_entries > MAX_DENSE_ENTRIES and not allow_large:
        raise ValueError(
            f"the block {tuple(block.shape)} has {n_entries:,} entries (limit {MAX_DENSE_ENTRIES:,}): choose "
            "row_tokens/col_tokens, scan it with diagonal_ranks or circuit.iter_row_chunks, or pass allow_large=True"
        )
    return block.AB


@torch.no_grad()
def diagonal_ranks(circuit: FactoredMatrix, chunk_size: int = 1024) -> Int[Tensor, "*batch d_vocab"]:
    """For each row ``t``, the rank of ``circuit[t, t]`` within its row (0 = the row's largest entry).

    On a full OV circuit, rank 0 means attending to token ``t`` raises ``t``'s own logit
    above every other: the head copies ``t``. ``(ranks == 0).float().mean()`` is the
    fraction of tokens copied. Scanned in blocks of ``chunk_size`` rows, so peak memory
    is ``chunk_size x d_vocab`` per head.
    """
    if not isinstance(circuit, FactoredMatrix):
        raise TypeError(f"circuit must be a FactoredMatrix, got {type(circuit).__name__}")
    if circuit.ldim != circuit.rdim:
        raise ValueError(f"diagonal_ranks needs a square circuit, got shape {tuple(circuit.shape)}")
    ranks = []
    for rows, block in circuit.iter_row_chunks(chunk_size):
        index = torch.arange(rows.start, rows.stop, device=block.device)
        diagonal = block[..., torch.arange(len(index)), index]  # [*batch, chunk]
        ranks.append((block > diagonal.unsqueeze(-1)).sum(dim=-1))
    return torch.cat(ranks, dim=-1)


@torch.no_grad()
def copying_scores(
    model: _checks.AnyModel, layer: int | None = None, head: int | None = None, read_out: str = "unembed"
) -> Float[Tensor, "*layer_head"]:
    """Copying score of each head's full OV circuit: ``sum_i Re(l_i) / sum_i |l_i|``.

    ``l_i`` are the eigenvalues of ``W_E W_V W_O W_U``; its nonzero ones are those of
    the ``d_head x d_head`` matrix ``W_O W_U W_E W_V`` (``FactoredMatrix.eigenvalues``).
    The score lies in ``[-1, 1]``: 1 when every eigenvalue is positive (the head raises
    the logits of the tokens it attends to), -1 when every one is negative (it suppresses
    them). Shape ``[layer, head_index]`` by default, fewer axes when ``layer``/``head`` is given.
    ``read_out`` as in ``full_ov_circuit``.
    """
    _checks.check_model(model)
    # W_O R W_E W_V with the d_model x d_model product R W_E formed once, not W_E W_V per head:
    # the same matrix FactoredMatrix.eigenvalues would build, without a d_vocab-long factor per head
    read_out_embed = _read_out_matrix(model, read_out) @ token_writes(model)  # [d_model, d_model]
    W_V, W_O = _select(model, model.W_V, layer, head), _select(model, model.W_O, layer, head)
    eigenvalues = torch.linalg.eigvals(W_O @ read_out_embed @ W_V)  # [..., d_head]
    return eigenvalues.real.sum(dim=-1) / eigenvalues.abs().sum(dim=-1)


def _as_factored(matrix, name: str) -> FactoredMatrix:
    if isinstance(matrix, FactoredMatrix):
        return matrix
    if isinstance(matrix, Tensor) and matrix.ndim >= 2:
        return FactoredMatrix(matrix, torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device))
    raise TypeError(f"{name} must be a FactoredMatrix or a tensor [..., rows, cols], got {type(matrix).__name__}")


@torch.no_grad()
def composition_score(
    left: FactoredMatrix | Float[Tensor, "*batch a b"], right: FactoredMatrix | Float[Tensor, "*batch b c"]
) -> Float[Tensor, "*batch"]:
    """``||left @ right||_F / (||left||_F ||right||_F)``, from the factors (batch axes broadcast)."""
    left, right = _as_factored(left, "left"), _as_factored(right, "right")
    return (left @ right).norm() / (left.norm() * right.norm())


@torch.no_grad()
def composition_scores(
    model: _checks.AnyModel, kind: str, readers: Sequence[tuple[int, int]] | None = None
) -> Float[Tensor, "layer head_index layer head_index"]:
    """Q-, K- or V-composition (``kind`` = ``"q"``, ``"k"``, ``"v"``) of every pair of heads.

    ``scores[l1, h1, l2, h2]`` is the composition of writer head ``(l1, h1)`` into reader
    head ``(l2, h2)``; it is 0 unless ``l1 < l2`` (a head reads only earlier layers).
    ``readers`` (a list of ``(layer, head)``) computes only those readers' columns, every
    earlier writer included; the others are NaN (not computed). Every pair costs
    ``2 d_head^2 d_model`` multiply-adds, so a large model's full table takes minutes.

    Computed from ``d_head``-sized Gram matrices, never a ``d_model x d_model`` product:
    with the writer's ``W_OV = V O`` and the reader's matrix ``W_B = P R^T`` (``P = W_Q``,
    ``R = W_K`` for Q-composition; swapped for K; ``P = W_V``, ``R = W_O^T`` for V),
    ``||W_OV W_B||_F^2 = tr(G M H M^T)`` with ``G = V^T V``, ``M = O P`` and ``H = R^T R``,
    each ``[d_head, d_head]``. One writer layer against every later head at a time.
    """
    _checks.check_model(model)
    if kind not in COMPOSITION_KINDS:
        raise ValueError(f"kind must be one of {COMPOSITION_KINDS}, got {kind!r}")
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    V, O = model.W_V, model.W_O.transpose(-2, -1)  # writer: W_OV = V O^T', both [layer, head_index, d_model, d_head]
    P, R = {"q": (model.W_Q, model.W_K), "k": (model.W_K, model.W_Q), "v": (model.W_V, model.W_O.transpose(-2, -1))}[
        kind
    ]
    gram = lambda A: A.transpose(-2, -1) @ A  # noqa: E731  [..., d_head, d_head]
    G, H = gram(V), gram(R)
    writer_norms = _frobenius(G, gram(O))  # ||V O^T'||_F = sqrt(tr(V^T V O^T' O'))
    reader_norms = _frobenius(gram(P), H)
    scores = torch.zeros(n_layers, n_heads, n_layers, n_heads, dtype=model.W_E.dtype, device=model.W_E.device)
    if readers is not None:
        scores.fill_(float("nan"))
        for l2, h2 in [(_checks.layer_index(model, l), _checks.head_index(model, h)) for l, h in readers]:
            M = einops.einsum(O[:l2], P[l2, h2], "layer writer d_model i, d_model j -> layer writer i j")
            product = ((G[:l2] @ M) * (M @ H[l2, h2])).sum(dim=(-2, -1)).clamp(min=0).sqrt()  # [layer, writer]
            scores[:l2, :, l2, h2] = product / (writer_norms[:l2] * reader_norms[l2, h2])
            scores[l2:, :, l2, h2] = 0.0
        return scores
    for l1 in range(n_layers - 1):
        M = einops.einsum(O[l1], P[l1 + 1 :], "writer d_model i, layer reader d_model j -> layer writer reader i j")
        GM = einops.einsum(G[l1], M, "writer i k, layer writer reader k j -> layer writer reader i j")
        MH = einops.einsum(M, H[l1 + 1 :], "layer writer reader i k, layer reader j k -> layer writer reader i j")
        product_norms = (GM * MH).sum(dim=(-2, -1)).clamp(min=0).sqrt()  # [layer, writer, reader]
        denominators = writer_norms[l1][None, :, None] * reader_norms[l1 + 1 :][:, None, :]
        scores[l1, :, l1 + 1 :, :] = einops.rearrange(
            product_norms / denominators, "layer writer reader -> writer layer reader"
        )
    return scores


def _frobenius(gram_left: Tensor, gram_right: Tensor) -> Tensor:
    """``||A B^T||_F`` from ``A^T A`` and ``B^T B`` (both ``[..., d_head, d_head]``): ``sqrt(tr(A^T A B^T B))``."""
    return (gram_left * gram_right.transpose(-2, -1)).sum(dim=(-2, -1)).clamp(min=0).sqrt()
