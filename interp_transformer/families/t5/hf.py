"""Hugging Face T5 (``T5ForConditionalGeneration``, v1.0 and v1.1) -> ``EncoderDecoderTransformer``.

Weight map (``encoder`` shown; the decoder's block has three sub-layers, ``layer.0`` self-attention,
``layer.1`` cross-attention, ``layer.2`` the MLP)::

    shared.weight [d_vocab d_model]                               -> embed.W_E (encoder/decoder.embed_tokens are tied to
    it)
    encoder.block.0.layer.0.SelfAttention.relative_attention_bias -> encoder.rel_pos_bias.W_rel_pos [n_buckets,
    head_index]
    encoder.block.L.layer.0.SelfAttention.{q,k,v,o}               -> encoder.blocks.L.attn.W_Q/W_K/W_V/W_O (biases:
    zeros)
    encoder.block.L.layer.0.layer_norm                            -> encoder.blocks.L.ln1
    encoder.block.L.layer.1.DenseReluDense.wi / wo                -> encoder.blocks.L.mlp.W_in / W_out     (v1.0)
    encoder.block.L.layer.1.DenseReluDense.wi_0 / wi_1 / wo       -> mlp.W_gate / W_in / W_out             (v1.1)
    encoder.block.L.layer.1.layer_norm                            -> encoder.blocks.L.ln2 (decoder: layer.2 -> ln3)
    decoder.block.L.layer.1.EncDecAttention.{q,k,v,o}             -> decoder.blocks.L.cross_attn.W_Q ...
    decoder.block.L.layer.1.layer_norm                            -> decoder.blocks.L.ln2
    encoder/decoder.final_layer_norm                              -> encoder/decoder.ln_final
    lm_head.weight (else the tied shared.weight)                  -> unembed.W_U = lm_head^T * d_model^-0.5 when the
    config
                                                                     rescales the decoder output (v1.0), else lm_head^T

The read-out rescaling of v1.0 (``scale_decoder_outputs``, or ``tie_word_embeddings`` in
configs written before it existed) is folded into ``W_U``, so ``logits = ln_final(x) W_U``
holds as in every other model. Relative position biases of layers other than 0 are
absent from T5 checkpoints; one would be refused as unexpected.
"""

from collections.abc import Mapping

import einops
import torch
from torch import Tensor

from interp_transformer.core.strict import check_checkpoint, state_dict_shapes
from interp_transformer.families.bart.hf import HF_ACTIVATIONS, check_model_type, run_seq2seq
from interp_transformer.families.encoder_decoder_conversion import (
    attention_shapes,
    attention_weights,
    fresh,
    mlp_in,
    mlp_out,
    special_token_ids,
    zero_attention_biases,
)
from interp_transformer.families.reference import Recorder, split_heads
from interp_transformer.families.t5.recipe import T5Config

SUPPORTED_MODEL_TYPES = ("t5",)
VERIFY_PADDED = True
PROJECTIONS = {"Q": "q", "K": "k", "V": "v", "O": "o"}
TIED = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight")


def scales_read_out(hf_config) -> bool:
    """Whether the decoder's output is multiplied by ``d_model ** -0.5`` before ``lm_head`` (T5 v1.0)."""
    scale = getattr(hf_config, "scale_decoder_outputs", None)
    return bool(getattr(hf_config, "tie_word_embeddings", True) if scale is None else scale)


def config_from_hf(hf_config) -> T5Config:
    """Our ``T5Config`` from a Hugging Face ``T5Config``; ``ValueError`` for variants we do not compute."""
    check_model_type(hf_config, SUPPORTED_MODEL_TYPES)
    proj = hf_config.feed_forward_proj
    gated = proj.startswith("gated-")
    activation = getattr(hf_config, "dense_act_fn", proj.removeprefix("gated-"))
    if activation not in HF_ACTIVATIONS:
        raise ValueError(
            f"feed_forward_proj={proj!r} uses an activation we do not compute; supported: {sorted(HF_ACTIVATIONS)}"
        )
    if hf_config.num_heads * hf_config.d_kv != hf_config.d_model:
        raise ValueError(
            f"num_heads * d_kv = {hf_config.num_heads} * {hf_config.d_kv} must equal "
            f"d_model={hf_config.d_model} "
            "(T5-3B and T5-11B widen their attention; not supported)"
        )
    special = special_token_ids(hf_config)
    return T5Config(
        d_model=hf_config.d_model,
        n_layers=hf_config.num_layers,
        n_decoder_layers=hf_config.num_decoder_layers,
        n_heads=hf_config.num_heads,
        d_head=hf_config.d_kv,
        d_mlp=hf_config.d_ff,
        d_vocab=hf_config.vocab_size,
        n_ctx=int(getattr(hf_config, "n_positions", None) or 512),
        act_fn=HF_ACTIVATIONS[activation],
        gated_mlp=gated,
        layer_norm_eps=float(hf_config.layer_norm_epsilon),
        init_range=float(hf_config.initializer_factor) * 0.02,
        n_buckets=hf_config.relative_attention_num_buckets,
        max_distance=hf_config.relative_attention_max_distance,
        scaled_read_out=scales_read_out(hf_config),
        name=str(getattr(hf_config, "name_or_path", "") or "t5"),
        **special,
    )


def _mlp_names(cfg: T5Config) -> tuple[str, ...]:
    return ("wi_0", "wi_1", "wo") if cfg.gated_mlp else ("wi", "wo")


def expected_hf_shapes(cfg: T5Config) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor of a ``T5ForConditionalGeneration`` checkpoint."""
    d, d_mlp = cfg.d_model, cfg.d_mlp
    shapes: dict[str, tuple[int, ...]] = {"shared.weight": (cfg.d_vocab, d), "lm_head.weight": (cfg.d_vocab, d)}
    for stack, n_layers in (("encoder", cfg.n_layers), ("decoder", cfg.n_decoder_layers)):
        shapes[f"{stack}.embed_tokens.weight"] = (cfg.d_vocab, d)
        shapes[f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = (cfg.n_buckets, cfg.n_heads)
        shapes[f"{stack}.final_layer_norm.weight"] = (d,)
        for layer in range(n_layers):
            p = f"{stack}.block.{layer}.layer."
            attentions = ["0.SelfAttention."] + (["1.EncDecAttention."] if stack == "decoder" else [])
            for attention in attentions:
                shapes.update(attention_shapes(p + attention, PROJECTIONS, d, bias=False))
            mlp = "2" if stack == "decoder" else "1"
            for name in _mlp_names(cfg):
                shapes[p + f"{mlp}.DenseReluDense.{name}.weight"] = (d, d_mlp) if name == "wo" else (d_mlp, d)
            for sub in range(int(mlp) + 1):
                shapes[p + f"{sub}.layer_norm.weight"] = (d,)
    return shapes


def convert_state_dict(hf_state_dict: Mapping[str, Tensor], cfg: T5Config) -> dict[str, Tensor]:
    """Hugging Face T5 state dict -> ours (see the module docstring). Pure: the input is not changed.

    ``cfg.scaled_read_out`` says whether T5 v1.0's ``d_model ** -0.5`` is folded into ``W_U``.
    """
    if not isinstance(cfg, T5Config):
        raise TypeError(f"cfg must be a T5Config, got {type(cfg).__name__}")
    shapes = state_dict_shapes(hf_state_dict)
    check_checkpoint(shapes, expected_hf_shapes(cfg), what="T5 checkpoint", optional=TIED)

    def read(name: str) -> Tensor:
        return hf_state_dict[name]

    ours = {"embed.W_E": fresh(read("shared.weight"))}
    for stack, n_layers in (("encoder", cfg.n_layers), ("decoder", cfg.n_decoder_layers)):
        ours[f"{stack}.rel_pos_bias.W_rel_pos"] = fresh(
            read(f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight")
        )
        ours[f"{stack}.ln_final.w"] = fresh(read(f"{stack}.final_layer_norm.weight"))
        for layer in range(n_layers):
            hf, q = f"{stack}.block.{layer}.layer.", f"{stack}.blocks.{layer}."
            parts = [("0.SelfAttention.", "attn.")] + (
                [("1.EncDecAttention.", "cross_attn.")] if stack == "decoder" else []
            )
            for theirs, mine in parts:
                weights = attention_weights(read, hf + theirs, q + mine, cfg.n_heads, PROJECTIONS, bias=False)
                ours.update(weights)
                ours.update(zero_attention_biases(q + mine, weights))
            norms = ("ln1", "ln2") if stack == "encoder" else ("ln1", "ln2", "ln3")
            for sub, norm in enumerate(norms):
                ours[q + f"{norm}.w"] = fresh(read(hf + f"{sub}.layer_norm.weight"))
            dense = hf + f"{len(norms) - 1}.DenseReluDense."
            W_out = mlp_out(read(dense + "wo.weight"))
            if cfg.gated_mlp:
                ours[q + "mlp.W_gate"], ours[q + "mlp.W_in"] = (
                    mlp_in(read(dense + "wi_0.weight")),
                    mlp_in(read(dense + "wi_1.weight")),
                )
            else:
                ours[q + "mlp.W_in"] = mlp_in(read(dense + "wi.weight"))
            ours[q + "mlp.W_out"] = W_out
            ours[q + "mlp.b_in"] = torch.zeros(cfg.d_mlp, dtype=W_out.dtype, device=W_out.device)
            ours[q + "mlp.b_out"] = torch.zeros(cfg.d_model, dtype=W_out.dtype, device=W_out.device)
    lm_head = read("lm_head.weight") if "lm_head.weight" in shapes else ours["embed.W_E"]
    W_U = einops.rearrange(lm_head, "d_vocab d_model -> d_model d_vocab")
    ours["unembed.W_U"] = fresh(W_U * cfg.d_model**-0.5 if cfg.scaled_read_out else W_U)
    ours["unembed.b_U"] = torch.zeros(cfg.d_vocab, dtype=W_U.dtype, device=W_U.device)
    return ours


def load_hf_model(directory, *, dtype=torch.float32):
    """The Hugging Face reference of a T5 directory: ``T5ForConditionalGeneration``, eager attention."""
    from transformers import T5ForConditionalGeneration

    return T5ForConditionalGeneration.from_pretrained(str(directory), dtype=dtype, attn_implementation="eager").eval()


def _record_t5(recorder: Recorder, hf_model, gated: bool) -> None:
    split = split_heads(head_index=hf_model.config.num_heads)

    def norm(module, prefix: str) -> None:  # T5 takes the mean square in float32, as our T5LayerNorm
        recorder.norm(module, prefix + ".", centred=False, mean_square_dtype=torch.float32)

    def attention(module, prefix: str, out_name: str) -> None:
        for letter in "qkv":
            recorder.output(getattr(module, letter), prefix + f".hook_{letter}", split)
        recorder.output(module, prefix + ".hook_pattern", index=2)
        recorder.input(module.o, prefix + ".hook_z", split)
        recorder.output(module, out_name)

    for stack, hf_stack in (("encoder", hf_model.encoder), ("decoder", hf_model.decoder)):
        recorder.output(hf_stack.embed_tokens, f"{stack}.hook_embed")
        recorder.output(hf_stack.block[0].layer[0].SelfAttention, f"{stack}.rel_pos_bias.hook_bias", index=1)
        norm(hf_stack.final_layer_norm, f"{stack}.ln_final")
        for layer, block in enumerate(hf_stack.block):
            b = f"{stack}.blocks.{layer}."
            recorder.input(block, b + "hook_resid_pre")
            norm(block.layer[0].layer_norm, b + "ln1")
            attention(block.layer[0].SelfAttention, b + "attn", b + "hook_attn_out")
            recorder.output(block.layer[0], b + "hook_resid_mid")
            if stack == "decoder":
                norm(block.layer[1].layer_norm, b + "ln2")
                attention(block.layer[1].EncDecAttention, b + "cross_attn", b + "hook_cross_attn_out")
                recorder.output(block.layer[1], b + "hook_resid_mid_cross")
            feed_forward = block.layer[-1]
            norm(feed_forward.layer_norm, b + ("ln3" if stack == "decoder" else "ln2"))
            dense = feed_forward.DenseReluDense
            if gated:
                recorder.output(dense.wi_0, b + "mlp.hook_pre")
                recorder.output(dense.wi_1, b + "mlp.hook_pre_linear")
            else:
                recorder.output(dense.wi, b + "mlp.hook_pre")
            recorder.input(dense.wo, b + "mlp.hook_post")
            recorder.output(dense, b + "hook_mlp_out")
            recorder.output(block, b + "hook_resid_post")


def hf_reference_activations(
    hf_model, tokens: Tensor, attention_mask: Tensor | None = None, decoder_input: Tensor | None = None
) -> dict[str, Tensor]:
    """Hugging Face T5's value for each of our hooks (every one but the attention scores), and ``"logits"``.

    RMSNorm scales are computed from each norm's input as T5 computes them (float32 mean square).
    """
    recorder = Recorder()
    _record_t5(recorder, hf_model, hf_model.config.is_gated_act)
    return run_seq2seq(hf_model, recorder, tokens, attention_mask, decoder_input)


__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "config_from_hf",
    "convert_state_dict",
    "expected_hf_shapes",
    "hf_reference_activations",
    "load_hf_model",
    "scales_read_out",
]
