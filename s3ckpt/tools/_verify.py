"""``s3ckpt verify``: re-read every byte and check every CRC32C; and ``s3ckpt inspect``.

What is checked, in order:

1. Structure (from ``.metadata`` and ``s3ckpt.json``): every tensor's saved chunks lie
   inside the tensor and cover it, every chunk has a stored item, every item has its
   ``s3ckpt.json`` row at the same place, every object it names is committed.
2. Objects (one HEAD each, in parallel): each exists, has the size ``s3ckpt.json``
   recorded, and is long enough for every byte range ``.metadata`` points into it.
3. Data (s3ckpt checkpoints): every item is read back with coalesced, parallel ranged
   GETs and its CRC32C and tensor framing compared, by the one verifier
   (:mod:`s3ckpt._verify`). Memory: ``read_concurrency * read_chunk_size``. Checkpoints
   of other DCP writers carry no checksums; steps 1 and 2 still run, and
   ``read_data=True`` reads every range back too.
4. Both ``.metadata`` copies against the marker (one GET each).

Nothing stops at the first problem: the result names every bad tensor and object.

``s3ckpt inspect`` (:func:`inspect_checkpoint`) reads the same structure and checks
nothing: what a checkpoint holds, from ``.metadata`` and ``s3ckpt.json`` alone, and the
state of its life as the catalog decides it (:func:`s3ckpt.retention.probe_checkpoint` with
the run's ``s3ckpt.check.json``: committed, archived or damaged, and why). Cost: four GETs
(the run's check record, the marker to judge it, the marker and the metadata to read it);
no tensor data is downloaded.
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from s3ckpt._verify import Item, Verifier, item_name
from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.dcp.reader import S3StorageReader
from s3ckpt.errors import StoreError
from s3ckpt.format._names import MANIFEST_NAME, METADATA_NAME
from s3ckpt.retention._check_record import read_check_record
from s3ckpt.retention._scan import probe_checkpoint
from s3ckpt.store import ObjectStore
from s3ckpt.store._location import LocationLike
from s3ckpt.tools._common import Chunk, Entry, NameFilter, dtype_name, index_checkpoint, open_reader

__all__ = [
    "InspectResult",
    "ObjectSummary",
    "Problem",
    "TensorSummary",
    "VerifyResult",
    "inspect_checkpoint",
    "verify_checkpoint",
]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a checkpoint."""

    kind: str
    """``checksum`` (bytes changed), ``truncated`` (object too short for an item),
    ``missing_object``, ``object_size`` (differs from ``s3ckpt.json``), ``structure``
    (metadata and marker disagree, chunks do not cover a tensor), ``metadata`` (a copy of
    ``.metadata`` is missing or damaged), ``read_error``."""
    object: str | None
    """Object name relative to the checkpoint prefix."""
    item: str | None
    """State-dict key of the damaged tensor or value."""
    chunk: tuple[int, ...] | None
    """Offsets of the damaged chunk in the full tensor (sharded saves)."""
    message: str


@dataclass(frozen=True)
class VerifyResult:
    """What :func:`verify_checkpoint` found."""

    url: str
    format: str
    """``s3ckpt`` (checksums checked) or ``dcp`` (another writer: structure and sizes)."""
    checksums: bool
    items: int
    """Saved items (tensor chunks and values) in the checkpoint."""
    items_read: int
    """Items read back (and, with checksums, checked)."""
    bytes_read: int
    objects: int
    problems: tuple[Problem, ...]
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def bad_items(self) -> list[str]:
        """Every damaged state-dict key, sorted."""
        return sorted({p.item for p in self.problems if p.item is not None})

    @property
    def bad_objects(self) -> list[str]:
        """Every object holding damage, sorted."""
        return sorted({p.object for p in self.problems if p.object is not None})

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (stable keys)."""
        d = asdict(self)
        return d | {"ok": self.ok, "bad_items": self.bad_items, "bad_objects": self.bad_objects}


def verify_checkpoint(
    checkpoint: LocationLike | S3StorageReader,
    *,
    read_data: bool | None = None,
    progress: Callable[[int, int], None] | None = None,
    s3_config: S3Config | None = None,
    transfer_config: TransferConfig | None = None,
    store: ObjectStore | None = None,
) -> VerifyResult:
    """Check ``checkpoint`` end to end; see the module docs.

    Args:
        checkpoint: URL (``s3://...``, fsspec URL, local path), a
            :class:`~s3ckpt.store.Location` or an open reader.
        read_data: Read every item back. Default: yes when the checkpoint has checksums
            (``s3ckpt.json``), no for other writers' checkpoints (HEADs only).
        progress: Called with ``(bytes_read, bytes_total)`` from worker threads.
        s3_config / transfer_config / store: How to open a URL ``checkpoint`` (a Location
            carries its own).

    Raises:
        CheckpointNotFoundError / CorruptCheckpointError: the marker or ``.metadata``
            itself is missing, malformed or does not match (nothing else can be checked).
    """
    t0 = time.perf_counter()
    # No roll-forward: verify reports a stale .metadata copy rather than repairing it.
    how: dict[str, Any] = dict(s3_config=s3_config, transfer_config=transfer_config, store=store)
    reader = open_reader(checkpoint, roll_forward=False, **how)
    entries = index_checkpoint(reader)
    manifest = reader.manifest
    problems = _structure(reader, entries)
    items = [_item(e, c) for e in entries.values() for c in e.chunks]
    recorded = {o.name: o.size for o in manifest.objects} if manifest is not None else {}
    v = Verifier(reader.store, reader.object_key, transfer_config or reader.transfer_config)
    if progress is not None:
        v.on_bytes = lambda _: progress(v.bytes_read, v.total)
    names = sorted({i.object for i in items} | set(recorded))
    readable = v.objects(items, v.sizes(names), recorded)
    if manifest is not None if read_data is None else read_data:
        v.read(readable)
    bytes_read, v.on_bytes = v.bytes_read, None  # data bytes only
    if manifest is not None and manifest.metadata_key != METADATA_NAME:
        v.metadata(reader.url.prefix, manifest)  # (a format-1 copy: checked by the open)
    for f in sorted(v.faults, key=lambda f: not f.kind.endswith("metadata")):
        if f.kind in ("missing_object", "object_size", "metadata", "stale_metadata"):
            problems.append(Problem(f.kind.removeprefix("stale_"), f.object, None, None, f.message))
        kind = "truncated" if f.kind == "object_size" else f.kind
        for i in f.items:
            e, c = i.ref
            text = f.message if f.item is not None else f"{i.name}: {f.message}"
            problems.append(Problem(kind, f.object, e.name, c.offsets, text))
    sums, seconds = manifest is not None, round(time.perf_counter() - t0, 3)
    return VerifyResult(
        reader.checkpoint_id,
        "s3ckpt" if sums else "dcp",
        sums,
        len(items),
        v.items_read,
        bytes_read,
        len(names),
        tuple(problems),
        seconds,
    )


def _item(entry: Entry, chunk: Chunk) -> Item:
    """The verifier's item of a chunk, with the ``(data_offset, nbytes)`` of a tensor item
    whose framing can be checked (the torch pass: the dtype's size comes from ``.metadata``)."""
    rec, numel, framing = chunk.record, math.prod(chunk.sizes or ()), None
    if rec and rec.data_offset is not None and entry.dtype is not None and chunk.sizes and numel:
        framing = (rec.data_offset, numel * entry.dtype.itemsize)
    crc, at = (rec.crc32c if rec else None), item_name(repr(entry.name), chunk.offsets)
    return Item(chunk.object, chunk.start, chunk.length, crc, at, None, (entry, chunk), framing)


def _structure(reader: S3StorageReader, entries: dict[str, Entry]) -> list[Problem]:
    """``.metadata`` against itself and ``s3ckpt.json``: chunks inside and covering each
    tensor, a stored item and a manifest row at the same place for every chunk, every
    object committed."""
    manifest, md = reader.manifest, reader.metadata.state_dict_metadata
    problems: list[Problem] = []

    def bad(obj: str | None, name: str | None, at: Any, message: str) -> None:
        problems.append(Problem("structure", obj, name, at, message))

    for name, entry in entries.items():
        if not entry.chunks:
            bad(None, name, None, f"{name!r} has no stored item")
            continue
        if isinstance(meta := md[name], TensorStorageMetadata) and entry.shape is not None:
            stored = {c.offsets for c in entry.chunks}
            for c in meta.chunks:
                offs, sizes = tuple(c.offsets), list(c.sizes)
                if any(o + s > d for o, s, d in zip(offs, sizes, entry.shape, strict=False)):
                    why = f"of size {sizes} lies outside the tensor's shape {list(entry.shape)}"
                    bad(None, name, offs, f"{name!r}: chunk at {list(offs)} {why}")
                if offs not in stored:
                    why = "has no stored item in .metadata's storage_data"
                    bad(None, name, offs, f"{name!r}: chunk at {list(offs)} {why}")
            covered = sum(math.prod(c.sizes) for c in meta.chunks)
            if covered != entry.numel:
                why = f"saved chunks hold {covered} elements, the tensor has {entry.numel}"
                bad(None, name, None, f"{name!r}: {why}")
        for c in entry.chunks if manifest is not None else ():
            rec, at = c.record, item_name(repr(name), c.offsets)
            if rec is None:
                bad(c.object, name, c.offsets, f"{at} has no row in {MANIFEST_NAME}")
            elif (rec.object, rec.start, rec.length) != (c.object, c.start, c.length):
                here = f"{c.object}[{c.start}:{c.start + c.length}]"
                there = f"{rec.object}[{rec.start}:{rec.start + rec.length}]"
                msg = f"{at}: .metadata places it at {here}, {MANIFEST_NAME} at {there}"
                bad(c.object, name, c.offsets, msg)
    if manifest is not None:
        committed = {o.name for o in manifest.objects}
        for obj in sorted({c.object for e in entries.values() for c in e.chunks} - committed):
            why = f".metadata points into {obj}, which {MANIFEST_NAME} does not list"
            bad(obj, None, None, why)
    return problems


# -- inspect ------------------------------------------------------------------------------------
_RANK_RE = re.compile(r"^__(\d+)_\d+[.\w]*\.distcp$")


@dataclass(frozen=True)
class TensorSummary:
    """One state-dict key."""

    name: str
    kind: str
    """``"tensor"`` or ``"bytes"`` (a pickled non-tensor value)."""
    dtype: str | None
    shape: tuple[int, ...] | None
    nbytes: int
    """Bytes of the full tensor (0 for non-tensor values)."""
    stored_bytes: int
    """Bytes of its saved items, framing included."""
    chunks: int
    objects: tuple[str, ...]


@dataclass(frozen=True)
class ObjectSummary:
    """One data object."""

    name: str
    size: int | None
    """From ``s3ckpt.json``; ``None`` for other writers' checkpoints (not listed)."""
    rank: int | None
    items: int


@dataclass(frozen=True)
class InspectResult:
    """What :func:`inspect_checkpoint` found."""

    url: str
    format: str
    """``"s3ckpt"`` (committed by ``s3ckpt.json``, with checksums) or ``"dcp"`` (another
    DCP writer's checkpoint: ``.metadata`` only)."""
    checksums: bool
    step: int | None
    created: float | None
    world_size: int | None
    """From ``s3ckpt.json``; for other writers, inferred from ``__RANK_*.distcp`` names."""
    save_id: str | None
    metrics: dict[str, float]
    user: dict[str, Any]
    versions: dict[str, str]
    tensor_count: int
    tensor_bytes: int
    other_count: int
    """Non-tensor entries."""
    stored_bytes: int
    """Data objects plus metadata (from ``s3ckpt.json``), else the saved items' bytes."""
    metadata_bytes: int | None
    tensors: tuple[TensorSummary, ...]
    objects: tuple[ObjectSummary, ...]
    layout: dict[str, Any] | None = None
    """Where the data objects are, as ``s3ckpt.json`` records it (hashed prefixes:
    ``{"prefix_strategy": "hashed", "fanout": ..., ...}``); ``None``: under the prefix."""
    life: str | None = None
    """The state of its life as the catalog decides it (:class:`s3ckpt.retention.Life`:
    ``committed``, ``archived``, ``damaged``...; what ``ls`` shows); ``None`` without a
    commit marker (another writer's checkpoint)."""
    damage: str | None = None
    """Why it is damaged (``s3ckpt check``'s finding, an unreadable marker); ``None`` when
    it is not, or when the run's check record could not be read."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (stable keys)."""
        return asdict(self)


def inspect_checkpoint(
    checkpoint: LocationLike | S3StorageReader,
    *,
    include: Iterable[str] | str | None = None,
    exclude: Iterable[str] | str | None = None,
    s3_config: S3Config | None = None,
    transfer_config: TransferConfig | None = None,
    store: ObjectStore | None = None,
) -> InspectResult:
    """Describe ``checkpoint`` without downloading tensor data.

    Args:
        checkpoint: URL (``s3://...``, fsspec URL, local path), a
            :class:`~s3ckpt.store.Location` or an open reader.
        include / exclude: Glob filters on the names listed in ``tensors`` (totals always
            cover the whole checkpoint).
        s3_config / transfer_config / store: How to open a URL ``checkpoint`` (a Location
            carries its own).
    """
    how: dict[str, Any] = dict(s3_config=s3_config, transfer_config=transfer_config, store=store)
    reader = open_reader(checkpoint, **how)
    manifest = reader.manifest
    entries = index_checkpoint(reader).values()
    names = NameFilter.of(include, exclude)
    tensors = tuple(
        TensorSummary(
            e.name,
            e.kind,
            dtype_name(e.dtype),
            e.shape,
            e.nbytes,
            e.stored_bytes,
            len(e.chunks),
            tuple(e.objects),
        )
        for e in entries
        if names(e.name)
    )
    per_object = Counter(c.object for e in entries for c in e.chunks)
    if manifest is not None:  # the catalog's verdict: the marker judged with the check record
        try:
            record = read_check_record(reader.store, reader.url.parent)
        except StoreError:
            record = None  # what a check found is unknown; the marker is still judged
        info = probe_checkpoint(reader.store, reader.url.parent, reader.url.name, record)
        objects = tuple(
            ObjectSummary(o.name, o.size, o.rank, per_object[o.name]) for o in manifest.objects
        )
        own: dict[str, Any] = {
            "format": "s3ckpt",
            "checksums": True,
            **{k: getattr(manifest, k) for k in ("step", "created", "world_size", "save_id")},
            **{k: dict(getattr(manifest, k)) for k in ("metrics", "user", "versions")},
            "stored_bytes": manifest.total_bytes,
            "metadata_bytes": manifest.metadata_size,
            "layout": manifest.layout.to_doc() if manifest.layout else None,
            "life": info.life.value if info is not None else None,
            "damage": info.damage if info is not None else None,
        }
    else:
        objects = tuple(
            ObjectSummary(n, None, int(m.group(1)) if (m := _RANK_RE.match(n)) else None, k)
            for n, k in sorted(per_object.items())
        )
        own = {
            "format": "dcp",
            "checksums": False,
            **dict.fromkeys(("step", "created", "save_id", "metadata_bytes")),
            **{k: {} for k in ("metrics", "user", "versions")},
            "world_size": max((o.rank + 1 for o in objects if o.rank is not None), default=None),
            "stored_bytes": sum(e.stored_bytes for e in entries),
        }
    return InspectResult(
        url=reader.checkpoint_id,
        tensor_count=sum(1 for e in entries if e.kind == "tensor"),
        tensor_bytes=sum(e.nbytes for e in entries),
        other_count=sum(1 for e in entries if e.kind != "tensor"),
        tensors=tensors,
        objects=objects,
        **own,
    )
