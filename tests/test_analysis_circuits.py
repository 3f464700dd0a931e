"""Full QK/OV circuits, copying and composition scores against dense products."""

import pytest
import torch

from analysis.readouts import circuits
from interp_transformer import DemoTransformer, TransformerConfig
from interp_transformer.circuits import factored_matrix


@pytest.fixture(scope="module")
def model64() -> DemoTransformer:
    """Three layers (so several layer pairs compose), float64, weights of order 1."""
    cfg = TransformerConfig(
        d_model=24, n_layers=3, n_heads=3, d_head=8, d_mlp=None, d_vocab=41, n_ctx=8, init_range=0.3
    )
    return DemoTransformer(cfg, dtype=torch.float64, seed=4).eval()


def dense_qk(model, layer, head):
    return model.W_E @ model.W_Q[layer, head] @ model.W_K[layer, head].T @ model.W_E.T


def dense_ov(model, layer, head):
    return model.W_E @ model.W_V[layer, head] @ model.W_O[layer, head] @ model.W_U


def test_factored_matrix_is_reexported():
    assert circuits.FactoredMatrix is factored_matrix.FactoredMatrix


def test_full_circuits_equal_dense_products(model64):
    qk_all, ov_all = circuits.full_qk_circuit(model64), circuits.full_ov_circuit(model64)
    assert isinstance(qk_all, circuits.FactoredMatrix) and qk_all.shape == (3, 3, 41, 41)
    assert qk_all.mdim == 8 and ov_all.mdim == 8  # kept factored through d_head
    with torch.no_grad():
        for layer in range(3):
            for head in range(3):
                qk, ov = dense_qk(model64, layer, head), dense_ov(model64, layer, head)
                assert torch.allclose(circuits.full_qk_circuit(model64, layer, head).AB, qk)
                assert torch.allclose(circuits.full_ov_circuit(model64, layer, head).AB, ov)
                assert torch.allclose(qk_all.AB[layer, head], qk)
                assert torch.allclose(ov_all.AB[layer, head], ov)
        assert torch.allclose(circuits.full_ov_circuit(model64, head=1).AB[2], dense_ov(model64, 2, 1))


def test_circuit_on_tokens_and_size_guard(model64, monkeypatch):
    circuit = circuits.full_ov_circuit(model64, 1, 2)
    with torch.no_grad():
        dense = dense_ov(model64, 1, 2)
    rows, cols = [3, 0, 40], torch.tensor([5, 5, 7, 1])
    assert torch.allclose(circuits.circuit_on_tokens(circuit, rows, cols), dense[rows][:, cols])
    assert torch.allclose(circuits.circuit_on_tokens(circuit, 4), dense[4:5])
    monkeypatch.setattr(circuits, "MAX_DENSE_ENTRIES", 100)
    with pytest.raises(ValueError, match="limit"):
        circuits.circuit_on_tokens(circuit)
    assert circuits.circuit_on_tokens(circuit, allow_large=True).shape == (41, 41)
    with pytest.raises(ValueError, match="row_tokens"):
        circuits.circuit_on_tokens(circuit, [41])


def test_diagonal_ranks_equal_dense_ranks(model64):
    circuit = circuits.full_ov_circuit(model64)
    ranks = circuits.diagonal_ranks(circuit, chunk_size=7)  # 7 does not divide 41
    dense = circuit.AB
    diagonal = dense.diagonal(dim1=-2, dim2=-1)
    assert torch.equal(ranks, (dense > diagonal.unsqueeze(-1)).sum(-1))
    with pytest.raises(ValueError, match="square"):
        circuits.diagonal_ranks(circuits.FactoredMatrix(torch.randn(5, 2), torch.randn(2, 4)))


def test_copying_scores_equal_dense_eigenvalues(model64):
    scores = circuits.copying_scores(model64)
    assert scores.shape == (3, 3)
    with torch.no_grad():
        for layer in range(3):
            for head in range(3):
                eigenvalues = torch.linalg.eigvals(dense_ov(model64, layer, head))  # all 41, most ~0
                expected = eigenvalues.real.sum() / eigenvalues.abs().sum()
                assert float(scores[layer, head]) == pytest.approx(float(expected), abs=1e-8)
    assert float(circuits.copying_scores(model64, 2, 1)) == pytest.approx(float(scores[2, 1]))


def test_copying_score_known_answers():
    cfg = TransformerConfig(
        d_model=16, n_layers=1, n_heads=2, d_head=8, d_mlp=None, d_vocab=12, n_ctx=4, init_range=0.5
    )
    model = DemoTransformer(cfg, dtype=torch.float64, seed=1)
    with torch.no_grad():
        # W_U = (W_E W_V W_O)^T makes head 0's full OV circuit M M^T: every eigenvalue >= 0
        M = model.W_E @ model.W_V[0, 0] @ model.W_O[0, 0]
        model.unembed.W_U.copy_(M.T)
        assert float(circuits.copying_scores(model, 0, 0)) == pytest.approx(1.0, abs=1e-9)
        model.unembed.W_U.copy_(-M.T)
        assert float(circuits.copying_scores(model, 0, 0)) == pytest.approx(-1.0, abs=1e-9)


@pytest.mark.parametrize("kind", ["q", "k", "v"])
def test_composition_scores_equal_dense_norms(model64, kind):
    scores = circuits.composition_scores(model64, kind)
    assert scores.shape == (3, 3, 3, 3)
    with torch.no_grad():
        W_OV = model64.W_V @ model64.W_O  # [layer, head_index, d_model, d_model]
        W_QK = model64.W_Q @ model64.W_K.transpose(-1, -2)
        reader = {"q": W_QK, "k": W_QK.transpose(-1, -2), "v": W_OV}[kind]
        for l1 in range(3):
            for h1 in range(3):
                for l2 in range(3):
                    for h2 in range(3):
                        if l1 >= l2:
                            assert scores[l1, h1, l2, h2] == 0
                            continue
                        A, B = W_OV[l1, h1], reader[l2, h2]
                        expected = torch.linalg.norm(A @ B) / (torch.linalg.norm(A) * torch.linalg.norm(B))
                        assert float(scores[l1, h1, l2, h2]) == pytest.approx(float(expected), rel=1e-8)


def test_composition_score_of_tensors():
    A, B = torch.randn(6, 6, dtype=torch.float64), torch.randn(6, 6, dtype=torch.float64)
    expected = torch.linalg.norm(A @ B) / (torch.linalg.norm(A) * torch.linalg.norm(B))
    assert float(circuits.composition_score(A, B)) == pytest.approx(float(expected))
    identity = torch.eye(4, dtype=torch.float64)
    assert float(circuits.composition_score(identity, identity)) == pytest.approx(0.5)  # ||I|| = 2


def test_bad_input(model64):
    with pytest.raises(ValueError, match="layer=3 is out of range"):
        circuits.full_qk_circuit(model64, 3, 0)
    with pytest.raises(ValueError, match="head=-4 is out of range"):
        circuits.full_ov_circuit(model64, 0, -4)
    with pytest.raises(ValueError, match="kind"):
        circuits.composition_scores(model64, "x")
    with pytest.raises(TypeError, match="DemoTransformer"):
        circuits.copying_scores("gpt2")
    with pytest.raises(TypeError, match="FactoredMatrix"):
        circuits.circuit_on_tokens(torch.eye(3))


def test_composition_into_chosen_readers_equals_the_full_table():
    from interp_transformer import DemoTransformer, TransformerConfig

    model = DemoTransformer(
        TransformerConfig(d_model=32, n_layers=3, n_heads=4, d_head=8, d_mlp=64, d_vocab=50, n_ctx=16),
        seed=0,
        dtype=torch.float64,
    )
    readers = [(2, 1), (1, 3)]
    for kind in circuits.COMPOSITION_KINDS:
        full, part = circuits.composition_scores(model, kind), circuits.composition_scores(model, kind, readers)
        for layer, head in readers:
            torch.testing.assert_close(part[:, :, layer, head], full[:, :, layer, head], rtol=0, atol=1e-12)
        assert torch.isnan(part[:, :, 0, 0]).all() and torch.isnan(part[:, :, 2, 0]).all()  # not computed: NaN, never 0
