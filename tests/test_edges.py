"""Edge attribution patching: each node's edges sum to its attribution-patching score, the logits' edges to the
final residual's.

Both identities are exact (float64, 1e-10): they compare the per-reader gradients (each query
head's, each key/value head's, each MLP's input, pulled back through its norm's full Jacobian)
with the gradients attribution patching reads at ``z`` and at the final residual stream.
"""

import pytest
import torch

from analysis.discovery import Site, attribution_patching, edge_attribution_patching, logit_diff_per_row, sites
from interp_transformer import TransformerConfig
from interp_transformer.families.gemma.recipe import GemmaConfig
from interp_transformer.families.gpt_neox.recipe import GPTNeoXConfig
from interp_transformer.families.gptj.recipe import GPTJConfig
from interp_transformer.families.llama.recipe import LlamaConfig
from interp_transformer.families.moe.recipe import MoEConfig
from interp_transformer.families.olmo2.recipe import Olmo2Config
from interp_transformer.families.opt.recipe import OPTPostNormConfig

from .encoder_helpers import random_mlm
from .perturbed import ANSWERS, CLEAN, CORRUPTED, perturbed_decoder
from .perturbed import SMALL_SHAPE as SHAPE

METRIC = logit_diff_per_row(*ANSWERS)
ROTARY = dict(SHAPE, n_key_value_heads=2)
CONFIGS = {
    "gpt2": lambda: TransformerConfig(**SHAPE),
    "llama_gqa": lambda: LlamaConfig(**ROTARY),
    "neox_parallel": lambda: GPTNeoXConfig(**SHAPE, rotary_dim=2),
    "gptj_shared_norm": lambda: GPTJConfig(**SHAPE, rotary_dim=2),
    "moe": lambda: MoEConfig(**dict(ROTARY, d_mlp=8), n_experts=4, experts_per_token=2),
    "moe_plain_experts_router_bias": lambda: MoEConfig(
        **dict(ROTARY, d_mlp=8), n_experts=4, experts_per_token=2, expert_mlp="plain", router_bias=True, act_fn="gelu"
    ),
    "gemma2_output_norms": lambda: GemmaConfig(**ROTARY, post_norms=True),
    "gemma3_qk_norms": lambda: GemmaConfig(**ROTARY, post_norms=True, qk_norm=True, attn_softcap=None),
    "olmo2_output_norms_only": lambda: Olmo2Config(**ROTARY),  # no norm before a sublayer; q/k norms over all heads
    "attn_only": lambda: TransformerConfig(**dict(SHAPE, d_mlp=None)),
    "opt_post_norm": lambda: OPTPostNormConfig(**SHAPE),
}


ENCODERS = {"bert_post_norm_encoder": lambda: random_mlm()[0]}  # real BERT parts, perturbed weights, MLM logits


@pytest.fixture(scope="module", params=sorted(CONFIGS) + sorted(ENCODERS))
def model(request):
    if request.param in ENCODERS:
        return ENCODERS[request.param]()
    return perturbed_decoder(CONFIGS[request.param]())


def _node_sites(model, name: str):
    """The attribution-patching site whose score a node's edges sum to (a mixture's experts: together)."""
    if name == "input":
        return sites(model, "resid_pre", layers=[0])[0]
    layer = int(name[1:].split("H")[0].split(".")[0]) if name.startswith("L") else int(name[3:].split(".")[0])
    if name.startswith("MLP"):
        return sites(model, "mlp_out", layers=[layer])[0]
    if name.endswith(".attn"):
        return sites(model, "attn_out", layers=[layer])[0]
    return next(site for site in sites(model, "heads", layers=[layer]) if site.label == name)


def test_each_nodes_edges_sum_to_its_attribution_patching_score(model):
    """A head's edges sum to its AtP at ``z``, a sublayer's or MLP's to AtP at its output, a mixture's experts'
    together to AtP at the mixture's output, the input's to AtP at the stream entering block 0."""
    edges = edge_attribution_patching(model, CLEAN, CORRUPTED, METRIC)
    by_site: dict = {}
    for row, name in enumerate(edges.upstream):
        by_site.setdefault(_node_sites(model, name), []).append(row)
    atp = attribution_patching(model, CLEAN, CORRUPTED, METRIC, list(by_site))
    for index, rows in enumerate(by_site.values()):
        torch.testing.assert_close(edges.scores[rows].sum(dim=(0, 1)), atp[index], rtol=0, atol=1e-10)
    assert bool((atp.abs() > 1e-6).all())
    assert len(by_site) < len(edges.upstream) or not model.has_experts


def test_the_logits_edges_sum_to_the_final_residuals_score(model):
    """Where the stream is a sum of writes (not post-norm, whose norms renormalize it between the writes)."""
    if not model.capabilities.additive_residual:
        pytest.skip("a post-norm stream is not the sum of the writes: each write reaches the logits through norms")
    edges = edge_attribution_patching(model, CLEAN, CORRUPTED, METRIC)
    final = Site(model.hook_names.final_residual_name(model.cfg.n_layers), model.cfg.n_layers - 1, (), None, "final")
    atp = attribution_patching(model, CLEAN, CORRUPTED, METRIC, [final])[0]
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


def test_output_norms_make_the_sublayer_the_node_and_experts_are_nodes():
    gemma = edge_attribution_patching(perturbed_decoder(CONFIGS["gemma2_output_norms"]()), CLEAN, CORRUPTED, METRIC)
    assert gemma.upstream[:3] == ["input", "L0.attn", "MLP0"] and "L0H0.q" in gemma.readers
    assert gemma.reads["L0.attn"] == ("L0H0.q", "L0H1.q", "L0H2.q", "L0H3.q", "L0K0.k", "L0K1.k", "L0K0.v", "L0K1.v")
    moe = edge_attribution_patching(perturbed_decoder(CONFIGS["moe"]()), CLEAN, CORRUPTED, METRIC)
    assert [name for name in moe.upstream if name.startswith("MLP0")] == [f"MLP0.E{e}" for e in range(4)]
    assert moe.reads["MLP0.E2"] == ("MLP0",) and moe.reads["L1H3"] == ("L1H3.q", "L1K1.k", "L1K1.v")


def test_the_experts_writes_are_weighted_by_routing_and_sum_to_the_mixtures_output():
    model = perturbed_decoder(CONFIGS["moe"]())
    part = model.blocks[1].mlp
    _, cache = model.run_with_cache(CLEAN)
    writes = part.expert_writes(cache.__getitem__)
    torch.testing.assert_close(writes.sum(dim=0), cache["blocks.1.hook_mlp_out"], rtol=0, atol=1e-12)
    unchosen = ~torch.nn.functional.one_hot(cache["blocks.1.mlp.hook_expert_indices"], 4).sum(dim=-2).bool()
    assert bool(unchosen.any()) and bool((writes.movedim(0, -2)[unchosen] == 0).all())


def test_models_the_graph_does_not_fit_are_refused():
    from interp_transformer.families.adapter_decoder.recipe import AdapterDecoderConfig

    adapter = perturbed_decoder(AdapterDecoderConfig(**SHAPE, d_adapter=6))
    with pytest.raises(
        ValueError, match="block 0 has a 'adapter' writer; edges are built for attention, cross-attention and MLPs"
    ):
        edge_attribution_patching(adapter, CLEAN, CORRUPTED, METRIC)
    model = perturbed_decoder(TransformerConfig(**SHAPE))
    with pytest.raises(ValueError, match="method must be one of"):
        edge_attribution_patching(model, CLEAN, CORRUPTED, METRIC, method="ACDC")
    with pytest.raises(ValueError, match="ig_on must be one of"):
        edge_attribution_patching(model, CLEAN, CORRUPTED, METRIC, method="EAP-IG", ig_on="weights")
    with pytest.raises(ValueError, match="do not depend on the logits"):
        edge_attribution_patching(model, CLEAN, CORRUPTED, lambda logits, prompt: torch.zeros(prompt.shape))
