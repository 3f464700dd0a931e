"""Edge attribution patching: each node's edges sum to its attribution-patching score, the logits' edges to the
final residual's.

Both identities are exact (float64, 1e-10): they compare the per-reader gradients (each query
head's, each key/value head's, each MLP's input, pulled back through its norm's full Jacobian)
with the gradients attribution patching reads at ``z`` and at the final residual stream.
"""

import pytest
import torch

from analysis.discovery import attribution_patching, edge_attribution_patching, logit_diff_per_row, sites
from interp_transformer import TransformerConfig
from interp_transformer.architectures.gemma import GemmaConfig
from interp_transformer.architectures.gpt_neox import GPTNeoXConfig
from interp_transformer.architectures.gptj import GPTJConfig
from interp_transformer.architectures.llama import LlamaConfig
from interp_transformer.architectures.moe import MoEConfig

from .perturbed import SMALL_SHAPE as SHAPE, perturbed_decoder

CLEAN = torch.tensor([[1, 5, 9, 2, 7, 3], [4, 4, 8, 1, 0, 6]])
CORRUPTED = torch.tensor([[1, 6, 9, 2, 8, 3], [4, 5, 8, 1, 2, 6]])
METRIC = logit_diff_per_row(torch.tensor([3, 6]), torch.tensor([8, 2]))
ROTARY = dict(SHAPE, n_key_value_heads=2)
CONFIGS = {
    "gpt2": lambda: TransformerConfig(**SHAPE),
    "llama_gqa": lambda: LlamaConfig(**ROTARY),
    "neox_parallel": lambda: GPTNeoXConfig(**SHAPE, rotary_dim=2),
    "gptj_shared_norm": lambda: GPTJConfig(**SHAPE, rotary_dim=2),
    "moe": lambda: MoEConfig(**dict(ROTARY, d_mlp=8), n_experts=4, experts_per_token=2),
    "attn_only": lambda: TransformerConfig(**dict(SHAPE, d_mlp=None)),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def model(request):
    return perturbed_decoder(CONFIGS[request.param]())


def test_a_heads_edges_sum_to_its_attribution_patching_score(model):
    edges = edge_attribution_patching(model, CLEAN, CORRUPTED, METRIC)
    heads = sites(model, "heads")
    atp = attribution_patching(model, CLEAN, CORRUPTED, METRIC, heads)
    for index, site in enumerate(heads):
        row = edges.upstream.index(site.label)
        torch.testing.assert_close(edges.scores[row].sum(dim=0), atp[index], rtol=0, atol=1e-10)
    assert bool((atp.abs() > 1e-6).any())


def test_the_logits_edges_sum_to_the_final_residuals_score(model):
    edges = edge_attribution_patching(model, CLEAN, CORRUPTED, METRIC)
    final = sites(model, "resid_post", layers=[model.cfg.n_layers - 1])
    atp = attribution_patching(model, CLEAN, CORRUPTED, METRIC, final)[0]
    torch.testing.assert_close(edges.scores[:, edges.readers.index("logits")].sum(dim=0), atp, rtol=0, atol=1e-10)


def test_the_graph_keeps_grouped_heads_and_the_order_of_the_stream():
    model = perturbed_decoder(LlamaConfig(**ROTARY))
    edges = edge_attribution_patching(model, CLEAN, CORRUPTED, METRIC)
    assert [r for r in edges.readers if r.startswith("L0")] == [
        "L0H0.q", "L0H1.q", "L0H2.q", "L0H3.q", "L0K0.k", "L0K1.k", "L0K0.v", "L0K1.v",
    ]  # fmt: skip
    up, read = edges.upstream.index, edges.readers.index
    assert edges.edge[up("L0H1"), read("MLP0")] and not edges.edge[up("L1H1"), read("L1H0.q")]
    assert not edges.edge[up("MLP1"), read("MLP1")] and edges.edge[up("input"), read("logits")]
    assert bool((edges.scores[~edges.edge] == 0).all())
    parallel = edge_attribution_patching(
        perturbed_decoder(GPTNeoXConfig(**SHAPE, rotary_dim=2)), CLEAN, CORRUPTED, METRIC
    )
    assert not parallel.edge[parallel.upstream.index("L0H1"), parallel.readers.index("MLP0")]  # a parallel MLP


def test_eap_ig_with_one_step_reads_the_clean_run():
    """EAP-IG's only interpolation at steps=1 is the clean input: its gradients are the clean run's."""
    model = perturbed_decoder(TransformerConfig(**SHAPE))
    ig = edge_attribution_patching(model, CLEAN, CORRUPTED, METRIC, method="EAP-IG", steps=1)
    swapped_metric_at_clean = edge_attribution_patching(model, CORRUPTED, CLEAN, METRIC)  # gradients at CLEAN
    torch.testing.assert_close(ig.scores, -swapped_metric_at_clean.scores, rtol=0, atol=1e-10)
    several = edge_attribution_patching(model, CLEAN, CORRUPTED, METRIC, method="EAP-IG", steps=4)
    assert several.top(3)[0][2] != 0 and not torch.equal(several.scores, ig.scores)
    bars = several.figure(5).data[0]
    assert list(bars.y)[-1] == "{} -> {}".format(*several.top(1)[0][:2]) and len(bars.x) == 5


def test_models_the_graph_does_not_fit_are_refused():
    gemma = perturbed_decoder(GemmaConfig(**ROTARY, post_norms=True))
    with pytest.raises(ValueError, match="passes its output through its own norm"):
        edge_attribution_patching(gemma, CLEAN, CORRUPTED, METRIC)
    model = perturbed_decoder(TransformerConfig(**SHAPE))
    with pytest.raises(ValueError, match="method must be one of"):
        edge_attribution_patching(model, CLEAN, CORRUPTED, METRIC, method="ACDC")
