"""GPT-2's GGUF entry: ``transformer.*`` names, ``position_embd``, fused ``attn_qkv``, LayerNorm and linear biases;
``attn_qkv`` / ``attn_output`` / ``ffn_up`` / ``ffn_down`` stored transposed (Hugging Face's ``Conv1D`` keeps
``[d_in, d_out]``).
"""

from collections.abc import Mapping
from typing import Any

from interp_transformer.families.gguf_entry import GGUFArchitecture, metadata_float, metadata_int


def _gpt2_fields(metadata: Mapping[str, Any], arch: str) -> dict:
    """``GPT2Config``'s fields; llama.cpp's GELU is the tanh approximation (``gelu_new``)."""
    heads = metadata_int(metadata, f"{arch}.attention.head_count")
    kv_heads = metadata_int(metadata, f"{arch}.attention.head_count_kv", heads)
    if kv_heads != heads:
        raise ValueError(f"GPT-2 has one key/value head per query head: head_count_kv={kv_heads}, head_count={heads}")
    return dict(
        n_embd=metadata_int(metadata, f"{arch}.embedding_length"),
        n_layer=metadata_int(metadata, f"{arch}.block_count"),
        n_head=heads,
        n_positions=metadata_int(metadata, f"{arch}.context_length"),
        n_inner=metadata_int(metadata, f"{arch}.feed_forward_length"),
        layer_norm_epsilon=metadata_float(metadata, f"{arch}.attention.layer_norm_epsilon"),
        activation_function="gelu_new",
    )


GPT2_GLOBAL_TENSORS = {"token_embd": "transformer.wte", "position_embd": "transformer.wpe", "output": "lm_head"}
GPT2_GLOBAL_TENSORS["output_norm"] = "transformer.ln_f"
GPT2_BLOCK_TENSORS = {"attn_norm": "ln_1", "attn_qkv": "attn.c_attn", "attn_output": "attn.c_proj", "ffn_norm": "ln_2"}
GPT2_BLOCK_TENSORS.update(ffn_up="mlp.c_fc", ffn_down="mlp.c_proj")


ARCHITECTURES = {
    "gpt2": GGUFArchitecture(
        "GPT2Config",
        "GPT2LMHeadModel",
        permuted_qk=False,
        block_tensors=GPT2_BLOCK_TENSORS,
        global_tensors=GPT2_GLOBAL_TENSORS,
        block_prefix="transformer.h",
        transposed_tensors=frozenset({"attn_qkv", "attn_output", "ffn_up", "ffn_down"}),
        config_fields=_gpt2_fields,
    ),
}


__all__ = ["ARCHITECTURES"]
