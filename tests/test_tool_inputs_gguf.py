"""GGUF headers that contradict their tensors are refused by name, before any config or model is built.

Each file is a tiny one written as llama.cpp writes it (``gguf_helpers``, ``gguf_family_helpers``), then one
unsigned 32-bit metadata value is overwritten in place: the tensors stay as they were, so every refusal must
say which field disagrees with which tensor, and what the tensors imply instead.
"""

import re
import struct
import time
from types import SimpleNamespace

import pytest

from analysis.cli import main
from analysis.cli.common import EXIT_USAGE
from interp_transformer.loading.gguf import read_gguf

from .gguf_family_helpers import write_family_gguf
from .gguf_helpers import tiny_llama, tiny_vocabulary, write_llama_gguf
from .test_gguf_families import tiny

GGUF_UINT32 = 4


def with_metadata(source, target, key: str, value: int):
    """A copy of the file ``source`` whose unsigned 32-bit metadata ``key`` holds ``value``; tensors untouched."""
    data = bytearray(source.read_bytes())
    name = key.encode()
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)  # a key is its length, then its bytes
    if struct.unpack_from("<I", data, at)[0] != GGUF_UINT32:
        raise ValueError(f"{key} is not stored as uint32 in {source}")
    struct.pack_into("<I", data, at + 4, value)
    target.write_bytes(bytes(data))
    return target


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """One consistent file per architecture: llama (rope.dimension_count, no key_length), qwen3 (q/k norms),
    gemma2, phi3 (fused q/k/v), gpt2 (position embeddings) and qwen2moe (experts, a shared expert)."""
    folder = tmp_path_factory.mktemp("gguf-headers")
    written = {"llama": folder / "llama.gguf"}
    write_llama_gguf(written["llama"], tiny_llama(len(tiny_vocabulary()[0])))
    for arch in ("qwen3", "gemma2", "phi3", "gpt2", "qwen2moe"):
        written[arch] = folder / f"{arch}.gguf"
        write_family_gguf(written[arch], tiny(arch, 96, num_hidden_layers=2), arch)
    return written


def test_the_unpatched_files_read(files):
    for path in files.values():
        read_gguf(path, load_tokenizer=False)


# (arch, metadata field, the value written over the right one, what the tensors imply: None where they cannot say)
CONTRADICTIONS = [
    ("llama", "embedding_length", 200, 256),  # token_embd.weight is [420, 256]
    ("llama", "attention.head_count", 3, 4),  # 256 is no multiple of 3; q rows 256 / rope dims 64
    ("llama", "attention.head_count", 8, 4),  # d_head 256 / 8 = 32, but rope.dimension_count says 64
    ("llama", "attention.head_count_kv", 1, 2),  # k rows 128 = 2 heads of 64
    ("llama", "feed_forward_length", 100, 512),
    ("llama", "vocab_size", 5, 420),
    ("qwen3", "attention.key_length", 16, 32),  # attn_q_norm has 32 entries
    ("qwen3", "attention.head_count", 8, 4),  # q rows 128 = 4 heads of 32
    ("qwen3", "embedding_length", 128, 64),
    ("gemma2", "attention.head_count", 3, 4),  # transformers' own validator used to raise here
    ("gemma2", "attention.head_count_kv", 4, 2),
    ("gemma2", "feed_forward_length", 64, 128),
    ("phi3", "attention.head_count", 8, 4),  # attn_output has 128 columns = 4 heads of 32
    ("phi3", "attention.head_count_kv", 4, 2),  # attn_qkv rows 256 = (4 + 2 * 2) heads of 32
    ("phi3", "feed_forward_length", 64, 128),  # ffn_up holds gate and up rows: 256 = 2 * 128
    ("gpt2", "attention.head_count", 3, None),  # no whole d_head; GPT-2's fused q/k/v cannot say the count
    ("gpt2", "context_length", 32, 64),  # position_embd has 64 rows
    ("gpt2", "feed_forward_length", 100, 128),
    ("gpt2", "embedding_length", 32, 64),
    ("qwen2moe", "expert_count", 8, 4),
    ("qwen2moe", "expert_feed_forward_length", 16, 32),
    ("qwen2moe", "expert_shared_feed_forward_length", 16, 48),
]


@pytest.mark.parametrize("arch, field, value, implied", CONTRADICTIONS, ids=lambda item: str(item))
def test_a_header_field_contradicting_the_tensors_is_named(files, tmp_path, arch, field, value, implied):
    path = with_metadata(files[arch], tmp_path / "bad.gguf", f"{arch}.{field}", value)
    with pytest.raises(ValueError) as raised:
        read_gguf(path, load_tokenizer=False)
    message = str(raised.value)
    assert type(raised.value) is ValueError, (type(raised.value), message)  # not transformers' validator errors
    assert str(path) in message and f"{arch}.{field}={value} contradicts the tensors" in message, message
    if implied is not None:
        assert f"the tensors imply {field}={implied}" in message, message


@pytest.mark.parametrize("block_count", [10**9, 3, 1])
def test_block_count_must_match_the_blocks_present_and_is_refused_at_once(files, tmp_path, block_count):
    path = with_metadata(files["llama"], tmp_path / "blocks.gguf", "llama.block_count", block_count)
    start = time.perf_counter()
    with pytest.raises(ValueError, match=rf"llama\.block_count={block_count} contradicts the tensors") as raised:
        read_gguf(path, load_tokenizer=False)
    assert time.perf_counter() - start < 0.5
    assert "the tensors imply block_count=2" in str(raised.value) and str(path) in str(raised.value)


def test_blocks_must_be_numbered_from_zero_without_gaps(files, tmp_path):
    data = files["llama"].read_bytes().replace(b"blk.1.", b"blk.5.")
    (tmp_path / "gap.gguf").write_bytes(data)
    with pytest.raises(ValueError, match=r"blocks blk\.0 \.\. blk\.1.*holds \[0, 5\]; missing \[1, 2, 3, 4\]"):
        read_gguf(tmp_path / "gap.gguf", load_tokenizer=False)


def test_a_block_missing_a_tensor_the_others_hold_is_named(tmp_path):
    hf_model = tiny_llama(len(tiny_vocabulary()[0]))
    dropped = "model.layers.1.self_attn.k_proj.weight"
    partial = SimpleNamespace(
        config=hf_model.config,
        state_dict=lambda: {name: tensor for name, tensor in hf_model.state_dict().items() if name != dropped},
    )
    write_llama_gguf(tmp_path / "partial.gguf", partial)
    with pytest.raises(ValueError, match=re.escape("blk.1 lacks ['attn_k.weight'], which blk.0 holds")):
        read_gguf(tmp_path / "partial.gguf", load_tokenizer=False)


@pytest.mark.parametrize(
    "command",
    [
        ["graph", "--model", "{file}", "--prompt", "hi", "--transcoders", "{folder}"],
        ["verify", "{file}"],
        ["demo", "--model", "{file}"],
    ],
    ids=lambda command: command[0],
)
def test_the_command_line_says_it_in_one_line(files, tmp_path, capsys, command):
    path = with_metadata(files["gemma2"], tmp_path / "bad.gguf", "gemma2.attention.head_count", 3)
    argv = [part.format(file=path, folder=tmp_path) for part in command]
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_USAGE and err and "Traceback" not in "\n".join(err), err
    assert "gemma2.attention.head_count=3 contradicts the tensors" in err[-1], err
