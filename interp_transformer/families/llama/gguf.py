"""Llama's GGUF entries: ``llama`` (q/k rows reordered for llama.cpp's rotary layout, ``permuted_qk``; attention / MLP
biases when their tensors are present), ``qwen2`` (q/k/v biases, always; no reordering) and ``qwen3`` (per-head q/k
norms, ``attn_q_norm``; ``attention_bias`` from its tensors).
"""

from interp_transformer.families.gguf_entry import LLAMA_BLOCK_TENSORS, QK_NORM_TENSORS, GGUFArchitecture

ARCHITECTURES = {
    "llama": GGUFArchitecture(
        "LlamaConfig",
        "LlamaForCausalLM",
        permuted_qk=True,
        flags_from_tensors=(("attention_bias", ".attn_q.bias"), ("mlp_bias", ".ffn_up.bias")),
    ),
    "qwen2": GGUFArchitecture("Qwen2Config", "Qwen2ForCausalLM", permuted_qk=False),
    "qwen3": GGUFArchitecture(
        "Qwen3Config",
        "Qwen3ForCausalLM",
        permuted_qk=False,
        flags_from_tensors=(("attention_bias", ".attn_q.bias"),),
        block_tensors={**LLAMA_BLOCK_TENSORS, **QK_NORM_TENSORS},
    ),
}


__all__ = ["ARCHITECTURES"]
