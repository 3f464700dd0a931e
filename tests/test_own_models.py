"""Decoders written from scratch, loaded into a DemoTransformer and verified against themselves (docs/own_models.md).

Three worked examples, each in plain PyTorch (``own_model_references``, and
``test_toy_architecture.TorchPostNormDecoder``): nanoGPT's GPT-2 (with and without biases),
a post-norm decoder of ``nn.TransformerEncoderLayer``s with a causal mask, and an
Annotated-Transformer-style decoder. Each follows the recipe: describe the architecture with
our parts (a registered config where one fits, else a new architecture), map the state-dict
keys, load strictly, and compare hook by hook with ``verify_against_module`` within 1e-5, on
weights perturbed away from their init (zero biases and unit norms would hide a tanh GELU in
place of the erf one, or torch's LayerNorm in place of the unbiased-std one). Each example
also shows that the comparison fails when one part is described wrong.
"""

from dataclasses import dataclass

import einops
import pytest
import torch

from interp_transformer import Capabilities, DemoTransformer, TransformerConfig
from interp_transformer.core.strict import CheckpointError, load_strict
from interp_transformer.families import Architecture, DecoderParts, register, unregister
from interp_transformer.families.opt.recipe import OPTPostNormConfig
from interp_transformer.hooks.names import DECODER_HOOK_NAMES
from interp_transformer.parts import (
    MLP,
    Attention,
    LayerNorm,
    PreNormBlock,
    ScaledEmbed,
    SinusoidalPosEmbed,
    UnbiasedLayerNorm,
    Unembed,
)
from interp_transformer.verify import verify_against_module

from .gpt2_helpers import one_thread  # noqa: F401 (autouse fixture)
from .own_model_references import AnnotatedConfig, AnnotatedLM, NanoGPT, NanoGPTConfig, perturb_
from .test_toy_architecture import PostNormDecoderConfig, TorchPostNormDecoder, slow_path_attention  # noqa: F401

TOKENS = torch.tensor([[1, 7, 3, 9, 7, 3, 9, 2, 11, 4], [5, 4, 5, 4, 5, 4, 5, 4, 30, 31]])
ATOL = 1e-5


def to_heads(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """An ``nn.Linear`` weight ``[(head_index d_head), d_model]`` as ``[head_index, d_model, d_head]``."""
    return einops.rearrange(weight, "(head_index d_head) d_model -> head_index d_model d_head", head_index=n_heads)


def from_heads(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """An ``nn.Linear`` weight ``[d_model, (head_index d_head)]`` as ``W_O [head_index, d_head, d_model]``."""
    return einops.rearrange(weight, "d_model (head_index d_head) -> head_index d_head d_model", head_index=n_heads)


def bias_heads(bias: torch.Tensor, n_heads: int) -> torch.Tensor:
    return einops.rearrange(bias, "(head_index d_head) -> head_index d_head", head_index=n_heads)


def loaded(cfg, ours: dict) -> DemoTransformer:
    """A DemoTransformer of ``cfg`` holding exactly ``ours`` (missing, unexpected or mis-shaped keys are refused)."""
    return load_strict(DemoTransformer(cfg), ours)


# --- nanoGPT: the GPT-2 architecture, with the exact GELU ----------------------------------------------------------
def nanogpt_config(config: NanoGPTConfig, act_fn: str = "gelu") -> TransformerConfig:
    return TransformerConfig(
        d_model=config.n_embd,
        n_layers=config.n_layer,
        n_heads=config.n_head,
        d_head=config.n_embd // config.n_head,
        d_mlp=4 * config.n_embd,
        d_vocab=config.vocab_size,
        n_ctx=config.block_size,
        act_fn=act_fn,
    )


def from_nanogpt(theirs: dict, cfg: TransformerConfig) -> dict:
    """nanoGPT's state dict under our names (nanoGPT's linears are ``[d_out, d_in]``; biases may be absent)."""
    zeros = lambda n: torch.zeros(n)  # noqa: E731
    get_bias = lambda name, n: theirs.get(name, zeros(n))  # noqa: E731
    ours = {"embed.W_E": theirs["transformer.wte.weight"], "pos_embed.W_pos": theirs["transformer.wpe.weight"]}
    for layer in range(cfg.n_layers):
        p, q = f"transformer.h.{layer}.", f"blocks.{layer}."
        for norm, their_norm in (("ln1", "ln_1"), ("ln2", "ln_2")):
            ours[q + f"{norm}.w"] = theirs[p + f"{their_norm}.weight"]
            ours[q + f"{norm}.b"] = get_bias(p + f"{their_norm}.bias", cfg.d_model)
        W_q, W_k, W_v = theirs[p + "attn.c_attn.weight"].split(cfg.d_model, dim=0)
        b_q, b_k, b_v = get_bias(p + "attn.c_attn.bias", 3 * cfg.d_model).split(cfg.d_model)
        for letter, W, b in (("Q", W_q, b_q), ("K", W_k, b_k), ("V", W_v, b_v)):
            ours[q + f"attn.W_{letter}"], ours[q + f"attn.b_{letter}"] = (
                to_heads(W, cfg.n_heads),
                bias_heads(b, cfg.n_heads),
            )
        ours[q + "attn.W_O"] = from_heads(theirs[p + "attn.c_proj.weight"], cfg.n_heads)
        ours[q + "attn.b_O"] = get_bias(p + "attn.c_proj.bias", cfg.d_model)
        ours[q + "mlp.W_in"], ours[q + "mlp.b_in"] = (
            theirs[p + "mlp.c_fc.weight"].T,
            get_bias(p + "mlp.c_fc.bias", cfg.d_mlp),
        )
        ours[q + "mlp.W_out"] = theirs[p + "mlp.c_proj.weight"].T
        ours[q + "mlp.b_out"] = get_bias(p + "mlp.c_proj.bias", cfg.d_model)
    ours["ln_final.w"] = theirs["transformer.ln_f.weight"]
    ours["ln_final.b"] = get_bias("transformer.ln_f.bias", cfg.d_model)
    ours["unembed.W_U"], ours["unembed.b_U"] = theirs["lm_head.weight"].T, zeros(cfg.d_vocab)
    return ours


def nanogpt_hook_map(n_layers: int) -> dict:
    hook_map = {
        "hook_embed": "transformer.wte",
        "hook_pos_embed": "transformer.wpe",
        "ln_final.hook_normalized": "transformer.ln_f",
    }
    for layer in range(n_layers):
        p, q = f"transformer.h.{layer}", f"blocks.{layer}."
        hook_map.update(
            {
                q + "hook_resid_pre": p + ":input",
                q + "ln1.hook_normalized": p + ".ln_1",
                q + "hook_attn_out": p + ".attn",
                q + "ln2.hook_normalized": p + ".ln_2",
                q + "mlp.hook_pre": p + ".mlp.c_fc",
                q + "mlp.hook_post": p + ".mlp.c_proj:input",
                q + "hook_mlp_out": p + ".mlp",
                q + "hook_resid_post": p,
            }
        )
    return hook_map


@pytest.mark.parametrize("bias", [True, False], ids=["biases", "no-biases"])
def test_nanogpt(bias):
    config = NanoGPTConfig(bias=bias)
    theirs = perturb_(NanoGPT(config), seed=1).eval()
    cfg = nanogpt_config(config)
    model = loaded(cfg, from_nanogpt(theirs.state_dict(), cfg))
    hook_map = nanogpt_hook_map(cfg.n_layers)
    report = verify_against_module(model, theirs, TOKENS, hook_map, atol=ATOL, rtol=0, float64_recheck=False)
    assert report.within_tolerance and report.logits_max_diff <= ATOL, str(report)
    assert {row.hook for row in report.rows} == set(hook_map) | {"logits"}
    assert torch.equal(
        model.generate(TOKENS[:1, :4], max_new_tokens=6, temperature=0), _greedy(theirs, TOKENS[:1, :4], 6)
    )
    tanh_gelu = loaded(nanogpt_config(config, act_fn="gelu_new"), from_nanogpt(theirs.state_dict(), cfg))
    wrong = verify_against_module(tanh_gelu, theirs, TOKENS, hook_map, atol=ATOL, rtol=0, float64_recheck=False)
    assert wrong.first_divergence == "blocks.0.mlp.hook_post"  # GPT-2's tanh GELU is not nanoGPT's nn.GELU


def _greedy(module, tokens: torch.Tensor, n: int) -> torch.Tensor:
    with torch.no_grad():
        for _ in range(n):
            tokens = torch.cat([tokens, module(tokens)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return tokens


def test_a_mapping_that_misses_a_key_is_refused():
    config = NanoGPTConfig()
    cfg = nanogpt_config(config)
    ours = from_nanogpt(NanoGPT(config).state_dict(), cfg)
    del ours["blocks.1.mlp.b_out"]
    ours["blocks.1.mlp.b_output"] = torch.zeros(cfg.d_model)
    with pytest.raises(
        CheckpointError,
        match=r"missing 1 tensor\(s\): blocks.1.mlp.b_out; unexpected 1 tensor\(s\): "
        r"blocks.1.mlp.b_output",
    ):
        loaded(cfg, ours)


# --- a post-norm decoder of nn.TransformerEncoderLayer: OPT-350m's block order, a registered architecture ------------
def from_torch_post_norm(theirs: dict, cfg: OPTPostNormConfig) -> dict:
    """``nn.TransformerEncoderLayer`` stacks: ``in_proj_weight`` is ``[(qkv head_index d_head), d_model]``."""
    ours = {
        "embed.W_E": theirs["embed.weight"],
        "pos_embed.W_pos": theirs["pos.weight"],
        "unembed.W_U": theirs["unembed.weight"].T,
        "unembed.b_U": theirs["unembed.bias"],
    }
    for layer in range(cfg.n_layers):
        p, q = f"layers.{layer}.", f"blocks.{layer}."
        W = einops.rearrange(
            theirs[p + "self_attn.in_proj_weight"],
            "(qkv head_index d_head) d_model -> qkv head_index d_model d_head",
            qkv=3,
            head_index=cfg.n_heads,
        )
        b = einops.rearrange(
            theirs[p + "self_attn.in_proj_bias"],
            "(qkv head_index d_head) -> qkv head_index d_head",
            qkv=3,
            head_index=cfg.n_heads,
        )
        for index, letter in enumerate("QKV"):
            ours[q + f"attn.W_{letter}"], ours[q + f"attn.b_{letter}"] = W[index], b[index]
        ours[q + "attn.W_O"] = from_heads(theirs[p + "self_attn.out_proj.weight"], cfg.n_heads)
        ours[q + "attn.b_O"] = theirs[p + "self_attn.out_proj.bias"]
        ours[q + "mlp.W_in"], ours[q + "mlp.b_in"] = theirs[p + "linear1.weight"].T, theirs[p + "linear1.bias"]
        ours[q + "mlp.W_out"], ours[q + "mlp.b_out"] = theirs[p + "linear2.weight"].T, theirs[p + "linear2.bias"]
        for norm, their_norm in (("ln1", "norm1"), ("ln2", "norm2")):
            ours[q + f"{norm}.w"], ours[q + f"{norm}.b"] = (
                theirs[p + f"{their_norm}.weight"],
                theirs[p + f"{their_norm}.bias"],
            )
    return ours


def test_post_norm_transformer_encoder_layers(slow_path_attention):  # noqa: F811
    shape = PostNormDecoderConfig()
    theirs = perturb_(TorchPostNormDecoder(shape), seed=2).eval()
    cfg = OPTPostNormConfig(
        d_model=shape.d_model,
        n_layers=shape.n_layers,
        n_heads=shape.n_heads,
        d_head=shape.d_head,
        d_mlp=shape.d_mlp,
        d_vocab=shape.d_vocab,
        n_ctx=shape.n_ctx,
        act_fn="relu",
    )
    model = loaded(cfg, from_torch_post_norm(theirs.state_dict(), cfg))
    hook_map = {"hook_embed": "embed", "hook_pos_embed": "pos"}
    for layer in range(cfg.n_layers):
        p, q = f"layers.{layer}", f"blocks.{layer}."
        hook_map.update(
            {
                q + "hook_resid_pre": p + ":input",
                q + "hook_attn_out": p + ".self_attn",
                q + "ln1.hook_normalized": p + ".norm1",
                q + "mlp.hook_pre": p + ".linear1",
                q + "mlp.hook_post": p + ".linear2:input",
                q + "hook_mlp_out": p + ".linear2",
                q + "hook_resid_post": p + ".norm2:input",
                q + "hook_normalized_resid_post": p,
            }
        )
    tokens = TOKENS[:, : shape.n_ctx]
    report = verify_against_module(model, theirs, tokens, hook_map, atol=ATOL, rtol=0, float64_recheck=False)
    assert report.within_tolerance and report.logits_max_diff <= ATOL, str(report)
    assert not model.capabilities.additive_residual  # so the cache refuses its pre-norm tools (test_classic_tools)
    swapped = from_torch_post_norm(theirs.state_dict(), cfg)
    swapped["blocks.0.ln1.w"], swapped["blocks.0.ln2.w"] = swapped["blocks.0.ln2.w"], swapped["blocks.0.ln1.w"]
    wrong = verify_against_module(
        loaded(cfg, swapped), theirs, tokens, hook_map, atol=ATOL, rtol=0, float64_recheck=False
    )
    assert wrong.first_divergence == "blocks.0.ln1.hook_normalized"


# --- an Annotated-Transformer-style decoder: a new architecture from our parts --------------------------------------
@dataclass(frozen=True)
class AnnotatedDecoderConfig:
    d_model: int = 32
    n_layers: int = 2
    n_heads: int = 4
    d_head: int = 8
    d_mlp: int = 64
    d_vocab: int = 50
    n_ctx: int = 16
    act_fn: str = "relu"
    layer_norm_eps: float = 1e-6
    init_range: float = 0.02
    torch_layer_norm: bool = False  # True: describe the norms wrongly, as torch's LayerNorm (the failing case)


def build_annotated(cfg: AnnotatedDecoderConfig) -> DecoderParts:
    def norm():
        return (
            LayerNorm(cfg.d_model, cfg.layer_norm_eps)
            if cfg.torch_layer_norm
            else UnbiasedLayerNorm(cfg.d_model, cfg.layer_norm_eps)
        )

    return DecoderParts(
        embed=ScaledEmbed(cfg),  # lut(x) * sqrt(d_model)
        pos_embed=SinusoidalPosEmbed(cfg, interleaved=True),  # pe[:, 0::2] = sin, pe[:, 1::2] = cos
        # x + f(norm(x))
        blocks=[PreNormBlock(norm(), Attention(cfg), norm(), MLP(cfg)) for _ in range(cfg.n_layers)],
        ln_final=norm(),
        unembed=Unembed(cfg),  # the generator's proj; its log_softmax is not a part of the model
    )


ANNOTATED = Architecture(
    name="annotated-decoder",
    config_class=AnnotatedDecoderConfig,
    build=build_annotated,
    capabilities=lambda cfg: Capabilities(
        causal=True, norm_placement="pre", final_norm="ln_final", read_out="unembed", next_token_logits=True
    ),
    hook_names=DECODER_HOOK_NAMES,
)


@pytest.fixture
def annotated_architecture():
    register(ANNOTATED)
    yield ANNOTATED
    unregister(ANNOTATED)


def from_annotated(theirs: dict, cfg: AnnotatedDecoderConfig) -> dict:
    """The Annotated-style state dict under our names; its positional table is a buffer we compute, so it is left
    out."""
    ours = {
        "embed.W_E": theirs["embed.0.lut.weight"],
        "ln_final.w": theirs["norm.a_2"],
        "ln_final.b": theirs["norm.b_2"],
        "unembed.W_U": theirs["generator.proj.weight"].T,
        "unembed.b_U": theirs["generator.proj.bias"],
    }
    for layer in range(cfg.n_layers):
        p, q = f"layers.{layer}.", f"blocks.{layer}."
        for index, letter in enumerate("QKV"):
            ours[q + f"attn.W_{letter}"] = to_heads(theirs[p + f"self_attn.linears.{index}.weight"], cfg.n_heads)
            ours[q + f"attn.b_{letter}"] = bias_heads(theirs[p + f"self_attn.linears.{index}.bias"], cfg.n_heads)
        ours[q + "attn.W_O"] = from_heads(theirs[p + "self_attn.linears.3.weight"], cfg.n_heads)
        ours[q + "attn.b_O"] = theirs[p + "self_attn.linears.3.bias"]
        for index, norm in enumerate(("ln1", "ln2")):
            ours[q + f"{norm}.w"], ours[q + f"{norm}.b"] = (
                theirs[p + f"sublayer.{index}.norm.a_2"],
                theirs[p + f"sublayer.{index}.norm.b_2"],
            )
        ours[q + "mlp.W_in"], ours[q + "mlp.b_in"] = (
            theirs[p + "feed_forward.w_1.weight"].T,
            theirs[p + "feed_forward.w_1.bias"],
        )
        ours[q + "mlp.W_out"], ours[q + "mlp.b_out"] = (
            theirs[p + "feed_forward.w_2.weight"].T,
            theirs[p + "feed_forward.w_2.bias"],
        )
    return ours


def annotated_hook_map(n_layers: int) -> dict:
    hook_map = {"hook_embed": "embed.0", "ln_final.hook_normalized": "norm"}
    for layer in range(n_layers):
        p, q = f"layers.{layer}", f"blocks.{layer}."
        hook_map.update(
            {
                q + "hook_resid_pre": p + ":input",
                q + "ln1.hook_normalized": p + ".sublayer.0.norm",
                q + "hook_attn_out": p + ".self_attn",
                q + "ln2.hook_normalized": p + ".sublayer.1.norm",
                q + "mlp.hook_pre": p + ".feed_forward.w_1",
                q + "mlp.hook_post": p + ".feed_forward.w_2:input",
                q + "hook_mlp_out": p + ".feed_forward",
                q + "hook_resid_post": p,
            }
        )
    return hook_map


def test_annotated_transformer_style_decoder(annotated_architecture):
    theirs = perturb_(AnnotatedLM(AnnotatedConfig()), seed=3).eval()
    cfg = AnnotatedDecoderConfig()
    model = loaded(cfg, from_annotated(theirs.state_dict(), cfg))
    hook_map = annotated_hook_map(cfg.n_layers)
    # their forward ends in the generator's log_softmax: compare every hook, then the log-probabilities
    report = verify_against_module(
        model, theirs, TOKENS, hook_map, logits=False, atol=ATOL, rtol=0, float64_recheck=False
    )
    assert report.within_tolerance, str(report)
    assert {row.hook for row in report.rows} == set(hook_map)
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS).log_softmax(-1), theirs(TOKENS), atol=ATOL, rtol=0)
    _, cache = model.run_with_cache(TOKENS)  # the residual tools hold: a pre-norm decoder
    torch.testing.assert_close(cache.decompose_resid().sum(0), cache["resid_post", -1], atol=1e-5, rtol=0)
    torch_norms = loaded(AnnotatedDecoderConfig(torch_layer_norm=True), from_annotated(theirs.state_dict(), cfg))
    wrong = verify_against_module(
        torch_norms, theirs, TOKENS, hook_map, logits=False, atol=ATOL, rtol=0, float64_recheck=False
    )
    assert wrong.first_divergence == "blocks.0.ln1.hook_normalized"  # torch's LayerNorm is not theirs
