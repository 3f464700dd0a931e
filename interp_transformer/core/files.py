"""Small file helpers every writer and reader of the package shares: atomic writes and JSON objects.

``atomic_write(path, write)`` writes through a temporary file in the same folder,
``fsync``-s it, renames it over ``path`` (atomic on POSIX) and ``fsync``-s the folder, so
a reader sees the old file or the complete new one, never a partial file, even after a
crash. ``read_json_object(path)`` reads a file that must hold one JSON object, with a
``ValueError`` naming the file when it does not.
"""

import json
import os
from collections.abc import Callable
from pathlib import Path

TEMP_MARKER = ".tmp-"  # in the name of a temporary file a killed writer may leave behind


def temp_path(path: Path) -> Path:
    """The temporary name ``path`` is written under before the rename."""
    return path.parent / f".{path.name}{TEMP_MARKER}{os.getpid()}"


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(
    path: Path, write: Callable[[Path], object], before_rename: Callable[[Path], None] | None = None
) -> None:
    """Write ``path`` through ``write(temp_path)``, fsync it, and rename it into place.

    ``before_rename(temp_path)`` runs after the fsync (to hash the bytes on disk, say).
    The temporary file is removed if anything fails.
    """
    path = Path(path)
    temp = temp_path(path)
    try:
        write(temp)
        with open(temp, "rb+") as handle:
            os.fsync(handle.fileno())
        if before_rename is not None:
            before_rename(temp)
        os.replace(temp, path)
    finally:
        if temp.exists():
            temp.unlink()
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda temp: temp.write_text(text, encoding="utf-8"))


def read_json_object(path: Path, what: str = "a JSON object") -> dict:
    """The JSON object in ``path``; ``ValueError`` naming the file if it is not valid JSON or not an object."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON ({error}); the file is damaged") from error
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold {what}, received {type(data).__name__}")
    return data


__all__ = ["TEMP_MARKER", "atomic_write", "atomic_write_text", "fsync_dir", "read_json_object", "temp_path"]
