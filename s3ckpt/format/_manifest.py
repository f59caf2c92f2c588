"""The commit marker ``s3ckpt.json``: what a committed checkpoint contains, its canonical
JSON and digest, and the parser that refuses anything malformed.

A prefix is *committed* iff the marker exists. The marker names the metadata object it
commits and its CRC32C, lists every data object with its size, and records a CRC32C for
every item, so a reader can verify every byte without trusting anything else. It carries a
SHA-256 ``digest`` of its canonical content (:func:`manifest_digest`), so a changed field
is refused rather than read as wrong bytes.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from s3ckpt._gc_pause import gc_paused
from s3ckpt.errors import CorruptCheckpointError
from s3ckpt.format._hashed import HashedPrefixes, object_key, shard_tag
from s3ckpt.format._metrics import metric_from_json, metric_to_json
from s3ckpt.format._names import MANIFEST_NAME, METADATA_NAME, TAG_LEN
from s3ckpt.format._values import as_str, check_name, created_time, nonneg, short

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "LAYOUT_FORMAT_VERSION",
    "MAX_FORMAT_VERSION",
    "MAX_MANIFEST_BYTES",
    "ItemRecord",
    "Manifest",
    "ObjectRecord",
    "manifest_digest",
]

FORMAT_NAME = "s3ckpt"
FORMAT_VERSION = 2
"""The version of a save in the default layout. 2: the manifest carries ``digest`` (SHA-256
of its canonical content); 1 had none."""
LAYOUT_FORMAT_VERSION = 3
"""The version of a save whose data objects are placed by a ``layout`` (:class:`HashedPrefixes`):
an s3ckpt that reads format 2 at most refuses it ("newer than this s3ckpt understands;
upgrade s3ckpt") instead of looking for the objects under the checkpoint prefix."""
MAX_FORMAT_VERSION = LAYOUT_FORMAT_VERSION
"""The newest ``format_version`` this s3ckpt reads."""

MAX_MANIFEST_BYTES = 512 * 1024 * 1024
"""The largest commit marker s3ckpt reads (512 MiB, some five million item rows: a save of
thousands of ranks with FSDP-sharded optimizer state stays well under it). A larger one is
not read at all (the catalog lists it as damaged), so a hostile object cannot exhaust the
memory of a scan."""


def _canonical(doc: Mapping[str, Any]) -> bytes:
    body = {k: v for k, v in doc.items() if k != "digest"}
    return json.dumps(
        body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode("ascii")


def manifest_digest(doc: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of a marker document's canonical content (sorted keys, compact,
    ASCII; the ``digest`` field itself left out): what ``digest`` must say."""
    return "sha256:" + hashlib.sha256(_canonical(doc)).hexdigest()


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
    layout: HashedPrefixes | None = None
    """Where the data objects are (``None``: directly under the checkpoint prefix); needs
    ``format_version`` :data:`LAYOUT_FORMAT_VERSION`, so older readers refuse the manifest
    instead of looking for the objects in the wrong place."""
    reaped: tuple[str, ...] = ()
    """Tags of other saves gc reaped in this prefix (their objects deleted) while this
    marker was committed: gc rewrites the marker with them (``If-Match``) before deleting,
    which changes its ETag, so a paused overwrite's compare-and-swap fails and its writer
    reads this field back. Readers ignore it."""
    writer: Mapping[str, str] = field(default_factory=dict)
    """Who committed it (``host``, ``pid``, ``job``): named to a writer that lost the race."""

    def __post_init__(self) -> None:
        if (self.layout is not None) != (self.format_version >= LAYOUT_FORMAT_VERSION):
            raise ValueError(
                f"a manifest has a layout iff it is format_version {LAYOUT_FORMAT_VERSION} or "
                f"newer (format_version {self.format_version}, layout {self.layout})"
            )

    def object_key(self, prefix: str, name: str) -> str:
        """The key of data object ``name`` of this save, checkpoint prefix ``prefix``."""
        return object_key(prefix, name, self.layout)

    @property
    def total_bytes(self) -> int:
        """Bytes in data objects plus metadata."""
        return sum(o.size for o in self.objects) + self.metadata_size

    def to_json(self) -> bytes:
        """Serialise (compact item rows, stable key order)."""
        with gc_paused():  # a list per item, no cycles (see s3ckpt._gc_pause)
            return self._to_json()

    @property
    def tag(self) -> str:
        """The save tag every object of this save carries (see :func:`save_tag`)."""
        return self.save_id[:TAG_LEN]

    def _to_json(self) -> bytes:
        doc: dict[str, Any] = {
            "format": FORMAT_NAME,
            "format_version": self.format_version,
            "save_id": self.save_id,
            "created": self.created,
            "step": self.step,
            "world_size": self.world_size,
            "byteorder": self.byteorder,
            **({"layout": self.layout.to_doc()} if self.layout is not None else {}),
            "versions": dict(self.versions),
            "metrics": {str(k): metric_to_json(v) for k, v in self.metrics.items()},
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
            **({"reaped": list(self.reaped)} if self.reaped else {}),
            **({"writer": dict(self.writer)} if self.writer else {}),
        }
        if self.format_version >= 2:
            doc["digest"] = manifest_digest(doc)
        return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode("utf-8")

    @classmethod
    def from_json(cls, raw: bytes, *, where: str = MANIFEST_NAME) -> Manifest:
        """Parse and validate; anything malformed raises :class:`CorruptCheckpointError`
        naming ``where``.

        Format 2 manifests must carry a ``digest`` matching their canonical content, so a
        changed offset, length, dtype-bearing field, checksum or object name is refused
        rather than read as wrong bytes. Every record is also checked for consistency
        (items inside their objects, names inside the prefix).
        """
        with gc_paused():  # a list and a record per item, no cycles (see s3ckpt._gc_pause)
            if len(raw) > MAX_MANIFEST_BYTES:
                raise CorruptCheckpointError(
                    f"{where} is {len(raw)} bytes, more than the {MAX_MANIFEST_BYTES} a commit "
                    "marker may have; it was not written by s3ckpt",
                    key=where,
                )
            try:
                doc = json.loads(raw.decode("utf-8"))
            except (ValueError, RecursionError) as exc:  # bad UTF-8 and JSON are ValueErrors
                raise CorruptCheckpointError(
                    f"{where} is not valid JSON ({short(exc)})", key=where
                ) from None
            try:
                return cls._from_doc(doc)
            except _NewerFormat as exc:
                raise CorruptCheckpointError(
                    f"{where} was written by a newer s3ckpt: {exc} to read it",
                    key=where,
                ) from None
            except _DigestMismatch as exc:
                raise CorruptCheckpointError(
                    f"{where} does not match its own digest ({exc}): it was changed or "
                    "corrupted after it was written; do not load it (restore the object, or "
                    "load an earlier checkpoint)",
                    key=where,
                ) from None
            except _MALFORMED as exc:
                raise CorruptCheckpointError(
                    f"{where} is malformed ({type(exc).__name__}: {short(exc)}); it was not "
                    "written by a compatible s3ckpt, or it was modified",
                    key=where,
                ) from None

    @classmethod
    def _from_doc(cls, doc: Any) -> Manifest:
        if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
            raise ValueError("missing 'format': 's3ckpt'")
        version = nonneg(doc["format_version"])
        if version > MAX_FORMAT_VERSION:
            raise _NewerFormat(
                f"format_version {version} is newer than this s3ckpt understands "
                f"({MAX_FORMAT_VERSION}); upgrade s3ckpt"
            )
        if version >= 2:
            recorded = doc.get("digest")
            if not isinstance(recorded, str):
                raise ValueError(f"format_version {version} needs a 'digest'")
            actual = manifest_digest(doc)
            if recorded != actual:
                raise _DigestMismatch(f"recorded {recorded}, content hashes to {actual}")
        if doc["item_fields"] != _ITEM_FIELDS:
            raise ValueError(f"item_fields {doc['item_fields']!r} != {_ITEM_FIELDS!r}")
        meta = doc["metadata"]
        objects = tuple(
            ObjectRecord(check_name(n, "object name"), nonneg(s), nonneg(r))
            for n, s, r in doc["objects"]
        )
        items = tuple(_item(row) for row in doc["items"])
        sizes = {o.name: o.size for o in objects}
        for item in items:
            size = sizes.get(item.object)
            if size is None:
                raise ValueError(f"item {item.fqn!r} names object {item.object!r}, not listed")
            if item.start + item.length > size:
                raise ValueError(
                    f"item {item.fqn!r} ends at byte {item.start + item.length}, past the end "
                    f"of {item.object!r} ({size} bytes)"
                )
            if item.data_offset is not None and item.data_offset > item.length:
                raise ValueError(f"item {item.fqn!r} has data_offset past its end")
        meta_key = check_name(meta["key"], "metadata key")
        if meta_key != METADATA_NAME and not meta_key.startswith(METADATA_NAME + "."):
            raise ValueError(f"metadata key {meta_key!r} is not a .metadata object")
        layout = None
        if version >= LAYOUT_FORMAT_VERSION:
            layout = HashedPrefixes.from_doc(doc["layout"])
            for o in objects:
                if shard_tag(o.name) is None:
                    raise ValueError(f"object {o.name!r} is no hashed-prefix data name")
        elif "layout" in doc:
            raise ValueError(f"a layout needs format_version {LAYOUT_FORMAT_VERSION}")
        step = doc.get("step")
        return cls(
            save_id=as_str(doc["save_id"]),
            created=created_time(doc["created"]),
            world_size=nonneg(doc["world_size"]),
            metadata_key=meta_key,
            metadata_crc32c=int(meta["crc32c"], 16),
            metadata_size=nonneg(meta["size"]),
            objects=objects,
            items=items,
            step=None if step is None else nonneg(step),
            metrics={str(k): metric_from_json(v) for k, v in (doc.get("metrics") or {}).items()},
            user=dict(doc.get("user") or {}),
            versions={str(k): str(v) for k, v in (doc.get("versions") or {}).items()},
            byteorder=as_str(doc.get("byteorder", "little")),
            format_version=version,
            layout=layout,
            reaped=tuple(as_str(t) for t in doc.get("reaped") or ()),
            writer={as_str(k)[:32]: as_str(v)[:128] for k, v in (doc.get("writer") or {}).items()},
        )

    def item_index(self) -> dict[tuple[str, tuple[int, ...] | None], ItemRecord]:
        """Items by (fqn, offset)."""
        with gc_paused():
            return {i.key: i for i in self.items}


# Whatever a hostile document can make the parser raise: wrong types (TypeError,
# AttributeError), missing keys, bad values, too large a number for a float (OverflowError)
# or too deep a nesting (RecursionError). Each is a damaged marker, never a crash.
_MALFORMED = (
    KeyError,
    TypeError,
    ValueError,
    IndexError,
    AttributeError,
    OverflowError,
    RecursionError,
)


class _DigestMismatch(ValueError):
    """The manifest's content does not hash to its recorded digest."""


class _NewerFormat(ValueError):
    """The manifest's ``format_version`` is newer than this s3ckpt reads."""


def _item(row: Sequence[Any]) -> ItemRecord:
    fqn, offset, obj, start, length, crc, data_offset = row
    if offset is not None:
        offset = tuple(nonneg(x) for x in offset)
    if data_offset is not None:
        data_offset = nonneg(data_offset)
    name = check_name(obj, "object name")
    return ItemRecord(
        fqn=as_str(fqn),
        offset=offset,
        object=name,
        start=nonneg(start),
        length=nonneg(length),
        crc32c=int(as_str(crc), 16),
        data_offset=data_offset,
    )
