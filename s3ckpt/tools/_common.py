"""Pieces the tools share: readers, the checkpoint index, name filters, sizes, dtypes."""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import MetadataIndex, TensorStorageMetadata

from s3ckpt.dcp import quiet_dcp
from s3ckpt.dcp.reader import S3StorageReader
from s3ckpt.errors import ConfigError
from s3ckpt.format._manifest import ItemRecord
from s3ckpt.metrics.instrument import in_context
from s3ckpt.store._location import LocationLike
from s3ckpt.tools._open import as_location

T = TypeVar("T")

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
    source: LocationLike | S3StorageReader, *, roll_forward: bool = True, **how: Any
) -> S3StorageReader:
    """An :class:`S3StorageReader` at ``source`` (reads ``s3ckpt.json`` and ``.metadata``);
    an open reader passes through, anything else is opened by
    :func:`~s3ckpt.tools._open.as_location` with ``how`` (its keywords)."""
    if isinstance(source, S3StorageReader):
        return source
    return S3StorageReader(as_location(source, **how), roll_forward=roll_forward)


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
        return math.prod(self.shape or ())

    @property
    def nbytes(self) -> int:
        """Bytes of the full tensor (0 for non-tensor items)."""
        return 0 if self.dtype is None else self.numel * self.dtype.itemsize  # (tensors only)

    @property
    def stored_bytes(self) -> int:
        """Bytes of the saved items (framing included)."""
        return sum(c.length for c in self.chunks)

    def load_bytes(self) -> int:
        """Bytes a load of it holds at most: the full tensor, or its saved items."""
        return max(self.nbytes, self.stored_bytes)

    @property
    def objects(self) -> list[str]:
        return sorted({c.object for c in self.chunks})


def index_checkpoint(reader: S3StorageReader) -> dict[str, Entry]:
    """Every key of the checkpoint in ``.metadata`` order, with its chunks and records."""
    records = reader.manifest.item_index() if reader.manifest is not None else {}
    storage = cast(dict[MetadataIndex, Any], reader.metadata.storage_data)  # torch's _StorageInfo
    entries: dict[str, Entry] = {}
    tensor_chunks: dict[tuple[str, tuple[int, ...]], tuple[int, ...]] = {}
    for fqn, md in reader.metadata.state_dict_metadata.items():
        if isinstance(md, TensorStorageMetadata):  # else BytesStorageMetadata
            entries[fqn] = Entry(fqn, "tensor", md.properties.dtype, tuple(md.size))
            tensor_chunks |= {(fqn, tuple(c.offsets)): tuple(c.sizes) for c in md.chunks}
        else:
            entries[fqn] = Entry(fqn, "bytes")
    for index, info in storage.items():
        if index.fqn in entries:
            offsets = tuple(index.offset) if index.offset is not None else None
            sizes = tensor_chunks.get((index.fqn, offsets)) if offsets is not None else None
            record = records.get((index.fqn, offsets))
            chunk = Chunk(offsets, sizes, info.relative_path, info.offset, info.length, record)
            entries[index.fqn].chunks.append(chunk)
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
            return () if v is None else (v,) if isinstance(v, str) else tuple(v)

        return cls(tup(include), tup(exclude))

    def __call__(self, name: str) -> bool:
        if self.include and not any(fnmatch.fnmatchcase(name, p) for p in self.include):
            return False
        return not any(fnmatch.fnmatchcase(name, p) for p in self.exclude)


# -- sizes and dtypes ---------------------------------------------------------------------------
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1}
for _n, _p in enumerate("kmgt", 1):
    _UNITS |= dict.fromkeys((_p, _p + "b"), 10 ** (3 * _n))
    _UNITS |= dict.fromkeys((_p + "i", _p + "ib"), 2 ** (10 * _n))


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
    **dict.fromkeys(("bf16", "bfloat16"), torch.bfloat16),
    **dict.fromkeys(("fp16", "float16", "half"), torch.float16),
    **dict.fromkeys(("fp32", "float32", "float"), torch.float32),
    **dict.fromkeys(("fp64", "float64", "double"), torch.float64),
    **dict.fromkeys(("fp8_e4m3", "float8_e4m3fn"), torch.float8_e4m3fn),
    **dict.fromkeys(("fp8_e5m2", "float8_e5m2"), torch.float8_e5m2),
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


# -- full values, a bounded window at a time ------------------------------------------------
# Each window is one ``dcp.load(..., no_dist=True)`` of a flat state dict holding just the
# keys of that window, with destinations allocated from ``.metadata``: DCP assembles full
# tensors from however many saved chunks (any world size) and the reader coalesces and
# parallelises the ranged GETs, checking every CRC32C. No process group is needed.
def load_entries(reader: S3StorageReader, entries: Sequence[Entry]) -> dict[str, Any]:
    """Full values of ``entries``: tensors, and non-tensor items as they were saved
    (decoded with ``torch.load(weights_only=True)`` checks by the reader)."""
    state: dict[str, Any] = {
        e.name: torch.empty(e.shape or (), dtype=e.dtype) if e.kind == "tensor" else None
        for e in entries
    }  # a None is replaced by the loaded object
    reader.reset()  # (the callers' windows are never empty)
    with quiet_dcp():
        dcp.load(state, storage_reader=reader, planner=DefaultLoadPlanner(), no_dist=True)
    return state


def batches(items: Iterable[T], window: int, size_of: Callable[[T], int]) -> Iterator[list[T]]:
    """``items`` in order, in batches of about ``window`` bytes (``size_of`` each; a larger
    one alone): windows of entries to load, shards of tensors to export."""
    batch: list[T] = []
    size = 0
    for e in items:
        n = size_of(e)
        if batch and size + n > window:
            yield batch
            batch, size = [], 0
        batch.append(e)
        size += n
    if batch:
        yield batch


def iter_loaded(
    reader: S3StorageReader, entries: Sequence[Entry], *, window: int
) -> Iterator[tuple[Entry, Any]]:
    """Yield ``(entry, value)`` in the order of ``entries``.

    Keys are loaded in windows of about ``window`` bytes (a larger tensor is a window of
    its own); the next window downloads while the caller works on this one, so memory
    holds at most two windows (or the two largest tensors). Closing the generator early
    waits for a download in flight.
    """
    windows = list(batches(entries, window, Entry.load_bytes))
    with ThreadPoolExecutor(1, thread_name_prefix="s3ckpt-prefetch") as pool:
        load = in_context(load_entries)  # requests count for the caller's operation
        nxt = [pool.submit(load, reader, w) for w in windows[:1]]  # the one download ahead
        for i, batch in enumerate(windows):
            values = nxt.pop().result()
            nxt += [pool.submit(load, reader, w) for w in windows[i + 1 : i + 2]]
            for e in batch:
                yield e, values.pop(e.name)
            del values
