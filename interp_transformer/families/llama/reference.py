"""Hugging Face's value of each of our hooks in a Llama-family model (``LlamaForCausalLM``, Mistral, Qwen2, Qwen3).

Values are read with torch hooks on Hugging Face's modules (``reference.Recorder``),
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

Float64 (see ``reference``): Hugging Face's Llama-family code computes every RMSNorm
and the eager softmax in float32 whatever the model's dtype; a float64 reference run uses
the same two formulas in float64, each norm's ``weight * (x * rsqrt(mean(x^2) + eps))`` and
the eager attention with its softmax in the input's dtype.
"""

from collections.abc import Callable
from contextlib import AbstractContextManager

import einops
import torch
from jaxtyping import Int
from torch import Tensor, nn

from interp_transformer.families.reference import (
    FROM_HEADS_FIRST,
    HFModule,
    Recorder,
    forward_patch,
    reference_activations,
    same,
    split_heads,
)


def rms_norm_in_input_dtype(norm, hidden_states: Tensor) -> Tensor:
    """Llama's RMSNorm formula, ``weight * (x * rsqrt(mean(x^2) + eps))``, without its cast to float32."""
    variance = hidden_states.pow(2).mean(dim=-1, keepdim=True)
    return norm.weight * (hidden_states * torch.rsqrt(variance + norm.variance_epsilon))


def record_attention(
    rec: Recorder, attn: HFModule, prefix: str, rotary_inputs: dict, layer: int, heads_first_norms: bool = False
) -> None:
    """q/k/v before rotation, q/k norms, the pattern and z of one Hugging Face attention (``q_proj`` ... ``o_proj``).

    The cos/sin the model hands the attention go to ``rotary_inputs[layer]`` (``reference.add_rotated``
    turns them into ``hook_rot_q``/``hook_rot_k``). ``heads_first_norms``: the q/k norms read
    ``[batch, head_index, pos, d_head]`` (Gemma 3), not ``[batch, pos, head_index, d_head]`` (Qwen3).
    """
    split = split_heads(d_head=attn.head_dim)
    for letter in "qkv":
        rec.output(getattr(attn, f"{letter}_proj"), prefix + f"attn.hook_{letter}", split)
    if hasattr(attn, "q_norm"):
        to_ours = (lambda x: einops.rearrange(x, FROM_HEADS_FIRST)) if heads_first_norms else same
        rec.norm(attn.q_norm, prefix + "attn.q_norm.", centred=False, transform=to_ours)
        rec.norm(attn.k_norm, prefix + "attn.k_norm.", centred=False, transform=to_ours)
    rec.kwargs(attn, lambda kwargs: rotary_inputs.__setitem__(layer, kwargs["position_embeddings"]))
    rec.output(attn, prefix + "attn.hook_pattern", index=1)
    rec.input(attn.o_proj, prefix + "attn.hook_z", split)


def record_gated_mlp(rec: Recorder, mlp: HFModule, prefix: str, transform: Callable = same) -> None:
    """A Hugging Face gated MLP (``gate_proj``, ``up_proj``, ``down_proj``) as our ``hook_pre``, ``hook_pre_linear``,
    ``hook_post``.

    ``transform`` reshapes each value (a mixture's shared expert reads ``[(batch pos), d_model]``).
    """
    rec.output(mlp.gate_proj, prefix + "hook_pre", transform)
    rec.output(mlp.up_proj, prefix + "hook_pre_linear", transform)
    rec.input(mlp.down_proj, prefix + "hook_post", transform)


def llama_float64_patches(hf_model: nn.Module) -> list[AbstractContextManager]:
    """Every RMSNorm of the model computed in its input's dtype (Hugging Face's casts it to float32)."""
    return [
        forward_patch(module, rms_norm_in_input_dtype)
        for module in hf_model.modules()
        if hasattr(module, "variance_epsilon")
    ]


def record_llama_block(rec: Recorder, block: HFModule, prefix: str, rotary_inputs: dict, layer: int) -> None:
    """Everything of one Llama-family block but its MLP's insides: residual stream, norms, attention, outputs."""
    rec.input(block, prefix + "hook_resid_pre")
    rec.norm(block.input_layernorm, prefix + "ln1.", centred=False)
    record_attention(rec, block.self_attn, prefix, rotary_inputs, layer)
    rec.output(block.self_attn, prefix + "hook_attn_out")
    rec.input(block.post_attention_layernorm, prefix + "hook_resid_mid")
    rec.norm(block.post_attention_layernorm, prefix + "ln2.", centred=False)
    rec.output(block.mlp, prefix + "hook_mlp_out")
    rec.output(block, prefix + "hook_resid_post")


def _record_block(rec: Recorder, block: HFModule, prefix: str, rotary_inputs: dict, layer: int) -> None:
    record_llama_block(rec, block, prefix, rotary_inputs, layer)
    record_gated_mlp(rec, block.mlp, prefix + "mlp.")


def hf_reference_activations(hf_model, tokens: Int[Tensor, "batch pos"], **forward_kwargs) -> dict[str, Tensor]:
    """Run a Hugging Face Llama-family model and return its value for each of our hooks (see the module docstring)."""
    return reference_activations(hf_model, tokens, forward_kwargs, _record_block, llama_float64_patches)


__all__ = [
    "hf_reference_activations",
    "llama_float64_patches",
    "record_attention",
    "record_gated_mlp",
    "record_llama_block",
    "rms_norm_in_input_dtype",
]
