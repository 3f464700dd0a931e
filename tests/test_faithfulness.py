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
from interp_transformer.families.gemma.recipe import GemmaConfig
from interp_transformer.families.gpt_neox.recipe import GPTNeoXConfig
from interp_transformer.families.gptj.recipe import GPTJConfig
from interp_transformer.families.llama.recipe import LlamaConfig
from interp_transformer.families.moe.recipe import MoEConfig
from interp_transformer.families.opt.recipe import OPTPostNormConfig

from .encoder_helpers import random_mlm
from .perturbed import ANSWERS, CLEAN, CORRUPTED, perturbed_decoder
from .perturbed import SMALL_SHAPE as SHAPE

METRIC = logit_diff_per_row(*ANSWERS)
CONFIGS = {
    "gpt2": lambda: TransformerConfig(**SHAPE),
    "llama_gqa": lambda: LlamaConfig(**SHAPE, n_key_value_heads=2),
    "neox_parallel": lambda: GPTNeoXConfig(**SHAPE, rotary_dim=2),
    "gptj_shared_norm": lambda: GPTJConfig(**SHAPE, rotary_dim=2),
    "gemma2_output_norms": lambda: GemmaConfig(**SHAPE, n_key_value_heads=2, post_norms=True),
    "gemma3_qk_norms": lambda: GemmaConfig(**SHAPE, n_key_value_heads=2, qk_norm=True, attn_softcap=None),
    "opt_post_norm": lambda: OPTPostNormConfig(**SHAPE),
    "moe_experts": lambda: MoEConfig(**dict(SHAPE, d_mlp=8, n_key_value_heads=2), n_experts=4, experts_per_token=2),
}


ENCODERS = {"bert_post_norm_encoder": lambda: random_mlm()[0]}  # real BERT parts, perturbed weights, MLM logits


@pytest.fixture(scope="module", params=sorted(CONFIGS) + sorted(ENCODERS))
def model(request):
    if request.param in ENCODERS:
        return ENCODERS[request.param]()
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


def _node_rows_and_site(model, edges, node: str):
    """The upstream rows of ``node`` (a head, else its attention sublayer; an MLP's experts together) and the site
    patching the same thing."""
    layer = int(node[-1])
    if node.startswith("mlp"):
        rows = [i for i, name in enumerate(edges.upstream) if name.split(".")[0] == f"MLP{layer}"]
        return rows, sites(model, "mlp_out", layers=[layer])
    head = 1 if layer == 0 else 3
    if f"L{layer}H{head}" in edges.upstream:
        return [edges.upstream.index(f"L{layer}H{head}")], sites(model, "heads", layers=[layer], units=[head])
    return [edges.upstream.index(f"L{layer}.attn")], sites(model, "attn_out", layers=[layer])


@pytest.mark.parametrize("node", ["attn0", "attn1", "mlp0"])
def test_cutting_a_nodes_edges_is_patching_it(model, edges, node):
    rows, site = _node_rows_and_site(model, edges, node)
    kept = edges.edge.clone()
    kept[rows] = False
    cut = run_circuit(model, CLEAN, CORRUPTED, METRIC, kept)
    # the clean run with the node set to its value on the corrupted prompts
    patched = patch_sites(model, CORRUPTED, CLEAN, METRIC, site, progress=False)[0]
    torch.testing.assert_close(cut, patched, rtol=0, atol=1e-10)
    assert not torch.allclose(cut, metric_of(model, CLEAN))  # the node matters: not a vacuous pass


def test_mean_ablating_a_heads_edges_is_setting_it_to_its_mean():
    """A head's write is linear in its ``z``: every edge of it mean-ablated is the clean run with ``z`` set to its
    mean over the corrupted prompts; with one corrupted prompt repeated, the mean is that prompt."""
    model = perturbed_decoder(CONFIGS["llama_gqa"]())
    edges = edge_attribution_patching(model, CLEAN, CORRUPTED, METRIC)
    kept = edges.edge.clone()
    kept[edges.upstream.index("L0H1")] = False
    cut = run_circuit(model, CLEAN, CORRUPTED, METRIC, kept, ablation="mean")
    _, cache = model.run_with_cache(CORRUPTED)
    mean_z = cache["blocks.0.attn.hook_z"][:, :, 1].mean(dim=0)

    def set_mean(z, hook):
        z[:, :, 1] = mean_z
        return z

    with torch.no_grad():
        expected = METRIC(model.run_with_hooks(CLEAN, fwd_hooks=[("blocks.0.attn.hook_z", set_mean)]), torch.arange(2))
    torch.testing.assert_close(cut, expected.double(), rtol=0, atol=1e-10)
    assert not torch.allclose(cut, run_circuit(model, CLEAN, CORRUPTED, METRIC, kept))
    repeated = CORRUPTED[:1].expand(2, -1)
    torch.testing.assert_close(
        run_circuit(model, CLEAN, repeated, METRIC, kept, ablation="mean"),
        run_circuit(model, CLEAN, repeated, METRIC, kept),
        rtol=0,
        atol=1e-10,
    )
    with pytest.raises(ValueError, match="ablation must be one of"):
        run_circuit(model, CLEAN, CORRUPTED, METRIC, kept, ablation="zero")


def test_the_faithfulness_curve_runs_from_none_to_all(model, edges):
    n_edges = int(edges.edge.sum())
    curve = faithfulness_curve(model, CLEAN, CORRUPTED, METRIC, edges, [0, 5, 20, n_edges])
    torch.testing.assert_close(curve.normalized[[0, -1]], torch.tensor([0.0, 1.0], dtype=torch.float64))
    assert curve.metric.shape == (4, 2) and curve.area == pytest.approx(float(curve.normalized.mean()))
    assert curve.figure().data[0].x == (0, 5, 20, n_edges)
    with pytest.raises(ValueError, match="counts must be ints"):
        faithfulness_curve(model, CLEAN, CORRUPTED, METRIC, edges, [n_edges + 1])
