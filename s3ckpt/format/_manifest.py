"""The commit marker ``s3ckpt.json``: what a committed checkpoint contains, its canonical
JSON and digest, and the parser that refuses anything malformed.

A prefix is *committed* iff the marker exists. The marker names the metadata object it
commits and its CRC32C, lists every data object with its size, and names the object of item
records (``s3ckpt.items.{tag}``, by size and CRC32C) that says where each item lies and its
CRC32C, so a reader can verify every byte without trusting anything else. Up to format 3
the item records were inside the marker; from format 4 they are beside it, so the marker
every resume and every retention scan reads stays small however many items a save has. It carries a
SHA-256 ``digest`` of its canonical content (:func:`manifest_digest`), so a changed field
is refused rather than read as wrong bytes.

Also here: metric values in the manifest (what a save accepts, how NaN and +-inf are
written and read).
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from s3ckpt import _crc
from s3ckpt._gc_pause import gc_paused
from s3ckpt._scalars import metric_scalar
from s3ckpt.errors import ConfigError, CorruptCheckpointError
from s3ckpt.format._names import (
    ITEMS_PREFIX,
    MANIFEST_NAME,
    METADATA_NAME,
    TAG_LEN,
    HashedPrefixes,
    as_str,
    check_name,
    created_time,
    nonneg,
    object_key,
    shard_tag,
    short,
)

FORMAT_NAME = "s3ckpt"
LAYOUT_FORMAT_VERSION = 3
"""The first version whose data objects may be placed by a ``layout`` (:class:`HashedPrefixes`):
an s3ckpt that reads format 2 at most refuses it ("newer than this s3ckpt understands;
upgrade s3ckpt") instead of looking for the objects under the checkpoint prefix. Format 3
has one; format 4 may."""
FORMAT_VERSION = 4
"""The version every save writes: 4, the item records in their own object (``items`` in the
marker names it); 3 had them inline with a layout, 2 inline without one (2 added ``digest``,
SHA-256 of the marker's canonical content; 1 had none). Older versions are still read."""
MAX_FORMAT_VERSION = FORMAT_VERSION
"""The newest ``format_version`` this s3ckpt reads."""
ITEMS_FORMAT = "s3ckpt.items"
"""The ``format`` field of an item-records object."""

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


@dataclass(frozen=True, slots=True)
class ObjectRecord:
    """One data object of the checkpoint."""

    name: str
    """Object name relative to the checkpoint prefix."""
    size: int
    rank: int


@dataclass(frozen=True, slots=True)
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
class ItemsRef:
    """The object holding a format-4 save's item records, as its marker commits it."""

    name: str
    """Its name relative to the checkpoint prefix (``s3ckpt.items.{tag}``)."""
    size: int
    crc32c: int
    count: int
    """How many item records it holds."""


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
    items: tuple[ItemRecord, ...] | None
    """The item records; None while they are only named by ``items_ref`` (a format-4
    marker as parsed: :meth:`with_items` adds them, read with :func:`s3ckpt._commit.read_items`)."""
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
    items_ref: ItemsRef | None = None
    """Format 4: the object of item records the marker commits (set by the writer once that
    object's bytes, :meth:`items_json`, are known)."""

    def __post_init__(self) -> None:
        version, layout = self.format_version, self.layout is not None
        if layout != (version >= LAYOUT_FORMAT_VERSION) and version <= LAYOUT_FORMAT_VERSION:
            raise ValueError(
                f"a layout needs format_version {LAYOUT_FORMAT_VERSION} or newer, and format "
                f"{LAYOUT_FORMAT_VERSION} needs one (format_version {version}, {self.layout})"
            )

    @property
    def records(self) -> tuple[ItemRecord, ...]:
        """The item records (a ``RuntimeError`` while they are not read: see ``items``)."""
        if self.items is None:
            raise RuntimeError(f"the item records of save {self.save_id} were not read yet")
        return self.items

    def object_key(self, prefix: str, name: str) -> str:
        """The key of data object ``name`` of this save, checkpoint prefix ``prefix``."""
        return object_key(prefix, name, self.layout)

    @property
    def controls(self) -> tuple[tuple[str, int, int], ...]:
        """``(name, size, crc32c)`` of each object beside the data that the marker commits:
        the ``.metadata`` it names and (format 4) the item records."""
        meta = (self.metadata_key, self.metadata_size, self.metadata_crc32c)
        ref = self.items_ref
        return (meta,) if ref is None else (meta, (ref.name, ref.size, ref.crc32c))

    @property
    def total_bytes(self) -> int:
        """Bytes in data objects plus those beside them (:attr:`controls`)."""
        return sum(o.size for o in self.objects) + sum(size for _, size, _ in self.controls)

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
                **self._items_doc(),
                **({"reaped": list(self.reaped)} if self.reaped else {}),
                **({"writer": dict(self.writer)} if self.writer else {}),
            }
            if self.format_version >= 2:
                doc["digest"] = manifest_digest(doc)
            return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode("utf-8")

    def _items_doc(self) -> dict[str, Any]:
        """The marker's ``items``: the records inline (format 3 and older), else what names
        their object."""
        if self.format_version < FORMAT_VERSION:
            return {"item_fields": _ITEM_FIELDS, "items": self._rows()}
        ref = self.items_ref
        if ref is None:
            raise ValueError("a format-4 manifest needs items_ref (see items_json)")
        crc = f"{ref.crc32c:08x}"
        return {"items": {"name": ref.name, "size": ref.size, "crc32c": crc, "count": ref.count}}

    def _rows(self) -> list[list[Any]]:
        return [
            [
                i.fqn,
                list(i.offset) if i.offset is not None else None,
                i.object,
                i.start,
                i.length,
                f"{i.crc32c:08x}",
                i.data_offset,
            ]
            for i in self.records
        ]

    def items_json(self) -> bytes:
        """The body of this save's item-records object (compact rows, in the save's order)."""
        with gc_paused():  # a list per item, no cycles (see s3ckpt._gc_pause)
            doc: dict[str, Any] = {"format": ITEMS_FORMAT, "save_id": self.save_id}
            doc |= {"item_fields": _ITEM_FIELDS, "items": self._rows()}
            return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode("utf-8")

    def split_items(self, name: str) -> tuple[Manifest, bytes]:
        """This manifest naming object ``name`` as the home of its item records (format 4),
        and that object's body (:meth:`items_json`): what a save writes before its marker."""
        body = self.items_json()
        ref = ItemsRef(name, len(body), _crc.crc32c(body), len(self.records))
        return replace(self, items_ref=ref), body

    def with_items(self, raw: bytes | None, *, where: str) -> Manifest:
        """This manifest with the item records of ``raw``, the body of the object ``items_ref``
        names (None: missing), checked against it (size, CRC32C, count, save id) and against
        the objects; raises :class:`CorruptCheckpointError` naming ``where`` if anything
        does not match. A manifest that has its records is returned as it is."""
        ref = self.items_ref
        if self.items is not None or ref is None:
            return self
        what = f"{MANIFEST_NAME} commits {ref.name}"
        if raw is None:
            problem = "which is missing; the checkpoint was partly deleted"
        elif len(raw) != ref.size or _crc.crc32c(raw) != ref.crc32c:
            problem = (
                f"but it does not match (size {len(raw)} vs {ref.size}, crc32c "
                f"{_crc.crc32c(raw):08x} vs {ref.crc32c:08x}): it was changed after the commit"
            )
        else:
            with gc_paused():  # a list and a record per item, no cycles
                try:
                    doc = json.loads(raw.decode("utf-8"))
                    if doc["format"] != ITEMS_FORMAT or doc["save_id"] != self.save_id:
                        raise ValueError("not this save's item records")
                    items = _items(doc, self.objects)
                    if len(items) != ref.count:
                        raise ValueError(f"{len(items)} records, the marker says {ref.count}")
                    return replace(self, items=items)
                except (*_MALFORMED, UnicodeDecodeError) as exc:
                    problem = f"which is malformed ({type(exc).__name__}: {short(exc)})"
        raise CorruptCheckpointError(
            f"{what}, {problem}. Do not load it (restore the object, or load an earlier "
            "checkpoint)",
            key=where,
        )

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
        meta = doc["metadata"]
        objects = tuple(
            ObjectRecord(check_name(n, "object name"), nonneg(s), nonneg(r))
            for n, s, r in doc["objects"]
        )
        items: tuple[ItemRecord, ...] | None = None
        items_ref = None
        if version >= FORMAT_VERSION:
            ref = doc["items"]
            name = check_name(ref["name"], "item records name")
            if not name.startswith(ITEMS_PREFIX):
                raise ValueError(f"item records name {name!r} is not an {ITEMS_PREFIX}* object")
            crc, count = int(as_str(ref["crc32c"]), 16), nonneg(ref["count"])
            items_ref = ItemsRef(name, nonneg(ref["size"]), crc, count)
        else:
            items = _items(doc, objects)
        meta_key = check_name(meta["key"], "metadata key")
        if meta_key != METADATA_NAME and not meta_key.startswith(METADATA_NAME + "."):
            raise ValueError(f"metadata key {meta_key!r} is not a .metadata object")
        layout = None
        if "layout" in doc or version == LAYOUT_FORMAT_VERSION:
            if version < LAYOUT_FORMAT_VERSION:
                raise ValueError(f"a layout needs format_version {LAYOUT_FORMAT_VERSION}")
            layout = HashedPrefixes.from_doc(doc["layout"])
            if bad := [o.name for o in objects if shard_tag(o.name) is None]:
                raise ValueError(f"object {bad[0]!r} is no hashed-prefix data name")
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
            items_ref=items_ref,
        )

    def item_index(self) -> dict[tuple[str, tuple[int, ...] | None], ItemRecord]:
        """Items by (fqn, offset)."""
        with gc_paused():
            return {i.key: i for i in self.records}


# Whatever a hostile document can make the parser raise: wrong types (TypeError,
# AttributeError), missing keys and indices (LookupError), bad values, too large a number
# for a float (OverflowError) or too deep a nesting (RecursionError). Each is a damaged
# marker, never a crash.
_MALFORMED = (LookupError, TypeError, ValueError, AttributeError, OverflowError, RecursionError)


def _items(doc: dict[str, Any], objects: Sequence[ObjectRecord]) -> tuple[ItemRecord, ...]:
    """The item rows of ``doc`` (a marker of format 3 or older, or an item-records object),
    each inside an object the marker lists (``ValueError`` naming the first that is not)."""
    if doc["item_fields"] != _ITEM_FIELDS:
        raise ValueError(f"item_fields {doc['item_fields']!r} != {_ITEM_FIELDS!r}")
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
    return items


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
