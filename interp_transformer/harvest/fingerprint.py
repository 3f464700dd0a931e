"""What determines the harvested activations, hashed, so that drift is never silent.

The fingerprint holds, as plain JSON values:

- ``weights_sha256``: sha256 over the model's ``state_dict`` in sorted name order,
  each entry hashed as its name, dtype, shape and raw bytes;
- ``processing``: the model's weight-processing steps (``model.processing``);
- ``hooks``: the hook names kept, in forward order;
- ``tokenizer_sha256``: sha256 of the tokenizer's full serialisation (vocabulary,
  merges, normalizer, pre-tokenizer, added tokens), or ``"none"``;
- ``context_length``, ``prepend_bos``, ``bos_token_id``, ``separator_token_id``;
- ``dtype``: the storage dtype;
- ``interp_transformer_version``, ``torch_version``.

``content_hash`` is the sha256 of the fingerprint's canonical JSON (sorted keys,
no whitespace). Two harvests with the same content hash computed the same
function of their tokens; the tokens themselves are hashed separately
(``tokens_sha256`` in the manifest), so harvests of different corpora with
one model and hook list share a content hash.
"""

import hashlib
import json
from importlib.metadata import PackageNotFoundError, version

import einops
import torch


def weights_sha256(model: torch.nn.Module) -> str:
    """sha256 of ``model.state_dict()``: names sorted; per tensor its name, dtype, shape and bytes."""
    digest = hashlib.sha256()
    state = model.state_dict()
    for name in sorted(state):
        tensor = state[name].detach()
        digest.update(f"{name}|{str(tensor.dtype).removeprefix('torch.')}|{list(tensor.shape)}\n".encode())
        digest.update(_raw_bytes(tensor))
    return digest.hexdigest()


def _raw_bytes(tensor: torch.Tensor) -> memoryview:
    # a uint8 view reads every dtype's bytes (numpy has no bfloat16) without converting values
    flat = einops.rearrange(tensor.detach().cpu().contiguous(), "... -> (...)")
    return flat.view(torch.uint8).numpy().data  # the array's buffer, as a memoryview


def tensor_sha256(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's dtype, shape and bytes."""
    digest = hashlib.sha256(f"{str(tensor.dtype).removeprefix('torch.')}|{list(tensor.shape)}\n".encode())
    digest.update(_raw_bytes(tensor))
    return digest.hexdigest()


def tokenizer_sha256(tokenizer) -> str:
    """sha256 of everything that decides a tokenizer's ids, or ``"none"`` without a tokenizer.

    A fast (Rust) tokenizer is serialised whole (``backend_tokenizer.to_str()``);
    another is hashed through its vocabulary (sorted), its merges if it has
    them, and its special tokens.
    """
    if tokenizer is None:
        return "none"
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        text = backend.to_str()
    else:
        vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
        merges = sorted(getattr(tokenizer, "bpe_ranks", {}).items(), key=lambda item: item[1])
        text = json.dumps({"vocab": vocab, "merges": [list(pair) for pair, _ in merges]}, ensure_ascii=False)
    specials = json.dumps(getattr(tokenizer, "special_tokens_map", {}), sort_keys=True)
    return hashlib.sha256(f"{type(tokenizer).__name__}\n{specials}\n{text}".encode()).hexdigest()


def library_versions() -> dict[str, str]:
    try:
        ours = version("interp-transformer")
    except PackageNotFoundError:
        ours = "unknown"
    return {"interp_transformer_version": ours, "torch_version": torch.__version__}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def make_fingerprint(
    model,
    hooks: list[str],
    context_length: int,
    prepend_bos: bool,
    bos_token_id: int | None,
    separator_token_id: int,
    dtype: torch.dtype,
) -> dict:
    """The fingerprint dict of this harvest (see the module docstring)."""
    return {
        "weights_sha256": weights_sha256(model),
        "processing": list(getattr(model, "processing", [])),
        "hooks": list(hooks),
        "tokenizer_sha256": tokenizer_sha256(getattr(model, "tokenizer", None)),
        "context_length": int(context_length),
        "prepend_bos": bool(prepend_bos),
        "bos_token_id": None if bos_token_id is None else int(bos_token_id),
        "separator_token_id": int(separator_token_id),
        "dtype": dtype_name(dtype),
        **library_versions(),
    }


def content_hash(fingerprint: dict) -> str:
    canonical = json.dumps(fingerprint, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def differences(recorded: dict, current: dict) -> list[str]:
    """One line per field whose value differs: ``field: folder has X, this run has Y``."""
    lines = []
    for key in sorted(set(recorded) | set(current)):
        old, new = recorded.get(key, "<absent>"), current.get(key, "<absent>")
        if old != new:
            lines.append(f"{key}: folder has {_short(old)}, this run has {_short(new)}")
    return lines


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 120 else text[:117] + "..."


__all__ = [
    "content_hash",
    "differences",
    "dtype_name",
    "make_fingerprint",
    "tensor_sha256",
    "tokenizer_sha256",
    "weights_sha256",
]
