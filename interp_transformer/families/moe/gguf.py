"""The mixtures of experts' GGUF entries: ``qwen2moe`` (experts stacked: ``ffn_gate_exps`` / ``ffn_up_exps`` joined
into Hugging Face's ``experts.gate_up_proj``, ``ffn_down_exps``; the router ``ffn_gate_inp``; a shared expert,
``ffn_*_shexp``, whose gate ``ffn_gate_inp_shexp`` lost its leading dimension; ``expert_*`` metadata) and
``qwen3moe`` (as ``qwen2moe`` without the shared expert, with q/k norms). llama.cpp's MoE files make every layer
sparse and renormalise the chosen routing weights of Qwen3-MoE (``norm_topk_prob``), not of Qwen2-MoE.
"""

from collections.abc import Mapping
from typing import Any

from interp_transformer.families.gguf_entry import LLAMA_BLOCK_TENSORS, QK_NORM_TENSORS, GGUFArchitecture, metadata_int


def _moe_fields(metadata: Mapping[str, Any], arch: str) -> dict:
    """Experts from ``{arch}.expert_*``; llama.cpp makes every layer sparse and renormalises Qwen3-MoE's top-k
    routing weights (not Qwen2-MoE's), which its files do not say."""
    fields: dict[str, Any] = dict(
        num_experts=metadata_int(metadata, f"{arch}.expert_count"),
        num_experts_per_tok=metadata_int(metadata, f"{arch}.expert_used_count"),
        moe_intermediate_size=metadata_int(metadata, f"{arch}.expert_feed_forward_length"),
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=arch == "qwen3moe",
    )
    if fields["num_experts_per_tok"] > fields["num_experts"]:
        raise ValueError(
            f"{arch}.expert_used_count={fields['num_experts_per_tok']} exceeds {arch}.expert_count="
            f"{fields['num_experts']}"
        )
    if arch == "qwen2moe":
        key = f"{arch}.expert_shared_feed_forward_length"
        fields["shared_expert_intermediate_size"] = metadata_int(metadata, key)
    return fields


# llama.cpp's stacked experts: [expert, rows, columns], as Hugging Face's model holds them in memory
MOE_BLOCK_TENSORS = {
    **{part: name for part, name in LLAMA_BLOCK_TENSORS.items() if not part.startswith("ffn_") or part == "ffn_norm"},
    "ffn_gate_inp": "mlp.gate",
}
MOE_BARE_TENSORS = {
    "ffn_gate_exps": "mlp.experts.gate_up_proj",
    "ffn_up_exps": "mlp.experts.gate_up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
}
MOE_JOINED_TENSORS = {"mlp.experts.gate_up_proj": ("ffn_gate_exps", "ffn_up_exps")}  # gate rows first
SHARED_EXPERT_TENSORS = {
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
_MOE: dict[str, Any] = dict(
    permuted_qk=False,
    extra_fields=_moe_fields,
    bare_tensors=MOE_BARE_TENSORS,
    joined_tensors=MOE_JOINED_TENSORS,
    feed_forward_fallback="expert_feed_forward_length",
)


ARCHITECTURES = {
    "qwen2moe": GGUFArchitecture(
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        block_tensors={**MOE_BLOCK_TENSORS, **SHARED_EXPERT_TENSORS},
        squeezed_tensors=frozenset({"ffn_gate_inp_shexp"}),
        **_MOE,
    ),
    "qwen3moe": GGUFArchitecture(
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        flags_from_tensors=(("attention_bias", ".attn_q.bias"),),
        block_tensors={**MOE_BLOCK_TENSORS, **QK_NORM_TENSORS},
        **_MOE,
    ),
}


__all__ = ["ARCHITECTURES"]
