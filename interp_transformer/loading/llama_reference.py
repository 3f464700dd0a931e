"""Hugging Face's value of each of our hooks in a Llama-family model (``LlamaForCausalLM``, Mistral, Qwen2, Qwen3).

Values are read with torch hooks on Hugging Face's modules, so they are its own
tensors, not recomputed: the token embedding, each block's residual stream (pre, mid,
post), the norm outputs, per-head q/k/v before rotation (``q_proj``/``k_proj``/``v_proj``
outputs; Qwen3's ``q_norm``/``k_norm`` outputs), attention patterns (eager attention for
the call), z (``o_proj``'s input), attention and MLP outputs, the gated MLP's gate, up
projection and product (``gate_proj``/``up_proj`` outputs, ``down_proj``'s input), the
final norm and the logits.

Two kinds of values Hugging Face never forms are derived from its own tensors: each
RMSNorm's ``hook_scale`` is ``sqrt(mean(x^2) + eps)`` of the input Hugging Face's norm
received, and the rotated q/k (``hook_rot_q``/``hook_rot_k``) are Hugging Face's own
``apply_rotary_pos_emb`` applied to its q/k with the cos/sin its model handed to the
attention. Not mapped: ``hook_attn_scores`` (Hugging Face masks with the dtype's minimum,
not ``-inf``).

Float64. Hugging Face's Llama-family code computes every RMSNorm and the eager softmax in
float32 whatever the model's dtype (a choice made for half precision), so its float64 run
is only float32-accurate there, and a float64 re-check could not tell rounding from a bug.
When the Hugging Face model is float64, the reference run therefore uses the same two
formulas in float64: each norm's ``weight * (x * rsqrt(mean(x^2) + eps))`` and the eager
attention with its softmax in the input's dtype (registered with ``transformers``'
``AttentionInterface`` under ``FLOAT64_ATTENTION``). Every other dtype runs Hugging Face's
code unchanged. The rotary cos/sin stay float32 in both models: that is the models' math.

Padding: with an ``attention_mask``, Hugging Face's forward would number positions
``0 .. pos-1`` through the padding, while ours (and Hugging Face's ``generate``) count
from each row's first real token; the reference is run with those ``position_ids``.
"""

import contextlib
import sys
import types

import einops
import torch
from jaxtyping import Int
from torch import Tensor

SPLIT_HEADS = "batch pos (head_index d_head) -> batch pos head_index d_head"
FLOAT64_ATTENTION = "interp_transformer_eager_in_input_dtype"


def positions_from_mask(attention_mask: Int[Tensor, "batch pos"]) -> Int[Tensor, "batch pos"]:
    """Position ids counted from each row's first real token (padding: the last real position before it, or 0)."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def _rms_scale(norm):
    """``sqrt(mean(x^2) + eps)`` of a Hugging Face RMSNorm's input, as our ``hook_scale`` holds it."""
    eps = norm.variance_epsilon
    return lambda x: (x.pow(2).mean(dim=-1, keepdim=True) + eps).sqrt()


def hf_reference_activations(hf_model, tokens: Int[Tensor, "batch pos"], **forward_kwargs) -> dict[str, Tensor]:
    """Run a Hugging Face Llama-family model and return its value for each of our hooks (see the module docstring)."""
    body = hf_model.model if hasattr(hf_model, "model") else hf_model
    d_head = body.layers[0].self_attn.head_dim
    acts: dict[str, Tensor] = {}
    rotary_inputs: dict[int, tuple] = {}  # layer -> (cos, sin) Hugging Face gave its attention
    handles = []

    def on_output(module, name: str, transform=lambda out: out):
        def hook(m, args, out):
            acts[name] = transform(out[0] if isinstance(out, tuple) else out).detach()  # attention returns (out, pattern)

        handles.append(module.register_forward_hook(hook))

    def on_input(module, name: str, transform=lambda x: x):
        def hook(m, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            acts[name] = transform(x).detach()

        handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))

    def on_norm(norm, prefix: str):
        on_input(norm, prefix + "hook_scale", _rms_scale(norm))
        on_output(norm, prefix + "hook_normalized")

    def split(out):
        return einops.rearrange(out, SPLIT_HEADS, d_head=d_head)

    on_output(body.embed_tokens, "hook_embed")
    for layer, block in enumerate(body.layers):
        q, attn = f"blocks.{layer}.", block.self_attn
        on_input(block, q + "hook_resid_pre")
        on_norm(block.input_layernorm, q + "ln1.")
        for letter in "qkv":
            on_output(getattr(attn, f"{letter}_proj"), q + f"attn.hook_{letter}", split)
        if hasattr(attn, "q_norm"):
            on_norm(attn.q_norm, q + "attn.q_norm.")
            on_norm(attn.k_norm, q + "attn.k_norm.")
        handles.append(attn.register_forward_pre_hook(
            lambda m, args, kwargs, layer=layer: rotary_inputs.__setitem__(layer, kwargs["position_embeddings"]),
            with_kwargs=True,
        ))
        handles.append(attn.register_forward_hook(
            lambda m, args, out, q=q: acts.__setitem__(q + "attn.hook_pattern", out[1].detach())
        ))
        on_input(attn.o_proj, q + "attn.hook_z", split)
        on_output(attn, q + "hook_attn_out")
        on_input(block.post_attention_layernorm, q + "hook_resid_mid")
        on_norm(block.post_attention_layernorm, q + "ln2.")
        on_output(block.mlp.gate_proj, q + "mlp.hook_pre")
        on_output(block.mlp.up_proj, q + "mlp.hook_pre_linear")
        on_input(block.mlp.down_proj, q + "mlp.hook_post")
        on_output(block.mlp, q + "hook_mlp_out")
        on_output(block, q + "hook_resid_post")
    on_norm(body.norm, "ln_final.")

    mask = forward_kwargs.get("attention_mask")
    if mask is not None and "position_ids" not in forward_kwargs:
        forward_kwargs = {**forward_kwargs, "position_ids": positions_from_mask(mask)}
    try:
        with _eager_reference_run(hf_model, float64=body.embed_tokens.weight.dtype == torch.float64), torch.no_grad():
            output = hf_model(tokens.to(body.embed_tokens.weight.device), use_cache=False, **forward_kwargs)
    finally:
        for handle in handles:
            handle.remove()
    _add_rotated(acts, body, rotary_inputs)
    if getattr(output, "logits", None) is not None:
        acts["logits"] = output.logits.detach()
    return acts


@contextlib.contextmanager
def _eager_reference_run(hf_model, float64: bool):
    """Eager attention (patterns visible) and eval mode for the call; in float64, norms and softmax in float64 too."""
    previous_attention, was_training = hf_model.config._attn_implementation, hf_model.training
    norms = [module for module in hf_model.modules() if hasattr(module, "variance_epsilon")] if float64 else []
    try:
        if float64:
            from transformers import AttentionInterface
            from transformers.masking_utils import AttentionMaskInterface, eager_mask

            AttentionInterface.register(FLOAT64_ATTENTION, _eager_attention_in_input_dtype)
            AttentionMaskInterface.register(FLOAT64_ATTENTION, eager_mask)
            for norm in norms:
                norm.forward = types.MethodType(_rms_norm_in_input_dtype, norm)
        hf_model.set_attn_implementation(FLOAT64_ATTENTION if float64 else "eager")
        hf_model.eval()
        yield
    finally:
        for norm in norms:
            norm.__dict__.pop("forward", None)
        hf_model.set_attn_implementation(previous_attention)
        hf_model.train(was_training)


def _rms_norm_in_input_dtype(norm, hidden_states: Tensor) -> Tensor:
    """Hugging Face's RMSNorm formula, ``weight * (x * rsqrt(mean(x^2) + eps))``, without its cast to float32."""
    variance = hidden_states.pow(2).mean(dim=-1, keepdim=True)
    return norm.weight * (hidden_states * torch.rsqrt(variance + norm.variance_epsilon))


def _eager_attention_in_input_dtype(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Hugging Face's eager attention (``[batch, head_index, pos, d_head]`` in, ``(z, pattern)`` out), softmax in the input's dtype."""
    repeat_kv = sys.modules[type(module).__module__].repeat_kv
    key, value = repeat_kv(key, module.num_key_value_groups), repeat_kv(value, module.num_key_value_groups)
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = weights.softmax(dim=-1)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def _add_rotated(acts: dict, body, rotary_inputs: dict) -> None:
    """``hook_rot_q``/``hook_rot_k``: Hugging Face's ``apply_rotary_pos_emb`` on its (normalized) q and k."""
    for layer, (cos, sin) in rotary_inputs.items():
        attn = body.layers[layer].self_attn
        apply_rotary = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        q = f"blocks.{layer}.attn."
        query = acts.get(q + "q_norm.hook_normalized", acts[q + "hook_q"])
        key = acts.get(q + "k_norm.hook_normalized", acts[q + "hook_k"])
        to_heads_first = "batch pos head_index d_head -> batch head_index pos d_head"
        rot_q, rot_k = apply_rotary(einops.rearrange(query, to_heads_first), einops.rearrange(key, to_heads_first), cos, sin)
        acts[q + "hook_rot_q"] = einops.rearrange(rot_q, "batch head_index pos d_head -> batch pos head_index d_head")
        acts[q + "hook_rot_k"] = einops.rearrange(rot_k, "batch head_index pos d_head -> batch pos head_index d_head")


__all__ = ["FLOAT64_ATTENTION", "hf_reference_activations", "positions_from_mask"]
