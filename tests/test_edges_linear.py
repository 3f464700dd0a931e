"""On a model linear in its input, attribution is patching: every identity holds exactly (float64, 1e-10).

The model (``perturbed.linear_decoder``; BERT's parts made linear, ``linear_encoder``) is built from our
parts with nothing nonlinear: norms ``x w + b``, MLP activations the identity, and attention patterns that
do not depend on the input (``W_Q = W_K = 0``). Then the metric is affine in every write, so:

- each edge's EAP score equals patching that one edge (its reader sees the node's clean write, all
  else corrupted), for every edge of the graph;
- EAP-IG, on inputs or on activations, equals EAP for any number of steps;
- the edges into the logits sum to the total effect ``m(clean) - m(corrupt)``;
- attribution patching equals activation patching for heads, MLPs and the residual stream.
"""

import copy

import pytest
import torch

from analysis.discovery import (
    attribution_patching,
    edge_attribution_patching,
    logit_diff_per_row,
    patch_sites,
    run_circuit,
    sites,
)
from interp_transformer import TransformerConfig
from interp_transformer.families.gemma.recipe import GemmaConfig
from interp_transformer.families.gpt_neox.recipe import GPTNeoXConfig
from interp_transformer.families.llama.recipe import LlamaConfig
from interp_transformer.families.moe.recipe import MoEConfig
from interp_transformer.families.opt.recipe import OPTPostNormConfig

from .encoder_helpers import random_mlm
from .perturbed import ANSWERS, CLEAN, CORRUPTED, LinearNorm, linear_decoder
from .perturbed import SMALL_SHAPE as SHAPE

METRIC = logit_diff_per_row(*ANSWERS)
CONFIGS = {
    "gpt2": lambda: TransformerConfig(**SHAPE),
    "llama_gqa": lambda: LlamaConfig(**SHAPE, n_key_value_heads=2),
    "neox_parallel": lambda: GPTNeoXConfig(**SHAPE, rotary_dim=2),
    "gemma2_output_norms": lambda: GemmaConfig(**SHAPE, n_key_value_heads=2, final_softcap=None),
    "opt_post_norm": lambda: OPTPostNormConfig(**SHAPE),
    "mixtral_experts": lambda: MoEConfig(**dict(SHAPE, d_mlp=8, n_key_value_heads=2), n_experts=4, experts_per_token=2),
}


def linear_encoder():
    """BERT's parts (a perturbed ``BertForMaskedLM`` loaded, post-norm, bidirectional, MLM logits) made linear the same
    way: the stream norms and the MLM head's norm ``x w + b``, activations the identity, ``W_Q = W_K = 0`` (every
    token attends uniformly to every token)."""
    model = copy.deepcopy(random_mlm()[0])  # random_mlm is cached: other tests read the same model
    generator = torch.Generator().manual_seed(2)
    d_model = model.cfg.d_model
    with torch.no_grad():
        for block in model.blocks:
            block.ln1, block.ln2 = (LinearNorm(d_model, generator, torch.float64) for _ in range(2))
            block.attn.W_Q.zero_()
            block.attn.stored("W_K").zero_()
            block.mlp.act_fn = lambda x: x
        model.mlm_head.act_fn = lambda x: x
        model.mlm_head.ln = LinearNorm(d_model, generator, torch.float64)
    model.setup()
    return model.eval()


@pytest.fixture(scope="module", params=sorted(CONFIGS) + ["bert_post_norm_encoder"])
def model(request):
    return linear_encoder() if request.param == "bert_post_norm_encoder" else linear_decoder(CONFIGS[request.param]())


@pytest.fixture(scope="module")
def edges(model):
    return edge_attribution_patching(model, CLEAN, CORRUPTED, METRIC)


def metric_of(model, tokens):
    with torch.no_grad():
        return METRIC(model(tokens), torch.arange(2)).double()


def test_every_edges_score_is_patching_that_edge(model, edges):
    """``run_circuit`` with the prompts swapped runs the corrupted prompts and feeds dropped edges the clean writes:
    dropping one edge alone is patching it clean."""
    corrupt = metric_of(model, CORRUPTED)
    assert int(edges.edge.sum()) >= 40
    for i, j in edges.edge.nonzero().tolist():
        alone = edges.edge.clone()
        alone[i, j] = False
        patched = run_circuit(model, CORRUPTED, CLEAN, METRIC, alone)
        torch.testing.assert_close(edges.scores[i, j], patched - corrupt, rtol=0, atol=1e-10)
    assert float(edges.scores.abs().max()) > 0.1


@pytest.mark.parametrize("ig_on", ["inputs", "activations"])
def test_eap_ig_is_eap(model, edges, ig_on):
    ig = edge_attribution_patching(model, CLEAN, CORRUPTED, METRIC, method="EAP-IG", steps=3, ig_on=ig_on)
    torch.testing.assert_close(ig.scores, edges.scores, rtol=0, atol=1e-10)


def test_the_logits_edges_sum_to_the_total_effect(model, edges):
    total = metric_of(model, CLEAN) - metric_of(model, CORRUPTED)
    torch.testing.assert_close(edges.scores[:, edges.readers.index("logits")].sum(dim=0), total, rtol=0, atol=1e-10)
    assert float(total.abs().min()) > 0.1


@pytest.mark.parametrize("component", ["heads", "mlp_out", "resid_mid"])
def test_attribution_patching_is_activation_patching(model, component):
    if component == "resid_mid" and "blocks.0.hook_resid_mid" not in model.hook_dict:
        component = "attn_out"  # a parallel block has no stream between its sublayers
    chosen = sites(model, component, positions="each", n_pos=CLEAN.shape[1])
    atp = attribution_patching(model, CLEAN, CORRUPTED, METRIC, chosen)
    patched = patch_sites(model, CLEAN, CORRUPTED, METRIC, chosen, progress=False)
    torch.testing.assert_close(atp, patched - metric_of(model, CORRUPTED), rtol=0, atol=1e-10)
    assert float(atp.abs().max()) > 0.01
