"""TransformerLens' ``FactoredMatrix``: our ``FactoredMatrix`` with TransformerLens' conventions where they differ.

- ``svd()`` returns ``(U, S, V)`` with ``AB = U diag(S) V^T`` (ours returns ``Vh = V^T``);
  ``V`` is a property, and ``Vh`` a deprecated alias that, as in TransformerLens, returns ``V``;
- indexing never returns a dense tensor: an integer row or column index keeps its axis
  (``fm[0, 0, 0, 1]`` is a ``1 x rdim`` factored matrix), as TransformerLens does;
- ``get_corner(k)`` takes the first ``k`` entries of every axis, batch axes included;
- ``has_leading_dims``: whether there are batch axes.

Everything else (products, ``norm``, ``eigenvalues``, ``collapse_l``/``collapse_r``, chunked
scans, factors and operands given as numpy arrays or lists) is ours, and every result is again
of this class. Errors carry our messages; where TransformerLens asserts (``fm * tensor_2d``, an
inner-dimension mismatch, ``BA`` of a non-square product) they are ``CompatValueError``, a
``ValueError`` that is also an ``AssertionError`` (``compat.errors``).

>>> import torch
>>> fm = FactoredMatrix(torch.randn(5, 3, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64))
>>> U, S, V = fm.svd()
>>> torch.allclose(U @ torch.diag(S) @ V.T, fm.AB)
True
>>> fm[1].shape, fm[1, 2].shape
(torch.Size([1, 4]), torch.Size([1, 1]))
"""

import functools
import warnings
from typing import Any, NamedTuple

import torch
from jaxtyping import Float

from interp_transformer.circuits.factored_matrix import FactoredMatrix as CoreFactoredMatrix
from interp_transformer.circuits.factored_matrix import _keep_axis
from interp_transformer.compat.errors import assertion_compatible_methods


class SVDV(NamedTuple):
    """``AB = U diag(S) V^T``, TransformerLens' convention."""

    U: Float[torch.Tensor, "*batch ldim k"]
    S: Float[torch.Tensor, "*batch k"]
    V: Float[torch.Tensor, "*batch rdim k"]


class FactoredMatrix(CoreFactoredMatrix):
    """``A @ B`` kept as its factors, with TransformerLens' conventions (see the module docstring)."""

    @property
    def has_leading_dims(self) -> bool:
        return len(self.batch_shape) > 0

    @functools.cached_property
    def _svd_v(self) -> SVDV:
        U, S, Vh = super().svd()
        return SVDV(U, S, Vh.mT)

    def svd(self) -> SVDV:  # type: ignore[override]
        """``(U, S, V)`` with ``AB = U @ diag(S) @ V^T`` (cached): U ``[*batch, ldim, k]``, V ``[*batch, rdim, k]``."""
        return self._svd_v

    @property
    def V(self) -> Float[torch.Tensor, "*batch rdim k"]:
        """Right singular vectors: ``AB = U @ diag(S) @ V^T``."""
        return self._svd_v.V

    @property
    def Vh(self) -> Float[torch.Tensor, "*batch rdim k"]:
        """Deprecated alias of ``V`` (TransformerLens' ``Vh`` has always returned ``V``, not its transpose)."""
        warnings.warn(
            "FactoredMatrix.Vh returns V (right singular vectors), not Vh, as in TransformerLens; use .V, "
            "or .V.mT for the transpose",
            DeprecationWarning,
            stacklevel=2,
        )
        return self._svd_v.V

    def collapse_l(self) -> Float[torch.Tensor, "*batch k rdim"]:
        """``diag(S) V^T``: the thin right factor with ``AB = U @ collapse_l()``."""
        return self.S[..., :, None] * self.V.mT

    def make_even(self) -> "FactoredMatrix":
        """The same AB with balanced factors ``U sqrt(S)`` and ``sqrt(S) V^T``."""
        root_S = self.S.sqrt()
        return self._new(self.U * root_S[..., None, :], root_S[..., :, None] * self.V.mT)

    def get_corner(self, k: int = 3) -> torch.Tensor:
        """The first ``k`` entries along every axis of AB (batch axes too), as TransformerLens' ``get_corner``."""
        corner = self.A[..., :k, :] @ self.B[..., :, :k]
        return corner[tuple(slice(k) for _ in range(corner.ndim))]

    def __getitem__(self, index: Any) -> "FactoredMatrix":
        """Index batch axes, then rows, then columns; an integer row or column keeps its axis (never dense)."""
        batch_index, row, col = self._split_index(index)
        whole = (slice(None), slice(None))
        selected = self._new(self.A[batch_index + whole], self.B[batch_index + whole])
        return selected._new(selected.A[..., _keep_axis(row), :], selected.B[..., :, _keep_axis(col)])

    def __repr__(self) -> str:
        return f"FactoredMatrix: Shape({self.shape}), Hidden Dim({self.mdim})"


assertion_compatible_methods(
    FactoredMatrix,
    [
        "__init__",
        "__matmul__",
        "__rmatmul__",
        "__mul__",
        "__rmul__",
        "__getitem__",
        "BA",
        "eigenvalues",
        "diagonal",
        "unsqueeze",
        "rows",
        "cols",
        "top_k_per_row",
    ],
)

__all__ = ["FactoredMatrix", "SVDV"]
