"""Tiny GGUF files of the Qwen, Qwen-MoE, Phi-3, GPT-2 and Gemma architectures, written as llama.cpp writes them.

``write_family_gguf`` renames each tensor with this module's own table of llama.cpp
names (independent of the reader's), adds 1 to Gemma's norm gains (llama.cpp's
``norm_shift``), stores each tensor in the ggml type asked for, and writes the metadata
llama.cpp writes for the family (sliding window, soft-caps). It returns what each Hugging
Face tensor should read back as. ``gemma_vocabulary`` is a small SentencePiece-style
vocabulary laid out as Gemma's: control tokens, user-defined newline and space runs,
the 256 byte pieces, then pieces in merge order.
"""

from pathlib import Path

import numpy as np
import torch

from .gguf_helpers import CORPUS, Q, encode, gguf

GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
COMMON = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
# the norm before the MLP is ffn_norm in every family; Gemma 2/3's post_attention_layernorm is the norm after attention
BLOCK = {
    "qwen2": {**COMMON, "post_attention_layernorm": "ffn_norm"},
    "qwen3": {**COMMON, "post_attention_layernorm": "ffn_norm"},
    "gemma": {**COMMON, "post_attention_layernorm": "ffn_norm"},
    "gemma2": {
        **COMMON,
        "post_attention_layernorm": "post_attention_norm",
        "pre_feedforward_layernorm": "ffn_norm",
        "post_feedforward_layernorm": "post_ffw_norm",
    },
}
BLOCK["gemma3"] = BLOCK["gemma2"]
# llama.cpp's MoE names; the experts are stacked [expert, rows, columns], Hugging Face's gate_up_proj split in two
MOE = {
    **{hf: gguf for hf, gguf in COMMON.items() if not hf.startswith("mlp.")},
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate": "ffn_gate_inp",
    "mlp.experts.down_proj": "ffn_down_exps",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
    "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
}
BLOCK["qwen2moe"] = BLOCK["qwen3moe"] = MOE
# GPT-2: transformer.* names, and Conv1D weights ([d_in, d_out]) that llama.cpp writes transposed
GPT2_GLOBAL = {"transformer.wte": "token_embd", "transformer.wpe": "position_embd", "transformer.ln_f": "output_norm"}
BLOCK["gpt2"] = {
    "ln_1": "attn_norm",
    "attn.c_attn": "attn_qkv",
    "attn.c_proj": "attn_output",
    "ln_2": "ffn_norm",
    "mlp.c_fc": "ffn_up",
    "mlp.c_proj": "ffn_down",
}
GPT2_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
BLOCK["phi3"] = {
    "input_layernorm": "attn_norm",
    "self_attn.qkv_proj": "attn_qkv",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
GEMMA = ("gemma", "gemma2", "gemma3")
CONTROL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
USER_DEFINED = ["\n", "\n\n", "  ", "   ", "\t"]


def gguf_tensor_name(hf_name: str, arch: str) -> str:
    if hf_name.endswith("experts.down_proj"):  # a stacked parameter with no .weight of its own
        hf_name += ".weight"
    base, _, kind = hf_name.rpartition(".")
    if base in GLOBAL or base in GPT2_GLOBAL:
        return f"{GLOBAL.get(base) or GPT2_GLOBAL[base]}.{kind}"
    _, _, layer, part = base.split(".", 3)
    return f"blk.{layer}.{BLOCK[arch][part]}.{kind}"


def gguf_tensors(hf_name: str, array: np.ndarray, arch: str) -> list[tuple[str, np.ndarray]]:
    """The llama.cpp tensors one Hugging Face tensor becomes: the stacked experts' gate_up_proj is two (gate rows
    first), the shared expert's gate [1, d_model] loses its leading dimension."""
    if hf_name.endswith("experts.gate_up_proj"):
        layer = hf_name.split(".")[2]
        gate, up = np.split(array, 2, axis=1)
        return [(f"blk.{layer}.ffn_gate_exps.weight", gate), (f"blk.{layer}.ffn_up_exps.weight", up)]
    if hf_name.endswith("shared_expert_gate.weight"):
        return [(gguf_tensor_name(hf_name, arch), array[0])]
    if arch == "gpt2" and hf_name.endswith(GPT2_CONV1D):
        return [(gguf_tensor_name(hf_name, arch), np.ascontiguousarray(array.T))]
    return [(gguf_tensor_name(hf_name, arch), array)]


def gemma_vocabulary() -> tuple[list[str], list[int]]:
    """(tokens, token types) of a Gemma-style SentencePiece vocabulary learned on ``CORPUS`` (spaces as ▁)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never", split=False)
    trainer = trainers.BpeTrainer(vocab_size=300, show_progress=False)
    tokenizer.train_from_iterator(CORPUS, trainer)
    import json

    model = json.loads(tokenizer.to_str())["model"]
    alphabet = [token for token in model["vocab"] if len(token) == 1]
    merged = ["".join(merge if isinstance(merge, list) else merge.split(" ")) for merge in model["merges"]]
    taken = set(CONTROL_TOKENS + USER_DEFINED) | {token.replace(" ", "\u2581") for token in USER_DEFINED}
    pieces = [piece for piece in dict.fromkeys(alphabet + merged) if piece not in taken]
    bytes_ = [f"<0x{byte:02X}>" for byte in range(256)]
    tokens = CONTROL_TOKENS + USER_DEFINED + bytes_ + pieces
    types = [3] * len(CONTROL_TOKENS) + [4] * len(USER_DEFINED) + [6] * 256 + [1] * len(pieces)
    return tokens, types


def write_family_gguf(
    path: Path,
    hf_model,
    arch: str,
    *,
    types: dict[str, Q] | None = None,
    tokens: tuple[list[str], list[int]] | None = None,
    extra_metadata: dict | None = None,
) -> dict[str, torch.Tensor]:
    """Write ``hf_model`` as llama.cpp's converter would for ``arch``; return what each tensor should read back as."""
    config = hf_model.config
    if arch == "gpt2":
        return _write_gpt2(path, hf_model, types)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    if arch in ("qwen2moe", "qwen3moe"):
        writer.add_expert_count(config.num_experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
        writer.add_expert_feed_forward_length(config.moe_intermediate_size)
        if arch == "qwen2moe":
            writer.add_expert_shared_feed_forward_length(config.shared_expert_intermediate_size)
    else:  # llama.cpp leaves out the dense width of an all-expert model
        writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    rope = config.rope_parameters.get("full_attention", config.rope_parameters)
    writer.add_rope_freq_base(rope["rope_theta"])
    if arch in ("gemma2", "gemma3"):
        writer.add_sliding_window(config.sliding_window)
    if arch == "phi3":  # llama.cpp writes 0 for none
        writer.add_sliding_window(config.sliding_window or 0)
        writer.add_rope_dimension_count(config.head_dim)
    if arch == "gemma2":
        writer.add_float32(f"{arch}.attn_logit_softcapping", config.attn_logit_softcapping)
        writer.add_float32(f"{arch}.final_logit_softcapping", config.final_logit_softcapping)
    for key, value in (extra_metadata or {}).items():
        if isinstance(value, float):
            writer.add_float32(key.format(arch=arch), value)
        else:
            writer.add_uint32(key.format(arch=arch), value)
    if tokens is not None:
        pieces, kinds = tokens
        writer.add_tokenizer_model("llama")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(pieces)
        writer.add_token_scores([-float(index) for index in range(len(pieces))])
        writer.add_token_types(kinds)
        writer.add_bos_token_id(pieces.index("<bos>"))
        writer.add_eos_token_id(pieces.index("<eos>"))
        writer.add_pad_token_id(pieces.index("<pad>"))
        writer.add_unk_token_id(pieces.index("<unk>"))
        writer.add_add_bos_token(True)
    return _write_tensors(writer, hf_model, arch, types)


def _write_gpt2(path: Path, hf_model, types: dict[str, Q] | None) -> dict[str, torch.Tensor]:
    """GPT-2's metadata as llama.cpp writes it; its converter writes output.weight (a copy of wte) too."""
    config = hf_model.config
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_block_count(config.n_layer)
    writer.add_context_length(config.n_positions)
    writer.add_embedding_length(config.n_embd)
    writer.add_feed_forward_length(config.n_inner or 4 * config.n_embd)
    writer.add_head_count(config.n_head)
    writer.add_layer_norm_eps(config.layer_norm_epsilon)
    return _write_tensors(writer, hf_model, "gpt2", types)


def _write_tensors(writer, hf_model, arch: str, types: dict[str, Q] | None) -> dict[str, torch.Tensor]:
    config = hf_model.config
    expected = {}
    for seed, (name, tensor) in enumerate(hf_model.state_dict().items()):
        if name == "lm_head.weight" and config.tie_word_embeddings and arch != "gpt2":
            continue
        read_back = []
        for gguf_name, array in gguf_tensors(name, tensor.numpy(), arch):
            shift = 1.0 if arch in GEMMA and gguf_name.endswith("norm.weight") else 0.0
            array = array + shift
            qtype = Q.F32 if array.ndim == 1 else (types or {}).get(gguf_name, Q.F32)
            stored = encode(array, qtype, seed)
            if qtype in (Q.F32, Q.F16):
                writer.add_tensor(gguf_name, stored)
                values = stored.astype(np.float32)
            else:
                writer.add_tensor(gguf_name, stored, raw_dtype=qtype)
                values = gguf.quants.dequantize(stored, qtype)
            read_back.append(values - shift)
        values = np.concatenate(read_back, axis=1) if len(read_back) > 1 else read_back[0]
        values = values.T if arch == "gpt2" and name.endswith(GPT2_CONV1D) else values
        expected[name] = torch.from_numpy(np.ascontiguousarray(values.reshape(tensor.shape)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected
