"""The Llama family's parts alone: RMSNorm, rotary positions, grouped-query attention, the gated MLP; bad configs.

References: each part's formula written out here, Hugging Face's own rotary functions
(Llama's half split, GPT-NeoX's partial rotary, GPT-J's interleaved pairs, the llama3 and
linear frequency scalings), and the fused kernels against the explicit paths.
"""

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from transformers import GPTNeoXConfig, MistralConfig, Qwen2Config
from transformers import LlamaConfig as HFLlamaConfig
from transformers.modeling_rope_utils import _compute_linear_scaling_rope_parameters, _compute_llama3_parameters
from transformers.models.gpt_neox import modeling_gpt_neox
from transformers.models.gptj import modeling_gptj

from interp_transformer import Capabilities, DemoTransformer
from interp_transformer.core.kv_cache import LayerKVCache
from interp_transformer.families import Architecture, DecoderParts, register, unregister
from interp_transformer.families.llama.hf import config_from_hf, convert_state_dict
from interp_transformer.families.llama.recipe import HOOK_NAMES, LlamaConfig
from interp_transformer.loading import CheckpointError
from interp_transformer.models import processing
from interp_transformer.parts import (
    Attention,
    CausalMask,
    Embed,
    LayerNorm,
    PaddingMask,
    PreNormBlock,
    SlidingWindowMask,
    TokenLayout,
    Unembed,
)
from interp_transformer.parts.gated_mlp import GatedMLP
from interp_transformer.parts.rms_norm import RMSNorm
from interp_transformer.parts.rotary import RopeScaling, Rotary, rotary_frequencies

from .gpt2_helpers import one_thread  # noqa: F401 (autouse fixture)
from .llama_helpers import tiny_hf_model

TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}


def randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# --- RMSNorm ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rms_norm_fused_and_explicit_paths_are_the_formula(dtype):
    norm = RMSNorm(24, eps=1e-5).to(dtype)
    with torch.no_grad():
        norm.w.copy_(1 + 0.3 * randn(24, seed=1, dtype=dtype))
    x = 3 * randn(2, 5, 24, dtype=dtype)
    formula = x / (x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt() * norm.w
    assert norm.uses_fused_path()
    fused = norm(x)
    norm.use_fused_rms_norm = False
    explicit = norm(x)
    torch.testing.assert_close(fused, formula, atol=TOLERANCE[dtype], rtol=0)
    torch.testing.assert_close(explicit, formula, atol=TOLERANCE[dtype], rtol=0)
    torch.testing.assert_close(norm.normalize(x), formula, atol=TOLERANCE[dtype], rtol=0)


def test_observing_the_scale_selects_the_explicit_rms_norm():
    norm, seen = RMSNorm(8, eps=1e-6).double(), {}
    norm.hook_scale.add_hook(lambda t, hook: seen.__setitem__("scale", t))
    try:
        assert not norm.uses_fused_path()
        norm(randn(1, 3, 8))
    finally:
        norm.hook_scale.remove_hooks()
    assert norm.uses_fused_path() and seen["scale"].shape == (1, 3, 1)


def test_rms_norm_algebra():
    norm = RMSNorm(16, eps=1e-6).double()
    with torch.no_grad():
        norm.w.copy_(1 + 0.5 * randn(16, seed=2))
    x, direction = randn(3, 4, 16, seed=3), randn(16, seed=4)
    scale = (x.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()
    torch.testing.assert_close(norm.apply_frozen(x, scale), norm.normalize(x))
    torch.testing.assert_close(norm.apply_frozen(x, scale) @ direction, (x * norm.pull_back(direction, scale)).sum(-1))
    assert not norm.bias_term(randn(5, 16)).any() and norm.removes_mean is False
    W, b = randn(16, 7, seed=5), randn(7, seed=6)
    expected = norm.normalize(x) @ W + b
    folded_W, folded_b = W.clone(), b.clone()
    norm.fold_into(folded_W, folded_b, center=False)
    assert torch.equal(folded_b, b)
    torch.testing.assert_close((x / scale) @ folded_W + folded_b, expected)
    with pytest.raises(ValueError, match="does not subtract the mean of its input"):
        norm.fold_into(W.clone(), None, center=True)
    norm.reset()
    assert torch.equal(norm.w, torch.ones(16, dtype=torch.float64))


# --- rotary positions ---------------------------------------------------------------------------
def test_half_split_rotary_is_hugging_face_llamas():
    from transformers.models.llama import modeling_llama

    config = HFLlamaConfig(
        hidden_size=64,
        num_attention_heads=2,
        head_dim=32,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
    )
    embedding = modeling_llama.LlamaRotaryEmbedding(config)
    q, k = randn(2, 7, 3, 32, seed=1), randn(2, 7, 3, 32, seed=2)
    positions = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [0, 0, 0, 1, 2, 3, 4]])
    cos, sin = embedding(q, positions)
    heads_first = lambda t: t.transpose(1, 2)  # noqa: E731
    theirs_q, theirs_k = modeling_llama.apply_rotary_pos_emb(heads_first(q), heads_first(k), cos, sin)
    rotary = Rotary(32, base=500.0)
    torch.testing.assert_close(rotary(q, positions), heads_first(theirs_q), atol=1e-15, rtol=0)
    torch.testing.assert_close(rotary(k, positions), heads_first(theirs_k), atol=1e-15, rtol=0)


def test_partial_half_split_rotary_is_gpt_neoxs():
    config = GPTNeoXConfig(hidden_size=64, num_attention_heads=2, rotary_pct=0.25, rotary_emb_base=10000)
    embedding = modeling_gpt_neox.GPTNeoXRotaryEmbedding(config)
    q, k = randn(1, 6, 2, 32, seed=3), randn(1, 6, 2, 32, seed=4)
    positions = torch.arange(3, 9)[None]
    cos, sin = embedding(q, positions)
    assert cos.shape[-1] == 8  # a quarter of each head rotates
    theirs_q, _ = modeling_gpt_neox.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
    ours = Rotary(32, rotary_dim=8)(q, positions)
    torch.testing.assert_close(ours, theirs_q.transpose(1, 2), atol=1e-6, rtol=0)
    assert torch.equal(ours[..., 8:], q[..., 8:])


def test_interleaved_partial_rotary_is_gpt_js():
    rotary_dim, q = 8, randn(2, 5, 3, 24, seed=5)
    positions = torch.tensor([[0, 1, 2, 3, 4], [2, 3, 4, 5, 6]])
    sincos = modeling_gptj.create_sinusoidal_positions(16, rotary_dim)[positions]
    sin, cos = torch.split(sincos, rotary_dim // 2, dim=-1)
    rotated = modeling_gptj.apply_rotary_pos_emb(q[..., :rotary_dim], sin.double(), cos.double())
    theirs = torch.cat([rotated, q[..., rotary_dim:]], dim=-1)
    torch.testing.assert_close(
        Rotary(24, rotary_dim=rotary_dim, interleaved=True)(q, positions), theirs, atol=1e-6, rtol=0
    )


@pytest.mark.parametrize(
    "parameters, scaling",
    [
        (
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            RopeScaling("llama3", 8.0, 1.0, 4.0, 64),
        ),
        ({"rope_type": "linear", "factor": 4.0}, RopeScaling("linear", 4.0)),
    ],
    ids=["llama3", "linear"],
)
def test_scaled_frequencies_are_hugging_faces(parameters, scaling):
    config = HFLlamaConfig(
        hidden_size=128, num_attention_heads=2, rope_parameters={**parameters, "rope_theta": 500000.0}
    )
    compute = _compute_llama3_parameters if scaling.kind == "llama3" else _compute_linear_scaling_rope_parameters
    theirs, attention_factor = compute(config)
    assert attention_factor == 1.0
    ours = rotary_frequencies(64, 500000.0, scaling)
    assert torch.equal(ours, theirs)
    assert not torch.equal(ours, rotary_frequencies(64, 500000.0))  # the scaling changed something


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotated_scores_depend_only_on_the_distance(interleaved):
    rotary = Rotary(16, rotary_dim=12, base=100.0, interleaved=interleaved)
    q, k = randn(1, 1, 1, 16, seed=7), randn(1, 1, 1, 16, seed=8)

    def score(query_position, key_position):
        rot_q = rotary(q, torch.tensor([[query_position]]))
        rot_k = rotary(k, torch.tensor([[key_position]]))
        return float((rot_q * rot_k).sum())

    assert score(5, 2) == pytest.approx(score(13, 10), abs=1e-6)
    assert score(5, 2) != pytest.approx(score(5, 3), abs=1e-3)


def test_bad_rotary_settings_are_refused():
    with pytest.raises(ValueError, match=r"rotary_dim must be an even int in \[2, d_head=16\], got 7"):
        Rotary(16, rotary_dim=7)
    with pytest.raises(ValueError, match="rotary base must be a number > 1, got 0.5"):
        Rotary(16, base=0.5)
    with pytest.raises(ValueError, match=r"rope scaling kind must be one of \('linear', .*\), got 'dynamic'"):
        RopeScaling("dynamic", 2.0)
    with pytest.raises(ValueError, match="high_freq_factor > low_freq_factor"):
        RopeScaling("llama3", 8.0, low_freq_factor=4.0, high_freq_factor=1.0)


# --- grouped-query attention with rotary ----------------------------------------------------------
@dataclass(frozen=True)
class AttnShape:
    d_model: int = 20  # deliberately not n_heads * d_head
    n_heads: int = 6
    d_head: int = 8


def grouped_attention(n_kv: int, masks, dtype: torch.dtype, seed: int = 0, q_norm: bool = False) -> Attention:
    norms = {"q_norm": RMSNorm(8, 1e-6), "k_norm": RMSNorm(8, 1e-6)} if q_norm else {}
    attn = Attention(AttnShape(), masks, n_key_value_heads=n_kv, rotary=Rotary(8, base=50.0), **norms).to(dtype)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in attn.parameters():
            param.copy_(
                0.5 * torch.randn(param.shape, generator=generator, dtype=dtype)
                + (1.0 if param.ndim == 1 and q_norm else 0.0)
            )
    return attn


LAYOUTS = {
    "causal": ((CausalMask(), PaddingMask()), lambda: TokenLayout.contiguous(2, 7)),
    "sliding-window": ((SlidingWindowMask(3), PaddingMask()), lambda: TokenLayout.contiguous(2, 7)),
    "left-padded": (
        (CausalMask(), PaddingMask()),
        lambda: TokenLayout.from_attention_mask(torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1] * 7])),
    ),
}


@pytest.mark.parametrize("n_kv", [1, 2, 3, 6])
@pytest.mark.parametrize("layout_name", sorted(LAYOUTS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_and_explicit_grouped_rotary_attention_agree(n_kv, layout_name, dtype):
    masks, make_layout = LAYOUTS[layout_name]
    attn, x = grouped_attention(n_kv, masks, dtype, q_norm=n_kv == 2), randn(2, 7, 20, seed=9, dtype=dtype)
    layout = make_layout()
    fused = attn(x, layout)
    attn.use_fused_attention = False
    explicit = attn(x, layout)
    # the two paths sum in different orders (einsum projections against the placed product): float rounding, relative
    torch.testing.assert_close(fused, explicit, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


def test_grouped_attention_equals_the_same_heads_written_out():
    """Each key/value head shared by its group is exactly a multi-head attention whose heads repeat it."""
    grouped = grouped_attention(2, (CausalMask(), PaddingMask()), torch.float64)
    plain = Attention(AttnShape(), (CausalMask(), PaddingMask()), rotary=Rotary(8, base=50.0)).double()
    with torch.no_grad():
        for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
            getattr(plain, name).copy_(getattr(grouped, name))  # W_K etc. per query head
    x = randn(2, 7, 20, seed=10)
    torch.testing.assert_close(grouped(x), plain(x), atol=1e-12, rtol=0)
    assert torch.equal(grouped.W_K[2], grouped.stored("W_K")[0]) and torch.equal(
        grouped.W_K[3], grouped.stored("W_K")[1]
    )


def test_keys_enter_the_cache_rotated_at_their_positions():
    attn = grouped_attention(3, (CausalMask(), PaddingMask()), torch.float64)
    x = randn(1, 6, 20, seed=11)
    whole = attn(x)
    cache = LayerKVCache()
    steps = torch.cat(
        [attn(x[:, :2], kv_cache=cache)] + [attn(x[:, p : p + 1], kv_cache=cache) for p in range(2, 6)], dim=1
    )
    torch.testing.assert_close(steps, whole, atol=1e-12, rtol=0)
    assert cache.keys.shape == (1, 6, 3, 8)


def test_attention_refuses_what_it_cannot_compute():
    with pytest.raises(ValueError, match="n_key_value_heads must be a positive int dividing n_heads=6, got 4"):
        Attention(AttnShape(), n_key_value_heads=4)
    with pytest.raises(ValueError, match="q_norm and k_norm come together"):
        Attention(AttnShape(), q_norm=RMSNorm(8, 1e-6))
    attn = grouped_attention(2, (CausalMask(),), torch.float32)
    with pytest.raises(ValueError, match="cross-attention"):
        attn(torch.zeros(1, 3, 20), kv_input=torch.zeros(1, 4, 20))
    with pytest.raises(KeyError, match="stored\\(\\) holds the key/value weights"):
        attn.stored("W_Q")


# --- the gated MLP ------------------------------------------------------------------------------
def test_gated_mlp_is_the_swiglu_formula():
    cfg = LlamaConfig(d_model=12, n_layers=1, n_heads=2, n_key_value_heads=1, d_head=6, d_mlp=20, d_vocab=5, n_ctx=8)
    mlp = GatedMLP(cfg).double()
    with torch.no_grad():
        for seed, param in enumerate(mlp.parameters()):
            param.copy_(randn(*param.shape, seed=seed))
    x, seen = randn(2, 3, 12, seed=20), {}
    handles = [
        getattr(mlp, name).register_forward_hook(lambda m, a, out, name=name: seen.__setitem__(name, out))
        for name in ("hook_pre", "hook_pre_linear", "hook_post")
    ]
    out = mlp(x)
    for handle in handles:
        handle.remove()
    gate, up = x @ mlp.W_gate, x @ mlp.W_in + mlp.b_in
    torch.testing.assert_close(seen["hook_pre"], gate)
    torch.testing.assert_close(seen["hook_pre_linear"], up)
    torch.testing.assert_close(seen["hook_post"], F.silu(gate) * up)
    torch.testing.assert_close(out, (F.silu(gate) * up) @ mlp.W_out + mlp.b_out)
    assert [b is None for _, b in mlp.input_weights()] == [True, False]


@dataclass(frozen=True)
class LayerNormGatedConfig:
    """A toy: LayerNorm (with a bias) read by a gated MLP, to show fold_ln refusing what it cannot fold."""

    d_model: int = 16
    n_layers: int = 1
    n_heads: int = 2
    d_head: int = 8
    d_mlp: int = 24
    d_vocab: int = 11
    n_ctx: int = 8
    act_fn: str = "silu"
    init_range: float = 0.2


def _toy_build(cfg):
    block = PreNormBlock(LayerNorm(16, 1e-5), Attention(cfg), LayerNorm(16, 1e-5), GatedMLP(cfg))
    return DecoderParts(Embed(cfg), None, [block], LayerNorm(16, 1e-5), Unembed(cfg))


def test_fold_ln_refuses_a_norm_bias_with_nowhere_to_go():
    toy = register(
        Architecture(
            "toy-layer-norm-gated",
            LayerNormGatedConfig,
            _toy_build,
            lambda cfg: Capabilities(True, "pre", "ln_final", "unembed", True),
            HOOK_NAMES,
        )
    )
    try:
        model = DemoTransformer(LayerNormGatedConfig(), seed=0, dtype=torch.float64)
        tokens = torch.tensor([[1, 2, 3, 4]])
        with torch.no_grad():
            model.blocks[0].ln2.b.fill_(0.3)
        weights = {name: p.clone() for name, p in model.state_dict().items()}
        with pytest.raises(
            ValueError, match="GatedMLP has weights without a bias .* reading a LayerNorm whose bias is not zero"
        ):
            processing.fold_ln(model)
        assert model.processing == [] and all(torch.equal(p, weights[name]) for name, p in model.state_dict().items())
        with torch.no_grad():
            model.blocks[0].ln2.b.zero_()
            before = model(tokens)
        processing.fold_ln(model)  # a zero bias folds: LayerNorm's centring is exact into the gate too
        torch.testing.assert_close(model(tokens), before, atol=1e-10, rtol=0)
    finally:
        unregister(toy)


# --- configs: ours refused with reasons, Hugging Face's variants we do not compute refused by name --------
@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(n_heads=6, n_key_value_heads=4), "n_heads=6 must be a multiple of n_key_value_heads=4"),
        (dict(d_head=7), "d_head=7 must be even: rotary positions rotate pairs"),
        (dict(n_key_value_heads=0), "n_key_value_heads must be a positive int, got 0"),
        (dict(sliding_window=0), "sliding_window must be a positive int, got 0"),
        (dict(attn_biases=("q", "x")), r"attn_biases must be a tuple of distinct names from \('q', 'k', 'v', 'o'\)"),
        (dict(act_fn="swish"), "act_fn must be one of"),
        (dict(rotary_base=1.0), "rotary_base must be a finite number > 1, got 1.0"),
        (dict(init_range=float("nan")), "init_range must be a finite number > 0, got nan"),
        (dict(rms_norm_eps=0.0), "rms_norm_eps must be a finite number > 0, got 0.0"),
    ],
)
def test_bad_configs_are_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        LlamaConfig(**changes)
    with pytest.raises(TypeError, match="rope_scaling must be a RopeScaling or None, got dict"):
        LlamaConfig(rope_scaling={"rope_type": "llama3"})


HF_SHAPE = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=20,
)


@pytest.mark.parametrize(
    "hf_config, message",
    [
        (HFLlamaConfig(**HF_SHAPE, mlp_bias=True), "llama config has mlp_bias=True"),
        (
            HFLlamaConfig(**HF_SHAPE, rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}),
            r"llama config has rope_type='dynamic'; supported: \['default', 'linear', 'llama3'\]",
        ),
        (
            HFLlamaConfig(
                **HF_SHAPE, rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}
            ),
            "partial_rotary_factor=0.5",
        ),
        (HFLlamaConfig(**HF_SHAPE, hidden_act="gelu_fast"), "llama hidden_act='gelu_fast' is not supported"),
        (
            Qwen2Config(**HF_SHAPE, use_sliding_window=True, sliding_window=4, max_window_layers=1),
            "qwen2 config mixes full_attention and sliding_attention layers",
        ),
        (GPTNeoXConfig(), "config_from_hf reads the model types"),
        (HFLlamaConfig(**{**HF_SHAPE, "vocab_size": 0}), "llama config field vocab_size must be a positive int, got 0"),
    ],
)
def test_hugging_face_variants_we_do_not_compute_are_refused(hf_config, message):
    with pytest.raises(ValueError, match=message):
        config_from_hf(hf_config)


def test_every_sliding_layer_gives_the_window():
    qwen2 = Qwen2Config(**HF_SHAPE, use_sliding_window=True, sliding_window=4, max_window_layers=0)
    assert config_from_hf(qwen2).sliding_window == 4
    assert config_from_hf(Qwen2Config(**HF_SHAPE)).sliding_window is None
    assert config_from_hf(MistralConfig(**HF_SHAPE, sliding_window=5)).sliding_window == 5


def test_checkpoints_that_do_not_fit_are_refused_before_reading():
    hf_model = tiny_hf_model("llama-mha-biases")
    cfg, state_dict = config_from_hf(hf_model.config), dict(hf_model.state_dict())
    with pytest.raises(CheckpointError, match="the config says num_hidden_layers=3, the checkpoint holds layers 0..1"):
        convert_state_dict(state_dict, cfg.replace(n_layers=3))
    untied = {name: t for name, t in state_dict.items() if name != "lm_head.weight"}
    with pytest.raises(CheckpointError, match="missing 1 tensor\\(s\\): lm_head.weight"):
        convert_state_dict(untied, cfg)  # untied: the read-out must be there
    without_biases = {
        name: t for name, t in state_dict.items() if not name.endswith(("k_proj.bias", "v_proj.bias", "o_proj.bias"))
    }
    with pytest.raises(CheckpointError, match="missing 6 tensor\\(s\\): .*layers.0.self_attn.k_proj.bias"):
        convert_state_dict(without_biases, cfg)  # its config says every projection has a bias
    with pytest.raises(CheckpointError, match="mis-shaped 1 tensor\\(s\\): layers.1.self_attn.q_norm.weight"):
        qwen3 = tiny_hf_model("qwen3-gqa3-qk-norm")
        broken = dict(qwen3.state_dict())
        broken["model.layers.1.self_attn.q_norm.weight"] = torch.ones(15)
        convert_state_dict(broken, config_from_hf(qwen3.config))
