"""``s3ckpt inspect``: what a checkpoint holds, from ``.metadata`` and ``s3ckpt.json`` alone,
and the state of its life as the catalog decides it (:func:`s3ckpt.retention.probe_checkpoint`
with the run's ``s3ckpt.check.json``: committed, archived or damaged, and why).

Cost: four GETs (the run's check record, the marker to judge it, the marker and the
metadata to read it); no tensor data is downloaded.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.dcp.reader import S3StorageReader
from s3ckpt.errors import StoreError
from s3ckpt.retention import probe_checkpoint, read_check_record
from s3ckpt.store import LocationLike, ObjectStore
from s3ckpt.tools._common import NameFilter, dtype_name, index_checkpoint, open_reader
from s3ckpt.tools._open import as_location

__all__ = ["InspectResult", "ObjectSummary", "TensorSummary", "inspect_checkpoint"]

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
    if not isinstance(checkpoint, S3StorageReader):
        checkpoint = as_location(
            checkpoint, s3_config=s3_config, transfer_config=transfer_config, store=store
        )
    reader = open_reader(checkpoint)
    info = None
    try:  # the catalog's verdict: the run's check record, then the marker judged with it
        record = read_check_record(reader.store, reader.url.parent)
    except StoreError:
        record = None  # what a check found is unknown; the marker is still judged
    if reader.manifest is not None:
        info = probe_checkpoint(reader.store, reader.url.parent, reader.url.name, record)
    entries = index_checkpoint(reader)
    manifest = reader.manifest
    names = NameFilter.of(include, exclude)
    tensors = tuple(
        TensorSummary(
            name=e.name,
            kind=e.kind,
            dtype=dtype_name(e.dtype),
            shape=e.shape,
            nbytes=e.nbytes,
            stored_bytes=e.stored_bytes,
            chunks=len(e.chunks),
            objects=tuple(e.objects),
        )
        for e in entries.values()
        if names(e.name)
    )
    per_object: dict[str, int] = defaultdict(int)
    for e in entries.values():
        for c in e.chunks:
            per_object[c.object] += 1
    if manifest is not None:
        objects = tuple(
            ObjectSummary(o.name, o.size, o.rank, per_object.get(o.name, 0))
            for o in manifest.objects
        )
        world_size: int | None = manifest.world_size
        stored = manifest.total_bytes
    else:
        rows = []
        for name in sorted(per_object):
            m = _RANK_RE.match(name)
            rows.append(ObjectSummary(name, None, int(m.group(1)) if m else None, per_object[name]))
        objects = tuple(rows)
        ranks = [o.rank for o in objects if o.rank is not None]
        world_size = max(ranks) + 1 if ranks else None
        stored = sum(e.stored_bytes for e in entries.values())
    return InspectResult(
        url=reader.checkpoint_id,
        format="s3ckpt" if manifest is not None else "dcp",
        checksums=manifest is not None,
        step=manifest.step if manifest is not None else None,
        created=manifest.created if manifest is not None else None,
        world_size=world_size,
        save_id=manifest.save_id if manifest is not None else None,
        metrics=dict(manifest.metrics) if manifest is not None else {},
        user=dict(manifest.user) if manifest is not None else {},
        versions=dict(manifest.versions) if manifest is not None else {},
        tensor_count=sum(1 for e in entries.values() if e.kind == "tensor"),
        tensor_bytes=sum(e.nbytes for e in entries.values()),
        other_count=sum(1 for e in entries.values() if e.kind != "tensor"),
        stored_bytes=stored,
        metadata_bytes=manifest.metadata_size if manifest is not None else None,
        tensors=tensors,
        objects=objects,
        layout=manifest.layout.to_doc() if manifest is not None and manifest.layout else None,
        life=info.life.value if info is not None else None,
        damage=info.damage if info is not None else None,
    )
