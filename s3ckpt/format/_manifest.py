"""The commit marker ``s3ckpt.json``: what a committed checkpoint contains, its canonical
JSON and digest, and the parser that refuses anything malformed.

A prefix is *committed* iff the marker exists. The marker names the metadata object it
commits and its CRC32C, lists every data object with its size, and records a CRC32C for
every item, so a reader can verify every byte without trusting anything else. It carries a
SHA-256 ``digest`` of its canonical content (:func:`manifest_digest`), so a changed field
is refused rather than read as wrong bytes.

Also here: metric values in the manifest (what a save accepts, how NaN and +-inf are
written and read), and the zip-framing check around a tensor's bytes inside a saved item
(:func:`tensor_framing_error`), which pins ``data_offset`` and the length independently of
the manifest.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from s3ckpt._gc_pause import gc_paused
from s3ckpt._scalars import metric_scalar
from s3ckpt.errors import ConfigError, CorruptCheckpointError
from s3ckpt.format._hashed import HashedPrefixes, object_key, shard_tag
from s3ckpt.format._names import (
    MANIFEST_NAME,
    METADATA_NAME,
    TAG_LEN,
    as_str,
    check_name,
    created_time,
    nonneg,
    short,
)

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


def manifest_digest(doc: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of a marker document's canonical content (sorted keys, compact,
    ASCII; the ``digest`` field itself left out): what ``digest`` must say."""
    body = {k: v for k, v in doc.items() if k != "digest"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)  # ASCII
    return "sha256:" + hashlib.sha256(text.encode("ascii")).hexdigest()


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

    @property
    def tag(self) -> str:
        """The save tag every object of this save carries (see :func:`save_tag`)."""
        return self.save_id[:TAG_LEN]

    def to_json(self) -> bytes:
        """Serialise (compact item rows, stable key order)."""
        with gc_paused():  # a list per item, no cycles (see s3ckpt._gc_pause)
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
                return cls._from_doc(doc, where)
            except _MALFORMED as exc:
                raise CorruptCheckpointError(
                    f"{where} is malformed ({type(exc).__name__}: {short(exc)}); it was not "
                    "written by a compatible s3ckpt, or it was modified",
                    key=where,
                ) from None

    @classmethod
    def _from_doc(cls, doc: Any, where: str) -> Manifest:
        if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
            raise ValueError("missing 'format': 's3ckpt'")
        version = nonneg(doc["format_version"])
        if version > MAX_FORMAT_VERSION:
            raise CorruptCheckpointError(
                f"{where} was written by a newer s3ckpt: format_version {version} is newer "
                f"than this s3ckpt understands ({MAX_FORMAT_VERSION}); upgrade s3ckpt to read it",
                key=where,
            )
        if version >= 2:
            recorded = doc.get("digest")
            if not isinstance(recorded, str):
                raise ValueError(f"format_version {version} needs a 'digest'")
            if recorded != (actual := manifest_digest(doc)):
                raise CorruptCheckpointError(
                    f"{where} does not match its own digest (recorded {recorded}, content "
                    f"hashes to {actual}): it was changed or corrupted after it was written; do "
                    "not load it (restore the object, or load an earlier checkpoint)",
                    key=where,
                )
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
            if bad := [o.name for o in objects if shard_tag(o.name) is None]:
                raise ValueError(f"object {bad[0]!r} is no hashed-prefix data name")
        elif "layout" in doc:
            raise ValueError(f"a layout needs format_version {LAYOUT_FORMAT_VERSION}")
        return cls(
            save_id=as_str(doc["save_id"]),
            created=created_time(doc["created"]),
            world_size=nonneg(doc["world_size"]),
            metadata_key=meta_key,
            metadata_crc32c=int(meta["crc32c"], 16),
            metadata_size=nonneg(meta["size"]),
            objects=objects,
            items=items,
            step=None if doc.get("step") is None else nonneg(doc["step"]),
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
# AttributeError), missing keys and indices (LookupError), bad values, too large a number
# for a float (OverflowError) or too deep a nesting (RecursionError). Each is a damaged
# marker, never a crash.
_MALFORMED = (LookupError, TypeError, ValueError, AttributeError, OverflowError, RecursionError)


def _item(row: Sequence[Any]) -> ItemRecord:
    fqn, offset, obj, start, length, crc, data_offset = row
    return ItemRecord(
        fqn=as_str(fqn),
        offset=None if offset is None else tuple(nonneg(x) for x in offset),
        object=check_name(obj, "object name"),
        start=nonneg(start),
        length=nonneg(length),
        crc32c=int(as_str(crc), 16),
        data_offset=None if data_offset is None else nonneg(data_offset),
    )


def check_metrics(metrics: Mapping[str, Any] | None) -> dict[str, float]:
    """Metrics as the manifest records them: string names, float values.

    NaN and +-inf are kept (a diverging run needs exactly that checkpoint, and retention
    ranks NaN worst); anything that is not a real number is a :class:`ConfigError`. A
    one-element tensor or numpy value is read with ``.item()`` (:func:`metric_scalar`).
    """
    out: dict[str, float] = {}
    for name, value in (metrics or {}).items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"metric names must be non-empty strings, got {name!r}")
        value = metric_scalar(name, value)
        if isinstance(value, bool):
            raise ConfigError(f"metric {name!r} must be a number, got a bool")
        try:
            out[name] = float(value)
        except (TypeError, ValueError):
            raise ConfigError(
                f"metric {name!r} must be a number, got {type(value).__name__} {value!r}"
            ) from None
    return out


def metric_to_json(value: float) -> float | str:
    """Finite metrics as JSON numbers; NaN and +-inf as the strings float() reads back."""
    value = float(value)
    return value if math.isfinite(value) else json.dumps(value)  # "NaN", "Infinity", ...


def metric_from_json(value: Any) -> float:
    """A metric read from a marker: a number, or one of the strings :func:`metric_to_json`
    writes (``TypeError`` / ``ValueError`` for anything else)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(f"metric must be a number, got {type(value).__name__}")
    if isinstance(value, str) and value not in ("NaN", "Infinity", "-Infinity"):
        raise ValueError(f"metric {value!r} is not a number")
    return float(value)


FRAMING_HEAD = 512
"""Bytes before a tensor's data that hold its zip local file header (30 bytes, the record
name, and torch's alignment padding of at most 64 bytes)."""
FRAMING_TAIL = 24
"""Bytes after a tensor's data that hold its zip data descriptor (ZIP64: 24 bytes)."""


def tensor_framing_error(
    head: bytes | bytearray | memoryview, tail: bytes | bytearray | memoryview, nbytes: int
) -> str | None:
    """Why ``data_offset`` does not point at a tensor's data inside its item, or None.

    An item is ``torch.save``'s zip archive; the tensor's bytes are the data of one record:
    a local file header ends exactly where they begin, and a data descriptor carrying their
    size follows them. Checking both pins ``data_offset`` and the length independently of
    the manifest, so even a manifest re-sealed with a valid digest cannot make a reader take
    other bytes for the tensor. ``head`` ends at ``data_offset`` (at least
    :data:`FRAMING_HEAD` bytes of it, or all there is); ``tail`` starts right after the data.
    """
    head = bytes(head[-FRAMING_HEAD:])
    at = head.rfind(b"PK\x03\x04")
    if at < 0 or len(head) - at < 30:
        return "no zip record header ends where the tensor data is said to begin"
    name_len, extra_len = struct.unpack_from("<HH", head, at + 26)
    if at + 30 + name_len + extra_len != len(head):
        return "the zip record header before the tensor data does not end at data_offset"
    if b"/data/" not in head[at + 30 : at + 30 + name_len]:
        return "the zip record before the tensor data is not a tensor storage"
    tail = bytes(tail[:FRAMING_TAIL])
    if tail[:4] != b"PK\x07\x08" or len(tail) < 16:
        return "no zip data descriptor follows the tensor data"
    small = struct.unpack_from("<II", tail, 8)
    large = struct.unpack_from("<QQ", tail, 8) if len(tail) >= 24 else None
    if (nbytes, nbytes) not in (small, large):
        return f"the zip record of the tensor data is not {nbytes} bytes long"
    return None
