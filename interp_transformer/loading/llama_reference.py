"""Hugging Face's value of each of our hooks in a Llama-family model (``LlamaForCausalLM``, Mistral, Qwen2, Qwen3).

Values are read with torch hooks on Hugging Face's modules (``reference_hooks.Recorder``),
so they are its own tensors, not recomputed: the token embedding, each block's residual
stream (pre, mid, post), the norm outputs, per-head q/k/v before rotation
(``q_proj``/``k_proj``/``v_proj`` outputs; Qwen3's ``q_norm``/``k_norm`` outputs), attention
patterns (eager attention for the call), z (``o_proj``'s input), attention and MLP outputs,
the gated MLP's gate, up projection and product (``gate_proj``/``up_proj`` outputs,
``down_proj``'s input), the final norm and the logits.

Two kinds of values Hugging Face never forms are derived from its own tensors: each
RMSNorm's ``hook_scale`` is ``sqrt(mean(x^2) + eps)`` of the input Hugging Face's norm
received, and the rotated q/k (``hook_rot_q``/``hook_rot_k``) are Hugging Face's own
``apply_rotary_pos_emb`` applied to its q/k with the cos/sin its model handed to the
attention. Not mapped: ``hook_attn_scores`` (Hugging Face masks with the dtype's minimum,
not ``-inf``).

Float64 (see ``reference_hooks``): Hugging Face's Llama-family code computes every RMSNorm
and the eager softmax in float32 whatever the model's dtype; a float64 reference run uses
the same two formulas in float64, each norm's ``weight * (x * rsqrt(mean(x^2) + eps))`` and
the eager attention with its softmax in the input's dtype.
"""

from typing import Callable

from jaxtyping import Int
from torch import Tensor, nn

from .reference_hooks import (
    FLOAT64_ATTENTION,
    Patch,
    Recorder,
    forward_patch,
    positions_from_mask,
    record_attention,
    reference_activations,
    rms_norm_in_input_dtype,
)


def record_gated_mlp(rec: Recorder, mlp: nn.Module, prefix: str, transform: Callable = lambda t: t) -> None:
    """A Hugging Face gated MLP (``gate_proj``, ``up_proj``, ``down_proj``) as our ``hook_pre``, ``hook_pre_linear``,
    ``hook_post``.

    ``transform`` reshapes each value (a mixture's shared expert reads ``[(batch pos), d_model]``).
    """
    rec.output(mlp.gate_proj, prefix + "hook_pre", transform)
    rec.output(mlp.up_proj, prefix + "hook_pre_linear", transform)
    rec.input(mlp.down_proj, prefix + "hook_post", transform)


def llama_float64_patches(hf_model: nn.Module) -> list[Patch]:
    """Every RMSNorm of the model computed in its input's dtype (Hugging Face's casts it to float32)."""
    return [
        forward_patch(module, rms_norm_in_input_dtype)
        for module in hf_model.modules()
        if hasattr(module, "variance_epsilon")
    ]


def record_llama_block(rec: Recorder, block: nn.Module, prefix: str, rotary_inputs: dict, layer: int) -> None:
    """Everything of one Llama-family block but its MLP's insides: residual stream, norms, attention, outputs."""
    rec.input(block, prefix + "hook_resid_pre")
    rec.norm(block.input_layernorm, prefix + "ln1.")
    record_attention(rec, block.self_attn, prefix, rotary_inputs, layer)
    rec.output(block.self_attn, prefix + "hook_attn_out")
    rec.input(block.post_attention_layernorm, prefix + "hook_resid_mid")
    rec.norm(block.post_attention_layernorm, prefix + "ln2.")
    rec.output(block.mlp, prefix + "hook_mlp_out")
    rec.output(block, prefix + "hook_resid_post")


def _record_block(rec: Recorder, block: nn.Module, prefix: str, rotary_inputs: dict, layer: int) -> None:
    record_llama_block(rec, block, prefix, rotary_inputs, layer)
    record_gated_mlp(rec, block.mlp, prefix + "mlp.")


def hf_reference_activations(hf_model, tokens: Int[Tensor, "batch pos"], **forward_kwargs) -> dict[str, Tensor]:
    """Run a Hugging Face Llama-family model and return its value for each of our hooks (see the module docstring)."""
    return reference_activations(hf_model, tokens, forward_kwargs, _record_block, llama_float64_patches)


__all__ = [
    "FLOAT64_ATTENTION",
    "hf_reference_activations",
    "llama_float64_patches",
    "positions_from_mask",
    "record_gated_mlp",
    "record_llama_block",
]
