"""Gemma's GGUF entries: ``gemma`` (norms stored as ``1 + w``, ``norm_offset``), ``gemma2`` (as ``gemma``, with norms
after each sublayer: ``post_attention_norm`` is Hugging Face's ``post_attention_layernorm``, ``ffn_norm`` its
``pre_feedforward_layernorm``; soft-caps and the sliding window from the metadata) and ``gemma3`` (as ``gemma2``
with q/k norms and no attention soft-cap; the sliding layers' rotary base ``rope.freq_base_swa``, 10,000 where
absent).

What a file does not say is what llama.cpp assumes: Gemma 2/3 scale queries by ``d_head^-1/2``
(``query_pre_attn_scalar = d_head``; ``d_model / n_heads`` for the 27B sizes, told apart by their layer count),
Gemma 3 has five sliding layers to one global, the activation is GELU (tanh); the config class's defaults say the
same.
"""

from collections.abc import Mapping
from typing import Any

from interp_transformer.families.gguf_entry import (
    LLAMA_BLOCK_TENSORS,
    QK_NORM_TENSORS,
    GGUFArchitecture,
    metadata_float,
    metadata_int,
    rope_parameters,
    sliding_window,
    soft_cap,
)

# Gemma 2/3: a norm after each sublayer; the one llama.cpp calls ffn_norm is the norm *before* the MLP
SANDWICH_BLOCK_TENSORS = {
    **LLAMA_BLOCK_TENSORS,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
GEMMA_LOCAL_ROPE_BASE = 10000.0  # Gemma 3's sliding layers, which llama.cpp's converter does not write down


# llama.cpp's 27B Gemmas (by layer count) scale queries by (d_model / n_heads)^-1/2, the others by d_head^-1/2
GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def _query_scale(metadata: Mapping[str, Any], arch: str) -> dict:
    """``query_pre_attn_scalar`` as llama.cpp computes it, which the file does not store."""
    if metadata_int(metadata, f"{arch}.block_count") == GEMMA_27B_LAYERS[arch]:
        hidden = metadata_int(metadata, f"{arch}.embedding_length")
        return {"query_pre_attn_scalar": hidden // metadata_int(metadata, f"{arch}.attention.head_count")}
    return {"query_pre_attn_scalar": metadata_int(metadata, f"{arch}.attention.key_length")}


def _gemma2_fields(metadata: Mapping[str, Any], arch: str) -> dict:
    return {
        **_query_scale(metadata, arch),
        **sliding_window(metadata, arch),
        **soft_cap(metadata, arch, "attn_logit_softcapping"),
        **soft_cap(metadata, arch, "final_logit_softcapping"),
    }


def _gemma3_layer_types(metadata: Mapping[str, Any], arch: str, layers: int) -> dict:
    """``layer_types`` from ``{arch}.attention.sliding_window_pattern`` where the file has it (a period, or one bool
    per layer: True = sliding); the config class's default pattern otherwise."""
    key = f"{arch}.attention.sliding_window_pattern"
    pattern = metadata.get(key)
    if pattern is None:
        return {}
    if isinstance(pattern, list) and len(pattern) == layers and all(isinstance(item, bool) for item in pattern):
        return {"layer_types": ["sliding_attention" if sliding else "full_attention" for sliding in pattern]}
    period = metadata_int(metadata, key)
    return {"layer_types": ["full_attention" if (i + 1) % period == 0 else "sliding_attention" for i in range(layers)]}


def _gemma3_fields(metadata: Mapping[str, Any], arch: str) -> dict:
    head_dim = metadata_int(metadata, f"{arch}.attention.key_length")
    local_base = metadata_float(metadata, f"{arch}.rope.freq_base_swa", GEMMA_LOCAL_ROPE_BASE)
    return {
        **_query_scale(metadata, arch),
        **sliding_window(metadata, arch),
        **soft_cap(metadata, arch, "final_logit_softcapping"),
        **_gemma3_layer_types(metadata, arch, metadata_int(metadata, f"{arch}.block_count")),
        "rope_parameters": {
            "full_attention": rope_parameters(metadata, arch, head_dim),
            "sliding_attention": {"rope_type": "default", "rope_theta": local_base},
        },
    }


_GEMMA: dict[str, Any] = dict(permuted_qk=False, norm_offset=1.0, sentencepiece_by_file_order=True)


ARCHITECTURES = {
    "gemma": GGUFArchitecture("GemmaConfig", "GemmaForCausalLM", **_GEMMA),
    "gemma2": GGUFArchitecture(
        "Gemma2Config", "Gemma2ForCausalLM", block_tensors=SANDWICH_BLOCK_TENSORS, extra_fields=_gemma2_fields, **_GEMMA
    ),
    "gemma3": GGUFArchitecture(
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        block_tensors={**SANDWICH_BLOCK_TENSORS, **QK_NORM_TENSORS},
        extra_fields=_gemma3_fields,
        **_GEMMA,
    ),
}


__all__ = ["ARCHITECTURES"]
