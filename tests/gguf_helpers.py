"""Tiny GGUF files written the way llama.cpp's converter writes them, from random-weight Hugging Face Llamas.

``write_llama_gguf`` renames each tensor to llama.cpp's name (its own table here,
independent of the reader's), reorders the rows of ``q_proj`` / ``k_proj`` the way
llama.cpp's ``convert_hf_to_gguf.py`` does (``LlamaModel.permute``), stores each
tensor in the ggml type asked for (quantized with the ``gguf`` package) and
records what a reader should get back: the Hugging Face tensor after the
quantization round trip. K-quants, which the ``gguf`` package cannot quantize,
are written as random blocks with finite scales.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "The capital of France is Paris. The capital of Italy is Rome.",
    "In 2024 there were 365 days; in 1999, 12 months and 52 weeks.",
    "def square(x):\n    return x * x\n\n",
    "naïve café résumé, Straße, 日本語, emoji 😀 and more text about the world.",
    "the quick brown fox jumps over the lazy dog " * 3,
]
# Where the float16 scales of a K-quant block sit (bytes), so random blocks can be given finite ones.
K_QUANT_SCALES = {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}
BLOCK_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def tiny_vocabulary() -> tuple[list[str], list[str]]:
    """(tokens in id order, merges) of a small byte-level BPE trained on ``CORPUS``; special tokens first."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=420,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    model = json.loads(tokenizer.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in model["merges"]]
    return tokens, merges


def tiny_llama(vocab_size: int, seed: int = 0, **overrides) -> LlamaForCausalLM:
    """A random Llama whose row lengths (256, 512) fit every block size, K-quants' 256 included."""
    settings = dict(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        rms_norm_eps=1e-5,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    settings.update(overrides)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**settings)).eval()
    with torch.no_grad():  # norms start at 1: make them matter
        for param in model.parameters():
            if param.ndim == 1:
                param.add_(torch.randn(param.shape) * 0.1)
    return model


def gguf_name(hf_name: str) -> str:
    globals_ = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if hf_name in globals_:
        return globals_[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    part, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{BLOCK_NAMES[part]}.{kind}"


def llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """``LlamaModel.permute`` of llama.cpp's converter: each head's rows from (pair, half) to (half, pair)."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def llama_cpp_unpermute(weights: np.ndarray, n_head: int) -> np.ndarray:
    return (
        weights.reshape(n_head, weights.shape[0] // n_head // 2, 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def random_k_blocks(qtype: Q, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Random bytes of a K-quant tensor of ``shape``, with small finite float16 scales."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(int(np.prod(shape)) // block_size, type_size), dtype=np.uint8)
    for offset in K_QUANT_SCALES[qtype]:
        scales = rng.uniform(0.001, 0.01, size=blocks.shape[0]).astype(np.float16)
        blocks[:, offset : offset + 2] = scales.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(*shape[:-1], -1)


def encode(array: np.ndarray, qtype: Q, seed: int) -> np.ndarray:
    """``array`` stored as ``qtype`` (bytes, or float arrays for F32/F16)."""
    if qtype == Q.F32:
        return array.astype(np.float32)
    if qtype == Q.F16:
        return array.astype(np.float16)
    if qtype in K_QUANT_SCALES:
        return random_k_blocks(qtype, array.shape, seed)
    return gguf.quants.quantize(array.astype(np.float32), qtype)


def write_llama_gguf(
    path: Path,
    hf_model: LlamaForCausalLM,
    *,
    types: dict[str, Q] | None = None,
    architecture: str = "llama",
    pre: str = "gpt2",
    tokenizer_model: str = "gpt2",
    extra_metadata: dict | None = None,
    respell: dict[str, str] | None = None,
) -> dict[str, torch.Tensor]:
    """Write ``hf_model`` as llama.cpp would; return what each Hugging Face tensor should read back as.

    ``types`` maps GGUF names to ggml types (default F32; 1-D norms always F32,
    as llama.cpp keeps them). ``extra_metadata`` adds or replaces metadata keys
    (``{arch}`` in a key is the architecture). ``respell`` writes some tokens in
    another spelling (e.g. raw text instead of GPT-2's byte alphabet).
    """
    config = hf_model.config
    tokens, merges = tiny_vocabulary()
    tokens = [(respell or {}).get(token, token) for token in tokens]
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_vocab_size(config.vocab_size)
    writer.add_tokenizer_model(tokenizer_model)
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3 if token in SPECIAL_TOKENS else 1 for token in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(config.bos_token_id)
    writer.add_eos_token_id(config.eos_token_id)
    writer.add_pad_token_id(config.pad_token_id)
    writer.add_add_bos_token(False)
    for key, value in (extra_metadata or {}).items():
        key = key.format(arch=architecture)
        writer.kv_data[0].pop(key, None)
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, value)

    expected = {}
    heads = {"q_proj": config.num_attention_heads, "k_proj": config.num_key_value_heads}
    for seed, (name, tensor) in enumerate(hf_model.state_dict().items()):
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        array = tensor.numpy()
        n_head = heads.get(name.split(".")[-2])
        stored_order = llama_cpp_permute(array, n_head) if n_head else array
        qtype = Q.F32 if array.ndim == 1 else (types or {}).get(gguf_name(name), Q.F32)
        stored = encode(stored_order, qtype, seed)
        if qtype in (Q.F32, Q.F16):
            writer.add_tensor(gguf_name(name), stored)
            values = stored.astype(np.float32)
        else:
            writer.add_tensor(gguf_name(name), stored, raw_dtype=qtype)
            values = gguf.quants.dequantize(stored, qtype)
        expected[name] = torch.from_numpy(
            np.ascontiguousarray(llama_cpp_unpermute(values, n_head) if n_head else values)
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


def hand_dequantize(blocks: np.ndarray, qtype: Q) -> np.ndarray:
    """Q8_0 and Q4_1 decoded from ggml's block layout directly, without the gguf package."""
    rows = blocks.reshape(-1, blocks.shape[-1])
    type_size = gguf.GGML_QUANT_SIZES[qtype][1]
    blocks = rows.reshape(-1, type_size)
    scale = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    if qtype == Q.Q8_0:  # d, then 32 int8: d * q
        values = scale * blocks[:, 2:].copy().view(np.int8).astype(np.float32)
    elif qtype == Q.Q4_1:  # d, m, then 16 bytes: low nibbles are values 0..15, high nibbles 16..31: d * q + m
        minimum = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
        packed = blocks[:, 4:]
        nibbles = np.concatenate([packed & 0x0F, packed >> 4], axis=1).astype(np.float32)
        values = scale * nibbles + minimum
    else:
        raise ValueError(f"no hand decoder for {qtype.name}")
    return values.reshape(rows.shape[0], -1)
