"""The gallery's sixteen classic designs: for each, a reference written from scratch, the one builder call that
describes it, where each of our parts finds its weights in the reference, and where each of our hooks' values lie.

``verify_design(design, **changes)`` loads a perturbed float64 reference into the model the builder
call gives (``changes`` describe it otherwise, to show a wrong description is caught) and compares
them hook by hook with ``verify_against_module``.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from interp_transformer.builder import build_decoder, build_encoder, build_encoder_decoder, load_from_modules
from interp_transformer.verify import verify_against_module

from . import gallery_references as ref
from .gallery_mappings import (
    annotated_reference,
    annotated_sources,
    arena_sources,
    bert_sources,
    nano_hooks,
    nano_sources,
    scratch_hooks,
    scratch_sources,
    seq2seq_sources,
    t5_hooks,
    t5_sources,
    torch_layer_hooks,
    torch_stack_sources,
)
from .own_model_references import NanoGPT, NanoGPTConfig, perturb_
from .test_toy_architecture import PostNormDecoderConfig, TorchPostNormDecoder

SHAPE = dict(d_model=16, n_layers=2, n_heads=4, d_mlp=32, d_vocab=23, n_ctx=12)
N_LAYERS, N_HEADS = 2, 4
TOKENS = torch.tensor([[1, 7, 3, 9, 7, 3, 9, 2, 11, 4], [5, 4, 5, 4, 5, 4, 5, 4, 20, 21]])
ENCODER_INPUTS = dict(
    attention_mask=torch.tensor([[1] * 10, [1] * 7 + [0] * 3]),
    token_type_ids=torch.tensor([[0] * 5 + [1] * 5, [0] * 4 + [1] * 3 + [0] * 3]),
)
SOURCE, TARGET = TOKENS[:, :8], torch.tensor([[2, 5, 9, 4, 1], [2, 8, 8, 3, 6]])
NANO = NanoGPTConfig(block_size=12, vocab_size=23, n_layer=2, n_head=4, n_embd=16)
ALIBI_FROM_ONE = tuple(2.0 ** (-8 * h / N_HEADS) for h in range(N_HEADS))  # 1, 1/4, 1/16, 1/64


@dataclass(frozen=True)
class Design:
    """One classic design: ``build(**fields)`` describes ``reference()``; ``sources(reference)`` maps its weights
    and ``hooks(layer)`` (plus ``top``) our hooks to its submodules."""

    name: str
    title: str
    build: Callable
    fields: dict
    reference: Callable[[], nn.Module]
    sources: Callable[[nn.Module], dict]
    hooks: Callable[[int], dict]
    top: dict = field(default_factory=dict)
    inputs: dict = field(default_factory=dict)  # our forward's other arguments
    reference_inputs: dict | None = None  # the reference's (None: the same as ours)
    tokens: torch.Tensor = TOKENS
    logits: bool = True  # the reference returns logits (else log-probabilities)


def hook_map(design: Design) -> dict:
    """Where each of our hooks' values lies in the reference: ``top``, then every layer's."""
    found = dict(design.top)
    for layer in range(N_LAYERS):
        found.update(design.hooks(layer))
    return found


def reference_of(design: Design, seed: int = 0) -> nn.Module:
    """The design's reference, float64, every parameter moved off its init."""
    return perturb_(design.reference().double(), seed).eval()


def model_of(design: Design, reference: nn.Module, **changes):
    model = design.build(**{**design.fields, **changes}, dtype=torch.float64, seed=0)
    return load_from_modules(model, design.sources(reference))


def verify_design(design: Design, atol: float = 1e-10, **changes):
    """The design's model (described with ``changes``) against its reference, hook by hook, in float64."""
    reference = reference_of(design)
    model = model_of(design, reference, **changes)
    fast_path = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)  # PyTorch's fused layers skip the submodules the map reads
    try:
        return verify_against_module(
            model,
            reference,
            design.tokens,
            hook_map(design),
            logits=design.logits,
            atol=atol,
            rtol=0,
            float64_recheck=False,
            reference_kwargs=design.inputs if design.reference_inputs is None else design.reference_inputs,
            **design.inputs,
        )
    finally:
        torch.backends.mha.set_fastpath_enabled(fast_path)


def scratch(layer, norm=lambda: nn.LayerNorm(16), positions=True, head_bias=True):
    """A ``ScratchDecoder`` factory: ``layer()`` and ``norm()`` build fresh parts for each reference."""
    return lambda: ref.ScratchDecoder(layer, norm(), positions=positions, head_bias=head_bias)


def layer_of(attention, mlp=ref.gelu_mlp, norm=lambda: nn.LayerNorm(16)):
    return lambda: ref.PreNormLayer(norm(), attention(), norm(), mlp())


NO_BIAS = dict(attn_bias=False, mlp_bias=False, readout_bias=False)
TOY = PostNormDecoderConfig(d_model=16, n_heads=4, d_head=4, d_mlp=32, d_vocab=23, n_ctx=12)
TORCH_TOP = {"hook_embed": "embed", "hook_pos_embed": "pos"}

GALLERY = [
    Design(
        "gpt2_pre",
        "GPT-2, pre-norm (nanoGPT)",
        build_decoder,
        dict(SHAPE, d_mlp=64, readout_bias=False),
        lambda: NanoGPT(NANO),
        nano_sources,
        nano_hooks,
        top={
            "hook_embed": "transformer.wte",
            "hook_pos_embed": "transformer.wpe",
            "ln_final.hook_normalized": "transformer.ln_f",
        },
    ),
    Design(
        "gpt2_post",
        "GPT-2's parts, post-norm blocks, no final norm",
        build_decoder,
        dict(SHAPE, d_mlp=64, placement="post", final_norm=False),
        lambda: ref.PostNormGPT(NANO),
        lambda theirs: nano_sources(theirs, post=True),
        lambda layer: nano_hooks(layer, post=True),
        top={"hook_embed": "wte", "hook_pos_embed": "wpe"},
    ),
    Design(
        "bert_mlm_pre",
        "BERT-style masked LM, pre-norm",
        build_decoder,
        dict(SHAPE, causal=False),
        ref.TorchEncoderLM,
        lambda t: torch_stack_sources(t, t.layers, t.norm),
        lambda layer: torch_layer_hooks(f"blocks.{layer}", f"layers.{layer}", post=False),
        top={**TORCH_TOP, "ln_final.hook_normalized": "norm"},
    ),
    Design(
        "bert_mlm_post",
        "BERT-style masked LM, post-norm",
        build_decoder,
        dict(SHAPE, causal=False, placement="post", final_norm=False),
        lambda: ref.TorchEncoderLM(norm_first=False),
        lambda t: torch_stack_sources(t, t.layers),
        lambda layer: torch_layer_hooks(f"blocks.{layer}", f"layers.{layer}", post=True),
        top=TORCH_TOP,
    ),
    Design(
        "annotated",
        "The Annotated Transformer's decoder",
        build_decoder,
        dict(
            SHAPE,
            norm="layer_unbiased",
            norm_eps=1e-6,
            embed_scale="sqrt_d_model",
            positions="sinusoidal_interleaved",
            activation="relu",
        ),
        annotated_reference,
        annotated_sources,
        lambda layer: {
            f"blocks.{layer}.hook_resid_pre": f"layers.{layer}:input",
            f"blocks.{layer}.ln1.hook_normalized": f"layers.{layer}.sublayer.0.norm",
            f"blocks.{layer}.hook_attn_out": f"layers.{layer}.self_attn",
            f"blocks.{layer}.mlp.hook_post": f"layers.{layer}.feed_forward.w_2:input",
            f"blocks.{layer}.hook_resid_post": f"layers.{layer}",
        },
        top={"hook_embed": "embed.0", "ln_final.hook_normalized": "norm"},
        logits=False,
    ),
    Design(
        "seq2seq_post_shared",
        "Post-norm encoder-decoder, one shared embedding",
        build_encoder_decoder,
        dict(SHAPE, n_decoder_layers=2, embed_scale="sqrt_d_model"),
        ref.TorchSeq2Seq,
        seq2seq_sources,
        lambda layer: {
            **torch_layer_hooks(f"encoder.blocks.{layer}", f"transformer.encoder.layers.{layer}", True),
            **torch_layer_hooks(f"decoder.blocks.{layer}", f"transformer.decoder.layers.{layer}", True, cross=True),
        },
        top={
            "encoder.ln_final.hook_normalized": "transformer.encoder.norm",
            "decoder.ln_final.hook_normalized": "transformer.decoder.norm",
        },
        tokens=SOURCE,
        inputs=dict(decoder_input=TARGET),
        reference_inputs=dict(target=TARGET),
    ),
    Design(
        "seq2seq_pre_separate",
        "Pre-norm encoder-decoder, separate source/target vocabularies, one learned positional table",
        build_encoder_decoder,
        dict(
            SHAPE,
            n_decoder_layers=2,
            placement="pre",
            positions="learned",
            share_positions=True,
            separate_embeddings=True,
            d_vocab_source=29,
            embed_scale="sqrt_d_model",
        ),
        lambda: ref.TorchSeq2Seq(norm_first=True, separate=True, source_vocab=29, learned=True),
        seq2seq_sources,
        lambda layer: {
            **torch_layer_hooks(f"encoder.blocks.{layer}", f"transformer.encoder.layers.{layer}", False),
            **torch_layer_hooks(f"decoder.blocks.{layer}", f"transformer.decoder.layers.{layer}", False, cross=True),
        },
        top={
            "decoder.hook_pos_embed": "pos",  # the reference records its table's last read: the target's
            "encoder.ln_final.hook_normalized": "transformer.encoder.norm",
            "decoder.ln_final.hook_normalized": "transformer.decoder.norm",
        },
        tokens=SOURCE + 7,  # ids up to 27: past the target's vocabulary of 23, inside the source's of 29
        inputs=dict(decoder_input=TARGET),
        reference_inputs=dict(target=TARGET),
    ),
    Design(
        "post_norm_final_norm",
        "Post-norm stack with a final norm",
        build_decoder,
        dict(SHAPE, placement="post", final_norm=True, norm_eps=1e-6, activation="relu"),
        ref.TorchCausalStack,
        lambda t: torch_stack_sources(t, t.stack.layers, t.stack.norm),
        lambda layer: torch_layer_hooks(f"blocks.{layer}", f"stack.layers.{layer}", post=True),
        top={**TORCH_TOP, "ln_final.hook_normalized": "stack.norm"},
    ),
    Design(
        "bert_segments_padding",
        "BERT: segments, padding, embedding norm, MLM head",
        build_encoder,
        dict(SHAPE, norm_eps=1e-12),
        ref.TinyBert,
        bert_sources,
        lambda layer: torch_layer_hooks(f"blocks.{layer}", f"layers.{layer}", post=True),
        top={
            "hook_embed": "word",
            "hook_pos_embed": "position",
            "hook_token_type_embed": "segment",
            "embed_ln.hook_normalized": "embed_norm",
            "mlm_head.hook_pre": "dense",
            "mlm_head.ln.hook_normalized": "head_norm",
        },
        inputs=ENCODER_INPUTS,
    ),
    Design(
        "torch_post_norm_gpt",
        "GPT of post-norm nn.TransformerEncoderLayers",
        build_decoder,
        dict(SHAPE, placement="post", final_norm=False, activation="relu"),
        lambda: TorchPostNormDecoder(TOY),
        lambda t: torch_stack_sources(t, t.layers),
        lambda layer: torch_layer_hooks(f"blocks.{layer}", f"layers.{layer}", post=True),
        top=TORCH_TOP,
    ),
    Design(
        "t5_style",
        "T5-style encoder-decoder: relative buckets only, RMSNorm, no biases, unscaled scores",
        build_encoder_decoder,
        dict(
            SHAPE,
            n_decoder_layers=2,
            placement="pre",
            norm="rms",
            norm_eps=1e-6,
            positions="relative_bucketed",
            n_buckets=8,
            max_distance=20,
            attn_scale=1.0,
            activation="relu",
            **NO_BIAS,
        ),
        ref.ScratchT5,
        t5_sources,
        t5_hooks,
        top={
            "decoder.hook_embed": "embed",  # the shared embedding's last call: the target's
            "encoder.rel_pos_bias.hook_bias": "encoder_bias",
            "decoder.rel_pos_bias.hook_bias": "decoder_bias",
            "encoder.ln_final.hook_normalized": "encoder_norm",
            "decoder.ln_final.hook_normalized": "decoder_norm",
        },
        tokens=SOURCE,
        inputs=dict(decoder_input=TARGET),
        reference_inputs=dict(target=TARGET),
    ),
    Design(
        "rotary",
        "Rotary positions, RMSNorm, SwiGLU",
        build_decoder,
        dict(SHAPE, norm="rms", norm_eps=1e-6, positions="rotary", gated_mlp=True, activation="silu", **NO_BIAS),
        scratch(
            layer_of(
                lambda: ref.SelfAttention(16, 4, bias=False, rotary=ref.RotaryEmbedding(4)),
                lambda: ref.SwiGLU(16, 32),
                lambda: ref.RMSNorm(16),
            ),
            lambda: ref.RMSNorm(16),
            positions=False,
            head_bias=False,
        ),
        scratch_sources,
        scratch_hooks,
        top={"hook_embed": "embed", "ln_final.hook_normalized": "norm"},
    ),
    Design(
        "arena",
        "ARENA's DemoTransformer",
        build_decoder,
        dict(SHAPE, activation="gelu_new"),
        ref.ArenaDemoTransformer,
        arena_sources,
        lambda layer: {
            f"blocks.{layer}.{hook}": f"blocks.{layer}{where}"
            for hook, where in (
                ("hook_resid_pre", ":input"),
                ("ln1.hook_normalized", ".ln1"),
                ("hook_attn_out", ".attn"),
                ("ln2.hook_normalized", ".ln2"),
                ("hook_mlp_out", ".mlp"),
                ("hook_resid_post", ""),
            )
        },
        top={"ln_final.hook_normalized": "ln_final"},
    ),
    Design(
        "moe",
        "Mixture of experts: router bias, Linear-GELU-Linear experts",
        build_decoder,
        dict(SHAPE, experts=dict(n_experts=4, top_k=2, router_bias=True, expert_mlp="plain")),
        scratch(layer_of(lambda: ref.SelfAttention(16, 4), lambda: ref.RouterMoE(16, 32))),
        scratch_sources,
        lambda layer: scratch_hooks(
            layer, {"mlp.hook_router_logits": "mlp.router", "mlp.experts.1.hook_post": "mlp.experts.1.2:input"}
        ),
        top={**TORCH_TOP, "ln_final.hook_normalized": "norm"},
    ),
    Design(
        "alibi_from_one",
        "ALiBi with slopes starting at 1",
        build_decoder,
        dict(SHAPE, positions="alibi", alibi_slopes=ALIBI_FROM_ONE),
        scratch(layer_of(lambda: ref.SelfAttention(16, 4, score_bias=ref.ALiBiBias(ALIBI_FROM_ONE))), positions=False),
        scratch_sources,
        lambda layer: scratch_hooks(layer, {"attn.score_bias.hook_bias": "attn.score_bias"}),
        top={"hook_embed": "embed", "ln_final.hook_normalized": "norm"},
    ),
    Design(
        "relative_clipped",
        "Learned relative-position bias clipped at +-3",
        build_decoder,
        dict(SHAPE, positions="relative_clipped", max_distance=3),
        scratch(layer_of(lambda: ref.SelfAttention(16, 4, score_bias=ref.ClippedRelativeBias(4, 3))), positions=False),
        scratch_sources,
        lambda layer: scratch_hooks(layer, {"attn.score_bias.hook_bias": "attn.score_bias"}),
        top={"hook_embed": "embed", "ln_final.hook_normalized": "norm"},
    ),
]
DESIGNS = {design.name: design for design in GALLERY}

__all__ = ["DESIGNS", "Design", "GALLERY", "hook_map", "model_of", "reference_of", "verify_design"]
