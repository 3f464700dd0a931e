"""Reading and writing SAEs in SAELens' folder format, strictly and safely.

A folder holds

``cfg.json``
    the config (format 6.x or older; see ``sae.config``);
``sae_weights.safetensors``
    the tensors (``W_enc``, ``b_enc``, ``W_dec``, ``b_dec``, ...). A folder without
    it may hold ``sae_weights.pt`` or ``sae_weights.bin`` instead, read only with
    ``torch.load(weights_only=True)``: a file that holds anything besides tensors
    is refused, never unpickled;
``sparsity.safetensors`` (optional)
    one tensor ``sparsity [d_sae]``, the log10 firing rate of each feature.

Loading is strict: a missing, unexpected or mis-shaped tensor raises one
``CheckpointError`` (a ``ValueError``) listing every difference, an unknown
architecture a ``ValueError`` listing the known ones. Two leftovers of older
SAELens files are read as SAELens reads them: a ``scaling_factor`` of all ones
is dropped (any other value is refused), and a JumpReLU ``log_threshold`` becomes
``threshold = exp(log_threshold)``.
"""

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

from interp_transformer.core.files import atomic_write, read_json_object
from interp_transformer.loading.sources import read_bin_file
from interp_transformer.sae.architectures import architecture_named
from interp_transformer.sae.config import SAEConfig, parse_dtype

CFG_FILE = "cfg.json"
WEIGHTS_FILE = "sae_weights.safetensors"
PICKLE_WEIGHTS_FILES = ("sae_weights.pt", "sae_weights.bin")  # read with weights_only=True
SPARSITY_FILE = "sparsity.safetensors"


def read_config(folder: str | Path) -> dict:
    """The raw ``cfg.json`` of an SAE folder."""
    path = Path(folder) / CFG_FILE
    if not path.is_file():
        present = sorted(p.name for p in Path(folder).iterdir()) if Path(folder).is_dir() else "no such folder"
        raise ValueError(f"no {CFG_FILE} in {folder}: an SAE folder in SAELens' format needs one (found: {present})")
    return read_json_object(path, "a JSON object (an SAE config)")


def read_safetensors(path: Path, dtype: torch.dtype | None = None) -> dict[str, Tensor]:
    """Every tensor of a safetensors file, each cast to ``dtype`` as it is read."""
    from safetensors import SafetensorError, safe_open

    tensors = {}
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            for name in handle.keys():  # noqa: SIM118 (a safe_open handle has no __iter__)
                tensor = handle.get_tensor(name)
                tensors[name] = tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor
    except (SafetensorError, OSError, ValueError, RuntimeError) as error:
        raise ValueError(
            f"{path} is not a readable safetensors file ({error}); the file is corrupt or truncated"
        ) from error
    return tensors


def read_weights(folder: str | Path, dtype: torch.dtype | None = None) -> dict[str, Tensor]:
    """The tensors of an SAE folder: safetensors, else a pickle read with ``weights_only=True``."""
    folder = Path(folder)
    if (folder / WEIGHTS_FILE).is_file():
        return read_safetensors(folder / WEIGHTS_FILE, dtype)
    for name in PICKLE_WEIGHTS_FILES:
        if (folder / name).is_file():
            tensors = read_bin_file(folder / name)
            return {k: v.to(dtype) if dtype is not None and v.is_floating_point() else v for k, v in tensors.items()}
    present = sorted(p.name for p in folder.iterdir())
    raise ValueError(
        f"no SAE weights in {folder}: expected {WEIGHTS_FILE} (or one of {list(PICKLE_WEIGHTS_FILES)}), found {present}"
    )


def prepare_tensors(cfg: SAEConfig, tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``tensors`` with the leftovers of older SAELens files read as SAELens reads them (module docstring)."""
    tensors = dict(tensors)
    if "scaling_factor" in tensors:
        scaling = tensors.pop("scaling_factor")
        if not torch.equal(scaling, torch.ones_like(scaling)):
            raise ValueError(
                "the SAE weights hold a scaling_factor that is not all ones (a finetuning scaling of the "
                "decoder, which the format no longer has); fold it into W_dec first"
            )
    if (
        "log_threshold" in tensors
        and "threshold" not in tensors
        and "threshold" in architecture_named(cfg.architecture).parameters
    ):
        tensors["threshold"] = tensors.pop("log_threshold").exp()
    return tensors


def read_sae_folder(folder: str | Path, *, dtype=None) -> tuple[SAEConfig, dict, Tensor | None]:
    """An SAE folder (see the module docstring) as ``(config, prepared tensors, sparsity or None)``.

    ``dtype`` overrides the config's dtype; tensors are cast as they are read. ``SAE.load``
    builds the module from these.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(
            f"{folder} is not a folder: an SAE in SAELens' format is a folder with {CFG_FILE} and {WEIGHTS_FILE}"
        )
    cfg = SAEConfig.from_dict(read_config(folder))
    if dtype is not None:
        cfg = cfg.replace(dtype=parse_dtype(dtype))
    tensors = prepare_tensors(cfg, read_weights(folder, cfg.dtype))
    sparsity = None
    if (folder / SPARSITY_FILE).is_file():
        stored = read_safetensors(folder / SPARSITY_FILE)
        if set(stored) != {"sparsity"}:
            raise ValueError(f"{folder / SPARSITY_FILE} must hold one tensor named 'sparsity', got {sorted(stored)}")
        sparsity = stored["sparsity"]
    return cfg, tensors, sparsity


def save_sae(sae, folder: str | Path) -> Path:
    """Write ``sae`` to ``folder`` in SAELens' format (cfg format 6.x); returns the folder.

    Each file is written to a temporary name and renamed, so an interrupted save
    never leaves a half-written file under the real name.
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    weights = {name: tensor.detach().contiguous().cpu() for name, tensor in sae.state_dict().items()}
    files = [(WEIGHTS_FILE, lambda path: save_file(weights, str(path)))]
    if sae.sparsity is not None:
        sparsity = {"sparsity": sae.sparsity.detach().contiguous().cpu()}
        files.append((SPARSITY_FILE, lambda path: save_file(sparsity, str(path))))
    config = json.dumps(sae.cfg.replace(dtype=sae.dtype).to_dict(), indent=1)
    files.append((CFG_FILE, lambda path: path.write_text(config, encoding="utf-8")))
    for name, write in files:
        atomic_write(folder / name, write)
    return folder


__all__ = [
    "CFG_FILE",
    "SPARSITY_FILE",
    "WEIGHTS_FILE",
    "prepare_tensors",
    "read_sae_folder",
    "read_config",
    "read_weights",
    "save_sae",
]
