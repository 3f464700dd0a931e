"""The spectral quantities of a ``FactoredMatrix`` ``A @ B``, all computed from the factors.

The SVD from QR decompositions of the thin factors, the nonzero eigenvalues from the small
``B @ A``, the Frobenius norm from two Gram matrices. Half precision, which ``torch.linalg``
does not decompose, is computed in float32.
"""

import functools
from typing import NamedTuple

import torch
from jaxtyping import Complex, Float


class SVD(NamedTuple):
    """Thin SVD ``AB = U @ diag(S) @ Vh`` with ``k = min(ldim, mdim, rdim)``."""

    U: Float[torch.Tensor, "*batch ldim k"]
    S: Float[torch.Tensor, "*batch k"]
    Vh: Float[torch.Tensor, "*batch k rdim"]


class FactoredSpectra:
    """SVD, eigenvalues and norm of ``A @ B`` for ``FactoredMatrix`` (which holds ``_A``, ``_B``)."""

    @functools.cached_property
    def _svd(self) -> SVD:
        # A = Q_A R_A and B^H = Q_B R_B (thin QR), so AB = Q_A (R_A R_B^H) Q_B^H. The core
        # R_A R_B^H is at most mdim x mdim; its SVD U_c S Vh_c gives AB = (Q_A U_c) S (Vh_c Q_B^H),
        # and Q_A U_c, Vh_c Q_B^H keep orthonormal columns/rows. Cost O((ldim + rdim) mdim^2).
        # Half precision (which torch.linalg does not decompose) is computed in float32 and returned as given.
        A, B = _decomposable(self._A), _decomposable(self._B)
        Q_A, R_A = torch.linalg.qr(A)
        Q_B, R_B = torch.linalg.qr(B.mH)
        U_core, S, Vh_core = torch.linalg.svd(R_A @ R_B.mH, full_matrices=False)
        dtype = self.dtype
        return SVD(U=(Q_A @ U_core).to(dtype), S=S.to(dtype), Vh=(Vh_core @ Q_B.mH).to(dtype))

    def svd(self) -> SVD:
        """Thin SVD ``AB = U diag(S) Vh`` computed from the factors (cached).

        Same convention as ``torch.linalg.svd(AB, full_matrices=False)`` truncated to
        ``k = min(ldim, mdim, rdim)`` (the rank bound): S descending, U ``[*batch, ldim, k]``
        with orthonormal columns, Vh ``[*batch, k, rdim]`` with orthonormal rows. Singular
        vectors are unique only up to sign (and rotation within repeated singular values).
        """
        return self._svd

    @property
    def U(self) -> Float[torch.Tensor, "*batch ldim k"]:
        return self._svd.U

    @property
    def S(self) -> Float[torch.Tensor, "*batch k"]:
        return self._svd.S

    @property
    def Vh(self) -> Float[torch.Tensor, "*batch k rdim"]:
        return self._svd.Vh

    @functools.cached_property
    def eigenvalues(self) -> Complex[torch.Tensor, "*batch mdim"]:
        """Eigenvalues of ``BA`` (complex, unsorted; needs ``ldim == rdim``).

        ``AB x = l x`` with ``l != 0`` implies ``BA (B x) = l (B x)`` and ``B x != 0``, so the
        nonzero eigenvalues of the big AB are exactly those of the ``mdim x mdim`` BA,
        with multiplicity. The two spectra (ldim and mdim values) differ only by zeros.
        Half precision is computed in float32 (complex64 eigenvalues).
        """
        self._require_square("eigenvalues")
        return torch.linalg.eigvals(_decomposable(self._B) @ _decomposable(self._A))

    def norm(self) -> Float[torch.Tensor, "*batch"]:
        """Frobenius norm ``||AB||_F``, one value per batch entry.

        ``||AB||_F^2 = tr((A^T A)(B B^T))``: two ``mdim x mdim`` Gram matrices, no SVD
        (composition scores take thousands of these).
        """
        squared = ((self.A.mT @ self.A) * (self.B @ self.B.mT)).sum(dim=(-2, -1))
        return squared.clamp_min(0).sqrt()


def _decomposable(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in a dtype ``torch.linalg`` decomposes: half precision (bfloat16, float16) becomes float32."""
    return tensor.float() if tensor.dtype in (torch.bfloat16, torch.float16) else tensor


__all__ = ["SVD", "FactoredSpectra"]
