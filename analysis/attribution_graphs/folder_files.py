"""The files of a transcoder folder, read only from inside it: every reader of a folder opens its files here.

A folder's files are named by the folder's own layout or config (circuit-tracer's ``config.yaml`` lists its layer
files), so a name may be anything. ``inside_folder(folder, name, what)`` refuses, before anything is opened, a name
that leaves the folder: an absolute path, a ``..`` part, or a symbolic link resolving outside (``ValueError`` naming
the entry and the folder). ``read_tensors`` and ``read_metadata`` then read a safetensors file; a truncated or
unreadable one raises ``ValueError`` naming the file (``interp_transformer.sae.loading.read_safetensors``).
"""

from pathlib import Path, PurePath

import torch
from torch import Tensor

from interp_transformer.sae.loading import read_safetensors


def inside_folder(folder: Path, name, what: str, *, kind: str = "file") -> Path:
    """``folder / name`` when it is a ``kind`` (``"file"`` or ``"folder"``) inside ``folder``; ``what`` says who named
    it (``"config.yaml's transcoders[0]"``). Checked before anything is opened (module docstring)."""
    if not isinstance(name, (str, PurePath)) or not str(name):
        raise TypeError(f"{what} must be a file name inside {folder}, got {type(name).__name__} {name!r}")
    relative = Path(name)
    path = Path(folder) / relative
    escapes = relative.is_absolute() or ".." in relative.parts
    if escapes or not path.resolve().is_relative_to(Path(folder).resolve()):
        raise ValueError(
            f"{what} names {str(name)!r}, which lies outside {folder}: a transcoder folder may only name its own "
            "files (no absolute paths, no '..', no links leading out of it)"
        )
    found = path.is_file() if kind == "file" else path.is_dir()
    if not found:
        raise FileNotFoundError(f"{what} names {str(name)!r}, which is no {kind} in {folder}")
    return path


def read_tensors(folder: Path, name: str, what: str, dtype: torch.dtype | None = None) -> dict[str, Tensor]:
    """Every tensor of the safetensors file ``name`` inside ``folder`` (floats cast to ``dtype``)."""
    return read_safetensors(inside_folder(folder, name, what), dtype)


def read_metadata(folder: Path, name: str, what: str) -> dict[str, str]:
    """The header metadata of the safetensors file ``name`` inside ``folder``."""
    from safetensors import SafetensorError, safe_open

    path = inside_folder(folder, name, what)
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            return dict(handle.metadata() or {})
    except (SafetensorError, OSError, ValueError, RuntimeError) as error:
        raise ValueError(
            f"{path} is not a readable safetensors file ({error}); the file is corrupt or truncated"
        ) from error


__all__ = ["inside_folder", "read_metadata", "read_tensors"]
