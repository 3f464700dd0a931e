"""Running a circuit: every edge kept is the clean run, none the corrupted run, one node's edges cut is patching it.

Each is an exact identity (float64, 1e-10) against the model's own runs and ``patch_sites``.
"""

import pytest
import torch

from analysis.discovery import (
    edge_attribution_patching,
    faithfulness_curve,
    logit_diff_per_row,
    patch_sites,
    run_circuit,
    sites,
)
from interp_transformer import TransformerConfig
from interp_transformer.architectures.gpt_neox import GPTNeoXConfig
from interp_transformer.architectures.gptj import GPTJConfig
from interp_transformer.architectures.llama import LlamaConfig

from .perturbed import SMALL_SHAPE as SHAPE, perturbed_decoder

CLEAN = torch.tensor([[1, 5, 9, 2, 7, 3], [4, 4, 8, 1, 0, 6]])
CORRUPTED = torch.tensor([[1, 6, 9, 2, 8, 3], [4, 5, 8, 1, 2, 6]])
METRIC = logit_diff_per_row(torch.tensor([3, 6]), torch.tensor([8, 2]))
CONFIGS = {
    "gpt2": lambda: TransformerConfig(**SHAPE),
    "llama_gqa": lambda: LlamaConfig(**SHAPE, n_key_value_heads=2),
    "neox_parallel": lambda: GPTNeoXConfig(**SHAPE, rotary_dim=2),
    "gptj_shared_norm": lambda: GPTJConfig(**SHAPE, rotary_dim=2),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def model(request):
    return perturbed_decoder(CONFIGS[request.param]())


@pytest.fixture(scope="module")
def edges(model):
    return edge_attribution_patching(model, CLEAN, CORRUPTED, METRIC)


def metric_of(model, tokens):
    with torch.no_grad():
        return METRIC(model(tokens), torch.arange(2)).double()


def test_every_edge_is_the_clean_run_and_none_the_corrupted(model, edges):
    everything = run_circuit(model, CLEAN, CORRUPTED, METRIC, edges.edge.clone())
    nothing = run_circuit(model, CLEAN, CORRUPTED, METRIC, torch.zeros_like(edges.edge))
    torch.testing.assert_close(everything, metric_of(model, CLEAN), rtol=0, atol=1e-10)
    torch.testing.assert_close(nothing, metric_of(model, CORRUPTED), rtol=0, atol=1e-10)


@pytest.mark.parametrize("node", ["L0H1", "L1H3", "MLP0"])
def test_cutting_a_nodes_edges_is_patching_it(model, edges, node):
    kept = edges.edge.clone()
    kept[edges.upstream.index(node)] = False
    cut = run_circuit(model, CLEAN, CORRUPTED, METRIC, kept)
    if node.startswith("MLP"):
        site = sites(model, "mlp_out", layers=[int(node[3:])])
    else:
        layer, head = (int(part) for part in node[1:].split("H"))
        site = sites(model, "heads", layers=[layer], units=[head])
    # the clean run with the node set to its value on the corrupted prompts
    patched = patch_sites(model, CORRUPTED, CLEAN, METRIC, site, progress=False)[0]
    torch.testing.assert_close(cut, patched, rtol=0, atol=1e-10)
    assert not torch.allclose(cut, metric_of(model, CLEAN))  # the node matters: not a vacuous pass


def test_the_faithfulness_curve_runs_from_none_to_all(model, edges):
    n_edges = int(edges.edge.sum())
    curve = faithfulness_curve(model, CLEAN, CORRUPTED, METRIC, edges, [0, 5, 20, n_edges])
    torch.testing.assert_close(curve.normalized[[0, -1]], torch.tensor([0.0, 1.0], dtype=torch.float64))
    assert curve.metric.shape == (4, 2) and 0 <= curve.area <= 1.5
    assert curve.figure().data[0].x == (0, 5, 20, n_edges)
    with pytest.raises(ValueError, match="counts must be ints"):
        faithfulness_curve(model, CLEAN, CORRUPTED, METRIC, edges, [n_edges + 1])
