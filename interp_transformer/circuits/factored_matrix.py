"""A matrix product ``A @ B`` kept as its two factors.

Circuit analysis multiplies weight matrices whose product is much bigger than
its factors. The QK circuit of one head, ``W_Q[h] @ W_K[h].T``, is
``d_model x d_model`` with rank at most ``d_head``; the full QK circuit
``W_E W_Q W_K^T W_E^T`` is ``d_vocab x d_vocab`` (2.5 billion entries for
GPT-2) with the same rank. ``FactoredMatrix(A, B)`` stores

    A: [*batch, ldim, mdim]    B: [*batch, mdim, rdim]    AB = A @ B: [*batch, ldim, rdim]

and answers questions about ``AB`` from the factors: the SVD from QR
decompositions of the thin factors, the nonzero eigenvalues from the small
``B @ A``, the Frobenius norm from the singular values, rows and columns on
demand. The full ``ldim x rdim`` tensor is built only when you ask for ``AB``;
``iter_row_chunks`` builds it one block of rows at a time.

Axes: ``ldim`` (rows of AB), ``mdim`` (the inner dimension), ``rdim`` (columns
of AB), and leading ``*batch`` axes such as ``layer head_index``, broadcast
between A and B.

Factors and operands may be anything ``torch.as_tensor`` takes (a numpy array, nested
lists of numbers); an operand of ``@`` takes the matrix's dtype and device:

>>> import numpy as np
>>> fm = FactoredMatrix(np.eye(3), torch.ones(3, 2, dtype=torch.float64))
>>> (fm @ np.ones((2, 4))).AB.shape, (np.ones(3) @ fm).tolist()
(torch.Size([3, 4]), [3.0, 3.0])

How this differs from classic TransformerLens' ``FactoredMatrix``: ``svd()``
returns ``Vh`` (as ``torch.linalg.svd`` does), not ``V``; an integer row or
column index returns a dense tensor (a row of AB is a vector, not a factored
matrix); ``rows``/``cols`` select token subsets and stay factored; row-chunked
scans bound the memory of vocab-sized circuits. Annotations here document
shapes and are not checked at run time, to keep ``@`` cheap.
"""

import functools
import numbers
from collections.abc import Iterator
from typing import Any, NamedTuple, TypeGuard, TypeVar, Union

import einops
import torch
from jaxtyping import Complex, Float, Int

from interp_transformer.circuits import factored_spectra as spectra
from interp_transformer.circuits.factored_spectra import SVD

Scalar = int | float | torch.Tensor
AxisIndex = int | slice | list | torch.Tensor


class TopK(NamedTuple):
    """The ``k`` largest (or smallest) entries of each row of AB, with their columns."""

    values: Float[torch.Tensor, "*batch ldim k"]
    indices: Int[torch.Tensor, "*batch ldim k"]


def _shape(tensor: Union[torch.Tensor, "FactoredMatrix"]) -> tuple[int, ...]:
    return tuple(tensor.shape)


def _is_integer(index: Any) -> TypeGuard[int | torch.Tensor]:
    """True for an index that removes an axis: a Python int or a 0-d integer tensor."""
    if isinstance(index, torch.Tensor):
        return index.ndim == 0 and not index.is_floating_point() and index.dtype != torch.bool
    return isinstance(index, numbers.Integral) and not isinstance(index, bool)


def _as_tensor(value: Any) -> Any:
    """``torch.as_tensor(value)`` for what it takes (a numpy array, nested lists of numbers); anything else as it is."""
    if isinstance(value, (torch.Tensor, str, bytes)) or value is None:
        return value
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        return value


def _keep_axis(index: AxisIndex) -> slice | torch.Tensor:
    """Turn a row/column selector into one that keeps the axis (an int ``i`` becomes ``[i]``)."""
    if isinstance(index, slice):
        return index
    if _is_integer(index):
        return torch.tensor([int(index)])
    if isinstance(index, (list, range)):
        # as_tensor keeps a list of bools a mask; an empty list must still index as long
        index = torch.as_tensor(list(index)) if len(index) else torch.empty(0, dtype=torch.long)
    if not isinstance(index, torch.Tensor):
        kind = type(index).__name__
        raise TypeError(f"row/column index must be an int, slice, list or 1-d tensor, got {kind}")
    if index.ndim != 1:
        raise IndexError(f"row/column index must be 1-d, got shape {_shape(index)}")
    return index


FactoredMatrixT = TypeVar("FactoredMatrixT", bound="FactoredMatrix")  # a subclass keeps its class through _new


class FactoredMatrix:
    """The product ``AB = A @ B`` of ``A: [*batch, ldim, mdim]`` and ``B: [*batch, mdim, rdim]``.

    Batch axes broadcast (``A`` and ``B`` are stored expanded to the common
    batch shape, as views). The factors are read-only: every operation
    returns a new ``FactoredMatrix`` or tensor, so cached results stay valid.

    >>> W_Q, W_K = torch.randn(768, 64), torch.randn(768, 64)
    >>> qk = FactoredMatrix(W_Q, W_K.T)   # W_Q W_K^T, never built as 768 x 768
    >>> qk.shape, qk.S.shape
    (torch.Size([768, 768]), torch.Size([64]))
    """

    __array_ufunc__ = None  # numpy_array @ fm: numpy steps aside for __rmatmul__

    def __init__(
        self,
        A: Float[torch.Tensor, "*batch ldim mdim"],
        B: Float[torch.Tensor, "*batch mdim rdim"],
    ) -> None:
        A, B = _as_tensor(A), _as_tensor(B)
        for name, factor in (("A", A), ("B", B)):
            if not isinstance(factor, torch.Tensor):
                raise TypeError(
                    f"{name} must be a torch.Tensor or what torch.as_tensor takes (a numpy array, nested lists of "
                    f"numbers), got {type(factor).__name__}"
                )
            if factor.ndim < 2:
                raise ValueError(f"{name} must have at least 2 axes [..., rows, columns], got shape {_shape(factor)}")
        if A.shape[-1] != B.shape[-2]:
            raise ValueError(
                f"inner dimensions differ: A has shape {_shape(A)} = [..., ldim, mdim], "
                f"so B must have shape [..., {A.shape[-1]}, rdim], got {_shape(B)}"
            )
        if A.device != B.device:
            raise ValueError(f"A and B must be on one device, got {A.device} and {B.device}")
        try:
            batch = torch.broadcast_shapes(A.shape[:-2], B.shape[:-2])
        except RuntimeError as error:
            raise ValueError(f"batch axes of A {_shape(A)[:-2]} and B {_shape(B)[:-2]} do not broadcast") from error
        dtype = torch.promote_types(A.dtype, B.dtype)
        self._A = A.to(dtype).expand(*batch, *A.shape[-2:])
        self._B = B.to(dtype).expand(*batch, *B.shape[-2:])

    # ---- shapes and the factors themselves -------------------------------------------

    @property
    def A(self) -> Float[torch.Tensor, "*batch ldim mdim"]:
        return self._A

    @property
    def B(self) -> Float[torch.Tensor, "*batch mdim rdim"]:
        return self._B

    @property
    def pair(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The factors ``(A, B)``."""
        return self._A, self._B

    @property
    def ldim(self) -> int:
        return self._A.shape[-2]

    @property
    def mdim(self) -> int:
        return self._A.shape[-1]

    @property
    def rdim(self) -> int:
        return self._B.shape[-1]

    @property
    def batch_shape(self) -> torch.Size:
        return self._A.shape[:-2]

    @property
    def shape(self) -> torch.Size:
        """Shape of AB: ``[*batch, ldim, rdim]``."""
        return torch.Size((*self.batch_shape, self.ldim, self.rdim))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self._A.dtype

    @property
    def device(self) -> torch.device:
        return self._A.device

    def __repr__(self) -> str:
        shapes = f"shape={_shape(self)}, A={_shape(self._A)}, B={_shape(self._B)}"
        return f"FactoredMatrix({shapes}, dtype={self.dtype})"

    def to(self, *args: Any, **kwargs: Any) -> "FactoredMatrix":
        """Move or cast both factors, with the arguments of ``torch.Tensor.to``."""
        return self._new(self._A.to(*args, **kwargs), self._B.to(*args, **kwargs))

    def unsqueeze(self, dim: int) -> "FactoredMatrix":
        """Insert a batch axis of size 1 at ``dim`` (counted as in ``Tensor.unsqueeze`` on AB).

        Only batch positions are allowed: the last two axes stay ``ldim rdim``.
        """
        n_batch = len(self.batch_shape)
        position = dim + self.ndim + 1 if dim < 0 else dim
        if not 0 <= position <= n_batch:
            raise ValueError(
                f"unsqueeze dim must be a batch position, in [0, {n_batch}] or "
                f"[{-self.ndim - 1}, -3] for shape {_shape(self)}, got {dim}"
            )
        return self._new(self._A.unsqueeze(position), self._B.unsqueeze(position))

    # ---- dense products ---------------------------------------------------------------

    @property
    def AB(self) -> Float[torch.Tensor, "*batch ldim rdim"]:
        """The dense product ``A @ B``; for a vocab-sized AB prefer ``rows``/``iter_row_chunks``."""
        return self._A @ self._B

    @property
    def BA(self) -> Float[torch.Tensor, "*batch mdim mdim"]:
        """The small product ``B @ A`` (needs ``ldim == rdim``); same nonzero spectrum as AB."""
        self._require_square("BA")
        return self._B @ self._A

    @property
    def T(self) -> "FactoredMatrix":
        """The transpose ``(AB)^T = B^T A^T``, still factored."""
        return self._new(self._B.mT, self._A.mT)

    def get_corner(self, k: int = 3) -> Float[torch.Tensor, "*batch k k"]:
        """The dense top-left ``k x k`` block of AB in every batch entry: ``A[:k] @ B[:, :k]``."""
        return self._A[..., :k, :] @ self._B[..., :, :k]

    def diagonal(self) -> Float[torch.Tensor, "*batch ldim"]:
        """The diagonal ``(AB)_ii = sum_m A_im B_mi``, without building AB (needs ldim == rdim)."""
        self._require_square("diagonal")
        return einops.einsum(self._A, self._B, "... row inner, ... inner row -> ... row")

    # ---- spectra, from the factors (circuits.factored_spectra) ------------------------
    @functools.cached_property
    def _svd(self) -> SVD:
        return spectra.thin_svd(self._A, self._B, self.dtype)

    def svd(self) -> SVD:
        """Thin SVD ``AB = U diag(S) Vh`` computed from the factors (cached).

        Same convention as ``torch.linalg.svd(AB, full_matrices=False)`` truncated to
        ``k = min(ldim, mdim, rdim)`` (the rank bound): S descending, U ``[*batch, ldim, k]``
        with orthonormal columns, Vh ``[*batch, k, rdim]`` with orthonormal rows. Singular
        vectors are unique only up to sign (and rotation within repeated singular values).
        Half precision, which ``torch.linalg`` does not decompose, is computed in float32.
        """
        return self._svd

    U = property(lambda self: self._svd.U, doc="``[*batch, ldim, k]``: left singular vectors.")
    S = property(lambda self: self._svd.S, doc="``[*batch, k]``: singular values, descending.")
    Vh = property(lambda self: self._svd.Vh, doc="``[*batch, k, rdim]``: right singular vectors, as rows.")

    @functools.cached_property
    def eigenvalues(self) -> Complex[torch.Tensor, "*batch mdim"]:
        """Eigenvalues of ``BA`` (complex, unsorted; needs ``ldim == rdim``): the nonzero ones of ``AB``."""
        self._require_square("eigenvalues")
        return spectra.nonzero_eigenvalues(self._A, self._B)

    def norm(self) -> Float[torch.Tensor, "*batch"]:
        """Frobenius norm ``||AB||_F``, one value per batch entry, with no SVD."""
        return spectra.frobenius_norm(self.A, self.B)

    # ---- arithmetic -------------------------------------------------------------------

    def __matmul__(self, other: Any) -> Union["FactoredMatrix", torch.Tensor]:
        """``AB @ other``: a vector gives a dense vector, a matrix or FactoredMatrix stays factored.

        Shapes: ``[rdim]`` -> ``[*batch, ldim]``; ``[..., rdim, n]`` -> ``[..., ldim, n]``.
        """
        if isinstance(other, FactoredMatrix):
            return _chain(self, other)
        other = self._operand(other)
        if other is None:
            return NotImplemented
        if other.ndim == 1:
            self._check_operand(other, 0, self.rdim, f"a vector of shape [{self.rdim}]")
            # as a column [rdim, 1] so that batch axes of the factors broadcast
            return (self._A @ (self._B @ other.unsqueeze(-1))).squeeze(-1)
        self._check_operand(other, -2, self.rdim, f"shape [..., {self.rdim}, n] on the right")
        # (AB) other splits as A (B other), inner mdim, or as (AB) other, inner rdim. Keep the
        # smaller inner dim; AB is built only when rdim < mdim, where it is smaller than A.
        if self.rdim < self.mdim:
            return self._new(self.AB, other)
        return self._new(self._A, self._B @ other)

    def __rmatmul__(self, other: Any) -> Union["FactoredMatrix", torch.Tensor]:
        """``other @ AB``, the mirror image of ``__matmul__``."""
        other = self._operand(other)
        if other is None:
            return NotImplemented
        if other.ndim == 1:
            self._check_operand(other, 0, self.ldim, f"a vector of shape [{self.ldim}]")
            return ((other.unsqueeze(-2) @ self._A) @ self._B).squeeze(-2)
        self._check_operand(other, -1, self.ldim, f"shape [..., n, {self.ldim}] on the left")
        if self.ldim < self.mdim:
            return self._new(other, self.AB)
        return self._new(other @ self._A, self._B)

    def __mul__(self, scalar: Scalar) -> "FactoredMatrix":
        """``c * AB = (c A) B`` for a Python number or a one-element tensor ``c`` (any number of axes of size 1)."""
        if not isinstance(scalar, (torch.Tensor, numbers.Number)):
            scalar = _as_tensor(scalar)  # a numpy array, a list
        if isinstance(scalar, torch.Tensor):
            if scalar.numel() != 1:
                raise ValueError(
                    f"FactoredMatrix can only be multiplied by a scalar (a tensor of one element), got shape "
                    f"{_shape(scalar)}; use @ for matrix products"
                )
            scalar = scalar.reshape(())
        elif isinstance(scalar, bool) or not isinstance(scalar, (int, float)):
            return NotImplemented
        return self._new(self._A * scalar, self._B)

    __rmul__ = __mul__

    def __neg__(self) -> "FactoredMatrix":
        return self * -1

    def collapse_l(self) -> Float[torch.Tensor, "*batch k rdim"]:
        """``diag(S) Vh``: the thin right factor with ``AB = U @ collapse_l()``."""
        return self.S[..., :, None] * self.Vh

    def collapse_r(self) -> Float[torch.Tensor, "*batch ldim k"]:
        """``U diag(S)``: the thin left factor with ``AB = collapse_r() @ Vh``."""
        return self.U * self.S[..., None, :]

    def make_even(self) -> "FactoredMatrix":
        """The same AB with balanced factors ``A' = U sqrt(S)``, ``B' = sqrt(S) Vh`` (inner k)."""
        root_S = self.S.sqrt()
        return self._new(self.U * root_S[..., None, :], root_S[..., :, None] * self.Vh)

    # ---- indexing and scanning --------------------------------------------------------

    def rows(self, index: AxisIndex) -> "FactoredMatrix":
        """Rows ``index`` of AB, factored: ``A[..., index, :] @ B``; an int keeps its axis."""
        return self._new(self._A[..., _keep_axis(index), :], self._B)

    def cols(self, index: AxisIndex) -> "FactoredMatrix":
        """Columns ``index`` of AB, factored: ``A @ B[..., :, index]``; an int keeps its axis."""
        return self._new(self._A, self._B[..., :, _keep_axis(index)])

    def __getitem__(self, index: Any) -> Union["FactoredMatrix", torch.Tensor]:
        """Index AB as ``fm[*batch_index, row_index, column_index]`` (missing trailing = ``:``).

        Batch indices apply to A and B alike (``fm[0, 3]`` is layer 0, head 3); row indices
        slice A, column indices slice B, each independently (not broadcast together as
        numpy would for several index arrays). Slices, lists and 1-d tensors keep the result
        factored; an integer row or column index returns the dense row, column or entry.
        """
        batch_index, row, col = self._split_index(index)
        whole = (slice(None), slice(None))
        selected = self._new(self._A[batch_index + whole], self._B[batch_index + whole])
        selected = selected.rows(row).cols(col)
        if not (_is_integer(row) or _is_integer(col)):
            return selected
        dense = selected.AB
        if _is_integer(row):
            dense = dense.squeeze(-2)
        if _is_integer(col):
            dense = dense.squeeze(-1)
        return dense

    def iter_row_chunks(self, chunk_size: int) -> Iterator[tuple[slice, Float[torch.Tensor, "*batch chunk rdim"]]]:
        """Yield ``(rows, AB[..., rows, :])`` for consecutive row blocks of at most ``chunk_size``.

        Peak memory is one ``[*batch, chunk_size, rdim]`` block, so a d_vocab x d_vocab
        circuit can be scanned without ever holding it whole.
        """
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
        for start in range(0, self.ldim, chunk_size):
            rows = slice(start, min(start + chunk_size, self.ldim))
            yield rows, self._A[..., rows, :] @ self._B

    def top_k_per_row(self, k: int, chunk_size: int = 1024, largest: bool = True) -> TopK:
        """The ``k`` largest (or smallest) entries of each row of AB, scanned in row chunks."""
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.rdim:
            raise ValueError(f"k must be an int in [1, rdim={self.rdim}], got {k!r}")
        values, indices = [], []
        for _, block in self.iter_row_chunks(chunk_size):
            top = block.topk(k, dim=-1, largest=largest)
            values.append(top.values)
            indices.append(top.indices)
        return TopK(values=torch.cat(values, dim=-2), indices=torch.cat(indices, dim=-2))

    # ---- helpers ----------------------------------------------------------------------

    def _new(self: "FactoredMatrixT", A: torch.Tensor, B: torch.Tensor) -> "FactoredMatrixT":
        """A factored matrix of this one's class (so that a subclass's results stay of the subclass)."""
        return type(self)(A, B)

    def _require_square(self, what: str) -> None:
        if self.ldim != self.rdim:
            raise ValueError(f"{what} needs a square AB (ldim == rdim), got shape {_shape(self)}")

    def _operand(self, other: Any) -> torch.Tensor | None:
        """``other`` as a tensor of this matrix's dtype and device (what ``torch.as_tensor`` takes: a numpy array,
        nested lists), or None where it is no vector or matrix (then ``other``'s own operator may answer)."""
        other = _as_tensor(other)
        if not isinstance(other, torch.Tensor) or other.ndim == 0:
            return None
        return other if other.dtype == self.dtype and other.device == self.device else other.to(self.device, self.dtype)

    def _check_operand(self, other: torch.Tensor, axis: int, size: int, wanted: str) -> None:
        if other.shape[axis] != size:
            raise ValueError(f"cannot multiply {self!r} with a tensor of shape {_shape(other)}: expected {wanted}")

    def _split_index(self, index: Any) -> tuple[tuple, Any, Any]:
        """Expand ``...`` and missing trailing axes into (batch indices, row index, col index)."""
        index = index if isinstance(index, tuple) else (index,)
        for item in index:
            if item is None:
                raise IndexError("None (new axis) is not supported in indexing; use unsqueeze")
            if isinstance(item, torch.Tensor) and item.dtype == torch.bool and item.ndim != 1:
                raise IndexError(f"boolean masks must be 1-d, got shape {_shape(item)}")
        ellipses = [position for position, item in enumerate(index) if item is Ellipsis]
        if len(ellipses) > 1:
            raise IndexError("an index can only have a single ellipsis ('...')")
        n_explicit = len(index) - len(ellipses)
        if n_explicit > self.ndim:
            raise IndexError(f"too many indices for FactoredMatrix of shape {_shape(self)}: got {n_explicit}")
        fill = (slice(None),) * (self.ndim - n_explicit)
        at = ellipses[0] if ellipses else len(index)  # no ellipsis: fill the trailing axes
        index = index[:at] + fill + index[at + 1 :]
        return index[:-2], index[-2], index[-1]


def _chain(left: FactoredMatrix, right: FactoredMatrix) -> FactoredMatrix:
    """``(A1 B1)(A2 B2)`` as a FactoredMatrix whose inner dim is ``min(mdim1, rdim1, mdim2)``."""
    if left.rdim != right.ldim:
        raise ValueError(
            f"cannot multiply {left!r} @ {right!r}: left rdim={left.rdim} must equal right ldim={right.ldim}"
        )
    # (A1 B1)(A2 B2) = ((A1 B1) A2) B2: each product keeps the smaller inner dim, so the result's is
    # min(mdim1, rdim1, mdim2) and no factor bigger than the inputs is built
    return (left @ right.A) @ right.B  # type: ignore[return-value]  # right.A is a matrix: the product stays factored
