"""Ported from TransformerLens v3.5.1, tests/unit/factored_matrix/test_constructor.py (MIT License, see
LICENSE-TransformerLens).

Changed: imports, and the model source (tests.compat.hub stand-ins for hub checkpoints).
Adapted (our error contract): batch axes that do not broadcast raise ValueError (TransformerLens: RuntimeError).
TransformerLens skips the inner-dimension test (its type checks fire first); it runs here.
"""

import pytest
import torch

from interp_transformer import FactoredMatrix


def test_factored_matrix():
    A = torch.randn(5, 3)
    B = torch.randn(3, 7)
    f = FactoredMatrix(A, B)

    assert torch.equal(f.A, A)
    assert torch.equal(f.B, B)

    assert (f.ldim, f.mdim, f.rdim) == (5, 3, 7)
    assert not f.has_leading_dims
    assert f.shape == (5, 7)


def test_factored_matrix_b_leading_dims():
    A = torch.ones((5, 3))
    B = torch.ones((2, 4, 3, 7))
    f = FactoredMatrix(A, B)

    assert f.A.shape == (2, 4, 5, 3)
    assert torch.equal(f.B, B)

    assert (f.ldim, f.mdim, f.rdim) == (5, 3, 7)
    assert f.has_leading_dims
    assert f.shape == (2, 4, 5, 7)


def test_factored_matrix_a_b_leading_dims():
    A = torch.ones((4, 5, 3))
    B = torch.ones((2, 4, 3, 7))
    f = FactoredMatrix(A, B)

    assert f.A.shape == (2, 4, 5, 3)
    assert torch.equal(f.B, B)

    assert (f.ldim, f.mdim, f.rdim) == (5, 3, 7)
    assert f.has_leading_dims
    assert f.shape == (2, 4, 5, 7)


def test_factored_matrix_broadcast_mismatch():
    A = torch.ones((9, 5, 3))
    B = torch.ones((2, 4, 3, 7))

    with pytest.raises(ValueError, match="do not broadcast"):  # ours: ValueError
        FactoredMatrix(A, B)


# TransformerLens skips this test (its jaxtyping checks fire first, issue 190); ours reaches the check: it runs here
def test_factored_matrix_inner_mismatch():
    A = torch.ones((2, 3, 4))
    B = torch.ones((2, 3, 5))
    with pytest.raises(AssertionError) as e:
        FactoredMatrix(A, B)

    assert "inner dimension" in str(e.value)
