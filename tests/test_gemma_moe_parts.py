"""The new parts alone: Gemma's norm and embedding against Hugging Face's modules, soft-capping, the pre/post-norm
block against its formula, and the mixture of experts against a per-token loop over its experts."""

import math

import pytest
import torch
from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm, Gemma2TextScaledWordEmbedding

from interp_transformer.families.gemma.recipe import GemmaConfig
from interp_transformer.families.moe.recipe import MoEConfig
from interp_transformer.hooks import HookedRootModule
from interp_transformer.parts.attention import Attention
from interp_transformer.parts.gemma_norm import GemmaRMSNorm
from interp_transformer.parts.layout import TokenLayout
from interp_transformer.parts.moe import MixtureOfExperts, Routing
from interp_transformer.parts.scaled_embed import ScaledEmbed
from interp_transformer.parts.softcap import soft_cap
from interp_transformer.parts.unembed import Unembed

from .gpt2_helpers import one_thread  # noqa: F401 (autouse fixture)

GEN = torch.Generator().manual_seed(0)


def randn(*shape, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=GEN, dtype=dtype)


class Root(HookedRootModule):
    """A part made hookable by name on its own."""

    def __init__(self, part):
        super().__init__()
        self.part = part
        self.setup()

    def forward(self, *args):
        return self.part(*args)

    def run_with_cache(self, *args):
        cache = {}
        with self.hooks(fwd_hooks=[(lambda name: True, lambda tensor, hook: cache.__setitem__(hook.name, tensor))]):
            out = self(*args)
        return out, cache


# --- Gemma's norm --------------------------------------------------------------------------------
@pytest.fixture
def norm():
    part = GemmaRMSNorm(8, 1e-6).double()
    with torch.no_grad():
        part.w_offset.copy_(randn(8) * 0.3)
    return part


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_norm_is_hugging_faces_in_float32_and_bfloat16(dtype):
    ours, theirs = GemmaRMSNorm(8, 1e-6), Gemma2RMSNorm(8, 1e-6)
    with torch.no_grad():
        theirs.weight.copy_(randn(8, dtype=torch.float32))
        ours.w_offset.copy_(theirs.weight)
    ours, theirs, x = ours.to(dtype), theirs.to(dtype), randn(2, 3, 8, dtype=dtype) * 5
    assert torch.equal(ours(x), theirs(x))  # float32 inside, the product rounded once (bfloat16 would lose w_offset)
    ours.use_fused_rms_norm = False
    torch.testing.assert_close(ours(x), theirs(x), atol=0, rtol=1e-6 if dtype == torch.float32 else 1e-2)


def test_the_norm_algebra(norm):
    x, direction = randn(2, 3, 8), randn(2, 3, 8)
    root = Root(norm)
    _, cache = root.run_with_cache(x)
    scale = cache["part.hook_scale"]
    torch.testing.assert_close(scale, (x.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt())
    torch.testing.assert_close(norm.apply_frozen(x, scale), norm(x))
    torch.testing.assert_close(norm.normalize(x), norm(x))
    torch.testing.assert_close(
        (norm.apply_frozen(x, scale) * direction).sum(-1), (x * norm.pull_back(direction, scale)).sum(-1)
    )
    torch.testing.assert_close(norm.w, 1 + norm.w_offset)
    assert not norm.bias_term(direction).any()


def test_folding_the_norm_into_a_reader(norm):
    x, W = randn(2, 3, 8), randn(8, 5)
    before = norm(x) @ W
    folded = W.clone()
    norm.fold_into(folded, None)
    norm.reset()
    assert torch.equal(norm.w, torch.ones(8, dtype=torch.float64))
    torch.testing.assert_close(norm(x) @ folded, before)
    with pytest.raises(ValueError, match="GemmaRMSNorm cannot fold with center=True"):
        norm.fold_into(W.clone(), None, center=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_the_scaled_embedding_is_hugging_faces(dtype):
    cfg = GemmaConfig(d_model=24, n_layers=1, n_heads=2, n_key_value_heads=1, d_head=8, d_mlp=8, d_vocab=11, n_ctx=8)
    theirs = Gemma2TextScaledWordEmbedding(11, 24, 0, embed_scale=24**0.5)
    if dtype == torch.float64:  # created in float64, as from_pretrained(dtype=float64) creates it: the exact factor
        theirs.embed_scale = torch.tensor(24**0.5, dtype=torch.float64)
    ours = ScaledEmbed(cfg, round_scale=True)
    with torch.no_grad():
        ours.W_E.copy_(theirs.weight)
    ours, theirs, tokens = ours.to(dtype), theirs.to(dtype), torch.tensor([[1, 5, 10]])
    assert torch.equal(ours(tokens), theirs(tokens))
    assert float((ours(tokens)[0, 0, 0] / ours.W_E[1, 0]).detach()) == pytest.approx(math.sqrt(24), rel=1e-2)


# --- soft-capping --------------------------------------------------------------------------------
def test_soft_cap_is_cap_tanh_and_keeps_masked_scores():
    x = torch.tensor([-float("inf"), -100.0, 0.0, 0.5, 100.0], dtype=torch.float64)
    capped = soft_cap(x, 2.0)
    assert capped[0] == -float("inf") and torch.equal(capped[1:], 2.0 * torch.tanh(x[1:] / 2.0))
    assert capped[1:].abs().max() <= 2.0 and capped[3] < 0.5


def test_soft_capped_attention_against_its_formula():
    cfg = GemmaConfig(d_model=12, n_layers=1, n_heads=2, n_key_value_heads=1, d_head=4, d_mlp=8, d_vocab=11, n_ctx=8)
    attn = Attention(cfg, softcap=0.7, n_key_value_heads=1, scale=0.3).double()
    with torch.no_grad():
        for param in attn.parameters():
            param.copy_(randn(*param.shape))
    x = randn(2, 5, 12)
    root = Root(attn)
    out, cache = root.run_with_cache(x, TokenLayout.contiguous(2, 5, 0, x.device))
    assert not attn.uses_fused_path()
    names = [name for name in root.hook_dict if "attn_scores" in name or "pattern" in name]
    # the order they fire
    assert names == ["part.hook_attn_scores_uncapped", "part.hook_attn_scores", "part.hook_pattern"]
    q = torch.einsum("bpm,hmd->bphd", x, attn.W_Q) + attn.b_Q
    k = torch.einsum("bpm,hmd->bphd", x, attn.W_K) + attn.b_K
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * 0.3
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    torch.testing.assert_close(cache["part.hook_attn_scores_uncapped"], scores.masked_fill(~causal, -float("inf")))
    pattern = (0.7 * torch.tanh(scores / 0.7)).masked_fill(~causal, -float("inf")).softmax(-1)
    torch.testing.assert_close(cache["part.hook_pattern"], pattern)
    assert torch.equal(out, attn(x))


def test_soft_capped_unembed():
    cfg = GemmaConfig(d_model=6, n_layers=1, n_heads=2, n_key_value_heads=1, d_head=4, d_mlp=8, d_vocab=11, n_ctx=8)
    unembed = Unembed(cfg, 1.5).double()
    with torch.no_grad():
        unembed.W_U.copy_(randn(6, 11) * 3)
    x = randn(2, 3, 6)
    uncapped = x @ unembed.W_U
    torch.testing.assert_close(unembed(x), 1.5 * torch.tanh(uncapped / 1.5))
    with pytest.raises(ValueError, match="a soft-cap must be a finite number > 0, got 0"):
        Unembed(cfg, 0)


# --- the mixture of experts ----------------------------------------------------------------------
def mixture(shared: bool = True, normalize: bool = True) -> MixtureOfExperts:
    part = MixtureOfExperts(8, 6, 5, 2, "silu", normalize, d_mlp_shared=4 if shared else None).double()
    with torch.no_grad():
        for param in part.parameters():
            param.copy_(randn(*param.shape))
    return part


def per_token_reference(part: MixtureOfExperts, x: torch.Tensor) -> torch.Tensor:
    """The mixture's formula one token at a time, with its chosen experts only."""
    out = torch.zeros_like(x)
    for b in range(x.shape[0]):
        for p in range(x.shape[1]):
            token = x[b, p]
            probs = (token @ part.W_router).softmax(-1)
            top = probs.topk(part.experts_per_token)
            weights = top.values / top.values.sum() if part.normalize_routing else top.values
            for weight, expert in zip(weights, top.indices.tolist()):
                e = part.experts[expert]
                out[b, p] += weight * (
                    (torch.nn.functional.silu(token @ e.W_gate) * (token @ e.W_in + e.b_in)) @ e.W_out + e.b_out
                )
            if part.shared_expert is not None:
                s = part.shared_expert
                shared = (torch.nn.functional.silu(token @ s.W_gate) * (token @ s.W_in + s.b_in)) @ s.W_out + s.b_out
                out[b, p] += torch.sigmoid(token @ part.W_shared_gate) * shared
    return out


@pytest.mark.parametrize("shared, normalize", [(True, False), (False, True)])
def test_both_paths_are_the_per_token_formula(shared, normalize):
    part, x = mixture(shared, normalize), randn(2, 4, 8)
    reference = per_token_reference(part, x)
    assert part.uses_sparse_path(x)
    torch.testing.assert_close(part(x), reference, atol=1e-12, rtol=0)
    part.use_sparse_experts = False
    torch.testing.assert_close(part(x), reference, atol=1e-12, rtol=0)


def test_the_explicit_path_runs_every_expert_on_every_token():
    part, x = mixture(), randn(2, 4, 8)
    root = Root(part)
    _, cache = root.run_with_cache(x)
    for expert in range(5):  # chosen or not, each expert's activations are on every token
        e = part.experts[expert]
        torch.testing.assert_close(
            cache[f"part.experts.{expert}.hook_post"], torch.nn.functional.silu(x @ e.W_gate) * (x @ e.W_in + e.b_in)
        )
    torch.testing.assert_close(cache["part.hook_expert_weights"], (x @ part.W_router).softmax(-1))
    assert cache["part.hook_expert_indices"].dtype == torch.int64


def test_a_hook_can_force_the_routing():
    part, x = mixture(shared=False), randn(1, 3, 8)
    forced = torch.tensor([[[4, 0], [4, 0], [4, 0]]])
    root = Root(part)
    out = root.run_with_hooks(x, fwd_hooks=[("part.hook_expert_indices", lambda indices, hook: forced)])
    probs = (x @ part.W_router).softmax(-1)
    weights = probs[..., [4, 0]] / probs[..., [4, 0]].sum(-1, keepdim=True)
    expected = sum(weights[..., i, None] * part.experts[e](x) for i, e in enumerate((4, 0)))
    torch.testing.assert_close(out, expected)


def test_routing_per_expert():
    routing = Routing(torch.tensor([[[2, 0], [1, 1]]]), torch.tensor([[[0.75, 0.25], [0.5, 0.5]]]))
    assert routing.per_expert(3).tolist() == [[[0.25, 0.0, 0.75], [0.0, 1.0, 0.0]]]


def test_the_meta_device_takes_the_explicit_path():
    part = MixtureOfExperts(8, 6, 5, 2, "silu", True).to("meta")
    x = torch.empty(2, 4, 8, device="meta")
    assert not part.uses_sparse_path(x) and part(x).shape == (2, 4, 8)


# --- bad input -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: MixtureOfExperts(8, 6, 2, 3, "silu", True), "experts_per_token=3 must be at most n_experts=2"),
        (lambda: MoEConfig(dense_layers=(1,)), "the dense MLPs' width is given exactly when there are dense layers"),
        (
            lambda: MoEConfig(n_layers=2, dense_layers=(2,), d_mlp_dense=4),
            r"dense_layers must be a sorted tuple of "
            r"distinct layers in \[0, 2\)",
        ),
        (lambda: GemmaConfig(attn_softcap=-1.0), "attn_softcap must be a finite number > 0, got -1.0"),
        (lambda: GemmaConfig(global_every=0), "global_every must be a positive int, got 0"),
        (lambda: GemmaConfig(n_heads=6, n_key_value_heads=4), "n_heads=6 must be a multiple of n_key_value_heads=4"),
    ],
)
def test_bad_configs_are_refused_by_name(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_circuits_read_the_scaled_embedding():
    """Gemma writes W_E[token] * sqrt(d_model); the full QK circuit is of those rows (off by d_model from W_E's)."""
    from analysis.readouts import circuits
    from interp_transformer import DemoTransformer

    cfg = GemmaConfig(d_model=24, n_layers=1, n_heads=2, n_key_value_heads=1, d_head=8, d_mlp=8, d_vocab=11, n_ctx=8)
    model = DemoTransformer(cfg, seed=0, dtype=torch.float64)
    tokens = torch.tensor([[3, 5]])
    _, cache = model.run_with_cache(tokens)
    torch.testing.assert_close(circuits.token_writes(model)[tokens[0]], cache["embed"][0], atol=1e-12, rtol=0)
    qk = circuits.full_qk_circuit(model, 0, 0)
    raw = model.W_E[3] @ model.W_Q[0, 0] @ model.W_K[0, 0].T @ model.W_E[5]
    torch.testing.assert_close(qk[3, 5], raw * 24, atol=1e-10, rtol=1e-10)
