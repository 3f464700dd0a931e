"""Models that ship inside the package, loadable with no network.

``induction-2l``: a 2-layer attention-only model trained on repeated random
tokens (see ``interp_transformer.induction``), in which a previous-token head
and an induction head form. Stored as safetensors next to a JSON file holding
its config, training settings and training curve.
"""

import dataclasses
import json
from pathlib import Path
from typing import Optional, Union

import torch
from safetensors.torch import load_file, save_file

from .config import TransformerConfig
from .model import DemoTransformer

PRETRAINED_DIR = Path(__file__).parent / "pretrained"
SHIPPED_MODELS = ("induction-2l",)


def shipped_paths(name: str, directory: Path = PRETRAINED_DIR) -> tuple[Path, Path]:
    if name not in SHIPPED_MODELS:
        raise KeyError(f"no shipped model named {name!r}; shipped models: {list(SHIPPED_MODELS)}")
    return directory / f"{name}.safetensors", directory / f"{name}.json"


def save_shipped(model: DemoTransformer, name: str, metadata: dict, directory: Path = PRETRAINED_DIR) -> tuple[Path, Path]:
    """Write ``model``'s weights (safetensors) and ``{config, **metadata}`` (JSON)."""
    weights_path, meta_path = shipped_paths(name, directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(weights_path))
    meta = {"config": dataclasses.asdict(model.cfg), **metadata}
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    return weights_path, meta_path


def load_shipped_metadata(name: str, directory: Path = PRETRAINED_DIR) -> dict:
    _, meta_path = shipped_paths(name, directory)
    if not meta_path.exists():
        raise FileNotFoundError(f"{meta_path} is missing: retrain with `interp-transformer train-induction`")
    return json.loads(meta_path.read_text())


def load_shipped(
    name: str = "induction-2l",
    dtype: torch.dtype = torch.float32,
    device: Union[str, torch.device, None] = None,
    directory: Optional[Path] = None,
) -> DemoTransformer:
    """Load a shipped model by name, e.g. ``load_shipped("induction-2l")``."""
    directory = PRETRAINED_DIR if directory is None else Path(directory)
    weights_path, _ = shipped_paths(name, directory)
    meta = load_shipped_metadata(name, directory)
    cfg = TransformerConfig(**meta["config"])
    model = DemoTransformer(cfg, dtype=dtype, device=device)
    state = load_file(str(weights_path))
    model.load_state_dict(state, strict=True)
    return model.to(dtype=dtype).eval()


def load_induction_model(**kwargs) -> DemoTransformer:
    """The shipped 2-layer attention-only induction model."""
    return load_shipped("induction-2l", **kwargs)
