"""FactoredMatrix against the dense product it stands for.

Every operation is compared with the same operation on ``A @ B`` built densely
(torch.linalg for SVD, eigenvalues and norms), in float64 on random factors of
several shapes: batched, broadcast, inner dim larger or smaller than the outer
dims, and rank-deficient. A vocab-sized case checks that the spectral methods
never build the ``ldim x rdim`` product.
"""

import time

import pytest
import torch
from torch.overrides import TorchFunctionMode

from interp_transformer.circuits.factored_matrix import FactoredMatrix

# (batch, ldim, mdim, rdim, rank of A or None for generic full rank)
SHAPES = [
    ((), 7, 3, 5, None),
    ((), 4, 6, 5, None),  # inner dim larger than both outer dims
    ((), 6, 6, 6, 2),  # rank-deficient, square
    ((2, 3), 6, 4, 6, None),
    ((2, 3), 5, 4, 5, 2),  # batched and rank-deficient
    ((3,), 5, 8, 5, None),  # BA has zero eigenvalues
    ((), 6, 1, 6, None),  # rank one
]
SQUARE_SHAPES = [shape for shape in SHAPES if shape[1] == shape[3]]


def make_factors(batch, ldim, mdim, rdim, rank=None, seed=0):
    generator = torch.Generator().manual_seed(seed)
    if rank is None:
        A = torch.randn(*batch, ldim, mdim, generator=generator, dtype=torch.float64)
    else:
        thin = torch.randn(*batch, ldim, rank, generator=generator, dtype=torch.float64)
        A = thin @ torch.randn(*batch, rank, mdim, generator=generator, dtype=torch.float64)
    B = torch.randn(*batch, mdim, rdim, generator=generator, dtype=torch.float64)
    return A, B


def expected_rank(ldim, mdim, rdim, rank):
    return min(ldim, mdim, rdim, rank if rank is not None else mdim)


def close(actual, expected, atol=1e-10):
    torch.testing.assert_close(actual, expected, rtol=1e-9, atol=atol)


def shape_id(shape):
    batch, ldim, mdim, rdim, rank = shape
    return f"batch{list(batch)}-{ldim}x{mdim}x{rdim}-rank{rank}"


@pytest.fixture(params=SHAPES, ids=shape_id)
def case(request):
    batch, ldim, mdim, rdim, rank = request.param
    A, B = make_factors(batch, ldim, mdim, rdim, rank)
    return FactoredMatrix(A, B), A @ B, request.param


def test_shapes_and_dense_product(case):
    fm, dense, (batch, ldim, mdim, rdim, _) = case
    assert fm.shape == dense.shape == torch.Size((*batch, ldim, rdim))
    assert (fm.ldim, fm.mdim, fm.rdim, fm.ndim) == (ldim, mdim, rdim, dense.ndim)
    close(fm.AB, dense)
    A, B = fm.pair
    assert A is fm.A and B is fm.B


def test_batch_axes_broadcast():
    A = torch.randn(2, 1, 5, 4, dtype=torch.float64)
    B = torch.randn(3, 4, 6, dtype=torch.float64)
    fm = FactoredMatrix(A, B)
    assert fm.shape == (2, 3, 5, 6)
    close(fm.AB, A @ B)
    close(FactoredMatrix(A[0, 0], B).AB, A[0, 0] @ B)


def test_mixed_dtypes_promote():
    fm = FactoredMatrix(torch.randn(3, 2), torch.randn(2, 3, dtype=torch.float64))
    assert fm.dtype == torch.float64 == fm.A.dtype == fm.B.dtype


@pytest.mark.parametrize("shape", SQUARE_SHAPES)
def test_BA(shape):
    A, B = make_factors(*shape)
    close(FactoredMatrix(A, B).BA, B @ A)


def test_transpose(case):
    fm, dense, _ = case
    assert isinstance(fm.T, FactoredMatrix)
    close(fm.T.AB, dense.mT)


def test_matmul_dense_matrix_on_both_sides(case):
    fm, dense, (batch, ldim, mdim, rdim, _) = case
    right = torch.randn(rdim, 3, dtype=torch.float64)
    left = torch.randn(*batch, 2, ldim, dtype=torch.float64)
    product_right, product_left = fm @ right, left @ fm
    assert isinstance(product_right, FactoredMatrix) and isinstance(product_left, FactoredMatrix)
    close(product_right.AB, dense @ right)
    close(product_left.AB, left @ dense)
    # the inner dimension kept is the smaller of the two ways to split the product
    assert product_right.mdim == min(mdim, rdim)
    assert product_left.mdim == min(mdim, ldim)


def test_matmul_vectors(case):
    fm, dense, (_, ldim, _, rdim, _) = case
    right, left = torch.randn(rdim, dtype=torch.float64), torch.randn(ldim, dtype=torch.float64)
    close(fm @ right, dense @ right)
    close(left @ fm, left @ dense)


def test_chain_of_factored_matrices():
    A1, B1 = make_factors((2,), 5, 3, 7, seed=1)
    A2, B2 = make_factors((2,), 7, 4, 6, seed=2)
    A3, B3 = make_factors((), 6, 2, 5, seed=3)
    first, second, third = FactoredMatrix(A1, B1), FactoredMatrix(A2, B2), FactoredMatrix(A3, B3)
    chain = first @ second @ third
    assert isinstance(chain, FactoredMatrix)
    close(chain.AB, (A1 @ B1) @ (A2 @ B2) @ (A3 @ B3))
    assert (first @ second).mdim == 3 and (second @ third).mdim == 2 and chain.mdim == 2


def test_scalar_multiplication(case):
    fm, dense, _ = case
    close((fm * 2.5).AB, 2.5 * dense)
    close((-3 * fm).AB, -3 * dense)
    close((fm * torch.tensor(0.5, dtype=torch.float64)).AB, 0.5 * dense)
    close((torch.tensor(2.0, dtype=torch.float64) * fm).AB, 2 * dense)
    close((-fm).AB, -dense)


def assert_same_subspaces(ours, reference, rank):
    """Projectors onto the top-i singular vectors agree for i = 1..rank (sign-free)."""
    for i in range(1, rank + 1):
        ours_projector = ours[..., :i] @ ours[..., :i].mT
        close(ours_projector, reference[..., :i] @ reference[..., :i].mT, atol=1e-8)


def test_svd_matches_dense_svd(case):
    fm, dense, (_, ldim, mdim, rdim, rank) = case
    U, S, Vh = fm.svd()
    k = min(ldim, mdim, rdim)
    assert U.shape[-2:] == (ldim, k) and S.shape[-1] == k and Vh.shape[-2:] == (k, rdim)
    U_ref, S_ref, Vh_ref = torch.linalg.svd(dense, full_matrices=False)
    close(S, S_ref[..., :k], atol=1e-9)
    close(U @ torch.diag_embed(S) @ Vh, dense)
    identity = torch.eye(k, dtype=torch.float64)
    close(U.mT @ U, identity.expand_as(U.mT @ U))
    close(Vh @ Vh.mT, identity.expand_as(Vh @ Vh.mT))
    true_rank = expected_rank(ldim, mdim, rdim, rank)
    assert_same_subspaces(U, U_ref, true_rank)
    assert_same_subspaces(Vh.mT, Vh_ref.mT, true_rank)
    assert fm.svd() is fm.svd()  # cached
    assert fm.U is U and fm.S is S and fm.Vh is Vh


def assert_same_nonzero_eigenvalues(ours, reference, tol=1e-7):
    ours, reference = ours[ours.abs() > tol], reference[reference.abs() > tol]
    assert len(ours) == len(reference), (ours, reference)
    remaining = list(reference)
    for value in ours:
        distances = torch.stack(remaining).sub(value).abs()
        nearest = int(distances.argmin())
        assert distances[nearest] < 1e-8 * max(1.0, float(value.abs())), (value, reference)
        remaining.pop(nearest)


@pytest.mark.parametrize("shape", SQUARE_SHAPES)
def test_eigenvalues_are_the_nonzero_eigenvalues_of_AB(shape):
    A, B = make_factors(*shape)
    fm = FactoredMatrix(A, B)
    eigenvalues = fm.eigenvalues
    assert eigenvalues.is_complex() and eigenvalues.shape == (*shape[0], shape[2])
    reference = torch.linalg.eigvals(A @ B)
    for ours, theirs in zip(eigenvalues.reshape(-1, shape[2]), reference.reshape(-1, shape[1])):
        assert_same_nonzero_eigenvalues(ours, theirs)
    n_nonzero = (eigenvalues.abs() > 1e-7).sum(-1)
    assert bool((n_nonzero == expected_rank(*shape[1:])).all())


def test_norm_is_frobenius_norm(case):
    fm, dense, (batch, *_) = case
    norm = fm.norm()
    assert norm.shape == batch
    close(norm, torch.linalg.matrix_norm(dense))


def test_collapse_and_make_even(case):
    fm, dense, _ = case
    close(fm.U @ fm.collapse_l(), dense)
    close(fm.collapse_r() @ fm.Vh, dense)
    even = fm.make_even()
    close(even.AB, dense)
    # balanced: A'^T A' = B' B'^T = diag(S)
    close(even.A.mT @ even.A, torch.diag_embed(fm.S))
    close(even.B @ even.B.mT, torch.diag_embed(fm.S))


def test_corner_and_diagonal(case):
    fm, dense, (_, ldim, _, rdim, _) = case
    close(fm.get_corner(3), dense[..., :3, :3])
    close(fm.get_corner(100), dense)
    if ldim == rdim:
        close(fm.diagonal(), dense.diagonal(dim1=-2, dim2=-1))


BATCHED = make_factors((2, 3), 5, 4, 6, seed=7)
# indices whose meaning is the same for a FactoredMatrix and for the dense product
INDICES = [
    0,
    (1, 2),
    (slice(None), 1),
    (torch.tensor(1),),
    (..., [0, 2, 4], slice(None)),
    (..., slice(1, 4), [0, 5]),
    (0, ..., slice(None, None, 2)),
    (..., torch.tensor([True, False, True, False, True]), slice(None)),
    (1, slice(0, 2), torch.tensor([4, 1, 1])),  # repeated rows
]
DENSE_INDICES = [(1, ..., 2, slice(None)), (..., 3), (0, 1, 2, 3), (..., 2, torch.tensor([0, 3]))]


@pytest.mark.parametrize("index", INDICES + DENSE_INDICES, ids=repr)
def test_indexing_matches_dense(index):
    A, B = BATCHED
    fm, dense = FactoredMatrix(A, B), A @ B
    selected = fm[index]
    stays_factored = any(index is candidate for candidate in INDICES)
    assert isinstance(selected, FactoredMatrix) == stays_factored
    close(selected.AB if stays_factored else selected, dense[index])


def test_rows_and_columns_together_index_independently():
    A, B = BATCHED
    fm, dense = FactoredMatrix(A, B), A @ B
    rows, cols = [0, 2, 4], [0, 5]
    selected = fm[..., rows, cols]
    assert isinstance(selected, FactoredMatrix) and selected.shape == (2, 3, 3, 2)
    close(selected.AB, dense[..., rows, :][..., :, cols])


@pytest.mark.parametrize("index", [[4, 0, 0], slice(1, 3), torch.tensor([3, 1]), 2, []])
def test_rows_and_cols_stay_factored(index):
    A, B = BATCHED
    fm, dense = FactoredMatrix(A, B), A @ B
    keep = [index] if isinstance(index, int) else index
    assert isinstance(fm.rows(index), FactoredMatrix) and isinstance(fm.cols(index), FactoredMatrix)
    close(fm.rows(index).AB, dense[..., keep, :])
    close(fm.cols(index).AB, dense[..., :, keep])


def test_rows_and_cols_take_boolean_masks():
    A, B = BATCHED
    fm, dense = FactoredMatrix(A, B), A @ B
    row_mask, col_mask = [True, False, True, False, True], [False, True, True, False, False, True]
    close(fm.rows(row_mask).AB, dense[..., [0, 2, 4], :])
    close(fm.cols(torch.tensor(col_mask)).AB, dense[..., :, [1, 2, 5]])


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 5, 100])
def test_row_chunks_rebuild_the_dense_product(chunk_size):
    A, B = BATCHED
    fm, dense = FactoredMatrix(A, B), A @ B
    chunks = list(fm.iter_row_chunks(chunk_size))
    assert all(block.shape[-2] <= chunk_size for _, block in chunks)
    close(torch.cat([block for _, block in chunks], dim=-2), dense)
    for rows, block in chunks:
        close(block, dense[..., rows, :])


@pytest.mark.parametrize("largest", [True, False])
def test_top_k_per_row(largest):
    A, B = make_factors((2,), 30, 4, 20, seed=5)
    dense = A @ B
    top = FactoredMatrix(A, B).top_k_per_row(3, chunk_size=7, largest=largest)
    reference = dense.topk(3, dim=-1, largest=largest)
    close(top.values, reference.values)
    assert torch.equal(top.indices, reference.indices)


def test_unsqueeze_to_and_repr():
    A, B = BATCHED
    fm, dense = FactoredMatrix(A, B), A @ B
    for dim in [0, 1, 2, -3, -5]:
        close(fm.unsqueeze(dim).AB, dense.unsqueeze(dim))
    single = fm.to(torch.float32)
    assert single.dtype == torch.float32 and single.AB.dtype == torch.float32
    assert fm.to("cpu").device.type == "cpu"
    text = repr(fm)
    assert "(2, 3, 5, 6)" in text and "(2, 3, 5, 4)" in text and "(2, 3, 4, 6)" in text


def test_bad_input_raises_clear_errors():
    A, B = BATCHED
    fm = FactoredMatrix(A, B)
    with pytest.raises(ValueError, match=r"B must have shape \[\.\.\., 4, rdim\], got \(2, 3"):
        FactoredMatrix(A, A @ B)
    with pytest.raises(ValueError, match="do not broadcast"):
        FactoredMatrix(A, B[:, :2])
    with pytest.raises(ValueError, match="at least 2 axes"):
        FactoredMatrix(torch.randn(4), torch.randn(4, 3))
    with pytest.raises(TypeError, match="must be a torch.Tensor or what torch.as_tensor takes"):
        FactoredMatrix(object(), torch.randn(1, 1))
    torch.testing.assert_close(FactoredMatrix([[2.0]], torch.ones(1, 1)).AB, torch.tensor([[2.0]]))  # as_tensor
    with pytest.raises(ValueError, match=r"\(5, 2\): expected shape \[\.\.\., 6, n\] on the right"):
        fm @ torch.randn(5, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"\(2, 6\): expected shape \[\.\.\., n, 5\] on the left"):
        torch.randn(2, 6, dtype=torch.float64) @ fm
    with pytest.raises(ValueError, match=r"shape \(5,\): expected a vector of shape \[6\]"):
        fm @ torch.randn(5, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"shape \(6,\): expected a vector of shape \[5\]"):
        torch.randn(6, dtype=torch.float64) @ fm
    with pytest.raises(ValueError, match="left rdim=6 must equal right ldim=5"):
        fm @ fm
    for square_only in ["BA", "eigenvalues", "diagonal"]:
        with pytest.raises(ValueError, match="needs a square AB"):
            attribute = getattr(fm, square_only)
            attribute() if callable(attribute) else None
    with pytest.raises(ValueError, match="scalar"):
        fm * torch.ones(2, dtype=torch.float64)
    with pytest.raises(TypeError):
        fm * fm
    with pytest.raises(ValueError, match="chunk_size"):
        next(fm.iter_row_chunks(0))
    with pytest.raises(ValueError, match="k must be"):
        fm.top_k_per_row(7)
    with pytest.raises(IndexError, match="too many indices"):
        fm[0, 0, 0, 0, 0]
    with pytest.raises(IndexError, match="unsqueeze"):
        fm[None]
    with pytest.raises(ValueError, match="batch position"):
        fm.unsqueeze(-1)


class ForbidLargeTensors(TorchFunctionMode):
    """Raise if any torch operation produces a tensor with more than ``max_numel`` entries."""

    def __init__(self, max_numel):
        super().__init__()
        self.max_numel = max_numel

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for output in result if isinstance(result, tuple) else (result,):
            if isinstance(output, torch.Tensor) and output.numel() > self.max_numel:
                raise MemoryError(f"{func} built a tensor of shape {tuple(output.shape)}")
        return result


@pytest.fixture(scope="module")
def vocab_sized():
    generator = torch.Generator().manual_seed(0)
    A = torch.randn(5000, 16, generator=generator, dtype=torch.float64)
    B = torch.randn(16, 5000, generator=generator, dtype=torch.float64)
    return A, B


def test_guard_catches_materialisation(vocab_sized):
    A, B = vocab_sized
    with ForbidLargeTensors(max_numel=1_000_000), pytest.raises(MemoryError):
        _ = FactoredMatrix(A, B).AB


def test_vocab_sized_circuit_is_never_materialised(vocab_sized):
    A, B = vocab_sized
    start = time.perf_counter()
    with ForbidLargeTensors(max_numel=1_000_000):
        fm = FactoredMatrix(A, B)
        U, S, Vh = fm.svd()
        norm = fm.norm()
        eigenvalues = fm.eigenvalues
        trace = fm.diagonal().sum()
        small = fm.rows(torch.arange(0, 5000, 50)).cols(slice(0, 300)).AB
        transposed_S = fm.T.S
    assert time.perf_counter() - start < 5.0
    # references from identities that need no 5000 x 5000 matrix either
    close(norm.square(), ((A.T @ A) * (B @ B.T)).sum(), atol=1e-6)
    close(eigenvalues.sum().real, (A * B.T).sum(), atol=1e-8)
    close(trace, (A * B.T).sum(), atol=1e-8)
    close(transposed_S, S)
    close(U.T @ U, torch.eye(16, dtype=torch.float64))
    close(small, A[::50] @ B[:, :300])
    close(U[:100] @ torch.diag(S) @ Vh[:, :100], A[:100] @ B[:, :100], atol=1e-8)


def test_row_chunks_bound_memory(vocab_sized):
    A, B = vocab_sized
    fm, chunk_size = FactoredMatrix(A, B), 250
    with ForbidLargeTensors(max_numel=chunk_size * 5000):
        top = fm.top_k_per_row(2, chunk_size=chunk_size)
    rows = torch.tensor([0, 1234, 4999])
    reference = (A[rows] @ B).topk(2, dim=-1)
    close(top.values[rows], reference.values)
    assert torch.equal(top.indices[rows], reference.indices)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_decompositions_run_in_float32_and_come_back_in_the_input_dtype(dtype):
    """torch.linalg refuses half precision: SVD and eigenvalues are computed in float32, then cast back."""
    generator = torch.Generator().manual_seed(3)
    A, B = torch.randn(2, 6, 3, generator=generator), torch.randn(2, 3, 6, generator=generator)
    half = FactoredMatrix(A.to(dtype), B.to(dtype))
    reference = FactoredMatrix(A.to(dtype).float(), B.to(dtype).float())
    U, S, Vh = half.svd()
    assert U.dtype == S.dtype == Vh.dtype == dtype
    torch.testing.assert_close(S.float(), reference.S, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close((U @ torch.diag_embed(S) @ Vh).float(), reference.AB, rtol=0, atol=5e-2)
    eigenvalues = half.eigenvalues
    assert eigenvalues.dtype == torch.complex64
    torch.testing.assert_close(
        eigenvalues.abs().sort(-1).values, reference.eigenvalues.abs().sort(-1).values, rtol=1e-4, atol=1e-4
    )


def test_a_one_element_tensor_is_a_scalar_and_results_keep_the_subclass():
    class Tagged(FactoredMatrix):
        pass

    fm = Tagged(torch.randn(4, 2, dtype=torch.float64), torch.randn(2, 5, dtype=torch.float64))
    for scalar in (torch.tensor([2.0], dtype=torch.float64), torch.tensor([[2.0]], dtype=torch.float64)):
        close((fm * scalar).AB, 2 * fm.AB)
        close((scalar * fm).AB, 2 * fm.AB)
    for result in (fm * 2, fm.T, fm @ torch.randn(5, 3, dtype=torch.float64), fm[1:3], fm @ fm.T, fm.make_even()):
        assert type(result) is Tagged
    assert (fm @ Tagged(torch.randn(5, 1, dtype=torch.float64), torch.randn(1, 4, dtype=torch.float64))).mdim == 1
