"""The GGUF container: header, metadata, tensor table, and each tensor's values, read without writing.

Layout of a GGUF file (versions 2 and 3, little-endian), as llama.cpp writes it::

    "GGUF"  u32 version  u64 tensor_count  u64 metadata_count
    metadata_count x (string key, u32 value_type, value)
    tensor_count   x (string name, u32 n_dims, n_dims x u64 dims, u32 ggml_type, u64 offset)
    padding to ``general.alignment`` (32 by default)
    tensor data: each tensor at data_start + offset

A string is a u64 byte count and UTF-8 bytes; an array is a u32 element type, a
u64 count and the elements. ``dims`` run fastest-varying first, so a torch shape
is ``dims`` reversed: a ``[d_out, d_in]`` weight is stored as ``dims = [d_in, d_out]``
with each row of ``d_in`` values contiguous.

Quantized types store each row as blocks of ``block_size`` values in
``type_size`` bytes (Q4_1: 32 values in 20 bytes, a float16 scale ``d``, a float16
minimum ``m`` and 32 four-bit ``q``, value ``= d * q + m``). Dequantization is the
``gguf`` package's (``gguf.quants.dequantize``); this module finds the bytes, checks
them against the file and hands them over.

Every malformed or truncated file gives a ``ValueError`` saying where the file
ends and what was being read, never a raw ``struct`` or ``numpy`` error. The file
is opened read-only; nothing is written.
"""

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # ggml tensors have at most four dimensions

# GGUF metadata value types: id -> (struct format, byte width) for the fixed-size ones.
_SCALAR_FORMATS = {
    0: ("<B", 1),
    1: ("<b", 1),
    2: ("<H", 2),
    3: ("<h", 2),
    4: ("<I", 4),
    5: ("<i", 4),
    6: ("<f", 4),
    7: ("<?", 1),
    10: ("<Q", 8),
    11: ("<q", 8),
    12: ("<d", 8),
}
_NUMPY_TYPES = {
    0: np.uint8,
    1: np.int8,
    2: np.uint16,
    3: np.int16,
    4: np.uint32,
    5: np.int32,
    6: np.float32,
    7: np.bool_,
    10: np.uint64,
    11: np.int64,
    12: np.float64,
}
_FLOAT32, _STRING, _ARRAY = 6, 8, 9

# The ggml types we turn into values: stored floats, and the block formats the gguf package dequantizes.
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
DEQUANTIZE_CHUNK_VALUES = 1 << 22  # values dequantized at once (16 MiB of float32)
_TORCH_FLOATS = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def _gguf_package():
    try:
        import gguf
    except ImportError as error:
        raise ImportError("reading GGUF files needs the gguf package: pip install gguf") from error
    return gguf


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor table: ``shape`` in torch order, ``start`` the absolute byte offset."""

    name: str
    shape: tuple[int, ...]
    type_name: str
    type_id: int
    start: int
    nbytes: int


@dataclass(frozen=True)
class GGUFHeader:
    """Everything in a GGUF file except the tensor data."""

    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]


class _Cursor:
    """Reads little-endian values from a buffer, refusing to read past its end."""

    def __init__(self, buffer, path: Path):
        self.buffer, self.path, self.pos, self.size = buffer, path, 0, len(buffer)

    def take(self, nbytes: int, what: str) -> bytes:
        end = self.pos + nbytes
        if nbytes < 0 or end > self.size:
            raise ValueError(
                f"{self.path} is truncated or corrupt: reading {what} needs bytes {self.pos}..{end}, "
                f"but the file has {self.size} bytes"
            )
        data = self.buffer[self.pos : end]
        self.pos = end
        return data

    def scalar(self, fmt: str, what: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        length = self.scalar("<Q", f"the length of {what}")
        raw = self.take(length, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(
                f"{self.path} is corrupt: {what} at byte {self.pos - length} is not UTF-8 ({error})"
            ) from error

    def value(self, value_type: int, what: str) -> Any:
        if value_type in _SCALAR_FORMATS:
            value = self.scalar(_SCALAR_FORMATS[value_type][0], what)
            # float32 metadata (norm eps, rope theta) as the decimal it was written from: 1e-05, not 9.99999974e-06
            return float(str(np.float32(value))) if value_type == _FLOAT32 else value
        if value_type == _STRING:
            return self.string(what)
        if value_type == _ARRAY:
            element_type = self.scalar("<I", f"the element type of {what}")
            count = self.scalar("<Q", f"the length of {what}")
            return self.array(element_type, count, what)
        raise ValueError(
            f"{self.path} is corrupt: {what} has value type {value_type}, which GGUF does not define (0-12)"
        )

    def array(self, element_type: int, count: int, what: str) -> list:
        if element_type in _NUMPY_TYPES:
            width = _SCALAR_FORMATS[element_type][1]
            values = np.frombuffer(
                self.take(count * width, what), dtype=np.dtype(_NUMPY_TYPES[element_type]).newbyteorder("<")
            )
            if element_type == _FLOAT32:
                return [float(str(value)) for value in values]
            return values.tolist()
        # Every element takes at least 8 bytes (a string's length), which bounds a corrupt count.
        if count * 8 > self.size - self.pos:
            raise ValueError(
                f"{self.path} is truncated or corrupt: {what} claims {count} elements, more than the file can hold"
            )
        return [self.value(element_type, f"element {index} of {what}") for index in range(count)]


def read_header(path: str | Path) -> GGUFHeader:
    """The metadata and tensor table of the GGUF file at ``path`` (no tensor data read).

    Checks that every tensor's bytes lie inside the file, so a truncated file is
    reported here rather than when a tensor is first read.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no GGUF file at {path}")
    size = path.stat().st_size
    if size < 24:
        raise ValueError(f"{path} is not a GGUF file: it has {size} bytes, fewer than a GGUF header's 24")
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        return _parse_header(_Cursor(mapped, path), path)


def _parse_header(cursor: _Cursor, path: Path) -> GGUFHeader:
    magic = cursor.take(4, "the magic bytes")
    if magic != GGUF_MAGIC:
        raise ValueError(f"{path} is not a GGUF file: it starts with {magic!r}, expected {GGUF_MAGIC!r}")
    version = cursor.scalar("<I", "the version")
    if version not in GGUF_VERSIONS:
        hint = " (a big-endian file, which is not supported)" if version & 0xFFFF == 0 else ""
        raise ValueError(f"{path} is GGUF version {version}{hint}; supported versions: {list(GGUF_VERSIONS)}")
    tensor_count = cursor.scalar("<Q", "the tensor count")
    metadata_count = cursor.scalar("<Q", "the metadata count")
    metadata: dict[str, Any] = {}
    for index in range(metadata_count):
        key = cursor.string(f"metadata key {index}")
        value_type = cursor.scalar("<I", f"the type of metadata {key!r}")
        metadata[key] = cursor.value(value_type, f"metadata {key!r}")
    entries = []
    for index in range(tensor_count):
        name = cursor.string(f"the name of tensor {index}")
        n_dims = cursor.scalar("<I", f"the rank of tensor {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise ValueError(f"{path} is corrupt: tensor {name!r} has {n_dims} dimensions, expected 1..{MAX_DIMS}")
        dims = struct.unpack(f"<{n_dims}Q", cursor.take(8 * n_dims, f"the shape of tensor {name!r}"))
        type_id = cursor.scalar("<I", f"the type of tensor {name!r}")
        offset = cursor.scalar("<Q", f"the offset of tensor {name!r}")
        entries.append((name, tuple(reversed(dims)), type_id, offset))
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"{path} is corrupt: general.alignment={alignment!r} must be a positive power of two")
    data_start = -(-cursor.pos // alignment) * alignment
    tensors = {}
    for name, shape, type_id, offset in entries:
        if name in tensors:
            raise ValueError(f"{path} is corrupt: tensor {name!r} appears twice in the tensor table")
        tensors[name] = _tensor_info(path, name, shape, type_id, data_start + offset, cursor.size)
    return GGUFHeader(path, version, metadata, tensors)


def _tensor_info(path: Path, name: str, shape: tuple[int, ...], type_id: int, start: int, file_size: int) -> TensorInfo:
    gguf = _gguf_package()
    try:
        quant_type = gguf.GGMLQuantizationType(type_id)
    except ValueError:
        raise ValueError(
            f"{path} is corrupt or too new: tensor {name!r} has ggml type id {type_id}, unknown to the gguf package"
        ) from None
    block_size, type_size = gguf.GGML_QUANT_SIZES[quant_type]
    if any(dim == 0 for dim in shape) or shape[-1] % block_size:
        raise ValueError(
            f"{path} is corrupt: tensor {name!r} of type {quant_type.name} has shape {list(shape)}; rows must be "
            f"a positive multiple of the block size {block_size}"
        )
    nbytes = math.prod(shape) // block_size * type_size  # Python ints: a corrupt shape cannot overflow
    if start + nbytes > file_size:
        raise ValueError(
            f"{path} is truncated: tensor {name!r} needs bytes {start}..{start + nbytes}, but the file has {file_size} "
            "bytes"
        )
    return TensorInfo(name, shape, quant_type.name, type_id, start, nbytes)


def check_supported_type(info: TensorInfo) -> None:
    """``ValueError`` naming the tensor, its type and the supported types, unless we can dequantize it."""
    if info.type_name not in SUPPORTED_TYPES:
        raise ValueError(
            f"tensor {info.name!r} has ggml type {info.type_name}, which cannot be dequantized; "
            f"supported types: {list(SUPPORTED_TYPES)}"
        )


def read_tensor(path: Path, info: TensorInfo) -> Tensor:
    """The values of one tensor, shape ``info.shape``: stored floats as stored, block formats as float32.

    Reads only this tensor's bytes (one ``read`` of ``info.nbytes``), so memory
    holds the packed bytes and the values of one tensor at a time.
    """
    check_supported_type(info)
    raw = bytearray(info.nbytes)  # writable, so torch can own the values without a copy
    with open(path, "rb") as handle:
        handle.seek(info.start)
        received = handle.readinto(raw)
    if received != info.nbytes:
        raise ValueError(
            f"{path} is truncated: tensor {info.name!r} needs {info.nbytes} bytes at {info.start}, read {received}"
        )
    if info.type_name in _TORCH_FLOATS:
        return torch.frombuffer(raw, dtype=_TORCH_FLOATS[info.type_name]).reshape(info.shape)
    gguf = _gguf_package()
    quant_type = gguf.GGMLQuantizationType(info.type_id)
    rows = np.frombuffer(raw, dtype=np.uint8).reshape(-1, info.nbytes // max(1, math.prod(info.shape[:-1])))
    # a chunk of rows at a time into the result, so the dequantizer's temporaries stay small beside a large tensor
    values = np.empty((rows.shape[0], info.shape[-1]), dtype=np.float32)
    step = max(1, DEQUANTIZE_CHUNK_VALUES // info.shape[-1])
    for start in range(0, rows.shape[0], step):
        values[start : start + step] = gguf.quants.dequantize(rows[start : start + step], quant_type)
    return torch.from_numpy(values).reshape(info.shape)


__all__ = ["GGUFHeader", "SUPPORTED_TYPES", "TensorInfo", "check_supported_type", "read_header", "read_tensor"]
