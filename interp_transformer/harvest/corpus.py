"""Corpora: where the documents of a harvest come from.

A ``Corpus`` yields documents in a fixed order, each either a ``str`` (text, to
be tokenized) or a list of ``int`` (token ids, for models without a tokenizer or
corpora tokenized beforehand). Sources:

- a list of documents (``Corpus.from_documents``);
- text files, one document per file (``.txt``, read as UTF-8);
- a JSONL file, one document per line, taken from the field ``text_field``
  (a string, or a list of token ids);
  a missing file or a line without the field is a named error (``FileNotFoundError``,
  ``KeyError``); so is an empty file (or a JSONL file of blank lines) with
  ``allow_empty_files=False``, as the trainers read; ``harvest`` reads it as no document;
- a Hugging Face ``datasets`` dataset: an in-memory ``datasets.Dataset``, a folder
  written by ``save_to_disk`` (read with ``datasets.load_from_disk``), or local
  files read with ``datasets.load_dataset("json" | "text", data_files=...)``,
  taking the column ``text_field``.

The order of documents is the order of the files given and of the lines or rows
in them; it fixes the global context index.

Paths are ``pathlib.Path`` objects (or one ``str``); a list of ``str`` is documents, so a list
of ``str`` that all name existing files is refused rather than taken as text (the text
would be the file names).
"""

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:
    import datasets

Document = str | list[int]
CorpusLike = Union[
    "Corpus", str, Path, Sequence[str], Sequence[Sequence[int]], Sequence[str | Path], "datasets.Dataset"
]
HF_LOADERS = ("json", "text")


@dataclass
class Corpus:
    """Documents in a fixed order, read afresh each time they are iterated."""

    description: str
    _documents: Callable[[], Iterator[Document]]

    def __iter__(self) -> Iterator[Document]:
        return self._documents()

    @classmethod
    def from_documents(cls, documents: Sequence[Document], description: str = "documents in memory") -> "Corpus":
        documents = list(documents)
        return cls(f"{description} ({len(documents)})", lambda: iter(documents))

    @classmethod
    def from_text_files(cls, paths: Sequence[str | Path], allow_empty_files: bool = True) -> "Corpus":
        files = [_existing_file(p, allow_empty_files) for p in paths]
        return cls(f"text files {[str(p) for p in files]}", lambda: (p.read_text(encoding="utf-8") for p in files))

    @classmethod
    def from_jsonl(
        cls, paths: Sequence[str | Path], text_field: str = "text", allow_empty_files: bool = True
    ) -> "Corpus":
        files = [_existing_file(p, allow_empty_files) for p in paths]
        return cls(
            f"JSONL {[str(p) for p in files]} field {text_field!r}",
            lambda: _read_jsonl(files, text_field, allow_empty_files),
        )

    @classmethod
    def from_hf_dataset(cls, dataset, text_field: str = "text", description: str = "datasets.Dataset") -> "Corpus":
        if text_field not in dataset.column_names:
            import difflib

            close = difflib.get_close_matches(text_field, dataset.column_names, n=3, cutoff=0.3)
            raise KeyError(
                f"the dataset has no column {text_field!r}; its columns are {dataset.column_names} (closest: {close}); "
                "choose one with text_field / --text-field"
            )
        column = dataset.select_columns([text_field])

        def documents() -> Iterator[Document]:
            for rows in column.iter(batch_size=1024):  # batches: far faster than one row at a time
                yield from rows[text_field]

        return cls(f"{description} column {text_field!r} ({len(dataset)} rows)", documents)

    @classmethod
    def from_disk(cls, directory: str | Path, text_field: str = "text") -> "Corpus":
        """A dataset folder written by ``datasets.Dataset.save_to_disk``."""
        import datasets

        directory = Path(directory)
        try:
            dataset = datasets.load_from_disk(str(directory))
        except FileNotFoundError as error:
            raise ValueError(f"{directory} is not a folder written by datasets' save_to_disk ({error})") from error
        if isinstance(dataset, datasets.DatasetDict):
            if "train" not in dataset:
                raise ValueError(f"{directory} holds the splits {list(dataset)}; save the split to harvest on its own")
            dataset = dataset["train"]
        return cls.from_hf_dataset(dataset, text_field, description=f"datasets folder {directory}")

    @classmethod
    def from_hf_files(cls, loader: str, paths: Sequence[str | Path], text_field: str = "text") -> "Corpus":
        """Local files read by ``datasets.load_dataset(loader, data_files=paths, split="train")``."""
        if loader not in HF_LOADERS:
            raise ValueError(f"the datasets loader must be one of {HF_LOADERS}, received {loader!r}")
        import datasets

        paths = [str(_existing_file(p)) for p in paths]
        dataset = datasets.load_dataset(loader, data_files=paths, split="train")
        return cls.from_hf_dataset(dataset, text_field, description=f"load_dataset({loader!r}, {paths})")


def _existing_file(path: str | Path, allow_empty: bool = True) -> Path:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file not found: {path}")
    if not allow_empty and path.stat().st_size == 0:
        raise ValueError(f"corpus file {path} is empty: give files that hold text, or leave this one out")
    return path


def _read_jsonl(paths: list[Path], text_field: str, allow_empty: bool = True) -> Iterator[Document]:
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            rows = 0
            for line_number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as error:
                    raise ValueError(f"{path}, line {line_number}: not valid JSON ({error})") from error
                if not isinstance(row, dict) or text_field not in row:
                    found = sorted(row) if isinstance(row, dict) else type(row).__name__
                    raise KeyError(
                        f"{path}, line {line_number}: expected an object with the field {text_field!r}, found {found}"
                    )
                rows += 1
                yield row[text_field]
        if rows == 0 and not allow_empty:
            raise ValueError(f"corpus file {path} holds no JSON line (only blank lines): expected one object per line")


def as_corpus(corpus: CorpusLike, text_field: str = "text", allow_empty_files: bool = True) -> Corpus:
    """Turn what ``harvest`` accepts as a corpus into a ``Corpus``.

    A path ending in ``.jsonl``/``.json`` is JSONL, a ``.txt`` path is one
    document, a folder is a ``datasets`` folder; a list of paths reads each in
    turn (all of one kind); a list of strings or of id lists is the documents
    (refused when they all name existing files). ``allow_empty_files=False``
    refuses an empty file by name instead of reading it as no document.
    """
    if isinstance(corpus, Corpus):
        return corpus
    if _is_hf_dataset(corpus):
        return Corpus.from_hf_dataset(corpus, text_field)
    if isinstance(corpus, (str, Path)):
        return _corpus_from_paths([Path(corpus)], text_field, allow_empty_files)
    if isinstance(corpus, (list, tuple)):
        if corpus and all(isinstance(item, Path) for item in corpus):
            return _corpus_from_paths(list(corpus), text_field, allow_empty_files)
        _refuse_file_names_as_documents(corpus)
        return Corpus.from_documents(corpus)
    raise TypeError(
        "corpus must be a Corpus, a path (.txt, .jsonl, or a datasets folder), a list of paths, a list of "
        f"documents (str or lists of token ids) or a datasets.Dataset, received {type(corpus).__name__}"
    )


def _refuse_file_names_as_documents(documents: Sequence) -> None:
    """A list of ``str`` is documents; when every one names an existing file, the files were meant."""
    if not documents or not all(isinstance(item, str) and "\n" not in item for item in documents):
        return
    try:
        all_files = all(Path(item).is_file() for item in documents)
    except (OSError, ValueError):  # a document too long or odd for a path
        return
    if all_files:
        shown = list(documents[:3]) + (["..."] if len(documents) > 3 else [])
        raise ValueError(
            f"the corpus documents {shown} are all names of existing files, so their text would be the names: "
            "to read the files, give them as pathlib.Path objects (or Corpus.from_text_files / Corpus.from_jsonl); "
            "to train on the names themselves, give Corpus.from_documents([...])"
        )


def _is_hf_dataset(obj) -> bool:
    return type(obj).__module__.startswith("datasets.") and hasattr(obj, "column_names")


def _corpus_from_paths(paths: list[Path], text_field: str, allow_empty_files: bool = True) -> Corpus:
    if len(paths) == 1 and paths[0].is_dir():
        return Corpus.from_disk(paths[0], text_field)
    suffixes = {p.suffix.lower() for p in paths}
    if suffixes <= {".jsonl", ".json"}:
        return Corpus.from_jsonl(paths, text_field, allow_empty_files)
    if suffixes <= {".txt"}:
        return Corpus.from_text_files(paths, allow_empty_files)
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise FileNotFoundError(f"corpus file not found: {missing}")
    raise ValueError(
        f"cannot tell how to read the corpus files {[str(p) for p in paths]} (suffixes {sorted(suffixes)}): expected "
        ".txt files (one document each), .jsonl files (one document per line), all of one kind, or one folder "
        "written by datasets' save_to_disk"
    )
