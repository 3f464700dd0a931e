"""Export a harvest to SAELens' cached-activations layout, so SAELens can train on it.

SAELens' ``CacheActivationsRunner`` writes, and its ``ActivationsStore`` reads
(``datasets.load_from_disk(path)``, then ``set_format("torch")``), a Hugging Face
``datasets`` folder with one row per context and these features:

- ``<hook_name>``: ``Array2D(shape=(context_size, d_in), dtype=<dtype name>)``;
  an activation with more than one axis after ``pos`` is flattened into ``d_in``
  (``[pos, head_index, d_head] -> [pos, head_index * d_head]``, as SAELens'
  ``get_activations`` does for head hooks);
- ``token_ids``: ``Sequence(Value("int32"), length=context_size)``.

``context_size`` counts the BOS in both tools, so it equals our ``context_length``.
The store checks ``features[hook_name].shape == (context_size, d_in)``. Rows are
written in global context order; SAELens shuffles when it trains.

Hooks whose activation is not ``[pos, ...]`` (attention patterns and scores,
``[head_index, query_pos, key_pos]``) have no place in this layout and are refused.
Arrow has no bfloat16, so bfloat16 activations are exported as float32 (exactly).
"""

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import einops
import torch
from safetensors import safe_open

from interp_transformer.harvest.fingerprint import dtype_name
from interp_transformer.harvest.manifest import Manifest

ARROW_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.float64: "float64"}


def saelens_features(manifest: Manifest, hooks: Sequence[str], dtype: torch.dtype):
    """The ``datasets.Features`` SAELens expects for ``hooks`` of this harvest."""
    from datasets import Array2D, Features, Value
    from datasets import Sequence as HFSequence

    context_length = manifest.context_length
    features = {}
    for name in hooks:
        shape = manifest.hook_shape(name)
        features[name] = Array2D(shape=(context_length, _d_in(shape)), dtype=ARROW_DTYPES[dtype])
    features["token_ids"] = HFSequence(Value("int32"), length=context_length)
    return Features(features)


def _d_in(shape: tuple[int, ...]) -> int:
    d_in = 1
    for size in shape[1:]:
        d_in *= size
    return d_in


def _export_dtype(manifest: Manifest, dtype: torch.dtype | None) -> torch.dtype:
    stored = getattr(torch, manifest.fingerprint["dtype"])
    if dtype is None:
        dtype = torch.float32 if stored == torch.bfloat16 else stored
    if dtype not in ARROW_DTYPES:
        raise ValueError(f"the export dtype must be one of {[dtype_name(d) for d in ARROW_DTYPES]}, received {dtype}")
    return dtype


def export_saelens(
    harvest_dir: str | Path,
    dest: str | Path,
    *,
    hooks: Sequence[str] | None = None,
    dtype: torch.dtype | None = None,
    check_hashes: bool = True,
    progress: bool = True,
) -> Path:
    """Write the harvest in ``harvest_dir`` to ``dest`` as SAELens' cached activations; returns ``dest``.

    ``hooks``: the hooks to export (default: all, each must be ``[pos, ...]``);
    SAELens trains on one hook per run, and each is a column here. ``dtype``: the
    column dtype (default: the storage dtype; bfloat16 becomes float32). ``dest``
    must not exist yet; it appears complete or not at all (written beside it,
    then renamed). ``progress=False`` silences datasets' bars. Load it with ``datasets.load_from_disk(dest)``, or point
    SAELens' ``cached_activations_path`` at it.
    """
    import datasets

    manifest = Manifest.read(harvest_dir).verify(check_hashes=check_hashes)
    hooks = manifest.hook_names if hooks is None else ([hooks] if isinstance(hooks, str) else list(hooks))
    for name in hooks:
        if tuple(manifest.hook_pos_axes(name)) != (0,):
            raise ValueError(
                f"{name} has shape {list(manifest.hook_shape(name))} per context, not [pos, ...]: SAELens' layout "
                "stores [context_size, d_in] per row, so it cannot hold it; export the other hooks"
            )
    dtype = _export_dtype(manifest, dtype)
    dest = Path(dest)
    if dest.exists():
        raise ValueError(f"{dest} already exists: the export writes a new folder (delete it, or choose another path)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    features = saelens_features(manifest, hooks, dtype)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    bars_were_on = datasets.is_progress_bar_enabled()
    if not progress:
        datasets.disable_progress_bars()
    try:
        parts = []
        for shard in sorted(manifest.shards, key=lambda s: s.first_context):
            columns = _shard_columns(manifest.out_dir / shard.file, hooks, dtype)
            part_dir = work / f"part-{shard.index:06d}"
            datasets.Dataset.from_dict(columns, features=features).save_to_disk(str(part_dir))
            parts.append(part_dir)
        combined = datasets.concatenate_datasets([datasets.load_from_disk(str(p)) for p in parts])
        combined.save_to_disk(str(work / "dataset"))
        del combined
        (work / "dataset").rename(dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if bars_were_on:
            datasets.enable_progress_bars()
    return dest


def _shard_columns(path: Path, hooks: Sequence[str], dtype: torch.dtype) -> dict:
    with safe_open(str(path), framework="pt", device="cpu") as handle:
        columns = {}
        for name in hooks:
            activation = handle.get_tensor(name).to(dtype)
            columns[name] = einops.rearrange(activation, "context pos ... -> context pos (...)").numpy()
        columns["token_ids"] = handle.get_tensor("token_ids").to(torch.int32).numpy()
    return columns
