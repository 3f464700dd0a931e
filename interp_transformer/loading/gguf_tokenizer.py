"""A Hugging Face tokenizer rebuilt from the tokenizer a GGUF file describes in its metadata.

A GGUF file carries no ``tokenizer.json``; llama.cpp stores the tokenizer as metadata:

- ``tokenizer.ggml.model``: the algorithm. ``"gpt2"`` is byte-level BPE (GPT-2,
  SmolLM, Llama 3, Qwen2 ...); ``"llama"`` is SentencePiece's BPE, read here for the
  Gemma architectures (see ``sentencepiece_backend``).
- ``tokenizer.ggml.tokens``: the vocabulary, token id = position. Byte-level
  tokens are spelled in GPT-2's byte alphabet (``"Ġthe"`` is ``" the"``).
- ``tokenizer.ggml.merges``: BPE merges, ``"Ġ t"``, best first.
- ``tokenizer.ggml.token_type``: 1 normal, 3 control (``<|im_end|>``),
  4 user-defined (always matched whole), ...
- ``tokenizer.ggml.pre``: how text is split into words before BPE. Each value
  names a list of regexes in llama.cpp (``llama-vocab.cpp``); each regex
  isolates its matches in turn. SmolLM2 says ``"smollm"``: first ``\\p{N}``
  (every digit on its own), then GPT-2's word regex.
- ``tokenizer.ggml.bos_token_id`` / ``eos_token_id`` / ``padding_token_id`` /
  ``unknown_token_id``, ``add_bos_token`` / ``add_eos_token``, ``tokenizer.chat_template``.

The result is a ``tokenizers.Tokenizer`` (BPE model, the splits of ``pre``,
byte-level decoding) wrapped in ``transformers.PreTrainedTokenizerFast``.
Encoding then decoding gives the text back, as byte-level BPE loses nothing.

Gemma's SentencePiece vocabulary has no merges in the file. A SentencePiece BPE
merges, at each step, the adjacent pair whose union is the best-ranked piece, and
Gemma's pieces are ranked by their order in the file. So the merges are rebuilt
from the vocabulary: every split of a piece into two pieces is a merge, ranked by
the piece's position (and, within one piece, the longer left part first). Spaces
are spelled ``▁``; a character no piece covers falls back to its UTF-8 bytes
(the ``<0x..>`` pieces); runs of spaces that the file spells as raw spaces are
respelled ``▁▁...``, as the text they match is.
"""

from collections.abc import Mapping
from typing import Any

from interp_transformer.families import gguf_architectures

GPT2_WORDS = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_WORDS = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_WORDS = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
DIGITS = r"\p{N}"

# tokenizer.ggml.pre -> the regexes llama.cpp splits with, in order (each isolates its matches).
PRE_TOKENIZER_SPLITS: dict[str, tuple[str, ...]] = {
    "default": (GPT2_WORDS,),
    "gpt2": (GPT2_WORDS,),
    # llama.cpp: STARCODER, REFACT, COMMAND_R, SMOLLM, CODESHELL, EXAONE share one rule
    "smollm": (DIGITS, GPT2_WORDS),
    "starcoder": (DIGITS, GPT2_WORDS),
    "refact": (DIGITS, GPT2_WORDS),
    "command-r": (DIGITS, GPT2_WORDS),
    "codeshell": (DIGITS, GPT2_WORDS),
    "exaone": (DIGITS, GPT2_WORDS),
    "llama-bpe": (LLAMA3_WORDS,),
    "llama3": (LLAMA3_WORDS,),
    "qwen2": (QWEN2_WORDS,),
}
SUPPORTED_TOKENIZER_MODELS = ("gpt2", "llama")
SPACE = "\u2581"
CONTROL, USER_DEFINED = 3, 4  # llama.cpp token types


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character table (bytes that print as themselves keep their character)."""
    ascii_printable = list(range(ord("!"), ord("~") + 1))
    latin1_printable = list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    printable = ascii_printable + latin1_printable
    extra = (byte for byte in range(256) if byte not in printable)
    table = {byte: chr(byte) for byte in printable}
    table.update({byte: chr(256 + index) for index, byte in enumerate(extra)})
    return table


def _pre_tokenizer(pre: str):
    from tokenizers import Regex, pre_tokenizers

    if pre not in PRE_TOKENIZER_SPLITS:
        raise ValueError(
            f"tokenizer.ggml.pre={pre!r} names a pre-tokenizer whose splitting rule is not known here; "
            f"known: {sorted(PRE_TOKENIZER_SPLITS)} (read the file with load_tokenizer=False to skip the tokenizer)"
        )
    splits = [pre_tokenizers.Split(Regex(pattern), behavior="isolated") for pattern in PRE_TOKENIZER_SPLITS[pre]]
    # The regexes have already cut the words; ByteLevel only maps bytes to the alphabet the vocabulary is spelled in.
    return pre_tokenizers.Sequence([*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _post_processor(bos: str | None, eos: str | None, add_bos: bool, add_eos: bool, ids: Mapping[str, int]):
    from tokenizers import processors

    prefix = [bos] if add_bos and bos is not None else []
    suffix = [eos] if add_eos and eos is not None else []
    single = " ".join([*prefix, "$A", *suffix])
    pair = " ".join([*prefix, "$A", *suffix, *prefix, "$B:1", *suffix])
    special = [(token, ids[token]) for token in dict.fromkeys(prefix + suffix)]
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)


def _metadata_list(metadata: Mapping[str, Any], key: str, length: int | None = None) -> list:
    value = metadata.get(key)
    if not isinstance(value, list) or (length is not None and len(value) != length):
        expected = "a list" if length is None else f"a list of {length} entries (one per token)"
        received = type(value).__name__ if not isinstance(value, list) else f"{len(value)} entries"
        raise ValueError(f"GGUF tokenizer metadata {key!r} must be {expected}, received {received}")
    return value


def _token_id(metadata: Mapping[str, Any], key: str, tokens: list[str]) -> int | None:
    token_id = metadata.get(f"tokenizer.ggml.{key}")
    if token_id is None:
        return None
    if not isinstance(token_id, int) or not 0 <= token_id < len(tokens):
        raise ValueError(f"tokenizer.ggml.{key}={token_id!r} must be a token id in [0, {len(tokens)})")
    return token_id


def byte_level_backend(metadata: Mapping[str, Any], tokens: list[str], token_types: list[int]):
    """The ``tokenizers.Tokenizer`` of a byte-level BPE (``tokenizer.ggml.model == "gpt2"``) and its vocabulary."""
    from tokenizers import Tokenizer, decoders, models

    merges = [tuple(merge.split(" ")) for merge in _metadata_list(metadata, "tokenizer.ggml.merges")]
    malformed = [" ".join(merge) for merge in merges if len(merge) != 2]
    if malformed:
        raise ValueError(f"tokenizer.ggml.merges must hold 'left right' pairs, received {malformed[:5]}")

    alphabet = _byte_alphabet()
    spelled = set(alphabet.values())
    vocab: dict[str, int] = {}
    for token_id, (token, token_type) in enumerate(zip(tokens, token_types, strict=True)):
        if token_type not in (CONTROL, USER_DEFINED) and not set(token) <= spelled:
            # a plain token written as raw text: spell it in the byte alphabet, as BPE will produce it
            token = "".join(alphabet[byte] for byte in token.encode("utf-8"))
        vocab.setdefault(token, token_id)
    _check_unique(vocab, tokens)
    unknown = [" ".join(merge) for merge in merges if not all(part in vocab for part in (*merge, "".join(merge)))]
    if unknown:
        raise ValueError(
            f"tokenizer.ggml.merges holds {len(unknown)} merge(s) of or into tokens not in the "
            f"vocabulary, e.g. {unknown[:5]}"
        )
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    backend.pre_tokenizer = _pre_tokenizer(metadata.get("tokenizer.ggml.pre", "default"))
    backend.decoder = decoders.ByteLevel()
    return backend, vocab


def sentencepiece_merges(tokens: list[str]) -> list[tuple[str, str]]:
    """The merges a SentencePiece BPE whose pieces are ranked by position applies, best first (module docstring)."""
    ids = {token: token_id for token_id, token in enumerate(tokens)}
    merges: list[tuple[str, str]] = []
    for token in tokens:
        # within one piece: the longer left part first
        merges.extend(
            (token[:cut], token[cut:])
            for cut in range(len(token) - 1, 0, -1)
            if token[:cut] in ids and token[cut:] in ids
        )
    return merges


def sentencepiece_backend(metadata: Mapping[str, Any], tokens: list[str], token_types: list[int]):
    """The ``tokenizers.Tokenizer`` of Gemma's SentencePiece BPE (``tokenizer.ggml.model == "llama"``) and its
    vocabulary: spaces read as ``▁``, merges from the vocabulary's order, bytes for what no piece covers."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    # a run of spaces stored as raw spaces matches the normalized text's run of ▁
    tokens = [token.replace(" ", SPACE) if token and not token.strip() else token for token in tokens]
    vocab: dict[str, int] = {}
    for token_id, token in enumerate(tokens):
        vocab.setdefault(token, token_id)
    _check_unique(vocab, tokens)
    unknown = metadata.get("tokenizer.ggml.unknown_token_id")
    if not isinstance(unknown, int) or not 0 <= unknown < len(tokens):
        raise ValueError(
            f"a SentencePiece vocabulary needs tokenizer.ggml.unknown_token_id in [0, {len(tokens)}), "
            f"received {unknown!r}"
        )
    missing_bytes = [f"<0x{byte:02X}>" for byte in range(256) if f"<0x{byte:02X}>" not in vocab]
    if missing_bytes:
        raise ValueError(
            f"a SentencePiece vocabulary needs the 256 byte pieces <0x00>..<0xFF>; missing {missing_bytes[:5]}"
        )
    model = models.BPE(
        vocab=vocab, merges=sentencepiece_merges(tokens), unk_token=tokens[unknown], fuse_unk=True, byte_fallback=True
    )
    backend = Tokenizer(model)
    backend.normalizer = normalizers.Replace(" ", SPACE)
    backend.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    return backend, vocab


def _check_unique(vocab: Mapping[str, int], tokens: list[str]) -> None:
    if len(vocab) != len(tokens):
        raise ValueError(
            f"tokenizer.ggml.tokens holds {len(tokens) - len(vocab)} duplicated token(s); each token needs one id"
        )


def tokenizer_from_gguf_metadata(metadata: Mapping[str, Any], architecture: str | None = None):
    """A ``transformers.PreTrainedTokenizerFast`` from a GGUF file's ``tokenizer.*`` metadata, or ``None``.

    ``None`` when the file describes no tokenizer (no ``tokenizer.ggml.model``);
    ``ValueError`` when it describes one that cannot be rebuilt faithfully (another
    algorithm than byte-level BPE or Gemma's SentencePiece BPE, an unknown ``pre``
    rule, inconsistent lists). ``architecture``: the file's ``general.architecture``
    (read from ``metadata`` when not given). Control tokens become special tokens and
    user-defined ones added tokens, both matched whole in the text, as llama.cpp does.
    """
    model = metadata.get("tokenizer.ggml.model")
    if model is None:
        return None
    architecture = architecture or metadata.get("general.architecture")
    if model not in SUPPORTED_TOKENIZER_MODELS:
        raise ValueError(
            f"tokenizer.ggml.model={model!r} is not supported; supported: {list(SUPPORTED_TOKENIZER_MODELS)} "
            "(byte-level BPE; SentencePiece for the Gemma architectures). Read the file with load_tokenizer=False "
            "to skip the tokenizer."
        )
    # the architectures whose GGUF entry says their SentencePiece vocabulary is ranked by file order
    sentencepiece = [arch for arch, entry in gguf_architectures().items() if entry.sentencepiece_by_file_order]
    if model == "llama" and architecture not in sentencepiece:
        raise ValueError(
            f"tokenizer.ggml.model='llama' (SentencePiece) is rebuilt for the architectures "
            f"{sentencepiece}, whose pieces are ranked by their order in the file; received "
            f"architecture {architecture!r}. Read the file with load_tokenizer=False to skip the tokenizer."
        )
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    tokens = _metadata_list(metadata, "tokenizer.ggml.tokens")
    token_types = metadata.get("tokenizer.ggml.token_type")
    token_types = (
        [1] * len(tokens) if token_types is None else _metadata_list(metadata, "tokenizer.ggml.token_type", len(tokens))
    )
    build = byte_level_backend if model == "gpt2" else sentencepiece_backend
    backend, vocab = build(metadata, tokens, token_types)
    backend.add_special_tokens(
        [
            AddedToken(token, special=True, normalized=False)
            for token, kind in zip(tokens, token_types, strict=True)
            if kind == CONTROL
        ]
    )
    # user-defined tokens are matched whole in the text, as spelled (a respelled run of spaces is left to BPE)
    backend.add_tokens(
        [
            AddedToken(token, special=False, normalized=False)
            for token, kind in zip(tokens, token_types, strict=True)
            if kind == USER_DEFINED and token in vocab
        ]
    )

    special = {
        name: tokens[token_id]
        for name, key in (
            ("bos_token", "bos_token_id"),
            ("eos_token", "eos_token_id"),
            ("pad_token", "padding_token_id"),
            ("unk_token", "unknown_token_id"),
        )
        if (token_id := _token_id(metadata, key, tokens)) is not None
    }
    backend.post_processor = _post_processor(
        special.get("bos_token"),
        special.get("eos_token"),
        bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
        bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
        vocab,
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, clean_up_tokenization_spaces=False, **special)
    if isinstance(metadata.get("tokenizer.chat_template"), str):
        tokenizer.chat_template = metadata["tokenizer.chat_template"]
    return tokenizer


__all__ = [
    "PRE_TOKENIZER_SPLITS",
    "SUPPORTED_TOKENIZER_MODELS",
    "sentencepiece_merges",
    "tokenizer_from_gguf_metadata",
]
