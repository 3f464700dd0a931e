"""Checkpoints: everything a run needs to continue exactly where it stopped.

One file, ``checkpoint.pt`` in the run's checkpoint folder, replaced whole at each save (written
beside it, then moved into place, so a run killed while saving leaves the previous one). It
holds the step reached, the model's weights, AdamW's moments, the gradient scaler's state,
the data generator's state, the training curve, and what the run was (settings, task, model
config): a resumed run draws the same batches and takes the same steps as one that never
stopped. It holds tensors, numbers and strings only, and is read with
``torch.load(weights_only=True)``: nothing in it is unpickled as code.
"""

import dataclasses
import json
import pickle
from pathlib import Path

import torch

from interp_transformer.core.files import atomic_write
from interp_transformer.training.settings import TrainSettings

CHECKPOINT_FILE = "checkpoint.pt"
FORMAT = 1
# settings a resumed run may change: what is logged or saved, and the thread count (float rounding only)
RESUMABLE_CHANGES = ("log_every", "checkpoint_every", "threads")


def config_record(cfg) -> str:
    """The model config as a JSON string (what a checkpoint records and compares)."""
    return json.dumps(dataclasses.asdict(cfg), sort_keys=True, default=str)


def save_checkpoint(folder: Path, state: dict) -> Path:
    """Write ``state`` to ``folder/checkpoint.pt`` in one step (``files.atomic_write``)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / CHECKPOINT_FILE
    atomic_write(path, lambda partial: torch.save({"format": FORMAT, **state}, partial))
    return path


def load_checkpoint(folder: Path | None) -> dict | None:
    """The checkpoint in ``folder``, or None when there is none; a file of another format raises ``ValueError``."""
    if folder is None or not (Path(folder) / CHECKPOINT_FILE).is_file():
        return None
    path = Path(folder) / CHECKPOINT_FILE
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as error:  # a damaged or foreign file
        raise ValueError(f"{path} is not a readable training checkpoint: {error}") from error
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"{path}: expected a training checkpoint of format {FORMAT}, got format {found!r}")
    return state


def _setting_defaults() -> dict:
    return {f.name: f.default for f in dataclasses.fields(TrainSettings) if f.default is not dataclasses.MISSING}


def check_same_run(state: dict, path: Path, settings: dict, task: dict, config: str) -> None:
    """Refuse to resume from a checkpoint of another run, naming what differs."""
    ours = {key: value for key, value in settings.items() if key not in RESUMABLE_CHANGES}
    # a setting added after the checkpoint was written had its default then (the behaviour before it existed)
    theirs = {**_setting_defaults(), **state["settings"]}
    theirs = {key: value for key, value in theirs.items() if key not in RESUMABLE_CHANGES}
    differences = [
        f"{key}: checkpoint {theirs.get(key)!r}, now {ours.get(key)!r}" for key in ours if ours[key] != theirs.get(key)
    ]
    differences += [f"task: checkpoint {state['task']}, now {task}"] if state["task"] != task else []
    differences += [f"model config: checkpoint {state['config']}, now {config}"] if state["config"] != config else []
    if differences:
        raise ValueError(
            f"{path} was written by another run, so it cannot be resumed ({'; '.join(differences)}); "
            "use another output folder, or delete the checkpoint to start again"
        )


__all__ = ["CHECKPOINT_FILE", "check_same_run", "config_record", "load_checkpoint", "save_checkpoint"]
