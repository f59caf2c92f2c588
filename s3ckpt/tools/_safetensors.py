"""The safetensors file format, written and read without the ``safetensors`` package.

A file is an 8-byte little-endian header length ``N``, ``N`` bytes of JSON (each tensor's
``dtype``, ``shape`` and ``data_offsets`` ``[begin, end)`` relative to the byte after the
header, plus an optional ``__metadata__`` map of strings), then the raw little-endian
tensor bytes, contiguous and in offset order. Because the header only needs names, dtypes
and shapes, a writer can emit it first and then stream tensors one at a time, and a reader
can fetch any tensor with one ranged read.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from s3ckpt.errors import CorruptCheckpointError

__all__ = [
    "HeaderEntry",
    "ST_DTYPES",
    "TORCH_TO_ST",
    "build_header",
    "parse_header",
    "tensor_bytes",
]

ST_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U64": torch.uint64,
    "U32": torch.uint32,
    "U16": torch.uint16,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
TORCH_TO_ST: dict[torch.dtype, str] = {v: k for k, v in ST_DTYPES.items()}

# The Rust implementation refuses headers above 100 MB.
MAX_HEADER = 100_000_000


@dataclass(frozen=True)
class HeaderEntry:
    """One tensor of a safetensors file."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


def build_header(
    tensors: Sequence[tuple[str, torch.dtype, tuple[int, ...]]],
    metadata: Mapping[str, str] | None = None,
) -> tuple[bytes, int]:
    """The 8-byte length plus JSON header for ``tensors`` laid out in the given order, and
    the number of data bytes that must follow."""
    doc: dict[str, object] = {}
    if metadata:
        doc["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    for name, dtype, shape in tensors:
        n = math.prod(shape) * dtype.itemsize
        doc[name] = {
            "dtype": TORCH_TO_ST[dtype],
            "shape": list(shape),
            "data_offsets": [offset, offset + n],
        }
        offset += n
    raw = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # keep tensor data 8-byte aligned, as safetensors does
    return struct.pack("<Q", len(raw)) + raw, offset


def parse_header(raw: bytes, *, where: str) -> tuple[list[HeaderEntry], int]:
    """Parse the JSON header bytes (without the 8-byte length).

    Returns the entries in data order and where the data starts in the file
    (``8 + len(raw)``); ``__metadata__`` is skipped.

    Raises:
        CorruptCheckpointError: naming ``where``, for anything that is not a valid header.
    """
    try:
        doc = json.loads(raw.decode("utf-8"))
        if not isinstance(doc, dict):
            raise ValueError("header is not a JSON object")
        doc.pop("__metadata__", None)
        entries = []
        for name, spec in doc.items():
            if (dtype := ST_DTYPES.get(spec["dtype"])) is None:
                raise ValueError(f"tensor {name!r} has unsupported dtype {spec['dtype']!r}")
            shape = tuple(int(s) for s in spec["shape"])
            begin, end = (int(x) for x in spec["data_offsets"])
            if end - begin != math.prod(shape) * dtype.itemsize or begin < 0:
                raise ValueError(f"tensor {name!r}: data_offsets do not match dtype and shape")
            entries.append(HeaderEntry(str(name), dtype, shape, begin, end))
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise CorruptCheckpointError(f"{where} is not a valid safetensors file: {exc}") from exc
    entries.sort(key=lambda e: (e.begin, e.end))
    return entries, 8 + len(raw)


def header_length(first8: bytes | bytearray, *, where: str) -> int:
    """The header length from a file's first 8 bytes."""
    if len(first8) < 8:
        raise CorruptCheckpointError(f"{where} is shorter than a safetensors header")
    (n,) = struct.unpack("<Q", first8[:8])
    if n > MAX_HEADER:
        raise CorruptCheckpointError(
            f"{where}: safetensors header of {n} bytes (limit {MAX_HEADER}); not a safetensors file"
        )
    return int(n)


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The raw bytes of a CPU tensor in row-major order (a view when already contiguous)."""
    t = tensor.detach().cpu().contiguous()
    return memoryview(t.reshape(-1).view(torch.uint8).numpy()) if t.numel() else memoryview(b"")
