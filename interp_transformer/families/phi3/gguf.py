"""Phi-3's GGUF entry: fused ``attn_qkv`` (Hugging Face's ``qkv_proj``) and ``ffn_up`` (gate rows then up rows:
``gate_up_proj``); the sliding window (0: none).
"""

from collections.abc import Mapping
from typing import Any

from interp_transformer.families.gguf_entry import LLAMA_BLOCK_TENSORS, GGUFArchitecture, metadata_int


def _phi3_fields(metadata: Mapping[str, Any], arch: str) -> dict:
    """Phi-3's sliding window (0: none), and the context length its rotary base was trained for."""
    key = f"{arch}.attention.sliding_window"
    window = None if metadata.get(key, 0) == 0 else metadata_int(metadata, key)
    context = metadata_int(metadata, f"{arch}.context_length")
    original = metadata_int(metadata, f"{arch}.rope.scaling.original_context_length", context)
    return {"sliding_window": window, "original_max_position_embeddings": original}


# Phi-3 keeps Hugging Face's fused projections: q/k/v rows in one tensor, gate rows then up rows in another
PHI3_BLOCK_TENSORS = {part: LLAMA_BLOCK_TENSORS[part] for part in ("attn_norm", "attn_output", "ffn_norm", "ffn_down")}
PHI3_BLOCK_TENSORS.update(attn_qkv="self_attn.qkv_proj", ffn_up="mlp.gate_up_proj")


ARCHITECTURES = {
    "phi3": GGUFArchitecture(
        "Phi3Config", "Phi3ForCausalLM", permuted_qk=False, block_tensors=PHI3_BLOCK_TENSORS, extra_fields=_phi3_fields
    ),
}


__all__ = ["ARCHITECTURES"]
