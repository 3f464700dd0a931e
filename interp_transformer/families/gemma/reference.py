"""Hugging Face's value of each of our hooks in a Gemma model (``GemmaForCausalLM``, ``Gemma2ForCausalLM``,
``Gemma3ForCausalLM``).

Read with torch hooks on Hugging Face's modules (``reference``): the scaled token
embedding (``embed_tokens``' output), each block's residual stream, every norm (Gemma 2/3:
``post_attention_layernorm`` is our ``ln1_post``, ``pre_feedforward_layernorm`` our ``ln2``,
``post_feedforward_layernorm`` our ``ln2_post``), q/k/v before rotation, Gemma 3's q/k norms,
the rotated q/k (derived, as for the Llama family), patterns, z, attention and MLP outputs
(after the post norms), the gated MLP's three hooks, the final norm, ``lm_head``'s output
(our ``unembed.hook_logits_uncapped``) and the logits (after Gemma 2's final soft-cap). Not
mapped: the attention scores before and after the cap (Hugging Face masks with the dtype's
minimum, not ``-inf``).

Float64 (see ``reference``): Hugging Face computes Gemma's norms in float32, and its
embedding factor ``sqrt(d_model)`` is a float32 buffer unless the model was created in
float64; a float64 reference run computes each norm's ``x * rsqrt(mean(x^2) + eps) * (1 +
weight)`` in float64, multiplies the embedding by the float64 ``sqrt(d_model)``, and runs the
eager attention (soft-cap included) with its softmax in float64.
"""

from contextlib import AbstractContextManager

import torch
from jaxtyping import Int
from torch import Tensor

from interp_transformer.families.llama.reference import record_attention, record_gated_mlp
from interp_transformer.families.reference import HFModule, Recorder, forward_patch, patched, reference_activations


def _gemma_norm_in_input_dtype(norm, x: Tensor) -> Tensor:
    """Gemma's RMSNorm formula, ``x * rsqrt(mean(x^2) + eps) * (1 + weight)``, without its cast to float32."""
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + norm.eps) * (1.0 + norm.weight)


def gemma_float64_patches(hf_model: HFModule) -> list[AbstractContextManager]:
    """Every Gemma norm in its input's dtype, and the embedding factor exact in float64."""
    norms = [
        module for module in hf_model.modules() if type(module).__name__.endswith("RMSNorm") and hasattr(module, "eps")
    ]
    embed = (hf_model.model if hasattr(hf_model, "model") else hf_model).embed_tokens
    scale = torch.tensor(embed.scalar_embed_scale, dtype=torch.float64, device=embed.weight.device)
    return [forward_patch(norm, _gemma_norm_in_input_dtype) for norm in norms] + [patched(embed, "embed_scale", scale)]


def _record_block(rec: Recorder, block: HFModule, prefix: str, rotary_inputs: dict, layer: int) -> None:
    rec.input(block, prefix + "hook_resid_pre")
    rec.norm(block.input_layernorm, prefix + "ln1.", centred=False)
    record_attention(rec, block.self_attn, prefix, rotary_inputs, layer, heads_first_norms=True)
    if hasattr(block, "pre_feedforward_layernorm"):  # Gemma 2/3: a norm after attention and after the MLP
        rec.norm(block.post_attention_layernorm, prefix + "ln1_post.", centred=False)
        rec.output(block.post_attention_layernorm, prefix + "hook_attn_out")
        mlp_norm, mlp_out = block.pre_feedforward_layernorm, block.post_feedforward_layernorm
        rec.norm(mlp_out, prefix + "ln2_post.", centred=False)
    else:
        rec.output(block.self_attn, prefix + "hook_attn_out")
        mlp_norm, mlp_out = block.post_attention_layernorm, block.mlp
    rec.input(mlp_norm, prefix + "hook_resid_mid")
    rec.norm(mlp_norm, prefix + "ln2.", centred=False)
    record_gated_mlp(rec, block.mlp, prefix + "mlp.")
    rec.output(mlp_out, prefix + "hook_mlp_out")
    rec.output(block, prefix + "hook_resid_post")


def hf_reference_activations(hf_model, tokens: Int[Tensor, "batch pos"], **forward_kwargs) -> dict[str, Tensor]:
    """Run a Hugging Face Gemma model and return its value for each of our hooks (see the module docstring)."""

    def uncapped_logits(rec: Recorder) -> None:
        if getattr(hf_model.config, "final_logit_softcapping", None) is not None and hasattr(hf_model, "lm_head"):
            rec.output(hf_model.lm_head, "unembed.hook_logits_uncapped")

    return reference_activations(
        hf_model, tokens, forward_kwargs, _record_block, gemma_float64_patches, uncapped_logits
    )


__all__ = ["gemma_float64_patches", "hf_reference_activations"]
