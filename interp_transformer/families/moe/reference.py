"""Hugging Face's value of each of our hooks in a mixture-of-experts model (Mixtral, Qwen2-MoE, Qwen3-MoE).

Attention, norms and the residual stream are read as in the Llama family
(``llama_reference.record_llama_block``). Of the mixture, Hugging Face's own tensors: the
router's outputs (its ``router_logits``, our ``hook_router_logits``; the chosen experts'
weights, ``hook_routing_weights``; their indices, ``hook_expert_indices``), the mixture's
output (``hook_mlp_out``), the shared expert's gate, up projection and product, and its
gate's logit (through a sigmoid: ``hook_shared_expert_gate``). Derived from Hugging Face's
tensors, since it never forms them: ``hook_expert_weights`` (the softmax of its router
logits) and every expert's ``hook_pre``/``hook_pre_linear``/``hook_post`` on every token,
Hugging Face's expert formula (``linear(x, gate_up_proj[E])`` split into gate and up,
``act(gate) * up``) applied to the input its experts received. Dense blocks are read as the
Llama family's MLP.

Float64 (see ``reference``): besides the RMSNorms, Hugging Face's routers take the
softmax in float32, and its default grouped matrix product has no float64 kernel; a float64
reference run computes each router in float64 (the same formula) and runs the experts
eagerly.
"""

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
import torch.nn.functional as F
from jaxtyping import Int
from torch import Tensor, nn

from interp_transformer.families.llama.reference import llama_float64_patches, record_gated_mlp, record_llama_block
from interp_transformer.families.reference import (
    HFModule,
    Recorder,
    current_experts,
    forward_patch,
    reference_activations,
)
from interp_transformer.parts.moe import routing_dtype


def _router_in_input_dtype(router, hidden_states: Tensor):
    """Hugging Face's top-k router (logits, chosen weights, chosen indices) with its softmax in the input's dtype."""
    router_logits = F.linear(hidden_states.reshape(-1, router.hidden_dim), router.weight)
    top_weights, indices = router_logits.softmax(dim=-1).topk(router.top_k, dim=-1)
    if getattr(router, "norm_topk_prob", True):  # Mixtral's router always renormalises
        top_weights = top_weights / top_weights.sum(dim=-1, keepdim=True)
    return router_logits, top_weights, indices


@contextlib.contextmanager
def eager_experts(hf_model):
    """Hugging Face's experts run eagerly for the call (``set_experts_implementation``); restored afterwards."""
    previous = current_experts(hf_model)
    hf_model.set_experts_implementation("eager")
    try:
        yield
    finally:
        hf_model.set_experts_implementation(previous)


def moe_float64_patches(hf_model: nn.Module) -> list[AbstractContextManager]:
    """The Llama family's float64 norms, every router in float64, and eager experts."""
    routers = [module for module in hf_model.modules() if type(module).__name__.endswith("TopKRouter")]
    return (
        llama_float64_patches(hf_model)
        + [forward_patch(router, _router_in_input_dtype) for router in routers]
        + [eager_experts(hf_model)]
    )


def record_mixture(
    rec: Recorder,
    router: HFModule,
    experts: HFModule,
    prefix: str,
    batch: int,
    expert_hooks: Callable[[Tensor, int], tuple[Tensor, Tensor, Tensor]],
) -> Callable[[Tensor], Tensor]:
    """The router's three outputs and, on every token, each expert's ``hook_pre``, ``hook_pre_linear`` and
    ``hook_post``: ``expert_hooks(x, expert)``, the family's expert formula on the input its experts received.

    Returns ``per_token``, which gives Hugging Face's ``[(batch pos), ...]`` as ``[batch, pos, ...]``.
    """
    per_token = lambda t: t.reshape(batch, -1, *t.shape[1:])  # noqa: E731  [(batch pos), ...] -> [batch, pos, ...]
    for index, name in enumerate(("hook_router_logits", "hook_routing_weights", "hook_expert_indices")):
        rec.output(router, prefix + name, per_token, index=index)

    def every_expert(module, args, kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        for expert in range(experts.num_experts):
            e = prefix + f"experts.{expert}."
            for name, value in zip(("hook_pre", "hook_pre_linear", "hook_post"), expert_hooks(x, expert), strict=True):
                rec.keep(e + name, per_token(value))

    rec.handles.append(experts.register_forward_pre_hook(every_expert, with_kwargs=True))
    return per_token


def with_expert_weights(acts: dict[str, Tensor]) -> dict[str, Tensor]:
    """``acts`` with each router's ``hook_expert_weights``, the softmax of its ``hook_router_logits`` over every
    expert (in the routing dtype)."""
    for name in [name for name in acts if name.endswith("hook_router_logits")]:
        logits = acts[name]
        acts[name.replace("hook_router_logits", "hook_expert_weights")] = logits.softmax(
            dim=-1, dtype=routing_dtype(logits.dtype)
        )
    return acts


def _record_mixture(rec: Recorder, mixture: HFModule, prefix: str, batch: int) -> None:
    """The router's outputs, every expert's hooks (derived on every token) and the shared expert of one mixture."""
    experts = mixture.experts

    def expert_hooks(x: Tensor, expert: int) -> tuple[Tensor, Tensor, Tensor]:
        gate, up = F.linear(x, experts.gate_up_proj[expert]).chunk(2, dim=-1)
        return gate, up, experts.act_fn(gate) * up

    per_token = record_mixture(rec, mixture.gate, experts, prefix, batch, expert_hooks)
    if hasattr(mixture, "shared_expert"):
        record_gated_mlp(rec, mixture.shared_expert, prefix + "shared_expert.", per_token)
        rec.output(
            mixture.shared_expert_gate, prefix + "hook_shared_expert_gate", lambda t: per_token(torch.sigmoid(t))
        )


def hf_reference_activations(hf_model, tokens: Int[Tensor, "batch pos"], **forward_kwargs) -> dict[str, Tensor]:
    """Run a Hugging Face mixture-of-experts model and return its value for each of our hooks (see the module
    docstring)."""

    def record_block(rec: Recorder, block: HFModule, prefix: str, rotary_inputs: dict, layer: int) -> None:
        record_llama_block(rec, block, prefix, rotary_inputs, layer)
        if hasattr(block.mlp, "experts"):
            _record_mixture(rec, block.mlp, prefix + "mlp.", tokens.shape[0])
        else:
            record_gated_mlp(rec, block.mlp, prefix + "mlp.")

    return with_expert_weights(
        reference_activations(hf_model, tokens, forward_kwargs, record_block, moe_float64_patches)
    )


__all__ = [
    "eager_experts",
    "hf_reference_activations",
    "moe_float64_patches",
    "record_mixture",
    "with_expert_weights",
]
