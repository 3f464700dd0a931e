"""Hugging Face's value of each of our hooks in an OLMo 2 or OLMo 3 model (``Olmo2ForCausalLM``, ``Olmo3ForCausalLM``).

Read with torch hooks on Hugging Face's modules (``reference``): the token embedding, each
block's residual stream (``resid_mid`` is what its MLP reads), q/k/v before rotation
(``q_proj``/``k_proj``/``v_proj`` outputs), the q/k norms over all heads (their outputs, split
into heads; their ``hook_scale`` from their inputs, one per position), the rotated q/k (derived,
as for the Llama family, from the cos/sin each layer was handed: OLMo 3's sliding layers get
their own), patterns, z, the norms after attention and after the MLP (``post_attention_layernorm``
is our ``ln1_post``, ``post_feedforward_layernorm`` our ``ln2_post``; their outputs are
``hook_attn_out`` and ``hook_mlp_out``), the gated MLP's three hooks, the final norm and the
logits. Not mapped: ``hook_attn_scores`` (Hugging Face masks with the dtype's minimum, not ``-inf``).

Float64 (see ``reference``): Hugging Face computes OLMo's RMSNorms in float32; a float64
reference run computes each as ``weight * (x * rsqrt(mean(x^2) + eps))`` in float64 (the
Llama family's patch) and runs the eager attention with its softmax in float64.
"""

from jaxtyping import Int
from torch import Tensor

from interp_transformer.families.llama.reference import llama_float64_patches, record_gated_mlp
from interp_transformer.families.reference import (
    HFModule,
    Recorder,
    norm_eps,
    norm_scale,
    reference_activations,
    split_heads,
)


def record_all_heads_norm(rec: Recorder, norm: HFModule, prefix: str, d_head: int) -> None:
    """A Hugging Face RMSNorm over ``[batch, pos, (head_index d_head)]`` as our ``AllHeadsRMSNorm``'s two hooks."""
    eps = norm_eps(norm)
    rec.input(norm, prefix + "hook_scale", lambda x: norm_scale(x, eps, centred=False))
    rec.output(norm, prefix + "hook_normalized", split_heads(d_head=d_head))


def record_attention(rec: Recorder, attn: HFModule, prefix: str, rotary_inputs: dict, layer: int) -> None:
    """q/k/v before the norms and the rotation, the q/k norms, the pattern and z of one OLMo attention."""
    split = split_heads(d_head=attn.head_dim)
    for letter in "qkv":
        rec.output(getattr(attn, f"{letter}_proj"), prefix + f"attn.hook_{letter}", split)
    record_all_heads_norm(rec, attn.q_norm, prefix + "attn.q_norm.", attn.head_dim)
    record_all_heads_norm(rec, attn.k_norm, prefix + "attn.k_norm.", attn.head_dim)
    rec.kwargs(attn, lambda kwargs: rotary_inputs.__setitem__(layer, kwargs["position_embeddings"]))
    rec.output(attn, prefix + "attn.hook_pattern", index=1)
    rec.input(attn.o_proj, prefix + "attn.hook_z", split)


def _record_block(rec: Recorder, block: HFModule, prefix: str, rotary_inputs: dict, layer: int) -> None:
    rec.input(block, prefix + "hook_resid_pre")
    record_attention(rec, block.self_attn, prefix, rotary_inputs, layer)
    rec.norm(block.post_attention_layernorm, prefix + "ln1_post.", centred=False)
    rec.output(block.post_attention_layernorm, prefix + "hook_attn_out")
    rec.input(block.mlp, prefix + "hook_resid_mid")
    record_gated_mlp(rec, block.mlp, prefix + "mlp.")
    rec.norm(block.post_feedforward_layernorm, prefix + "ln2_post.", centred=False)
    rec.output(block.post_feedforward_layernorm, prefix + "hook_mlp_out")
    rec.output(block, prefix + "hook_resid_post")


def hf_reference_activations(hf_model, tokens: Int[Tensor, "batch pos"], **forward_kwargs) -> dict[str, Tensor]:
    """Run a Hugging Face OLMo 2 or OLMo 3 model and return its value for each of our hooks (module docstring)."""
    return reference_activations(hf_model, tokens, forward_kwargs, _record_block, llama_float64_patches)


__all__ = ["hf_reference_activations", "record_all_heads_norm", "record_attention"]
