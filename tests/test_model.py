"""DemoTransformer as a whole: every hook against the DESIGN section 3 definitions, the
residual-stream identities on random configs, parameter layout, key/value cache, causality.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from interp_transformer import DemoTransformer, KeyValueCache, TransformerConfig

from .test_components import random_tokens, randomize, reference_hooks, single_thread  # noqa: F401


@st.composite
def small_configs(draw):
    n_heads = draw(st.integers(1, 4))
    d_head = draw(st.integers(1, 8))
    attn_only = draw(st.booleans())
    return TransformerConfig(
        d_model=n_heads * d_head,
        n_layers=draw(st.integers(1, 3)),
        n_heads=n_heads,
        d_head=d_head,
        d_mlp=None if attn_only else draw(st.integers(1, 24)),
        d_vocab=draw(st.integers(2, 40)),
        n_ctx=draw(st.integers(4, 12)),
    )


IDENTITY_SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check_every_hook(model: DemoTransformer, tokens: torch.Tensor, atol: float) -> None:
    logits, cache = model.run_with_cache(tokens)
    ref = reference_hooks(model, tokens)
    assert list(cache.keys()) == list(model.hook_dict)
    assert set(cache.keys()) == set(ref) - {"logits"}
    assert ("blocks.0.hook_resid_mid" in cache) == (not model.cfg.attn_only)
    for name, value in ref.items():
        got = logits if name == "logits" else cache[name]
        torch.testing.assert_close(got, value, rtol=0, atol=atol, msg=lambda m, name=name: f"{name}: {m}")
    # the fused path (nothing observes the pattern) gives the same logits
    torch.testing.assert_close(model(tokens), ref["logits"], rtol=0, atol=atol)


@IDENTITY_SETTINGS
@given(cfg=small_configs(), seed=st.integers(0, 2**16), batch=st.integers(1, 3))
def test_every_hook_matches_its_definition(cfg, seed, batch):
    """Each cached activation equals the DESIGN table's formula computed from the weights.

    float64, so that a tolerance of 1e-10 separates bugs from rounding even for degenerate
    shapes (d_model=2 LayerNorms amplify float32 noise past 1e-5).
    """
    model = randomize(DemoTransformer(cfg, dtype=torch.float64, seed=seed), seed=seed).eval()
    check_every_hook(model, random_tokens(cfg, batch, cfg.n_ctx, seed=seed), atol=1e-10)


@pytest.mark.parametrize("attn_only", [False, True])
def test_every_hook_matches_its_definition_float32(attn_only):
    cfg = TransformerConfig(
        d_model=64, n_layers=2, n_heads=4, d_head=16, d_mlp=None if attn_only else 256, d_vocab=97, n_ctx=32
    )
    model = randomize(DemoTransformer(cfg, seed=0), seed=2).eval()
    check_every_hook(model, random_tokens(cfg, 2, 32, seed=3), atol=1e-5)


@IDENTITY_SETTINGS
@given(cfg=small_configs(), seed=st.integers(0, 2**16), dtype=st.sampled_from([torch.float32, torch.float64]))
def test_residual_stream_identities(cfg, seed, dtype):
    model = randomize(DemoTransformer(cfg, dtype=dtype, seed=seed), seed=seed + 1).eval()
    tokens = random_tokens(cfg, 2, cfg.n_ctx, seed=seed)
    logits, cache = model.run_with_cache(tokens)
    close = dict(rtol=0, atol=1e-5)
    for layer in range(cfg.n_layers):
        if cfg.attn_only:
            torch.testing.assert_close(
                cache["resid_post", layer], cache["resid_pre", layer] + cache["attn_out", layer], **close
            )
        else:
            torch.testing.assert_close(
                cache["resid_mid", layer], cache["resid_pre", layer] + cache["attn_out", layer], **close
            )
            torch.testing.assert_close(
                cache["resid_post", layer], cache["resid_mid", layer] + cache["mlp_out", layer], **close
            )
        if layer + 1 < cfg.n_layers:
            torch.testing.assert_close(cache["resid_pre", layer + 1], cache["resid_post", layer], rtol=0, atol=0)
        # per-head results of this layer plus b_O rebuild attn_out
        heads = cache.stack_head_results(layer + 1)[layer * cfg.n_heads :]
        torch.testing.assert_close(heads.sum(0) + model.blocks[layer].attn.b_O, cache["attn_out", layer], **close)
        # and each head's result is z_h W_O[h], computed here by hand
        for h in range(cfg.n_heads):
            torch.testing.assert_close(heads[h], cache["z", layer][:, :, h] @ model.W_O[layer, h], **close)
    resid_final = cache["resid_post", -1]
    torch.testing.assert_close(cache.decompose_resid().sum(0), resid_final, **close)
    torch.testing.assert_close(cache.accumulated_resid()[-1], resid_final, rtol=0, atol=0)
    torch.testing.assert_close(cache.accumulated_resid()[0], cache["embed"] + cache["pos_embed"], rtol=0, atol=0)
    if dtype == torch.float64:  # a LayerNorm over d_model=2 can amplify float32 noise past 1e-5
        by_hand = F.layer_norm(resid_final, (cfg.d_model,), model.ln_final.w, model.ln_final.b, cfg.layer_norm_eps)
        torch.testing.assert_close(logits, by_hand @ model.W_U + model.b_U, **close)


def test_logits_are_unembedded_final_layer_norm_float32(small_cfg, small_model, tokens):
    model = randomize(copy.deepcopy(small_model), seed=7)
    logits, cache = model.run_with_cache(tokens)
    resid_final = cache["resid_post", -1]
    by_hand = F.layer_norm(
        resid_final, (small_cfg.d_model,), model.ln_final.w, model.ln_final.b, small_cfg.layer_norm_eps
    )
    torch.testing.assert_close(logits, by_hand @ model.W_U + model.b_U, rtol=0, atol=1e-5)


# --- parameters ----------------------------------------------------------------------------
def test_parameter_names_and_shapes_follow_design(small_cfg, small_model):
    c = small_cfg
    expected = {
        "embed.W_E": (c.d_vocab, c.d_model),
        "pos_embed.W_pos": (c.n_ctx, c.d_model),
        "ln_final.w": (c.d_model,),
        "ln_final.b": (c.d_model,),
        "unembed.W_U": (c.d_model, c.d_vocab),
        "unembed.b_U": (c.d_vocab,),
    }
    for layer in range(c.n_layers):
        p = f"blocks.{layer}."
        for ln in ("ln1", "ln2"):
            expected[p + ln + ".w"] = expected[p + ln + ".b"] = (c.d_model,)
        for w in ("W_Q", "W_K", "W_V"):
            expected[p + "attn." + w] = (c.n_heads, c.d_model, c.d_head)
        for b in ("b_Q", "b_K", "b_V"):
            expected[p + "attn." + b] = (c.n_heads, c.d_head)
        expected[p + "attn.W_O"] = (c.n_heads, c.d_head, c.d_model)
        expected[p + "attn.b_O"] = (c.d_model,)
        expected[p + "mlp.W_in"] = (c.d_model, c.d_mlp)
        expected[p + "mlp.b_in"] = (c.d_mlp,)
        expected[p + "mlp.W_out"] = (c.d_mlp, c.d_model)
        expected[p + "mlp.b_out"] = (c.d_model,)
    got = {name: tuple(t.shape) for name, t in small_model.state_dict().items()}
    assert got == expected


def test_stacked_weights_are_the_blocks_weights(small_model):
    for attr in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
        stacked = getattr(small_model, attr)
        for layer, block in enumerate(small_model.blocks):
            assert torch.equal(stacked[layer], getattr(block.attn, attr))
    for attr in ("W_in", "b_in", "W_out", "b_out"):
        stacked = getattr(small_model, attr)
        for layer, block in enumerate(small_model.blocks):
            assert torch.equal(stacked[layer], getattr(block.mlp, attr))
    assert small_model.W_E is small_model.embed.W_E and small_model.W_U is small_model.unembed.W_U


def test_attention_only_model_has_no_mlp(attn_only_model):
    assert not any("mlp" in name or "ln2" in name or "resid_mid" in name for name in attn_only_model.hook_dict)
    with pytest.raises(AttributeError, match="attention-only"):
        attn_only_model.W_in


def test_init_follows_gpt2():
    cfg = TransformerConfig(d_model=64, n_layers=2, n_heads=4, d_head=16, d_mlp=256, d_vocab=500, n_ctx=64)
    model = DemoTransformer(cfg, seed=0)
    for name, param in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf.startswith("W_"):
            assert abs(param.std().item() - cfg.init_range) < 0.1 * cfg.init_range, name
        elif leaf == "w":
            assert torch.equal(param, torch.ones_like(param)), name
        else:
            assert torch.equal(param, torch.zeros_like(param)), name
    same = DemoTransformer(cfg, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), same.parameters()))


def test_float64_model(small_cfg, tokens):
    model = DemoTransformer(small_cfg, dtype=torch.float64, seed=0)
    assert all(p.dtype == torch.float64 for p in model.parameters())
    assert model(tokens).dtype == torch.float64


def test_stop_at_layer_returns_the_residual(small_model, tokens):
    # cache only the residuals, so both runs take the fused attention path: bit-identical
    _, cache = small_model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_resid_pre"))
    n_layers = small_model.cfg.n_layers
    for layer in range(n_layers):
        torch.testing.assert_close(small_model(tokens, stop_at_layer=layer), cache["resid_pre", layer], rtol=0, atol=0)
        torch.testing.assert_close(
            small_model(tokens, stop_at_layer=layer - n_layers), cache["resid_pre", layer], rtol=0, atol=0
        )
    # stop_at_layer=n_layers is the final residual stream, before the final norm (not the logits)
    _, final = small_model.run_with_cache(tokens, names_filter=f"blocks.{n_layers - 1}.hook_resid_post")
    torch.testing.assert_close(small_model(tokens, stop_at_layer=n_layers), final["resid_post", -1], rtol=0, atol=0)
    for bad in (n_layers + 1, -n_layers - 1, 1.5):
        with pytest.raises(ValueError, match="stop_at_layer"):
            small_model(tokens, stop_at_layer=bad)


# --- key/value cache -------------------------------------------------------------------------
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("attn_only", [False, True])
def test_kv_cache_chunks_equal_one_full_run(fused, attn_only):
    cfg = TransformerConfig(
        d_model=32, n_layers=3, n_heads=4, d_head=8, d_mlp=None if attn_only else 48, d_vocab=41, n_ctx=16
    )
    model = randomize(DemoTransformer(cfg, dtype=torch.float64, seed=0), seed=11, scale=1.0).eval()
    for block in model.blocks:
        block.attn.use_fused_attention = fused
    tokens = random_tokens(cfg, 2, 14, seed=4)
    with torch.no_grad():
        full = model(tokens)
        for split in ([5, 9], [1, 1, 12], [6, 1, 1, 6]):
            kv_cache = KeyValueCache(cfg.n_layers)
            chunks, start = [], 0
            for size in split:
                chunks.append(model(tokens[:, start : start + size], kv_cache=kv_cache))
                start += size
                assert kv_cache.n_positions == start
            torch.testing.assert_close(torch.cat(chunks, dim=1), full, rtol=0, atol=1e-12)


def test_kv_cache_respects_n_ctx_and_batch():
    cfg = TransformerConfig(d_model=16, n_layers=1, n_heads=2, d_head=8, d_mlp=32, d_vocab=11, n_ctx=6)
    model = DemoTransformer(cfg, seed=0)
    kv_cache = KeyValueCache(1)
    model(torch.zeros(2, 4, dtype=torch.long), kv_cache=kv_cache)
    with pytest.raises(ValueError, match="n_ctx=6"):
        model(torch.zeros(2, 3, dtype=torch.long), kv_cache=kv_cache)
    with pytest.raises(ValueError, match="batch"):
        model(torch.zeros(3, 1, dtype=torch.long), kv_cache=kv_cache)


# --- causality -------------------------------------------------------------------------------
@settings(max_examples=15, deadline=None)
@given(cfg=small_configs(), seed=st.integers(0, 2**16), data=st.data())
def test_changing_a_later_token_never_changes_earlier_logits(cfg, seed, data):
    model = randomize(DemoTransformer(cfg, dtype=torch.float64, seed=seed), seed=seed).eval()
    tokens = random_tokens(cfg, 1, cfg.n_ctx, seed=seed)
    changed_at = data.draw(st.integers(0, cfg.n_ctx - 1))
    changed = tokens.clone()
    changed[0, changed_at:] = (tokens[0, changed_at:] + data.draw(st.integers(1, cfg.d_vocab - 1))) % cfg.d_vocab
    with torch.no_grad():
        for fused in (True, False):
            for block in model.blocks:
                block.attn.use_fused_attention = fused
            before, after = model(tokens), model(changed)
            assert torch.equal(before[:, :changed_at], after[:, :changed_at])


def test_a_changed_token_moves_its_own_and_later_logits(small_model, tokens):
    """The other half of causality, so the test above cannot pass on a model that ignores tokens."""
    changed = tokens.clone()
    changed[:, 5] = (tokens[:, 5] + 1) % small_model.cfg.d_vocab
    before, after = small_model(tokens), small_model(changed)
    assert torch.equal(before[:, :5], after[:, :5])
    assert ((before[:, 5:] - after[:, 5:]).abs().amax(dim=-1) > 1e-4).all()


def test_batch_rows_are_independent(small_model, tokens):
    together = small_model(tokens)
    for row in range(tokens.shape[0]):
        torch.testing.assert_close(small_model(tokens[row : row + 1])[0], together[row], rtol=0, atol=1e-5)


def test_deepcopy_keeps_hook_names(small_model):
    clone = copy.deepcopy(small_model)
    assert [hp.name for hp in clone.hook_points()] == [hp.name for hp in small_model.hook_points()]
