"""Hugging Face's value of each of our hooks in a gpt-oss model (``GptOssForCausalLM``).

Attention, norms and the residual stream are read as in the Llama family
(``llama_reference.record_llama_block``): the pattern is Hugging Face's attention weights,
the sink's column already dropped. Of the mixture, Hugging Face's own tensors: the router's
outputs (its logits, our ``hook_router_logits``; the softmax over the chosen experts,
``hook_routing_weights``; their indices, ``hook_expert_indices``) and the mixture's output
(``hook_mlp_out``). Derived from Hugging Face's tensors, since it never forms them: the
sinks' column (``attn.sinks.hook_logits``: its ``sinks`` parameter on every query's row),
``hook_expert_weights`` (the softmax of its router logits over every expert), and every
expert's ``hook_pre``/``hook_pre_linear``/``hook_post`` on every token: Hugging Face's expert
formula applied to the input its experts received, ``x gate_up_proj[E] + gate_up_proj_bias[E]``
with the gate in the even columns and the up projection in the odd ones, clipped at the
experts' ``limit`` and gated as ``(up + 1) * gate * sigmoid(alpha * gate)``.

Float64 (see ``reference``): besides the RMSNorms, Hugging Face's default grouped matrix
product for the experts has no float64 kernel; a float64 reference run runs the experts
eagerly. Its router and its eager attention (sinks included) already compute in the input's
dtype.
"""

from contextlib import AbstractContextManager

import einops
import torch
from jaxtyping import Int
from torch import Tensor, nn

from interp_transformer.families.llama.reference import llama_float64_patches, record_llama_block
from interp_transformer.families.moe.reference import eager_experts, record_mixture, with_expert_weights
from interp_transformer.families.reference import HFModule, Recorder, reference_activations


def gpt_oss_float64_patches(hf_model: nn.Module) -> list[AbstractContextManager]:
    """The Llama family's float64 norms and eager experts."""
    return llama_float64_patches(hf_model) + [eager_experts(hf_model)]


def _record_sinks(rec: Recorder, attn: HFModule, prefix: str) -> None:
    """The sinks' column of the scores, ``[batch, head_index, query_pos, 1]``, for the attention's inputs."""

    def keep(module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        batch, pos = hidden.shape[:2]
        sinks = einops.repeat(attn.sinks, "head_index -> batch head_index pos 1", batch=batch, pos=pos)
        rec.keep(prefix + "attn.sinks.hook_logits", sinks)

    rec.handles.append(attn.register_forward_pre_hook(keep, with_kwargs=True))


def _record_mixture(rec: Recorder, mixture: HFModule, prefix: str, batch: int) -> None:
    """The router's outputs and every expert's hooks (derived on every token) of one mixture."""
    experts = mixture.experts

    def expert_hooks(x: Tensor, expert: int) -> tuple[Tensor, Tensor, Tensor]:
        gate_up = x @ experts.gate_up_proj[expert] + experts.gate_up_proj_bias[expert]
        pre, pre_linear = gate_up[..., ::2], gate_up[..., 1::2]  # interleaved: gate, up, gate, up, ...
        gate = pre.clamp(max=experts.limit)
        up = pre_linear.clamp(min=-experts.limit, max=experts.limit)
        return pre, pre_linear, (up + 1) * (gate * torch.sigmoid(gate * experts.alpha))

    record_mixture(rec, mixture.router, experts, prefix, batch, expert_hooks)


def hf_reference_activations(hf_model, tokens: Int[Tensor, "batch pos"], **forward_kwargs) -> dict[str, Tensor]:
    """Run a Hugging Face gpt-oss model and return its value for each of our hooks (see the module docstring)."""

    def record_block(rec: Recorder, block: HFModule, prefix: str, rotary_inputs: dict, layer: int) -> None:
        record_llama_block(rec, block, prefix, rotary_inputs, layer)
        _record_sinks(rec, block.self_attn, prefix)
        _record_mixture(rec, block.mlp, prefix + "mlp.", tokens.shape[0])

    return with_expert_weights(
        reference_activations(hf_model, tokens, forward_kwargs, record_block, gpt_oss_float64_patches)
    )


__all__ = ["gpt_oss_float64_patches", "hf_reference_activations"]
