"""The classic decoders' parts alone, each against the reference that defines it.

Rotary positions against GPT-J's and GPT-NeoX's own functions; ALiBi against BLOOM's slopes
and bias; the score-bias paths of ``Attention`` against each other; the unbiased-std
LayerNorm against the Annotated Transformer's formula and its own algebra; sinusoidal tables
against the Annotated Transformer's and Marian's constructions; the activations against
Hugging Face's; and the converters' refusals, each named.
"""

import math

import pytest
import torch
from transformers import BloomConfig, GPT2Config, GPTNeoXConfig
from transformers.activations import ACT2FN
from transformers.models.bloom import modeling_bloom
from transformers.models.gpt_neox import modeling_gpt_neox
from transformers.models.gptj import modeling_gptj
from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

from interp_transformer.core.kv_cache import LayerKVCache
from interp_transformer.families.bloom.recipe import BloomConfig as OurBloomConfig
from interp_transformer.families.gpt_neox.recipe import GPTNeoXConfig as OurNeoXConfig
from interp_transformer.families.gptj.recipe import GPTJConfig as OurGPTJConfig
from interp_transformer.families.opt.recipe import OPTConfig as OurOPTConfig
from interp_transformer.loading import CheckpointError, architecture_module, from_pretrained
from interp_transformer.parts import (
    ALiBi,
    Attention,
    LayerNorm,
    NormedEmbed,
    ScaledEmbed,
    SinusoidalPosEmbed,
    TokenLayout,
    UnbiasedLayerNorm,
)
from interp_transformer.parts.activations import ACTIVATIONS
from interp_transformer.parts.alibi import alibi_slopes
from interp_transformer.parts.rotary import Rotary
from interp_transformer.parts.sinusoidal import sinusoidal_table
from interp_transformer.verify import verify_against_hf

from .classic_helpers import FAMILIES, left_padded, tiny_hf_model
from .gpt2_helpers import one_thread, tiny_gpt2  # noqa: F401 (one_thread: autouse fixture)


def randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# the second row continues after 7 cached positions
POSITIONS = torch.tensor([[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]])


# --- rotary: the interleaved (GPT-J) and half-split (GPT-NeoX) layouts on part of each head -------------------------
@pytest.mark.parametrize("rotary_dim", [4, 8, 16])
def test_interleaved_rotary_is_gptjs(rotary_dim):
    x = randn(2, 6, 3, 16, dtype=torch.float32)
    ours = Rotary(16, rotary_dim=rotary_dim, interleaved=True)(x, POSITIONS)
    sincos = modeling_gptj.create_sinusoidal_positions(32, rotary_dim)[POSITIONS]  # GPT-J's table at our positions
    sin, cos = torch.split(sincos, rotary_dim // 2, dim=-1)
    theirs = torch.cat([modeling_gptj.apply_rotary_pos_emb(x[..., :rotary_dim], sin, cos), x[..., rotary_dim:]], dim=-1)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)
    half_split = Rotary(16, rotary_dim=rotary_dim, interleaved=False)(x, POSITIONS)
    assert (half_split - theirs).abs().max() > 0.1  # the two layouts are not interchangeable


@pytest.mark.parametrize("partial_rotary_factor", [0.25, 0.5, 1.0])
def test_half_split_rotary_is_gpt_neoxs(partial_rotary_factor):
    config = GPTNeoXConfig(hidden_size=48, num_attention_heads=3, rotary_pct=partial_rotary_factor, rotary_emb_base=500)
    rotary_dim = int(16 * partial_rotary_factor)
    q, k = randn(2, 6, 3, 16, seed=1, dtype=torch.float32), randn(2, 6, 3, 16, seed=2, dtype=torch.float32)
    cos, sin = modeling_gpt_neox.GPTNeoXRotaryEmbedding(config)(q, POSITIONS)
    heads_first = lambda t: t.transpose(1, 2)  # noqa: E731
    their_q, their_k = modeling_gpt_neox.apply_rotary_pos_emb(heads_first(q), heads_first(k), cos, sin)
    rotary = Rotary(16, rotary_dim=rotary_dim, base=500)
    torch.testing.assert_close(rotary(q, POSITIONS), heads_first(their_q), atol=1e-6, rtol=0)
    torch.testing.assert_close(rotary(k, POSITIONS), heads_first(their_k), atol=1e-6, rtol=0)


# --- ALiBi -------------------------------------------------------------------------------------------------------
def test_alibi_slopes_are_blooms():
    for n_heads in range(1, 34):
        assert torch.equal(alibi_slopes(n_heads), modeling_bloom._get_alibi_slopes(n_heads, torch.device("cpu"))), (
            n_heads
        )
    with pytest.raises(ValueError, match="n_heads must be a positive int, got 0"):
        alibi_slopes(0)


@pytest.mark.parametrize("n_heads", [4, 6])
def test_alibi_bias_is_blooms_up_to_a_constant_per_query(n_heads):
    """BLOOM adds ``slope * key_position``; ours is ``-slope * |q - k|``: equal on every causal key after adding ``slope
    * q``."""
    _, mask = left_padded(torch.zeros(2, 7, dtype=torch.long), (3, 0))
    layout = TokenLayout.from_attention_mask(mask)
    ours = ALiBi(n_heads)(layout, torch.float64)  # [batch, head_index, query_pos, key_pos]
    theirs = modeling_bloom.build_alibi_tensor(mask, n_heads, torch.float64).reshape(2, n_heads, 1, 7)
    slopes = alibi_slopes(n_heads).double()[None, :, None, None]
    # causal, real keys
    visible = (torch.arange(7)[None, :] <= torch.arange(7)[:, None]) & mask.bool()[:, None, None, :]
    shifted = ours + slopes * layout.positions[:, None, :, None]
    torch.testing.assert_close(torch.where(visible, shifted, 0.0), torch.where(visible, theirs.expand_as(ours), 0.0))
    assert ours.shape == (2, n_heads, 7, 7) and bool((ours <= 0).all())


def test_alibi_attention_paths_agree_with_padding_and_a_key_value_cache():
    cfg = OurBloomConfig(d_model=24, n_layers=1, n_heads=3, d_head=8, d_mlp=32, d_vocab=10, n_ctx=16)
    attn = Attention(cfg, score_bias=ALiBi(3)).double()
    with torch.no_grad():
        for param in attn.parameters():
            param.copy_(randn(*param.shape, seed=param.numel()))
    x = randn(2, 7, 24, seed=9)
    _, mask = left_padded(torch.zeros(2, 7, dtype=torch.long), (2, 0))
    layout = TokenLayout.from_attention_mask(mask)
    outputs = {}
    for fused in (True, False):
        attn.use_fused_attention = fused
        whole = attn(x, layout)
        cache = LayerKVCache()  # the same text in two steps: 4 positions, then 3 more
        first = attn(x[:, :4], TokenLayout.from_attention_mask(mask[:, :4]), cache)
        second = attn(x[:, 4:], TokenLayout.from_attention_mask(mask[:, 4:], mask[:, :4].bool()), cache)
        torch.testing.assert_close(
            torch.cat([first, second], dim=1)[mask.bool()], whole[mask.bool()], atol=1e-12, rtol=0
        )
        outputs[fused] = whole
    torch.testing.assert_close(outputs[True][mask.bool()], outputs[False][mask.bool()], atol=1e-12, rtol=0)
    no_bias = Attention(cfg).double()
    no_bias.load_state_dict(attn.state_dict())
    assert (no_bias(x, layout) - outputs[False])[mask.bool()].abs().max() > 1e-3  # the bias matters


def test_alibi_takes_other_slopes_and_its_attention_is_a_from_scratch_alibis():
    """A design whose slopes start at 1 (``2^(-8h/H)``): our attention with those slopes equals the textbook
    formula written here, softmax(q k / sqrt(d) - slope_h |i - j|) over the causal keys; the default slopes differ."""
    cfg = OurBloomConfig(d_model=24, n_layers=1, n_heads=3, d_head=8, d_mlp=32, d_vocab=10, n_ctx=16)
    slopes = 2 ** (-8 * torch.arange(3) / 3)
    attn = Attention(cfg, score_bias=ALiBi(3, slopes=slopes)).double()
    with torch.no_grad():
        for param in attn.parameters():
            param.copy_(randn(*param.shape, seed=param.numel()))
    x = randn(1, 6, 24, seed=3)
    attn.use_fused_attention = False
    patterns = {}
    attn.hook_pattern.add_hook(lambda pattern, hook: patterns.setdefault("ours", pattern))
    attn(x, TokenLayout.contiguous(1, 6, device=x.device))
    q = torch.einsum("bpd,hde->bhpe", x, attn.W_Q) + attn.b_Q[None, :, None, :]
    k = torch.einsum("bpd,hde->bhpe", x, attn.W_K) + attn.b_K[None, :, None, :]
    distance = (torch.arange(6)[:, None] - torch.arange(6)[None, :]).abs()
    scores = q @ k.transpose(-1, -2) / 8**0.5 - slopes.double()[None, :, None, None] * distance
    scores = scores.masked_fill(torch.arange(6)[None, :] > torch.arange(6)[:, None], float("-inf"))
    torch.testing.assert_close(patterns["ours"], scores.softmax(dim=-1), atol=1e-12, rtol=0)
    assert not torch.equal(ALiBi(3).slopes, ALiBi(3, slopes=slopes).slopes)
    with pytest.raises(ValueError, match=r"one slope per head, shape \(3,\), got shape \(2,\)"):
        ALiBi(3, slopes=[1.0, 0.5])
    with pytest.raises(ValueError, match="must be positive and finite"):
        ALiBi(3, slopes=[1.0, -0.5, 0.25])


def test_a_clipped_relative_bias_is_its_from_scratch_formula_padded_and_cached():
    """Shaw-style clipped offsets: our attention equals softmax(q k / sqrt(d) + W_rel[clip(j - i, -2, 2) + 2, h])
    written here; a left-padded row gets what it gets alone, and a key/value cache changes nothing."""
    from interp_transformer.parts import ClippedRelativeBias

    cfg = OurBloomConfig(d_model=24, n_layers=1, n_heads=3, d_head=8, d_mlp=32, d_vocab=10, n_ctx=16)
    attn = Attention(cfg, score_bias=ClippedRelativeBias(3, max_distance=2)).double()
    with torch.no_grad():
        for param in attn.parameters():
            param.copy_(randn(*param.shape, seed=param.numel()))
    attn.use_fused_attention = False
    x = randn(2, 6, 24, seed=4)
    patterns = []
    attn.hook_pattern.add_hook(lambda pattern, hook: patterns.append(pattern))
    attn(x[:1], TokenLayout.contiguous(1, 6, device=x.device))
    q = torch.einsum("bpd,hde->bhpe", x[:1], attn.W_Q) + attn.b_Q[None, :, None, :]
    k = torch.einsum("bpd,hde->bhpe", x[:1], attn.W_K) + attn.b_K[None, :, None, :]
    offset = (torch.arange(6)[None, :] - torch.arange(6)[:, None]).clamp(-2, 2) + 2
    table = attn.score_bias.W_rel.detach()
    scores = q @ k.transpose(-1, -2) / 8**0.5 + table[offset].permute(2, 0, 1)[None]
    scores = scores.masked_fill(torch.arange(6)[None, :] > torch.arange(6)[:, None], float("-inf"))
    torch.testing.assert_close(patterns[0], scores.softmax(dim=-1), atol=1e-12, rtol=0)
    alone = attn(x[1:, 2:], TokenLayout.contiguous(1, 4, device=x.device))
    _, mask = left_padded(torch.zeros(2, 6, dtype=torch.long), (2, 0))
    padded = attn(x.flip(0), TokenLayout.from_attention_mask(mask))  # row 0: x[1] with its first 2 positions padding
    torch.testing.assert_close(padded[0, 2:], alone[0], atol=1e-12, rtol=0)
    cache = LayerKVCache()
    first = attn(x[:, :4], TokenLayout.contiguous(2, 4, device=x.device), cache)
    second = attn(x[:, 4:], TokenLayout.contiguous(2, 2, offset=4, device=x.device), cache)
    torch.testing.assert_close(
        torch.cat([first, second], dim=1), attn(x, TokenLayout.contiguous(2, 6)), atol=1e-12, rtol=0
    )
    with pytest.raises(ValueError, match="max_distance a positive int, got 0"):
        ClippedRelativeBias(3, max_distance=0)


# --- the unbiased-std LayerNorm -------------------------------------------------------------------------------------
def annotated_layer_norm(x, a_2, b_2, eps):
    """The Annotated Transformer's LayerNorm, as it writes it."""
    mean = x.mean(-1, keepdim=True)
    std = x.std(-1, keepdim=True)
    return a_2 * (x - mean) / (std + eps) + b_2


def test_unbiased_layer_norm_is_the_annotated_transformers():
    norm = UnbiasedLayerNorm(12, eps=1e-6).double()
    with torch.no_grad():
        norm.w.copy_(1 + randn(12, seed=1))
        norm.b.copy_(randn(12, seed=2))
    x = 3 * randn(2, 5, 12, seed=3) + 1
    seen = {}
    hook = norm.hook_scale.add_hook(lambda scale, hook: seen.setdefault("scale", scale))
    out = norm(x)
    norm.hook_scale.remove_hook(hook)
    torch.testing.assert_close(out, annotated_layer_norm(x, norm.w, norm.b, 1e-6), atol=1e-12, rtol=0)
    torch.testing.assert_close(seen["scale"], x.std(-1, keepdim=True) + 1e-6, atol=1e-12, rtol=0)
    torch.testing.assert_close(norm.normalize(x), out, atol=1e-12, rtol=0)
    plain = LayerNorm(12, 1e-6).double()
    plain.load_state_dict(norm.state_dict())
    assert (plain(x) - out).abs().max() > 1e-2  # torch's LayerNorm is another formula


def test_unbiased_layer_norm_algebra():
    """Frozen, it is affine: apply_frozen + b is its output, pull_back moves a direction through it, fold_into is
    exact."""
    norm = UnbiasedLayerNorm(12, eps=1e-6).double()
    with torch.no_grad():
        norm.w.copy_(1 + randn(12, seed=4))
        norm.b.copy_(randn(12, seed=5))
    x = randn(3, 12, seed=6)
    scale = x.std(-1, keepdim=True) + 1e-6
    torch.testing.assert_close(norm.apply_frozen(x, scale) + norm.b, norm.normalize(x), atol=1e-12, rtol=0)
    direction = randn(12, seed=7)
    torch.testing.assert_close(
        norm.apply_frozen(x, scale) @ direction, (x * norm.pull_back(direction, scale)).sum(-1), atol=1e-12, rtol=0
    )
    W, b_next = randn(12, 5, seed=8), randn(5, seed=9)
    expected = norm.normalize(x) @ W + b_next
    norm.fold_into(W, b_next, center=True)
    norm.reset()
    torch.testing.assert_close(norm.normalize(x) @ W + b_next, expected, atol=1e-12, rtol=0)
    assert not norm.uses_fused_path() and norm.removes_mean
    with pytest.raises(ValueError, match="d_model >= 2"):
        UnbiasedLayerNorm(1, 1e-6)


# --- sinusoidal positions and scaled or normalized embeddings
# -----------------------------------------------------------
def annotated_positional_table(n_ctx: int, d_model: int) -> torch.Tensor:
    """The Annotated Transformer's ``PositionalEncoding`` table, as it builds it (float32)."""
    pe = torch.zeros(n_ctx, d_model)
    position = torch.arange(0, n_ctx).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2) * -(math.log(10000.0) / d_model))
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe


def test_sinusoidal_tables_are_the_annotated_transformers_and_marians():
    positions = torch.arange(40)
    torch.testing.assert_close(
        sinusoidal_table(positions, 16, interleaved=True), annotated_positional_table(40, 16), atol=2e-6, rtol=0
    )
    for d_model in (16, 15):
        marian = MarianSinusoidalPositionalEmbedding(40, d_model)
        torch.testing.assert_close(sinusoidal_table(positions, d_model), marian.create_weight(), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="interleaved sines and cosines need an even d_model, got 15"):
        sinusoidal_table(positions, 15, interleaved=True)


def test_sinusoidal_pos_embed_follows_the_models_dtype_and_offset():
    cfg = OurGPTJConfig(d_model=16, n_layers=1, n_heads=2, d_head=8, d_mlp=8, d_vocab=10, n_ctx=12, rotary_dim=None)
    pos_embed = SinusoidalPosEmbed(cfg, interleaved=True)
    tokens = torch.zeros(2, 3, dtype=torch.long)
    assert pos_embed(tokens).dtype == torch.float32 and pos_embed.double()(tokens).dtype == torch.float64
    assert pos_embed.W_pos.dtype == torch.float64 and pos_embed.W_pos.shape == (12, 16)
    torch.testing.assert_close(pos_embed(tokens, offset=4)[0], pos_embed.W_pos[4:7])
    assert pos_embed.output_weights() == [] and list(pos_embed.parameters()) == []


def test_scaled_and_normalized_embeddings():
    cfg = OurGPTJConfig(d_model=16, n_layers=1, n_heads=2, d_head=8, d_mlp=8, d_vocab=10, n_ctx=12, rotary_dim=None)
    tokens = torch.tensor([[1, 4, 4, 9]])
    scaled = ScaledEmbed(cfg)
    normed = NormedEmbed(cfg, LayerNorm(16, 1e-5))
    with torch.no_grad():
        scaled.W_E.copy_(randn(10, 16, dtype=torch.float32))
        normed.W_E.copy_(randn(10, 16, dtype=torch.float32))
    torch.testing.assert_close(scaled(tokens), scaled.W_E[tokens] * 4.0)
    torch.testing.assert_close(normed(tokens), torch.nn.functional.layer_norm(normed.W_E[tokens], (16,)))
    assert normed.output_weights() == []
    with pytest.raises(ValueError, match="scale must be a finite number or None"):
        ScaledEmbed(cfg, scale=float("inf"))


# --- activations --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["relu", "gelu", "gelu_new", "gelu_fast", "quick_gelu", "silu"])
def test_activations_are_hugging_faces(name):
    x = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    torch.testing.assert_close(ACTIVATIONS[name](x), ACT2FN[name](x), atol=1e-15, rtol=0)


def test_blooms_gelu_is_its_own_and_not_the_others():
    x = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    torch.testing.assert_close(ACTIVATIONS["bloom_gelu"](x), modeling_bloom.bloom_gelu_forward(x), atol=1e-15, rtol=0)
    assert (ACTIVATIONS["bloom_gelu"](x) - ACTIVATIONS["gelu_new"](x)).abs().max() > 1e-10  # its rounded constant
    assert (ACTIVATIONS["gelu"](x) - ACTIVATIONS["gelu_new"](x)).abs().max() > 1e-4  # erf and tanh GELU differ


# --- configs and converters refuse what they do not compute ---------------------------------------------------------
@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: OurNeoXConfig(rotary_dim=3), "rotary_dim must be even and at most d_head=64"),
        (lambda: OurNeoXConfig(parallel_residual=1), "parallel_residual must be a bool"),
        (lambda: OurGPTJConfig(rotary_dim=512), r"rotary_dim must be even and at most d_head=256 \(or None\)"),
        (lambda: OurOPTConfig(d_embed=0), "d_embed must be a positive int or None"),
        (lambda: OurBloomConfig(act_fn="mish"), "act_fn must be one of"),
    ],
)
def test_configs_refuse_bad_fields(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


@pytest.mark.parametrize(
    "hf_config, match",
    [
        (
            GPTNeoXConfig(hidden_size=48, num_attention_heads=3, rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
            r"gpt_neox config has rope_type='dynamic'; supported: \['default', 'linear'\]",
        ),
        (GPTNeoXConfig(hidden_size=48, num_attention_heads=3, rotary_pct=0.2), r"rotates 3 of d_head=16 dimensions"),
        (
            GPTNeoXConfig(hidden_size=48, num_attention_heads=3, hidden_act="mish"),
            "gpt_neox activation 'mish' is not supported",
        ),
        (
            BloomConfig(hidden_size=48, n_head=3, apply_residual_connection_post_layernorm=True),
            "apply_residual_connection_post_layernorm=True",
        ),
    ],
)
def test_converters_refuse_what_they_do_not_compute(hf_config, match):
    module = architecture_module(hf_config.model_type)
    with pytest.raises(ValueError, match=match):
        module.config_from_hf(hf_config)


def test_gpt2_refuses_scaling_by_layer_and_accepts_upcast_attention():
    """``scale_attn_by_inverse_layer_idx`` changes the scores (refused); ``reorder_and_upcast_attn`` only the
    precision."""
    with pytest.raises(
        ValueError, match="scale_attn_by_inverse_layer_idx=True; only scale_attn_by_inverse_layer_idx=False"
    ):
        architecture_module("gpt2").config_from_hf(
            GPT2Config(n_layer=2, n_embd=32, n_head=4, scale_attn_by_inverse_layer_idx=True)
        )
    hf_model = tiny_gpt2(reorder_and_upcast_attn=True)
    tokens = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(0))
    report = verify_against_hf(from_pretrained(hf_model), hf_model, tokens, float64_recheck="always")
    assert report.within_tolerance and report.float64.within_tolerance, str(report)


@pytest.mark.parametrize("label", sorted(FAMILIES))
def test_a_checkpoint_that_does_not_fit_is_refused_with_every_difference(label):
    hf_model = tiny_hf_model(label)
    module = architecture_module(hf_model.config.model_type)
    cfg = module.config_from_hf(hf_model.config)
    state_dict = dict(hf_model.state_dict())
    dropped = next(name for name in state_dict if ".1." in name and name.endswith("weight"))
    widened = next(
        name for name in state_dict if ".0." in name and name.endswith(("q_proj.weight", "query_key_value.weight"))
    )
    del state_dict[dropped]
    state_dict[widened] = torch.zeros(state_dict[widened].shape[0] + 1)
    state_dict["stray.weight"] = torch.zeros(3)
    with pytest.raises(CheckpointError) as error:
        module.convert_state_dict(state_dict, cfg)
    assert len(error.value.missing) == 1 and dropped.endswith(error.value.missing[0])
    assert error.value.unexpected == ["stray.weight"] and len(error.value.mis_shaped) == 1


def test_gpt_neox_reads_the_read_out_under_its_old_name():
    hf_model = tiny_hf_model("neox-parallel")
    module = architecture_module("gpt_neox")
    cfg = module.config_from_hf(hf_model.config)
    state_dict = dict(hf_model.state_dict())
    state_dict["embed_out.weight"] = state_dict.pop("lm_head.weight")
    assert torch.equal(module.convert_state_dict(state_dict, cfg)["unembed.W_U"], hf_model.lm_head.weight.T)
    del state_dict["embed_out.weight"]  # untied: the read-out may not be left out
    with pytest.raises(CheckpointError, match="missing 1 tensor"):
        module.convert_state_dict(state_dict, cfg)


def test_opt_folds_its_projections_into_the_embeddings():
    hf_model = tiny_hf_model("opt-350m-layout").double()
    model = from_pretrained(hf_model, dtype=torch.float64)
    decoder = hf_model.model.decoder
    assert model.cfg.d_embed == 32 and model.W_E.shape == (61, 48) and model.W_U.shape == (48, 61)
    torch.testing.assert_close(model.W_E, decoder.embed_tokens.weight @ decoder.project_in.weight.T, atol=1e-14, rtol=0)
    torch.testing.assert_close(model.W_U, decoder.project_out.weight.T @ hf_model.lm_head.weight.T, atol=1e-14, rtol=0)
    torch.testing.assert_close(model.W_pos, decoder.embed_positions.weight[2:], atol=0, rtol=0)
