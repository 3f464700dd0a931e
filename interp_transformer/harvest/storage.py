"""Files of a harvest folder, each written atomically.

Layout of ``out_dir``::

    manifest.json                  what was harvested, how, and every shard's hash (see ``manifest``)
    tokens.safetensors             token_ids [n_contexts, pos] (int32), the contexts in global order
    shard-000000.safetensors       one tensor per hook [n_contexts_in_shard, pos, ...],
                                   plus context_index [n_contexts_in_shard] and token_ids
    shard-000000.json              the shard's record: context range, sha256, content hash
    runs.jsonl                     one line per run: world size, tokens per second, peak memory

Every file is written under a temporary name in the same folder, flushed and
``fsync``-ed, then renamed over its final name (``os.replace`` is atomic on
POSIX), and the folder is ``fsync``-ed so the rename itself survives a crash.
A reader therefore sees either the old file or the complete new one, never a
partial file. A shard counts as finished only when its record exists and the
sha256 of the shard file equals the hash in the record; the record is written
after the shard, so a process killed between the two leaves a shard that is
redone.
"""

import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from interp_transformer.core.files import TEMP_MARKER, atomic_write, atomic_write_text, read_json_object
from interp_transformer.text.tokens import sha256_of_file

MANIFEST_FILE = "manifest.json"
TOKENS_FILE = "tokens.safetensors"
RUNS_FILE = "runs.jsonl"
METADATA_KEY = "harvest"


def shard_name(index: int) -> str:
    return f"shard-{index:06d}.safetensors"


def record_name(index: int) -> str:
    return f"shard-{index:06d}.json"


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1) + "\n")


def read_json(path: Path) -> dict:
    return read_json_object(path)


def remove_stale_temporaries(directory: Path) -> list[str]:
    """Delete temporary files left by killed writers; returns their names.

    Call it only while no process writes into ``directory`` (before the run's
    first barrier).
    """
    stale = sorted(p for p in directory.iterdir() if p.name.startswith(".") and TEMP_MARKER in p.name)
    for path in stale:
        path.unlink()
    return [p.name for p in stale]


def save_tensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict, on_temp_file=None) -> str:
    """Atomically write ``tensors`` as safetensors; returns the sha256 of the bytes written.

    ``metadata`` goes into the header as one key, ``"harvest"``, holding its JSON
    with sorted keys: safetensors keeps header metadata in a hash map whose order
    varies between processes, and one key keeps the file's bytes reproducible.

    ``on_temp_file(temp_path)`` runs once the temporary file is complete, before
    the rename (the resumability tests use it to stop a process at that moment).
    """
    digest: dict[str, str] = {}

    def hash_and_hook(temp: Path) -> None:
        digest["sha256"] = sha256_of_file(temp)
        if on_temp_file is not None:
            on_temp_file(temp)

    header = {METADATA_KEY: json.dumps(metadata, sort_keys=True)}
    atomic_write(path, lambda temp: save_file(tensors, str(temp), metadata=header), before_rename=hash_and_hook)
    return digest["sha256"]


def load_tensor(path: Path, name: str) -> torch.Tensor:
    """One tensor of a safetensors file (``ValueError`` if the file or the name is missing)."""
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            if name not in handle.keys():  # noqa: SIM118 (a safe_open handle has no __contains__)
                raise ValueError(f"{path} holds no tensor {name!r}; it holds {sorted(handle.keys())}")
            return handle.get_tensor(name)
    except (SafetensorError, OSError) as error:
        raise ValueError(f"{path} is not a readable safetensors file ({error}); the file is damaged") from error


def check_writable(directory: Path) -> None:
    """Create ``directory`` if needed and prove a file can be written there (``ValueError`` otherwise)."""
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"out_dir {directory} is a file, expected a folder (or a path where one can be created)")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".write-probe{TEMP_MARKER}{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise ValueError(f"cannot write into out_dir {directory}: {error.strerror or error}") from error
