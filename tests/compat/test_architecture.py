"""A ``HookedTransformerConfig`` builds our parts: norms, shortformer positions, masks, scales; and refuses what we
lack."""

import pytest
import torch
import torch.nn.functional as F

from interp_transformer import DemoTransformer, HookedTransformer, HookedTransformerConfig
from interp_transformer.parts import LayerNorm, LayerNormPre, NoNorm, RMSNorm, RMSNormPre


def config(**overrides) -> HookedTransformerConfig:
    settings = dict(n_layers=2, d_model=24, d_head=6, n_ctx=12, d_vocab=30, act_fn="relu", seed=0)
    settings.update(overrides)
    return HookedTransformerConfig(**settings)


def randomized(model):
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.1)
    return model.eval()


TOKENS = torch.randint(0, 30, (2, 8), generator=torch.Generator().manual_seed(1))


def test_defaults_follow_transformer_lens():
    cfg = HookedTransformerConfig(d_model=64, d_head=16, n_layers=3, n_ctx=32, d_vocab=50)
    assert (cfg.n_heads, cfg.d_mlp, cfg.act_fn, cfg.normalization_type, cfg.d_vocab_out) == (4, 256, "relu", "LN", 50)
    assert cfg.initializer_range == pytest.approx(0.8 / 8) and cfg.attn_scale == pytest.approx(4.0)
    assert cfg.n_params == 3 * (4 * 64 * 64 + 2 * 64 * 256)
    assert HookedTransformerConfig.unwrap(cfg.to_dict()) == cfg
    with pytest.raises(TypeError, match="d_modle"):
        HookedTransformerConfig.from_dict({**cfg.to_dict(), "d_modle": 3})
    with pytest.raises(ValueError, match="normalization_type"):
        config(normalization_type="BatchNorm")
    with pytest.raises(ValueError, match="act_fn"):
        config(act_fn="swish")


@pytest.mark.parametrize(
    "normalization_type, part",
    [("LN", LayerNorm), ("LNPre", LayerNormPre), ("RMS", RMSNorm), ("RMSPre", RMSNormPre), (None, NoNorm)],
)
def test_normalization_types_pick_their_norm(normalization_type, part):
    model = randomized(HookedTransformer(config(normalization_type=normalization_type)))
    assert all(isinstance(norm, part) for block in model.blocks for norm in (block.ln1, block.ln2))
    assert isinstance(model.ln_final, part)
    logits, cache = model.run_with_cache(TOKENS)
    final = cache["resid_post", -1]
    if normalization_type == "LN":
        expected = F.layer_norm(final, (24,), model.ln_final.w, model.ln_final.b, 1e-5)
    elif normalization_type == "LNPre":
        expected = F.layer_norm(final, (24,), None, None, 1e-5)
    elif normalization_type == "RMS":
        expected = final / (final.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt() * model.ln_final.w
    elif normalization_type == "RMSPre":
        expected = final / (final.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()
    else:
        expected = final
        assert "ln_final.hook_scale" not in model.hook_dict and not any("ln1" in name for name in model.hook_dict)
    torch.testing.assert_close(logits, expected @ model.W_U + model.b_U, rtol=0, atol=1e-5)
    # the residual stream decomposes exactly, and the logit lens reads through the model's own final norm
    torch.testing.assert_close(cache.decompose_resid().sum(0), final, rtol=0, atol=1e-5)
    torch.testing.assert_close(
        cache.accumulated_resid(apply_ln=True)[-1] @ model.W_U + model.b_U, logits, rtol=0, atol=1e-4
    )


def test_shortformer_positions_enter_queries_and_keys_only():
    model = randomized(HookedTransformer(config(positional_embedding_type="shortformer")))
    logits, cache = model.run_with_cache(TOKENS)
    assert model.hook_names.input_writers == ("embed",)
    torch.testing.assert_close(cache["resid_pre", 0], cache["embed"], rtol=0, atol=0)
    pos = model.W_pos[:8]
    torch.testing.assert_close(cache["pos_embed"], pos.expand(2, 8, 24), rtol=0, atol=0)
    for layer in range(2):
        attn = model.blocks[layer].attn
        normalized = cache["normalized", layer, "ln1"]
        for name, W, b, extra in (
            ("q", attn.W_Q, attn.b_Q, pos),
            ("k", attn.W_K, attn.b_K, pos),
            ("v", attn.W_V, attn.b_V, 0),
        ):
            expected = torch.einsum("bpm,hmd->bphd", normalized + extra, W) + b
            torch.testing.assert_close(cache[name, layer], expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(cache.decompose_resid().sum(0), cache["resid_post", -1], rtol=0, atol=1e-5)
    # a DemoTransformer would add the positions to the residual stream: it refuses instead of computing that
    with pytest.raises(ValueError, match="shortformer"):
        DemoTransformer(model.cfg)(TOKENS)


def test_attention_scale_direction_and_output_width():
    cfg = config(
        attention_dir="bidirectional", use_attn_scale=False, d_vocab_out=7, scale_attn_by_inverse_layer_idx=True
    )
    model = randomized(HookedTransformer(cfg))
    logits, cache = model.run_with_cache(TOKENS)
    assert logits.shape == (2, 8, 7) and model.W_U.shape == (24, 7)
    assert not model.capabilities.causal
    for layer in range(2):
        q, k = cache["q", layer], cache["k", layer]
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / (layer + 1)  # no 1/sqrt(d_head), then 1/(layer+1)
        torch.testing.assert_close(cache["attn_scores", layer], scores, rtol=0, atol=1e-5)


def test_hook_tokens_sees_and_replaces_the_ids():
    model = randomized(HookedTransformer(config(use_hook_tokens=True)))
    assert list(model.hook_dict)[0] == "hook_tokens"
    replaced = TOKENS.clone()
    replaced[:, 0] = 3

    def swap(tokens, hook):
        tokens[:, 0] = 3
        return tokens

    assert torch.equal(model.run_with_hooks(TOKENS.clone(), fwd_hooks=[("hook_tokens", swap)]), model(replaced))
    _, cache = model.run_with_cache(TOKENS)
    assert torch.equal(cache["hook_tokens"], TOKENS)


@pytest.mark.parametrize(
    "overrides, named",
    [
        (dict(parallel_attn_mlp=True, use_split_qkv_input=True), "parallel_attn_mlp=True with attn_only"),
        (dict(post_embedding_ln=True), "a norm after the embeddings"),
        (dict(act_fn="solu_ln"), "solu_ln"),
        (dict(load_in_4bit=True), "4-bit weights"),
        (dict(num_experts=4, experts_per_token=2), "mixture-of-experts"),
        (dict(n_key_value_heads=3), "divide"),
    ],
)
def test_what_we_do_not_compute_is_refused_by_name(overrides, named):
    with pytest.raises(ValueError, match=named):
        HookedTransformer(config(**overrides))


def test_n_params_total_and_init_modes():
    model = HookedTransformer(config(init_mode="xavier_normal", initializer_range=1.0))
    assert model.n_params_total == sum(p.numel() for p in model.parameters())
    W = model.blocks[0].attn.W_Q  # fan_in 24, fan_out 4 * 6: std sqrt(2 / 48)
    assert W.std().item() == pytest.approx((2 / 48) ** 0.5, rel=0.2)
    assert torch.equal(model.blocks[0].ln1.w, torch.ones(24)) and torch.equal(
        model.blocks[0].attn.b_Q, torch.zeros(4, 6)
    )
    with pytest.raises(ValueError, match="init_mode"):
        HookedTransformer(config(init_mode="orthogonal"))


def test_rotary_grouped_gated_models_match_the_llama_architecture():
    """The same model through both configs: HookedTransformerConfig(RMS, rotary, grouped, gated) and LlamaConfig."""
    from interp_transformer.families.llama.recipe import LlamaConfig

    cfg = config(
        act_fn="silu",
        normalization_type="RMS",
        positional_embedding_type="rotary",
        rotary_base=10000,
        n_key_value_heads=2,
        gated_mlp=True,
        d_mlp=40,
    )
    model = randomized(HookedTransformer(cfg))
    llama = DemoTransformer(
        LlamaConfig(
            d_model=24,
            n_layers=2,
            n_heads=4,
            n_key_value_heads=2,
            d_head=6,
            d_mlp=40,
            d_vocab=30,
            n_ctx=12,
            rms_norm_eps=1e-5,
            rotary_base=10000.0,
        )
    )
    llama.load_state_dict(model.state_dict())
    logits, cache = model.run_with_cache(TOKENS)
    torch.testing.assert_close(logits, llama(TOKENS), rtol=0, atol=1e-5)
    assert (
        cache["k", 0].shape == (2, 8, 2, 6)
        and cache["rot_q", 1].shape == (2, 8, 4, 6)
        and "hook_pos_embed" not in model.hook_dict
    )
    torch.testing.assert_close(cache.decompose_resid().sum(0), cache["resid_post", -1], rtol=0, atol=1e-5)
    model.set_use_split_qkv_input(True)  # grouped keys and values: one input per key/value head
    _, split = model.run_with_cache(TOKENS)
    assert split["k_input", 0].shape == (2, 8, 2, 24) and split["q_input", 0].shape == (2, 8, 4, 24)


def test_final_rms_and_qk_norm():
    model = randomized(HookedTransformer(config(final_rms=True, use_qk_norm=True)))
    assert isinstance(model.ln_final, RMSNorm) and isinstance(model.blocks[0].ln1, LayerNorm)
    _, cache = model.run_with_cache(TOKENS)
    attn = model.blocks[0].attn
    q = torch.einsum("bpm,hmd->bphd", cache["normalized", 0, "ln1"], attn.W_Q) + attn.b_Q
    torch.testing.assert_close(cache["q", 0], q, rtol=0, atol=1e-5)  # hook_q is before the norm, as with Qwen3's


def test_parallel_blocks_and_alibi_are_the_native_architectures_parts():
    """parallel_attn_mlp builds GPT-NeoX's parallel block, ALiBi BLOOM's score bias: same weights, same logits and
    hooks."""
    from interp_transformer.families.gpt_neox.recipe import GPTNeoXConfig
    from interp_transformer.parts.alibi import alibi_slopes

    cfg = config(
        parallel_attn_mlp=True,
        positional_embedding_type="rotary",
        rotary_dim=4,
        rotary_base=10000,
        act_fn="gelu",
        n_heads=4,
        d_mlp=48,
        eps=1e-5,
    )
    ours = randomized(HookedTransformer(cfg))
    native = DemoTransformer(
        GPTNeoXConfig(
            d_model=24, n_layers=2, n_heads=4, d_head=6, d_mlp=48, d_vocab=30, n_ctx=12, rotary_dim=4, act_fn="gelu"
        )
    )
    native.load_state_dict(ours.state_dict(), strict=False)
    torch.testing.assert_close(ours(TOKENS), native(TOKENS), atol=1e-5, rtol=1e-5)
    _, cache = ours.run_with_cache(TOKENS)
    assert "blocks.0.hook_resid_mid" not in ours.hook_dict
    torch.testing.assert_close(
        cache["resid_post", 0], cache["resid_pre", 0] + cache["attn_out", 0] + cache["mlp_out", 0]
    )

    alibi = randomized(HookedTransformer(config(positional_embedding_type="alibi", n_heads=4)))
    _, cache = alibi.run_with_cache(TOKENS)
    positions = torch.arange(TOKENS.shape[1])
    bias = -alibi_slopes(4)[:, None, None] * (positions[:, None] - positions[None, :]).abs()
    scores = torch.einsum("bqhd,bkhd->bhqk", cache["q", 0], cache["k", 0]) / 6**0.5 + bias
    causal = torch.ones(8, 8, dtype=torch.bool).tril()
    torch.testing.assert_close(cache["pattern", 0], scores.masked_fill(~causal, float("-inf")).softmax(-1))
    assert cache["alibi", 0].shape == (2, 4, 8, 8) and "hook_pos_embed" not in alibi.hook_dict


@pytest.mark.parametrize("family", ["pythia", "opt"])
def test_from_pretrained_holds_pythia_and_opt(family):
    """HookedTransformer.from_pretrained of a random GPT-NeoX / OPT model: Hugging Face's log-probs, processed or
    not."""
    import transformers

    from ..gpt2_helpers import randomize_

    torch.manual_seed(0)
    if family == "pythia":
        hf_model = transformers.GPTNeoXForCausalLM(
            transformers.GPTNeoXConfig(
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=64,
                vocab_size=30,
                rotary_pct=0.25,
            )
        )
    else:
        hf_model = transformers.OPTForCausalLM(
            transformers.OPTConfig(
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                ffn_dim=64,
                vocab_size=30,
                word_embed_proj_dim=32,
                max_position_embeddings=16,
            )
        )
    hf_model = randomize_(hf_model, seed=3).eval()
    with torch.no_grad():
        expected = hf_model(TOKENS).logits.log_softmax(-1)
    for load in (HookedTransformer.from_pretrained, HookedTransformer.from_pretrained_no_processing):
        model = load(hf_model)
        assert model.cfg.parallel_attn_mlp == (family == "pythia")
        torch.testing.assert_close(model(TOKENS).log_softmax(-1), expected, atol=1e-4, rtol=1e-4)
