"""A part given an input of the wrong width, or a cache of the wrong shape, says so at its entry.

Each case gives one part one wrong argument; the error (``ShapeError``: a ``TypeCheckError`` and a
``ValueError``) names the argument, the axis and both sizes, with shape checks on and off, and it is
raised before any of the part's hooks fires. ``core.shape_checks`` holds the check: each part names where
its sizes are (``axis_sizes``), the cache the axes of the keys it holds (``ENTRY_AXES``).
"""

from types import SimpleNamespace

import pytest
import torch
from jaxtyping import Float, TypeCheckError
from torch import Tensor

from interp_transformer import shape_checking
from interp_transformer.builder import build_decoder, build_encoder, build_encoder_decoder
from interp_transformer.core.kv_cache import KeyValueCache, LayerKVCache
from interp_transformer.core.shape_checks import ShapeError, shape_checked
from interp_transformer.models.encoder_decoder.kv_cache import EncoderDecoderKVCache
from interp_transformer.parts.adapter import GatedAdapter
from interp_transformer.parts.all_heads_norm import AllHeadsRMSNorm
from interp_transformer.parts.clamped_swiglu import ClampedSwiGLU
from interp_transformer.parts.cross_attention import CrossAttentionSource, DecoderLayerKVCache
from interp_transformer.parts.gemma_norm import GemmaRMSNorm
from interp_transformer.parts.layout import TokenLayout

D, HEADS, D_HEAD, N_CTX = 16, 4, 4, 12  # every model's sizes; a wrong width is D + 1 = 17
SIZES = dict(d_model=D, n_layers=1, n_heads=HEADS, d_mlp=32, d_vocab=50, n_ctx=N_CTX)


@pytest.fixture(scope="module")
def models() -> dict:
    stack = {key: value for key, value in SIZES.items() if key != "n_layers"}
    return {
        "gpt2": build_decoder(**SIZES, seed=0),
        "llama": build_decoder(**SIZES, norm="rms", positions="rotary", gated_mlp=True, n_key_value_heads=2, seed=0),
        "moe": build_decoder(**SIZES, experts=dict(n_experts=4, top_k=2), seed=0),
        "parallel": build_decoder(**SIZES, parallel_residual=True, seed=0),
        "pre_post": build_decoder(**SIZES, norm="rms", post_norms=True, seed=0),
        "post": build_decoder(**SIZES, placement="post", seed=0),
        "output": build_decoder(**SIZES, norm="rms", placement="output", seed=0),
        "attn_only": build_decoder(**{**SIZES, "d_mlp": None}, seed=0),
        "other_heads": build_decoder(**{**SIZES, "n_heads": 2}, seed=0),
        "encoder": build_encoder(**SIZES, pooler=True, seed=0),
        "t5_like": build_encoder_decoder(**stack, n_layers=1, n_decoder_layers=1, placement="pre", seed=0),
        "bart_like": build_encoder_decoder(**stack, n_layers=1, n_decoder_layers=1, seed=0),
        "bart_other_heads": build_encoder_decoder(**{**stack, "n_heads": 2}, n_layers=1, n_decoder_layers=1, seed=0),
    }


def wide(*shape: int) -> Tensor:
    return torch.randn(*shape)


def filled_cache(batch: int = 2, heads: int = HEADS, d_head: int = D_HEAD, pos: int = 3) -> LayerKVCache:
    cache = LayerKVCache()
    cache.append(torch.randn(batch, pos, heads, d_head), torch.randn(batch, pos, heads, d_head))
    return cache


def layout(batch: int = 2, pos: int = 1) -> TokenLayout:
    return TokenLayout.contiguous(batch, pos, 0, torch.device("cpu"))


def source(batch: int = 2, width: int = D) -> CrossAttentionSource:
    return CrossAttentionSource(torch.randn(batch, 5, width))


def model_cache_of_another_batch(model):
    cache = KeyValueCache(1)
    model(torch.randint(0, 50, (3, 3)), kv_cache=cache)
    return lambda: model(torch.randint(0, 50, (2, 1)), kv_cache=cache)


def translation_cache_of_another_model(model, other):
    cache, source_ids = EncoderDecoderKVCache(1), torch.randint(3, 50, (2, 5))
    other.decode(torch.randint(3, 50, (2, 2)), other.encode(source_ids), kv_cache=cache)
    encoded = model.encode(source_ids)
    return lambda: model.decode(torch.randint(3, 50, (2, 1)), encoded, kv_cache=cache)


# label: (models -> the failing call, the argument, the axis, its size, the size the part holds)
CASES = {
    "layer_norm": (lambda m: lambda: m["gpt2"].blocks[0].ln1(wide(2, 5, 17)), "x", "d_model", 17, D),
    "rms_norm": (lambda m: lambda: m["llama"].blocks[0].ln1(wide(2, 5, 17)), "x", "d_model", 17, D),
    "final_norm": (lambda m: lambda: m["gpt2"].ln_final(wide(2, 5, 17)), "x", "d_model", 17, D),
    "gemma_norm": (lambda m: lambda: GemmaRMSNorm(D, 1e-6)(wide(2, 5, 17)), "x", "d_model", 17, D),
    "all_heads_norm": (
        lambda m: lambda: AllHeadsRMSNorm(HEADS, D_HEAD, 1e-6)(wide(2, 5, 3, D_HEAD)),
        "x",
        "head_index",
        3,
        HEADS,
    ),
    "unembed": (lambda m: lambda: m["gpt2"].unembed(wide(2, 5, 17)), "normalized", "d_model", 17, D),
    "mlp": (lambda m: lambda: m["gpt2"].blocks[0].mlp(wide(2, 5, 17)), "normalized", "d_model", 17, D),
    "gated_mlp": (lambda m: lambda: m["llama"].blocks[0].mlp(wide(2, 5, 17)), "normalized", "d_model", 17, D),
    "moe": (lambda m: lambda: m["moe"].blocks[0].mlp(wide(2, 5, 17)), "normalized", "d_model", 17, D),
    "one_expert": (lambda m: lambda: m["moe"].blocks[0].mlp.experts[0](wide(2, 5, 17)), "normalized", "d_model", 17, D),
    "clamped_swiglu": (
        lambda m: (
            lambda: ClampedSwiGLU(SimpleNamespace(d_model=D, d_mlp=8, swiglu_alpha=1.7, swiglu_limit=7.0))(
                wide(2, 5, 17)
            )
        ),
        "normalized",
        "d_model",
        17,
        D,
    ),
    "adapter": (lambda m: lambda: GatedAdapter(D, 8, "gelu")(wide(2, 5, 17)), "normalized", "d_model", 17, D),
    "mlm_head": (lambda m: lambda: m["encoder"].mlm_head(wide(2, 5, 17)), "resid", "d_model", 17, D),
    "pooler": (lambda m: lambda: m["encoder"].pooler(wide(2, 5, 17)), "resid", "d_model", 17, D),
    "pos_embed_past_n_ctx": (
        lambda m: lambda: m["gpt2"].pos_embed(torch.zeros(2, 3, dtype=torch.long), offset=11),
        "tokens",
        "pos",
        3,
        N_CTX,
    ),
    "pos_embed_longer_than_n_ctx": (
        lambda m: lambda: m["gpt2"].pos_embed(torch.zeros(2, 13, dtype=torch.long)),
        "tokens",
        "pos",
        13,
        N_CTX,
    ),
    "attention": (lambda m: lambda: m["gpt2"].blocks[0].attn(wide(2, 12, 17)), "normalized", "d_model", 17, D),
    "grouped_attention": (lambda m: lambda: m["llama"].blocks[0].attn(wide(2, 12, 17)), "normalized", "d_model", 17, D),
    "attention_cache_heads": (
        lambda m: lambda: m["gpt2"].blocks[0].attn(wide(2, 1, D), kv_cache=filled_cache(heads=2, d_head=8)),
        "kv_cache",
        "n_key_value_heads",
        2,
        HEADS,
    ),
    "attention_cache_d_head": (
        lambda m: lambda: m["gpt2"].blocks[0].attn(wide(2, 1, D), kv_cache=filled_cache(d_head=5)),
        "kv_cache",
        "d_head",
        5,
        D_HEAD,
    ),
    "attention_cache_batch": (
        lambda m: lambda: m["gpt2"].blocks[0].attn(wide(2, 1, D), kv_cache=filled_cache(batch=3)),
        "kv_cache",
        "batch",
        3,
        2,
    ),
    "grouped_attention_cache_heads": (
        lambda m: lambda: m["llama"].blocks[0].attn(wide(2, 1, D), kv_cache=filled_cache(heads=HEADS)),
        "kv_cache",
        "n_key_value_heads",
        HEADS,
        2,
    ),
    "cross_attention_query": (
        lambda m: lambda: m["bart_like"].decoder.blocks[0].cross_attn(wide(2, 1, 17), kv_input=wide(2, 5, D)),
        "normalized",
        "d_model",
        17,
        D,
    ),
    "cross_attention_source_width": (
        lambda m: lambda: m["bart_like"].decoder.blocks[0].cross_attn(wide(2, 1, D), kv_input=wide(2, 5, 17)),
        "kv_input",
        "d_model",
        17,
        D,
    ),
    "cross_attention_source_batch": (
        lambda m: lambda: m["bart_like"].decoder.blocks[0].cross_attn(wide(2, 1, D), kv_input=wide(3, 5, D)),
        "kv_input",
        "batch",
        3,
        2,
    ),
    "cross_attention_cache_d_head": (
        lambda m: lambda: m["bart_like"].decoder.blocks[0].cross_attn(wide(2, 1, D), kv_cache=filled_cache(d_head=5)),
        "kv_cache",
        "d_head",
        5,
        D_HEAD,
    ),
    "cross_attention_cache_batch": (
        lambda m: lambda: m["t5_like"].decoder.blocks[0].cross_attn(wide(2, 1, D), kv_cache=filled_cache(batch=3)),
        "kv_cache",
        "batch",
        3,
        2,
    ),
    "transformer_block": (lambda m: lambda: m["gpt2"].blocks[0](wide(2, 5, 17)), "resid_pre", "d_model", 17, D),
    "attn_only_block": (lambda m: lambda: m["attn_only"].blocks[0](wide(2, 5, 17)), "resid_pre", "d_model", 17, D),
    "parallel_block": (lambda m: lambda: m["parallel"].blocks[0](wide(2, 5, 17)), "resid_pre", "d_model", 17, D),
    "pre_post_norm_block": (lambda m: lambda: m["pre_post"].blocks[0](wide(2, 5, 17)), "resid_pre", "d_model", 17, D),
    "post_norm_block": (lambda m: lambda: m["post"].blocks[0](wide(2, 5, 17)), "resid_pre", "d_model", 17, D),
    "output_norm_block": (lambda m: lambda: m["output"].blocks[0](wide(2, 5, 17)), "resid_pre", "d_model", 17, D),
    "encoder_block": (lambda m: lambda: m["encoder"].blocks[0](wide(2, 5, 17)), "resid_pre", "d_model", 17, D),
    "block_cache_batch": (
        lambda m: lambda: m["gpt2"].blocks[0](wide(2, 1, D), kv_cache=filled_cache(batch=3)),
        "kv_cache",
        "batch",
        3,
        2,
    ),
    "block_cache_heads": (
        lambda m: lambda: m["gpt2"].blocks[0](wide(2, 1, D), kv_cache=filled_cache(heads=2, d_head=8)),
        "kv_cache",
        "n_key_value_heads",
        2,
        HEADS,
    ),
    "cross_attention_block": (
        lambda m: lambda: m["t5_like"].decoder.blocks[0](wide(2, 1, 17), layout(), source=source()),
        "resid_pre",
        "d_model",
        17,
        D,
    ),
    "post_norm_cross_attention_block": (
        lambda m: lambda: m["bart_like"].decoder.blocks[0](wide(2, 1, 17), layout(), source=source()),
        "resid_pre",
        "d_model",
        17,
        D,
    ),
    "cross_attention_block_source": (
        lambda m: lambda: m["bart_like"].decoder.blocks[0](wide(2, 1, D), layout(), source=source(width=17)),
        "kv_input",
        "d_model",
        17,
        D,
    ),
    "decoder_layer_cache_batch": (
        lambda m: (
            lambda: m["t5_like"].decoder.blocks[0](
                wide(2, 1, D),
                layout(),
                source=source(),
                kv_cache=DecoderLayerKVCache(filled_cache(batch=3), LayerKVCache()),
            )
        ),
        "kv_cache",
        "batch",
        3,
        2,
    ),
    "model_cache_batch": (lambda m: model_cache_of_another_batch(m["gpt2"]), "kv_cache", "batch", 3, 2),
    "translation_cache_of_another_model": (
        lambda m: translation_cache_of_another_model(m["bart_like"], m["bart_other_heads"]),
        "kv_cache",
        "n_key_value_heads",
        2,
        HEADS,
    ),
}


@pytest.mark.parametrize("checks", [True, False], ids=["checks_on", "checks_off"])
@pytest.mark.parametrize("label", list(CASES))
def test_wrong_input_names_the_argument_the_axis_and_both_sizes(models, label, checks):
    make, argument, axis, got, held = CASES[label]
    call = make(models)
    with shape_checking(checks), pytest.raises(ShapeError) as raised:
        call()
    message = str(raised.value).splitlines()[0]
    assert f"'{argument}'" in message
    assert axis in message
    assert f"{axis} = {got}" in message
    assert str(held) in message.split(f"{axis} = {got}", 1)[1]  # the part's size, after the argument's


def test_the_error_is_a_shape_check_error_and_a_value_error(models):
    with pytest.raises(TypeCheckError), shape_checking(False):
        models["gpt2"].blocks[0].mlp(wide(2, 5, 17))
    with pytest.raises(ValueError):
        models["gpt2"].blocks[0].mlp(wide(2, 5, 17))


@pytest.mark.parametrize("checks", [True, False], ids=["checks_on", "checks_off"])
def test_the_check_runs_before_any_hook_fires(models, checks):
    model, fired = models["gpt2"], []
    every_hook = [(lambda name: True, lambda t, hook: fired.append(hook.name))]
    with shape_checking(checks), model.hooks(fwd_hooks=every_hook), pytest.raises(ShapeError, match="resid_pre"):
        model.blocks[0](wide(2, 5, 17))
    assert fired == []


@pytest.mark.parametrize("checks", [True, False], ids=["checks_on", "checks_off"])
def test_a_cache_of_the_wrong_kind_is_named(models, checks):
    with shape_checking(checks), pytest.raises(TypeError, match="'kv_cache' must be a .*DecoderLayerKVCache"):
        models["bart_like"].decoder.blocks[0](wide(2, 1, D), layout(), source=source(), kv_cache=(torch.zeros(1),))
    with shape_checking(checks), pytest.raises(TypeError, match="'kv_cache' must be a LayerKVCache"):
        models["gpt2"].blocks[0].attn(wide(2, 1, D), kv_cache=(torch.zeros(1),))


class TwoInputs(torch.nn.Module):
    """A module declaring no sizes: only the full check (checks on) compares its arguments."""

    @shape_checked
    def forward(
        self, a: Float[Tensor, "batch d_model"], b: Float[Tensor, "batch d_model"]
    ) -> Float[Tensor, "batch d_model"]:
        return a + b


def test_a_failed_full_check_names_the_argument_the_axis_and_both_sizes():
    with pytest.raises(ShapeError, match="Type-check error") as raised:
        TwoInputs()(torch.zeros(2, 5), torch.zeros(3, 5))
    first = str(raised.value).splitlines()[0]
    assert "'b'" in first and "batch = 3" in first and "'a' has batch = 2" in first
    with pytest.raises(ShapeError, match="'a' .* has 1 axes"):
        TwoInputs()(torch.zeros(5), torch.zeros(5))


def test_right_inputs_still_run_and_a_wrong_rank_passes_with_checks_off(models):
    """The entry check compares sizes only; a wrong rank stays the full check's, which checks off switch off."""
    block = models["gpt2"].blocks[0]
    assert block(wide(2, 5, D)).shape == (2, 5, D)
    with shape_checking(False):
        assert block.ln1(wide(5, D)).shape == (5, D)
