"""The commit marker ``s3ckpt.json``: what a committed checkpoint contains.

A checkpoint is a prefix holding torch's DCP layout (``__{rank}_{i}.<tag>.distcp`` data
objects and the pickled ``.metadata``) plus this marker, written last with a conditional
PUT. A prefix is *committed* iff the marker exists. The marker names the metadata object it
commits and its CRC32C, lists every data object with its size, and records a CRC32C for
every item, so a reader can verify every byte without trusting anything else.

This module needs neither torch nor boto3 (the retention cron imports it).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from s3ckpt._gc import gc_paused
from s3ckpt.errors import CorruptCheckpointError

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "METADATA_NAME",
    "ItemRecord",
    "Manifest",
    "ObjectRecord",
]

FORMAT_NAME = "s3ckpt"
FORMAT_VERSION = 1
MANIFEST_NAME = "s3ckpt.json"
METADATA_NAME = ".metadata"

_ITEM_FIELDS = ["fqn", "offset", "object", "start", "length", "crc32c", "data_offset"]


@dataclass(frozen=True)
class ObjectRecord:
    """One data object of the checkpoint."""

    name: str
    """Object name relative to the checkpoint prefix."""
    size: int
    rank: int


@dataclass(frozen=True)
class ItemRecord:
    """Where one saved item lives and its checksum.

    ``fqn`` and ``offset`` identify the item as DCP's ``MetadataIndex`` does (the
    state-dict key and, for a tensor shard, the shard's offsets in the full tensor).
    """

    fqn: str
    offset: tuple[int, ...] | None
    object: str
    start: int
    length: int
    crc32c: int
    data_offset: int | None = None
    """For tensors: where the raw tensor bytes begin inside the item (``torch.save``
    framing precedes them); lets a reader stream them straight into the destination."""

    @property
    def key(self) -> tuple[str, tuple[int, ...] | None]:
        """Lookup key matching a DCP ``MetadataIndex`` (fqn, offset)."""
        return (self.fqn, self.offset)


@dataclass(frozen=True)
class Manifest:
    """Contents of ``s3ckpt.json``."""

    save_id: str
    created: float
    world_size: int
    metadata_key: str
    metadata_crc32c: int
    metadata_size: int
    objects: tuple[ObjectRecord, ...]
    items: tuple[ItemRecord, ...]
    step: int | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    user: Mapping[str, Any] = field(default_factory=dict)
    versions: Mapping[str, str] = field(default_factory=dict)
    byteorder: str = sys.byteorder
    format_version: int = FORMAT_VERSION

    @property
    def total_bytes(self) -> int:
        """Bytes in data objects plus metadata."""
        return sum(o.size for o in self.objects) + self.metadata_size

    def to_json(self) -> bytes:
        """Serialise (compact item rows, stable key order)."""
        with gc_paused():  # a list per item, no cycles (see s3ckpt._gc)
            return self._to_json()

    def _to_json(self) -> bytes:
        doc = {
            "format": FORMAT_NAME,
            "format_version": self.format_version,
            "save_id": self.save_id,
            "created": self.created,
            "step": self.step,
            "world_size": self.world_size,
            "byteorder": self.byteorder,
            "versions": dict(self.versions),
            "metrics": dict(self.metrics),
            "user": dict(self.user),
            "metadata": {
                "key": self.metadata_key,
                "crc32c": f"{self.metadata_crc32c:08x}",
                "size": self.metadata_size,
            },
            "total_bytes": self.total_bytes,
            "objects": [[o.name, o.size, o.rank] for o in self.objects],
            "object_fields": ["name", "size", "rank"],
            "item_fields": _ITEM_FIELDS,
            "items": [
                [
                    i.fqn,
                    list(i.offset) if i.offset is not None else None,
                    i.object,
                    i.start,
                    i.length,
                    f"{i.crc32c:08x}",
                    i.data_offset,
                ]
                for i in self.items
            ],
        }
        return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode("utf-8")

    @classmethod
    def from_json(cls, raw: bytes, *, where: str = MANIFEST_NAME) -> Manifest:
        """Parse and validate; anything malformed raises :class:`CorruptCheckpointError`
        naming ``where``."""
        with gc_paused():  # a list and a record per item, no cycles (see s3ckpt._gc)
            try:
                doc = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise CorruptCheckpointError(
                    f"{where} is not valid JSON ({exc})", key=where
                ) from exc
            try:
                return cls._from_doc(doc)
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                raise CorruptCheckpointError(
                    f"{where} is malformed ({type(exc).__name__}: {exc}); it was not written "
                    "by a compatible s3ckpt, or it was modified",
                    key=where,
                ) from exc

    @classmethod
    def _from_doc(cls, doc: Any) -> Manifest:
        if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
            raise ValueError("missing 'format': 's3ckpt'")
        version = int(doc["format_version"])
        if version > FORMAT_VERSION:
            raise ValueError(
                f"format_version {version} is newer than this s3ckpt understands "
                f"({FORMAT_VERSION}); upgrade s3ckpt"
            )
        if doc["item_fields"] != _ITEM_FIELDS:
            raise ValueError(f"item_fields {doc['item_fields']!r} != {_ITEM_FIELDS!r}")
        meta = doc["metadata"]
        objects = tuple(ObjectRecord(_str(n), _nonneg(s), _nonneg(r)) for n, s, r in doc["objects"])
        items = tuple(_item(row) for row in doc["items"])
        step = doc.get("step")
        return cls(
            save_id=_str(doc["save_id"]),
            created=float(doc["created"]),
            world_size=_nonneg(doc["world_size"]),
            metadata_key=_str(meta["key"]),
            metadata_crc32c=int(meta["crc32c"], 16),
            metadata_size=_nonneg(meta["size"]),
            objects=objects,
            items=items,
            step=None if step is None else int(step),
            metrics={str(k): float(v) for k, v in (doc.get("metrics") or {}).items()},
            user=dict(doc.get("user") or {}),
            versions={str(k): str(v) for k, v in (doc.get("versions") or {}).items()},
            byteorder=_str(doc.get("byteorder", "little")),
            format_version=version,
        )

    def item_index(self) -> dict[tuple[str, tuple[int, ...] | None], ItemRecord]:
        """Items by (fqn, offset)."""
        with gc_paused():
            return {i.key: i for i in self.items}


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _nonneg(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected a non-negative integer, got {value!r}")
    return value


def _item(row: Sequence[Any]) -> ItemRecord:
    fqn, offset, obj, start, length, crc, data_offset = row
    if offset is not None:
        offset = tuple(_nonneg(x) for x in offset)
    if data_offset is not None:
        data_offset = _nonneg(data_offset)
    name = _str(obj)
    if "/" in name or name.startswith(".."):
        raise ValueError(f"object name {name!r} escapes the checkpoint prefix")
    return ItemRecord(
        fqn=_str(fqn),
        offset=offset,
        object=name,
        start=_nonneg(start),
        length=_nonneg(length),
        crc32c=int(_str(crc), 16),
        data_offset=data_offset,
    )
