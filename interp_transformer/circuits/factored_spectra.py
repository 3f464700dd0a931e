"""The spectral quantities of a product ``A @ B`` computed from its factors (what ``FactoredMatrix`` answers with).

The SVD from QR decompositions of the thin factors, the nonzero eigenvalues from the small
``B @ A``, the Frobenius norm from two Gram matrices. Half precision, which ``torch.linalg``
does not decompose, is computed in float32.
"""

from typing import NamedTuple

import torch
from jaxtyping import Complex, Float


class SVD(NamedTuple):
    """Thin SVD ``AB = U @ diag(S) @ Vh`` with ``k = min(ldim, mdim, rdim)``."""

    U: Float[torch.Tensor, "*batch ldim k"]
    S: Float[torch.Tensor, "*batch k"]
    Vh: Float[torch.Tensor, "*batch k rdim"]


def thin_svd(A: torch.Tensor, B: torch.Tensor, dtype: torch.dtype) -> SVD:
    """Thin SVD of ``A @ B`` from the factors, returned in ``dtype``.

    ``A = Q_A R_A`` and ``B^H = Q_B R_B`` (thin QR), so ``AB = Q_A (R_A R_B^H) Q_B^H``. The core
    ``R_A R_B^H`` is at most ``mdim x mdim``; its SVD ``U_c S Vh_c`` gives ``AB = (Q_A U_c) S
    (Vh_c Q_B^H)``, and ``Q_A U_c``, ``Vh_c Q_B^H`` keep orthonormal columns/rows. Cost
    ``O((ldim + rdim) mdim^2)``.
    """
    Q_A, R_A = torch.linalg.qr(_decomposable(A))
    Q_B, R_B = torch.linalg.qr(_decomposable(B).mH)
    U_core, S, Vh_core = torch.linalg.svd(R_A @ R_B.mH, full_matrices=False)
    return SVD(U=(Q_A @ U_core).to(dtype), S=S.to(dtype), Vh=(Vh_core @ Q_B.mH).to(dtype))


def nonzero_eigenvalues(A: torch.Tensor, B: torch.Tensor) -> Complex[torch.Tensor, "*batch mdim"]:
    """Eigenvalues of the small ``B @ A``: the nonzero eigenvalues of ``A @ B``, with multiplicity.

    ``AB x = l x`` with ``l != 0`` implies ``BA (B x) = l (B x)`` and ``B x != 0``; the two
    spectra (``ldim`` and ``mdim`` values) differ only by zeros.
    """
    return torch.linalg.eigvals(_decomposable(B) @ _decomposable(A))


def frobenius_norm(A: torch.Tensor, B: torch.Tensor) -> Float[torch.Tensor, "*batch"]:
    """``||AB||_F`` from two ``mdim x mdim`` Gram matrices: ``||AB||_F^2 = tr((A^T A)(B B^T))``, no SVD."""
    squared = ((A.mT @ A) * (B @ B.mT)).sum(dim=(-2, -1))
    return squared.clamp_min(0).sqrt()


def _decomposable(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in a dtype ``torch.linalg`` decomposes: half precision (bfloat16, float16) becomes float32."""
    return tensor.float() if tensor.dtype in (torch.bfloat16, torch.float16) else tensor


__all__ = ["SVD", "frobenius_norm", "nonzero_eigenvalues", "thin_svd"]
