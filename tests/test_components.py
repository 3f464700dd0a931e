"""Per-component parity: each component against a hand-written reference, fed real cached activations.

The references here are written with plain ``torch`` ops (``@``, ``F.layer_norm``, an
explicit ``triu`` mask, the GELU formula typed out) and one loop over heads, so they share
no code with the components they check. ``reference_hooks`` recomputes every hook of the
DESIGN section 3 table from the weights alone; ``test_model.py`` uses it on random configs.
"""

import math
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from interp_transformer import DemoTransformer, TransformerConfig
from interp_transformer.parts import attention as attention_module
from interp_transformer.parts import gelu_new


# --- references --------------------------------------------------------------------------
def ref_gelu_new(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's GELU, typed out from the paper: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def ref_layer_norm(x, ln, eps):
    """(normalized, scale) with torch's own LayerNorm as the reference for the output."""
    normalized = F.layer_norm(x, (x.shape[-1],), ln.w, ln.b, eps)
    scale = torch.sqrt(x.var(dim=-1, unbiased=False, keepdim=True) + eps)
    return normalized, scale


def ref_attention(x, attn, offset: int = 0, k_prev=None, v_prev=None):
    """Dense causal attention, one head at a time. Returns a dict of the attention hooks + out."""
    n_heads, d_head = attn.W_Q.shape[0], attn.W_Q.shape[2]
    q = torch.stack([x @ attn.W_Q[h] + attn.b_Q[h] for h in range(n_heads)], dim=2)
    k = torch.stack([x @ attn.W_K[h] + attn.b_K[h] for h in range(n_heads)], dim=2)
    v = torch.stack([x @ attn.W_V[h] + attn.b_V[h] for h in range(n_heads)], dim=2)
    k_all = k if k_prev is None else torch.cat([k_prev, k], dim=1)
    v_all = v if v_prev is None else torch.cat([v_prev, v], dim=1)
    n_q, n_k = q.shape[1], k_all.shape[1]
    # key j is in the future of query i (absolute position offset + i) when j > offset + i
    future = torch.triu(torch.ones(n_q, n_k, dtype=torch.bool), diagonal=offset + 1)
    scores, patterns, zs = [], [], []
    for h in range(n_heads):
        s = q[:, :, h] @ k_all[:, :, h].transpose(-1, -2) / math.sqrt(d_head)
        s = s.masked_fill(future, float("-inf"))
        p = torch.exp(s - s.max(dim=-1, keepdim=True).values)
        p = p / p.sum(dim=-1, keepdim=True)
        scores.append(s)
        patterns.append(p)
        zs.append(p @ v_all[:, :, h])
    z = torch.stack(zs, dim=2)
    out = sum(z[:, :, h] @ attn.W_O[h] for h in range(n_heads)) + attn.b_O
    return {
        "q": q,
        "k": k,
        "v": v,
        "z": z,
        "out": out,
        "attn_scores": torch.stack(scores, dim=1),
        "pattern": torch.stack(patterns, dim=1),
    }


def ref_mlp(x, mlp, act=ref_gelu_new):
    pre = x @ mlp.W_in + mlp.b_in
    post = act(pre)
    return {"pre": pre, "post": post, "out": post @ mlp.W_out + mlp.b_out}


@torch.no_grad()
def reference_hooks(model: DemoTransformer, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every hook of DESIGN section 3, recomputed from the weights (plus the logits)."""
    cfg = model.cfg
    eps = cfg.layer_norm_eps
    out = {"hook_embed": model.W_E[tokens]}
    positions = torch.arange(tokens.shape[1])
    out["hook_pos_embed"] = model.W_pos[positions].expand(tokens.shape[0], -1, -1)
    resid = out["hook_embed"] + out["hook_pos_embed"]
    for layer, block in enumerate(model.blocks):
        p = f"blocks.{layer}."
        out[p + "hook_resid_pre"] = resid
        normalized, scale = ref_layer_norm(resid, block.ln1, eps)
        out[p + "ln1.hook_scale"], out[p + "ln1.hook_normalized"] = scale, normalized
        attn = ref_attention(normalized, block.attn)
        for name in ("q", "k", "v", "attn_scores", "pattern", "z"):
            out[p + "attn.hook_" + name] = attn[name]
        out[p + "hook_attn_out"] = attn["out"]
        resid = resid + attn["out"]
        if cfg.attn_only:
            out[p + "hook_resid_post"] = resid
            continue
        out[p + "hook_resid_mid"] = resid
        normalized, scale = ref_layer_norm(resid, block.ln2, eps)
        out[p + "ln2.hook_scale"], out[p + "ln2.hook_normalized"] = scale, normalized
        mlp = ref_mlp(normalized, block.mlp)
        out[p + "mlp.hook_pre"], out[p + "mlp.hook_post"] = mlp["pre"], mlp["post"]
        out[p + "hook_mlp_out"] = mlp["out"]
        resid = resid + mlp["out"]
        out[p + "hook_resid_post"] = resid
    normalized, scale = ref_layer_norm(resid, model.ln_final, eps)
    out["ln_final.hook_scale"], out["ln_final.hook_normalized"] = scale, normalized
    out["logits"] = normalized @ model.W_U + model.b_U
    return out


@torch.no_grad()
def randomize(model: DemoTransformer, seed: int, scale: float = 0.3) -> DemoTransformer:
    """Give every parameter (biases and LayerNorm weights too) a random value.

    The default init zeroes biases and sets LayerNorm w=1, which would hide a missing bias.
    """
    g = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        noise = torch.randn(param.shape, generator=g, dtype=torch.float64).to(param.dtype)
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "w":
            param.copy_(1.0 + 0.1 * noise)
        elif leaf.startswith("W_"):
            param.copy_(noise * scale / math.sqrt(param.shape[-2] if param.ndim >= 2 else 1))
        else:
            param.copy_(0.1 * noise)
    return model


def random_tokens(cfg: TransformerConfig, batch: int, pos: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, cfg.d_vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))


# --- fixtures ------------------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def single_thread():
    """Tiny tensors run fastest on one thread; two threads on a busy 2-core machine crawl."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def model64():
    cfg = TransformerConfig(d_model=32, n_layers=2, n_heads=4, d_head=8, d_mlp=64, d_vocab=61, n_ctx=16)
    return randomize(DemoTransformer(cfg, dtype=torch.float64, seed=0), seed=3).eval()


@pytest.fixture(scope="module")
def run64(model64):
    tokens = random_tokens(model64.cfg, 3, 9, seed=1)
    logits, cache = model64.run_with_cache(tokens)
    return tokens, logits, cache


# --- the activation function ----------------------------------------------------------------
def test_gelu_new_matches_formula_and_hugging_face():
    from transformers.activations import NewGELUActivation

    x = torch.linspace(-8, 8, 2001, dtype=torch.float64)
    torch.testing.assert_close(gelu_new(x), ref_gelu_new(x), rtol=0, atol=1e-12)
    torch.testing.assert_close(gelu_new(x), NewGELUActivation()(x), rtol=0, atol=1e-12)
    # not the exact erf GELU: the two differ by ~1e-4 near |x| = 2, so a swap would show
    assert (gelu_new(x) - F.gelu(x)).abs().max() > 1e-5


# --- per-component parity fed with real cached activations ---------------------------------
def test_embed_and_pos_embed(model64, run64):
    tokens, _, cache = run64
    torch.testing.assert_close(model64.embed(tokens), model64.W_E[tokens], rtol=0, atol=0)
    torch.testing.assert_close(cache["embed"], model64.W_E[tokens], rtol=0, atol=0)
    expected_pos = torch.stack([model64.W_pos[: tokens.shape[1]]] * tokens.shape[0])
    torch.testing.assert_close(model64.pos_embed(tokens), expected_pos, rtol=0, atol=0)
    torch.testing.assert_close(cache["pos_embed"], expected_pos, rtol=0, atol=0)
    # offset: positions continue after the cached ones
    torch.testing.assert_close(model64.pos_embed(tokens[:, :2], 5)[0], model64.W_pos[5:7], rtol=0, atol=0)


@pytest.mark.parametrize("layer", [0, 1])
def test_block_components_fed_cached_activations(model64, run64, layer):
    _, _, cache = run64
    block = model64.blocks[layer]
    eps = model64.cfg.layer_norm_eps
    close = dict(rtol=0, atol=1e-12)
    with torch.no_grad():
        # LayerNorm 1: our module and torch's layer_norm, both fed resid_pre from the cache
        resid_pre = cache["resid_pre", layer]
        normalized, scale = ref_layer_norm(resid_pre, block.ln1, eps)
        torch.testing.assert_close(block.ln1(resid_pre), cache["normalized", layer, "ln1"], **close)
        torch.testing.assert_close(cache["normalized", layer, "ln1"], normalized, **close)
        torch.testing.assert_close(cache["scale", layer, "ln1"], scale, **close)
        # attention, fed ln1's cached output
        ref = ref_attention(cache["normalized", layer, "ln1"], block.attn)
        torch.testing.assert_close(block.attn(cache["normalized", layer, "ln1"]), cache["attn_out", layer], **close)
        for name in ("q", "k", "v", "attn_scores", "pattern", "z"):
            torch.testing.assert_close(cache[name, layer], ref[name], **close)
        torch.testing.assert_close(cache["attn_out", layer], ref["out"], **close)
        # LayerNorm 2 and MLP, fed resid_mid / ln2 output from the cache
        normalized, scale = ref_layer_norm(cache["resid_mid", layer], block.ln2, eps)
        torch.testing.assert_close(block.ln2(cache["resid_mid", layer]), normalized, **close)
        torch.testing.assert_close(cache["scale", layer, "ln2"], scale, **close)
        mlp = ref_mlp(cache["normalized", layer, "ln2"], block.mlp)
        torch.testing.assert_close(block.mlp(cache["normalized", layer, "ln2"]), cache["mlp_out", layer], **close)
        torch.testing.assert_close(cache["pre", layer], mlp["pre"], **close)
        torch.testing.assert_close(cache["post", layer], mlp["post"], **close)
        torch.testing.assert_close(cache["mlp_out", layer], mlp["out"], **close)
        # the whole block
        torch.testing.assert_close(block(resid_pre), cache["resid_post", layer], **close)


def test_final_layer_norm_and_unembed(model64, run64):
    _, logits, cache = run64
    with torch.no_grad():
        resid_final = cache["resid_post", -1]
        normalized, scale = ref_layer_norm(resid_final, model64.ln_final, model64.cfg.layer_norm_eps)
        torch.testing.assert_close(model64.ln_final(resid_final), normalized, rtol=0, atol=1e-12)
        torch.testing.assert_close(cache["scale"], scale, rtol=0, atol=1e-12)
        torch.testing.assert_close(model64.unembed(cache["normalized"]), logits, rtol=0, atol=1e-12)
        torch.testing.assert_close(logits, normalized @ model64.W_U + model64.b_U, rtol=0, atol=1e-12)


def test_layer_norm_output_is_after_w_and_b(model64, run64):
    """hook_normalized includes the affine part; (normalized - b) / w is the pure z-score."""
    _, _, cache = run64
    ln = model64.ln_final
    resid = cache["resid_post", -1]
    zscore = (resid - resid.mean(-1, keepdim=True)) / cache["scale"]
    torch.testing.assert_close((cache["normalized"] - ln.b) / ln.w, zscore, rtol=0, atol=1e-10)
    assert (ln.b.abs() > 0).any() and ((ln.w - 1).abs() > 0).any()  # else the check proves nothing


# --- attention: explicit path, fused path, and the rule that picks one ----------------------
@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_explicit_and_fused_attention_agree(dtype, atol):
    cfg = TransformerConfig(d_model=48, n_layers=1, n_heads=6, d_head=8, d_mlp=96, d_vocab=31, n_ctx=20)
    model = randomize(DemoTransformer(cfg, dtype=dtype, seed=0), seed=5, scale=1.0).eval()
    attn = model.blocks[0].attn
    x = torch.randn(3, 17, cfg.d_model, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(dtype)
    with (
        torch.no_grad(),
        mock.patch.object(
            attention_module.F, "scaled_dot_product_attention", wraps=F.scaled_dot_product_attention
        ) as sdpa,
    ):
        assert attn.uses_fused_path()
        fused = attn(x)
        assert sdpa.call_count == 1  # the fused kernel really ran
        attn.use_fused_attention = False
        try:
            explicit = attn(x)
        finally:
            attn.use_fused_attention = True
        assert sdpa.call_count == 1  # ... and the explicit path did not call it
        dense = ref_attention(x, attn)["out"]
    torch.testing.assert_close(fused, explicit, rtol=0, atol=atol)
    torch.testing.assert_close(explicit, dense, rtol=0, atol=atol)
    torch.testing.assert_close(fused, dense, rtol=0, atol=atol)


def test_observing_scores_or_pattern_switches_to_explicit_path(small_model, tokens):
    attn = small_model.blocks[1].attn
    assert attn.uses_fused_path()
    for hook_name in ("blocks.1.attn.hook_pattern", "blocks.1.attn.hook_attn_scores"):
        with small_model.hooks([(hook_name, lambda t, hook: None)]):
            assert not attn.uses_fused_path()
            assert small_model.blocks[0].attn.uses_fused_path()  # the choice is per layer
        assert attn.uses_fused_path()
    # caching the pattern: the explicit path runs (the pattern exists), SDPA is not called there
    with mock.patch.object(
        attention_module.F, "scaled_dot_product_attention", wraps=F.scaled_dot_product_attention
    ) as sdpa:
        _, cache = small_model.run_with_cache(tokens, names_filter="blocks.1.attn.hook_pattern")
        assert sdpa.call_count == 1  # layer 0 fused, layer 1 explicit
        _, cache_all = small_model.run_with_cache(tokens)
        assert sdpa.call_count == 1  # everything cached: no fused call at all
    torch.testing.assert_close(cache["pattern", 1], cache_all["pattern", 1])
    # a backward hook on the pattern needs the pattern too
    with small_model.hooks(bwd_hooks=[("blocks.1.attn.hook_pattern", lambda g, hook: None)]):
        assert not attn.uses_fused_path()
    assert attn.uses_fused_path()


def test_causal_mask_is_minus_infinity_above_diagonal(run64):
    _, _, cache = run64
    scores = cache["attn_scores", 0]
    pos = scores.shape[-1]
    above = torch.triu(torch.ones(pos, pos, dtype=torch.bool), diagonal=1)
    assert torch.isneginf(scores[..., above]).all()
    assert torch.isfinite(scores[..., ~above]).all()
    pattern = cache["pattern", 0]
    assert (pattern[..., above] == 0).all()
    torch.testing.assert_close(pattern.sum(-1), torch.ones_like(pattern.sum(-1)), rtol=0, atol=1e-12)
