"""Pieces the tools share: readers, the checkpoint index, name filters, sizes, dtypes."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol, cast

import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)

from s3ckpt.dcp.reader import S3StorageReader
from s3ckpt.errors import ConfigError
from s3ckpt.format import ItemRecord, Manifest
from s3ckpt.store import Location

__all__ = [
    "Chunk",
    "Entry",
    "NameFilter",
    "dtype_name",
    "index_checkpoint",
    "open_reader",
    "parse_dtype",
    "parse_size",
]


def open_reader(
    source: Location | S3StorageReader, *, roll_forward: bool = True
) -> S3StorageReader:
    """An :class:`S3StorageReader` at ``source``, with its settings (reads ``s3ckpt.json``
    and ``.metadata``); an open reader passes through."""
    if isinstance(source, S3StorageReader):
        return source
    return S3StorageReader(source, roll_forward=roll_forward)


# -- the checkpoint index ---------------------------------------------------------------------
@dataclass(frozen=True)
class Chunk:
    """One saved item: a tensor chunk (or a whole non-tensor item) and where it lives."""

    offsets: tuple[int, ...] | None
    """Offsets of the chunk in the full tensor; ``None`` for a non-tensor item."""
    sizes: tuple[int, ...] | None
    object: str
    start: int
    length: int
    record: ItemRecord | None
    """The ``s3ckpt.json`` row (with its CRC32C), ``None`` for other writers' checkpoints."""


@dataclass
class Entry:
    """One state-dict key of a checkpoint (DCP's flattened name) and its saved chunks."""

    name: str
    kind: str
    """``"tensor"`` or ``"bytes"`` (a pickled non-tensor value)."""
    dtype: torch.dtype | None = None
    shape: tuple[int, ...] | None = None
    chunks: list[Chunk] = field(default_factory=list)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape or ():
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        """Bytes of the full tensor (0 for non-tensor items)."""
        if self.kind != "tensor" or self.dtype is None:
            return 0
        return self.numel * torch.empty((), dtype=self.dtype).element_size()

    @property
    def stored_bytes(self) -> int:
        """Bytes of the saved items (framing included)."""
        return sum(c.length for c in self.chunks)

    @property
    def objects(self) -> list[str]:
        return sorted({c.object for c in self.chunks})


class _Stored(Protocol):
    """What ``.metadata``'s ``storage_data`` says about one item (the fields of torch's
    ``_StorageInfo`` the tools read; typed structurally, so no private torch name)."""

    relative_path: str
    offset: int
    length: int


def index_checkpoint(reader: S3StorageReader) -> dict[str, Entry]:
    """Every key of the checkpoint in ``.metadata`` order, with its chunks and records."""
    metadata: Metadata = reader.metadata
    manifest: Manifest | None = reader.manifest
    records = manifest.item_index() if manifest is not None else {}
    storage = cast(dict[MetadataIndex, _Stored], metadata.storage_data)
    entries: dict[str, Entry] = {}
    for fqn, md in metadata.state_dict_metadata.items():
        if isinstance(md, TensorStorageMetadata):
            entries[fqn] = Entry(fqn, "tensor", md.properties.dtype, tuple(md.size))
        else:
            assert isinstance(md, BytesStorageMetadata)
            entries[fqn] = Entry(fqn, "bytes")
    tensor_chunks = {
        (fqn, tuple(c.offsets)): tuple(c.sizes)
        for fqn, md in metadata.state_dict_metadata.items()
        if isinstance(md, TensorStorageMetadata)
        for c in md.chunks
    }
    for index, info in storage.items():
        entry = entries.get(index.fqn)
        if entry is None:
            continue
        offsets = tuple(index.offset) if index.offset is not None else None
        sizes = tensor_chunks.get((index.fqn, offsets)) if offsets is not None else None
        entry.chunks.append(
            Chunk(
                offsets=offsets,
                sizes=sizes,
                object=info.relative_path,
                start=info.offset,
                length=info.length,
                record=records.get((index.fqn, offsets)),
            )
        )
    for entry in entries.values():
        entry.chunks.sort(key=lambda c: c.offsets or ())
    return entries


# -- names --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NameFilter:
    """Glob filters on state-dict keys (``fnmatch``: ``*`` also matches dots).

    A key passes if it matches any ``include`` pattern (or there are none) and no
    ``exclude`` pattern.
    """

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    @classmethod
    def of(
        cls, include: Iterable[str] | str | None = None, exclude: Iterable[str] | str | None = None
    ) -> NameFilter:
        def tup(v: Iterable[str] | str | None) -> tuple[str, ...]:
            if v is None:
                return ()
            return (v,) if isinstance(v, str) else tuple(v)

        return cls(tup(include), tup(exclude))

    def __call__(self, name: str) -> bool:
        if self.include and not any(fnmatch.fnmatchcase(name, p) for p in self.include):
            return False
        return not any(fnmatch.fnmatchcase(name, p) for p in self.exclude)


# -- sizes and dtypes ---------------------------------------------------------------------------
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "ki": 2**10,
    "kib": 2**10,
    "mi": 2**20,
    "mib": 2**20,
    "gi": 2**30,
    "gib": 2**30,
    "ti": 2**40,
    "tib": 2**40,
}


def parse_size(text: str | int) -> int:
    """``"5GB"`` -> 5e9, ``"500MiB"`` -> 500 * 2**20, ``123`` -> 123 (Hugging Face's units:
    KB/MB/GB are powers of 10, KiB/MiB/GiB powers of 2)."""
    if isinstance(text, int):
        value = text
    else:
        m = _SIZE_RE.match(text)
        if m is None:
            raise ConfigError(f"not a size: {text!r}; expected e.g. 5GB, 500MiB or 1000000")
        value = int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])
    if value <= 0:
        raise ConfigError(f"size must be positive, got {text!r}")
    return value


_DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
    "fp64": torch.float64,
    "float64": torch.float64,
    "double": torch.float64,
    "fp8_e4m3": torch.float8_e4m3fn,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
    "float8_e5m2": torch.float8_e5m2,
}


def parse_dtype(text: str | torch.dtype | None) -> torch.dtype | None:
    """A floating-point dtype from ``bf16``, ``fp16``, ``fp32``, ``float32`` ... (or None)."""
    if text is None or isinstance(text, torch.dtype):
        return text
    dtype = _DTYPES.get(text.lower())
    if dtype is None:
        raise ConfigError(f"unknown dtype {text!r}; expected one of {', '.join(sorted(_DTYPES))}")
    return dtype


def dtype_name(dtype: torch.dtype | None) -> str | None:
    """``torch.float32`` -> ``"float32"``."""
    return None if dtype is None else str(dtype).removeprefix("torch.")
