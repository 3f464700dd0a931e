"""A set of transcoders on disk: one folder per layer in SAELens' format, or a cross-layer transcoder in
circuit-tracer's layout, with ``training.json`` (the training config and metrics) beside them.

``save_transcoders(transcoders, folder, record)`` writes ``folder/layer_{i}/`` (``cfg.json``,
``sae_weights.safetensors``) for each layer's SAE, or ``folder/W_enc_{i}.safetensors`` and
``folder/W_dec_{i}.safetensors`` for a ``CrossLayerTranscoder``; ``load_transcoders(folder)`` reads either back,
exactly (the tensors and configs round-trip bit for bit).
"""

import json
import re
from pathlib import Path

from interp_transformer.core.files import atomic_write_text
from interp_transformer.sae import SAE

from .clt import CrossLayerTranscoder
from .folder_files import inside_folder

RECORD = "training.json"
LAYER_FOLDER = re.compile(r"^layer_(\d+)$")


def save_transcoders(transcoders, folder: str | Path, record: dict | None = None) -> Path:
    """Write ``transcoders`` (a ``CrossLayerTranscoder``, or one SAE per layer in layer order) to ``folder``, with
    ``record`` as ``training.json`` when given (module docstring). Returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(transcoders, CrossLayerTranscoder):
        transcoders.save(folder)
    else:
        for layer, sae in enumerate(transcoders):
            if not isinstance(sae, SAE):
                raise TypeError(f"transcoder {layer} must be an SAE, got {type(sae).__name__}")
            sae.save(folder / f"layer_{layer}")
    if record is not None:
        atomic_write_text(folder / RECORD, json.dumps(record, indent=2, sort_keys=True) + "\n")
    return folder


def load_transcoders(folder: str | Path):
    """What ``save_transcoders`` wrote: a ``CrossLayerTranscoder`` (the folder holds ``W_enc_0.safetensors``) or the
    list of SAEs in ``layer_0``, ``layer_1``, ...; ``FileNotFoundError`` naming what was looked for."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no transcoder folder at {folder}")
    if (folder / "W_enc_0.safetensors").is_file():
        return CrossLayerTranscoder.load(folder)
    layers = sorted(
        (int(match.group(1)), path)
        for path in folder.iterdir()
        if path.is_dir() and (match := LAYER_FOLDER.match(path.name))
    )
    if not layers:
        raise FileNotFoundError(
            f"{folder} holds neither a cross-layer transcoder (W_enc_0.safetensors) nor per-layer folders layer_0, ..."
        )
    numbers = [n for n, _ in layers]
    if numbers != list(range(len(layers))):
        missing = sorted(set(range(max(numbers) + 1)) - set(numbers))
        raise FileNotFoundError(
            f"{folder}: per-layer folders must be layer_0 .. layer_{max(numbers)}; missing {missing}"
        )
    # a layer folder linked from elsewhere is refused before anything in it is read
    return [SAE.load(inside_folder(folder, path.name, f"{folder}'s layer {n}", kind="folder")) for n, path in layers]


def training_record(folder: str | Path) -> dict | None:
    """``training.json`` of a saved set, or None when there is none."""
    path = Path(folder) / RECORD
    return json.loads(path.read_text()) if path.is_file() else None


__all__ = ["load_transcoders", "save_transcoders", "training_record"]
