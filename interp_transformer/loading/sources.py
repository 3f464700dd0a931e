"""Resolve a model source to a Hugging Face config, a lazily read state dict and a tokenizer.

A *source* is one of

- an in-memory ``transformers.PreTrainedModel``;
- a local directory in Hugging Face layout: ``config.json`` plus weights in
  ``model.safetensors`` (or sharded, ``model.safetensors.index.json``) or
  ``pytorch_model.bin`` (or ``pytorch_model.bin.index.json``), and optionally
  tokenizer files (``tokenizer.json``, ``vocab.json`` + ``merges.txt``, ...);
- a Hugging Face Hub repo id (``"gpt2"``, ``"openai-community/gpt2-medium"``):
  resolved with ``huggingface_hub.snapshot_download`` to a snapshot directory in
  the local cache (downloaded only when missing and the hub is reachable), then
  read as a local directory.

Safety: safetensors files are preferred and can hold nothing but tensors.
``.bin`` files are read only with ``torch.load(weights_only=True)``, which refuses
any pickled object other than tensors and plain containers; nothing is ever
unpickled unsafely.

Memory: tensors are read one at a time when the converter asks for them
(``LazyStateDict``), from memory-mapped files, and cast to the requested dtype as
they are read, so loading holds about one copy of the weights.
"""

import json
import pickle
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

import torch
from torch import Tensor

from interp_transformer.core.files import read_json_object

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_FILE = "pytorch_model.bin"
BIN_INDEX = "pytorch_model.bin.index.json"
WEIGHT_FILES = (SAFETENSORS_FILE, SAFETENSORS_INDEX, BIN_FILE, BIN_INDEX)  # in order of preference
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "special_tokens_map.json",
    "added_tokens.json",
)
# Names users most often mean; used for "did you mean" suggestions.
KNOWN_HUB_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "distilgpt2")

if TYPE_CHECKING:
    import transformers

Source = Union[str, Path, "transformers.PreTrainedModel"]


class LazyStateDict(Mapping[str, Tensor]):
    """A read-only state dict whose tensors are read (and cast to ``dtype``) when indexed.

    Each ``state_dict[name]`` reads that tensor afresh; nothing is kept, so a
    converter that reads each name once holds only what it builds. ``shapes()``
    gives every tensor's shape without reading data.
    """

    def __init__(
        self,
        loaders: Mapping[str, Callable[[], Tensor]],
        shapes: Mapping[str, tuple[int, ...]],
        dtype: torch.dtype | None = None,
        description: str = "state dict",
    ):
        self._loaders = dict(loaders)
        self._shapes = {name: tuple(shape) for name, shape in shapes.items()}
        self.dtype = dtype
        self.description = description

    def __getitem__(self, name: str) -> Tensor:
        tensor = self._loaders[name]()
        if self.dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(self.dtype)
        return tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaders)

    def __len__(self) -> int:
        return len(self._loaders)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self._shapes)

    def with_dtype(self, dtype: torch.dtype | None) -> "LazyStateDict":
        """The same tensors, cast to ``dtype`` when read."""
        return LazyStateDict(self._loaders, self._shapes, dtype, self.description)

    def __repr__(self) -> str:
        return f"LazyStateDict({self.description}, {len(self)} tensors, dtype={self.dtype})"


# ---------------------------------------------------------------- reading weight files


def open_safetensors_file(path: Path) -> tuple[dict, dict]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            names = list(handle.keys())
            shapes = {name: tuple(handle.get_slice(name).get_shape()) for name in names}
    except (SafetensorError, OSError, ValueError) as error:
        raise ValueError(
            f"{path} is not a readable safetensors file ({error}); the file is corrupt or truncated"
        ) from error

    def loader(name: str) -> Callable[[], Tensor]:
        def load() -> Tensor:
            # One handle per tensor: a handle maps the whole file, and every page a
            # conversion touches stays resident while the mapping lives. Per tensor, the
            # mapping (and its pages) goes away with the tensor, so loading holds about
            # one source tensor beside the converted model instead of the whole file.
            try:
                with safe_open(str(path), framework="pt", device="cpu") as handle:
                    return handle.get_tensor(name)
            except (SafetensorError, OSError, ValueError, RuntimeError) as error:
                raise ValueError(f"cannot read tensor {name!r} from {path} ({error}); the file is corrupt") from error

        return load

    return {name: loader(name) for name in names}, shapes


def read_bin_file(path: str | Path) -> dict[str, Tensor]:
    """Tensors of a PyTorch ``.bin`` checkpoint, read with ``torch.load(weights_only=True)``.

    ``weights_only=True`` rebuilds only tensors and plain containers, never arbitrary
    Python objects, so a file crafted to run code when unpickled is refused with a
    ``ValueError`` instead of being executed. The file is memory-mapped when its
    format allows.
    """
    path = Path(path)
    with open(path, "rb") as handle:
        head = handle.read(4)
    if not (head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"):
        raise ValueError(
            f"cannot read {path}: it is not a PyTorch checkpoint (a .bin checkpoint is a zip archive or a "
            f"pickle; this file starts with {head!r}); the file is corrupt or of another kind"
        )
    try:
        try:
            loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as error:
            if "mmap" not in str(error):
                raise
            # Legacy (non-zip) checkpoints cannot be memory-mapped: read them whole.
            loaded = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError, KeyError, AttributeError) as error:
        message = str(error)
        if "Weights only load failed" in message:
            detail = next((line.strip() for line in message.splitlines() if "WeightsUnpickler error" in line), "")
            raise ValueError(
                f"refusing to load {path}: torch.load(weights_only=True) found Python objects besides tensors "
                f"({detail or 'not a plain state dict'}). Unpickling them could run arbitrary code, so the file "
                "is not loaded; re-create it from a trusted model, preferably as model.safetensors."
            ) from error
        first_line = message.strip().splitlines()[0] if message.strip() else ""
        raise ValueError(
            f"cannot read {path}: the file is corrupt or not a PyTorch checkpoint ({type(error).__name__}: "
            f"{first_line})"
        ) from error
    if not isinstance(loaded, dict) or not all(isinstance(k, str) and isinstance(v, Tensor) for k, v in loaded.items()):
        raise ValueError(f"{path} must hold a dict of name -> tensor (a state dict), received {type(loaded).__name__}")
    return loaded


def _open_bin(path: Path) -> tuple[dict, dict]:
    tensors = read_bin_file(path)
    return {name: (lambda t=t: t) for name, t in tensors.items()}, {n: tuple(t.shape) for n, t in tensors.items()}


def _read_index(path: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(path.read_text(encoding="utf-8"))["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not a valid shard index (expected JSON with a 'weight_map'): {error}") from error
    if not isinstance(weight_map, dict):
        raise ValueError(f"{path}: 'weight_map' must map tensor names to shard file names")
    return weight_map


def open_weights(directory: str | Path, dtype: torch.dtype | None = None) -> LazyStateDict:
    """The weights in a Hugging Face model directory, as a ``LazyStateDict``.

    Looks for ``model.safetensors``, ``model.safetensors.index.json``,
    ``pytorch_model.bin`` and ``pytorch_model.bin.index.json``, in that order.
    """
    directory = Path(directory)
    for file_name in WEIGHT_FILES:
        path = directory / file_name
        if path.is_file():
            break
    else:
        present = sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []
        raise ValueError(f"no weights in {directory}: expected one of {list(WEIGHT_FILES)}, found {present}")
    opener = open_safetensors_file if "safetensors" in file_name else _open_bin
    if not file_name.endswith(".index.json"):
        loaders, shapes = opener(path)
    else:
        loaders, shapes = {}, {}
        weight_map = _read_index(path)
        for shard in sorted(set(weight_map.values())):
            shard_path = (directory / str(shard)).resolve()
            if directory.resolve() not in shard_path.parents:
                raise ValueError(
                    f"{path} names the shard {shard!r}, which lies outside {directory}: a shard index may "
                    "only name files inside the checkpoint directory"
                )
            shard_loaders, shard_shapes = opener(shard_path)
            loaders.update(shard_loaders)
            shapes.update(shard_shapes)
    return LazyStateDict(loaders, shapes, dtype, description=str(path))


def state_dict_of_model(hf_model, dtype: torch.dtype | None = None) -> LazyStateDict:
    """An in-memory model's state dict as a ``LazyStateDict`` (tensors cast only when read)."""
    tensors = hf_model.state_dict()
    return LazyStateDict(
        {name: t.detach for name, t in tensors.items()},  # each read detaches
        {name: tuple(t.shape) for name, t in tensors.items()},
        dtype,
        description=f"in-memory {type(hf_model).__name__}",
    )


# ---------------------------------------------------------------- configs and tokenizers


def read_config_dict(directory: str | Path) -> dict[str, Any]:
    """The raw ``config.json`` of a model directory (``ValueError`` if absent or invalid)."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise ValueError(f"no {CONFIG_FILE} in {directory}: a Hugging Face model directory needs one")
    config = read_json_object(path, "a JSON object with a 'model_type' string")
    if not isinstance(config.get("model_type"), str):
        raise ValueError(f"{path} must be a JSON object with a 'model_type' string (e.g. \"gpt2\")")
    return config


def has_tokenizer_files(directory: str | Path) -> bool:
    return any((Path(directory) / name).is_file() for name in TOKENIZER_FILES)


def load_tokenizer(directory: str | Path):
    """``AutoTokenizer.from_pretrained(directory)``, or ``None`` when it holds no tokenizer files."""
    if not has_tokenizer_files(directory):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(directory))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"the tokenizer files in {directory} could not be loaded: {error}") from error


# ---------------------------------------------------------------- the hub


def _is_pathlike(text: str) -> bool:
    return text.startswith((".", "/", "~")) or "\\" in text or text.count("/") > 1


def download_from_hub(
    repo_id: str,
    *,
    revision: str | None = None,
    cache_dir: str | Path | None = None,
    local_files_only: bool = False,
) -> Path:
    """Local snapshot directory of a Hub model: config, tokenizer and weights (safetensors if any).

    Uses the Hugging Face cache (``HF_HUB_CACHE``, or ``cache_dir``); with
    ``local_files_only=True`` or ``HF_HUB_OFFLINE=1`` the network is never used and
    only cached snapshots are found. Only the files loading needs are fetched:
    ``.bin`` weights only when the repo has no safetensors.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    common: dict[str, Any] = dict(revision=revision, cache_dir=cache_dir, local_files_only=local_files_only)
    base = [CONFIG_FILE, *TOKENIZER_FILES, "generation_config.json"]
    try:
        directory = Path(
            snapshot_download(repo_id, allow_patterns=base + ["*.safetensors", SAFETENSORS_INDEX], **common)
        )
        if not any((directory / name).is_file() for name in WEIGHT_FILES):
            directory = Path(
                snapshot_download(repo_id, allow_patterns=base + ["pytorch_model*.bin", BIN_INDEX], **common)
            )
    except (RepositoryNotFoundError, LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError) as error:
        import difflib

        close = difflib.get_close_matches(repo_id, KNOWN_HUB_NAMES, n=3, cutoff=0.6)
        hint = f"; did you mean {close}?" if close and repo_id not in close else ""
        raise ValueError(
            f"cannot load {repo_id!r}: it is not a local directory, and the Hugging Face Hub could not "
            f"provide it ({type(error).__name__}: {error}){hint}. Offline, a hub model loads only if it is "
            "already in the Hugging Face cache; otherwise pass a directory written by save_pretrained "
            "or an in-memory transformers model."
        ) from error
    return directory


# ---------------------------------------------------------------- resolving a source


@dataclass
class ResolvedSource:
    """Where a model's config, weights and tokenizer come from.

    One of ``directory`` (local or a hub snapshot), ``hf_model`` and ``weights`` is set.
    ``model_type`` is known without building the config, so an unsupported
    architecture is rejected before anything heavy is read. A source that brings its own
    weights, config and tokenizer (a GGUF file, see ``loading.gguf_source``) sets
    ``weights(dtype) -> LazyStateDict``, ``_hf_config``, ``tokenizer`` and
    ``reference(dtype)``, the Hugging Face model ``verify`` compares against.
    """

    description: str
    model_type: str
    directory: Path | None = None
    hf_model: Any = None
    _hf_config: Any = field(default=None, repr=False)
    weights: Callable[[torch.dtype | None], LazyStateDict] | None = field(default=None, repr=False)
    tokenizer: Any = field(default=None, repr=False)
    reference: Callable[[torch.dtype], Any] | None = field(default=None, repr=False)

    @property
    def hf_config(self):
        """The ``transformers`` config (built from ``config.json`` on first use)."""
        if self._hf_config is None:
            from huggingface_hub.errors import StrictDataclassError
            from transformers import AutoConfig

            try:
                self._hf_config = AutoConfig.from_pretrained(str(self.directory))
            except (OSError, ValueError, KeyError, TypeError, StrictDataclassError) as error:
                detail = " ".join(str(error).split())
                raise ValueError(f"cannot read the config of {self.description}: {detail}") from error
        return self._hf_config

    def open_state_dict(self, dtype: torch.dtype | None = None) -> LazyStateDict:
        if self.weights is not None:
            return self.weights(dtype)
        if self.hf_model is not None:
            return state_dict_of_model(self.hf_model, dtype)
        if self.directory is None:  # every source is built with one of the three
            raise ValueError("this source has no weights, model or directory to read the state dict from")
        return open_weights(self.directory, dtype)

    def load_tokenizer(self):
        """The tokenizer stored with the model, or ``None`` (in-memory models carry none)."""
        if self.tokenizer is not None:
            return self.tokenizer
        return None if self.directory is None else load_tokenizer(self.directory)


def resolve_source(
    source: Source,
    *,
    hf_config=None,
    revision: str | None = None,
    cache_dir: str | Path | None = None,
    local_files_only: bool = False,
) -> ResolvedSource:
    """Find what ``source`` names (see the module docstring); read no weights yet.

    ``hf_config`` overrides the config the source carries.
    """
    from transformers import PreTrainedModel

    if isinstance(source, PreTrainedModel):
        config = hf_config if hf_config is not None else source.config
        return ResolvedSource(
            f"in-memory {type(source).__name__}", config.model_type, hf_model=source, _hf_config=config
        )
    if isinstance(source, torch.nn.Module):
        raise TypeError(
            f"source must be a transformers PreTrainedModel, a directory or a hub name, received a plain "
            f"torch module ({type(source).__name__}); for a state dict use the architecture's convert_state_dict"
        )
    if not isinstance(source, (str, Path)):
        raise TypeError(
            "source must be a hub name (str), a local directory (str or Path) or an in-memory transformers "
            f"model, received {type(source).__name__}"
        )
    path = Path(source).expanduser()
    if path.is_dir():
        directory, description = path, f"directory {path}"
    elif path.exists():
        raise ValueError(f"{path} is a file; pass the directory that holds config.json and the weights")
    elif isinstance(source, Path) or _is_pathlike(str(source)):
        raise ValueError(f"no directory at {path} (a local source must be a Hugging Face model directory)")
    else:
        directory = download_from_hub(
            str(source), revision=revision, cache_dir=cache_dir, local_files_only=local_files_only
        )
        description = f"hub model {source!r} ({directory})"
    model_type = hf_config.model_type if hf_config is not None else read_config_dict(directory)["model_type"]
    return ResolvedSource(description, model_type, directory=directory, _hf_config=hf_config)


__all__ = [
    "LazyStateDict",
    "ResolvedSource",
    "download_from_hub",
    "has_tokenizer_files",
    "load_tokenizer",
    "open_weights",
    "read_bin_file",
    "read_config_dict",
    "resolve_source",
    "state_dict_of_model",
]
