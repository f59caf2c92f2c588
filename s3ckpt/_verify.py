"""The one read-back verifier (no torch): a checkpoint's bytes against what was recorded.

Used by the commit-time check (:func:`verify_objects`, below: every item and the ``.metadata``
of a save, before its marker), ``s3ckpt verify`` (:mod:`s3ckpt.tools._verify`: every item
``.metadata`` names, plus the torch pass for framing, :attr:`Item.framing`) and ``s3ckpt
check`` (:mod:`s3ckpt.tools._check`: a sample of the items, :func:`sample_items`)::

    v = Verifier(store, key_of, transfer_config)
    readable = v.objects(items, v.sizes(names, listing), recorded_sizes)
    v.metadata(prefix, manifest, listing)        # both .metadata copies
    v.read(readable)                             # coalesced ranged GETs, CRC32C per item
    v.faults                                     # what is wrong; each caller words its result

Nothing raises for damage: every finding is a :class:`Fault`. Also here: the zip-framing check
around a tensor's bytes inside a saved item (:func:`tensor_framing_error`), which pins
``data_offset`` and the length independently of the manifest. Reads use the walk of the DCP
reader (:class:`~s3ckpt._transfer.RangeWalk`): memory one ``read_chunk_size`` buffer per
reading thread.

Verify after write (:func:`verify_objects`, :func:`verify_marker`): the coordinator reads a
save back before its commit marker.

A store that ignores the CRC32C sent with each upload (moto, some S3-compatible servers)
stores whatever bytes reach it: a byte flipped in transit commits corrupt data that only
a load notices, later. With ``S3Config.verify_after_write`` on (auto: where the store is
not known to verify checksums, see :func:`verify_wanted`) the coordinator re-reads every
data object, the ``.metadata`` and the item records of the save and checks each item's
CRC32C recorded in the manifest before it writes the marker; a mismatch fails the save with a
:class:`~s3ckpt.errors.ChecksumMismatchError` naming the object, the item and the rank
that wrote it, and the previous checkpoint stays committed. After the marker is written,
it is read back too: a marker that arrived altered is rewritten (If-Match on the altered
one) before the save reports success.

Cost: one more read of every byte the save wrote, all of it through the coordinator
(the simplest way to know that what is committed is what every rank sent), with the
coalesced ranged GETs of the load (``TransferConfig.read_concurrency`` at a time, one
``read_chunk_size`` buffer each). At the coordinator's
download bandwidth B, a save of S bytes takes S / B longer (e.g. 10 GB at 1 GB/s: 10 s).
"""

from __future__ import annotations

import contextlib
import logging
import random
import struct
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from s3ckpt._crc import crc32c
from s3ckpt._transfer import RangeWalk, ReadFailure, Span, SpanReader
from s3ckpt.config import TransferConfig
from s3ckpt.errors import (
    ChecksumMismatchError,
    CorruptCheckpointError,
    ObjectNotFoundError,
    S3CkptError,
    StoreError,
)
from s3ckpt.format._manifest import ItemRecord, Manifest
from s3ckpt.format._names import MANIFEST_NAME, METADATA_NAME
from s3ckpt.metrics.instrument import expecting, in_context, record_checksum_failure
from s3ckpt.store import ObjectInfo, ObjectStore
from s3ckpt.uri import StoreURL

__all__ = [
    "Fault", "Item", "Verifier", "item_name", "manifest_items", "sample_items", "verify_marker",
    "verify_objects", "verify_wanted",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Item:
    """One saved item to check: where it lies, its recorded CRC32C (None: read only) and the
    name faults give it."""

    object: str
    start: int
    length: int
    crc32c: int | None
    name: str
    rank: int | None = None
    ref: Any = None
    """The caller's handle (a manifest row; verify's entry and chunk)."""
    framing: tuple[int, int] | None = None
    """``(data_offset, nbytes)`` of a tensor item: its zip framing must put the data there."""

    @property
    def end(self) -> int:
        return self.start + self.length


@dataclass(frozen=True)
class Fault:
    """One thing wrong. ``kind``: ``checksum``, ``structure`` (framing), ``truncated``,
    ``missing_object``, ``object_size``, ``metadata`` (the committed ``.metadata``),
    ``stale_metadata`` (the plain copy), ``read_error``. ``item`` is the item it names (a
    finding about one item); ``items`` every item it costs."""

    kind: str
    object: str | None
    message: str
    item: Item | None = None
    items: tuple[Item, ...] = ()
    expected: str | None = None
    found: str | None = None
    error: S3CkptError | None = None


def item_name(fqn: str, offset: Sequence[int] | None) -> str:
    """``model.w``, or ``model.w (chunk at [4, 0])`` for a shard."""
    return f"{fqn} (chunk at {list(offset)})" if offset and any(offset) else fqn


def manifest_items(
    manifest: Manifest, name: Callable[[ItemRecord], str] = lambda i: item_name(i.fqn, i.offset)
) -> list[Item]:
    """The marker's items, in its order, each with the rank that wrote its object."""
    ranks = {o.name: o.rank for o in manifest.objects}
    return [
        Item(i.object, i.start, i.length, i.crc32c, name(i), ranks.get(i.object), i)
        for i in manifest.records
    ]


def sample_items(items: Sequence[Any], fraction: float, rng: random.Random) -> list[Any]:
    """A ``fraction`` of the items' bytes (each has a ``length``), chosen at random (at
    least one item when ``fraction > 0``; all at ``>= 1``), in their order (for coalesced
    reads). Sized by bytes, what a read costs, not by count."""
    if fraction <= 0 or not items:
        return []
    if fraction >= 1:
        return list(items)
    order = list(range(len(items)))
    rng.shuffle(order)
    want = fraction * sum(i.length for i in items)
    sums = accumulate(items[i].length for i in order)
    n = next((n for n, got in enumerate(sums, 1) if got >= want), len(order))
    return [items[i] for i in sorted(order[:n])]


class _Framing:
    """The bytes around a tensor's data, kept while its item streams past: its zip framing
    must put the data at ``data_offset`` (a resealed marker with a moved offset must fail)."""

    def __init__(self, data_offset: int, nbytes: int) -> None:
        head_from, self.tail_from = max(0, data_offset - FRAMING_HEAD), data_offset + nbytes
        self.head, self.tail = bytearray(data_offset - head_from), bytearray(FRAMING_TAIL)
        self.parts = ((head_from, self.head), (self.tail_from, self.tail))
        self.nbytes, self.seen = nbytes, 0

    def feed(self, data: memoryview) -> None:
        """The next piece of the item (pieces come in order, from its first byte)."""
        at, self.seen = self.seen, self.seen + len(data)
        for start, buf in self.parts:
            lo, hi = max(at, start), min(self.seen, start + len(buf))
            if lo < hi:
                buf[lo - start : hi - start] = data[lo - at : hi - at]

    def error(self) -> str | None:
        tail = self.tail[: max(0, self.seen - self.tail_from)]  # as much of it as was read
        return tensor_framing_error(self.head, tail, self.nbytes)


_METADATA_FIX = {
    "metadata": "s3ckpt still loads from the plain .metadata while it is intact; copy it over "
    "{key} (its CRC32C must match the marker's), or load an earlier checkpoint",
    "stale_metadata": "`s3ckpt gc --apply`, or any s3ckpt load with write access, copies {key} "
    "back over it",
}
_METADATA_ROLE = {
    "metadata": "the committed metadata",
    "stale_metadata": "the copy stock DCP readers load",
}


class Verifier:
    """One check of one checkpoint's objects; collects :attr:`faults` (module docs).

    Args:
        store / key_of: Where the objects are; the store key of an object name.
        config: ``concurrency`` (HEADs), the read walk's settings.
        on_bytes: Called with the size of every piece read (from reading threads).
    """

    def __init__(
        self,
        store: ObjectStore,
        key_of: Callable[[str], str],
        config: TransferConfig,
        *,
        on_bytes: Callable[[int], None] | None = None,
    ) -> None:
        self.store, self.key_of, self.config, self.on_bytes = store, key_of, config, on_bytes
        self.faults: list[Fault] = []
        self.items_read = self.bytes_read = self.total = 0
        self._lock = threading.Lock()

    def count(self, n: int) -> None:
        """``n`` more bytes read."""
        with self._lock:
            self.bytes_read += n
        if self.on_bytes is not None:
            self.on_bytes(n)

    def sizes(
        self, names: Iterable[str], listing: Mapping[str, ObjectInfo] | None = None
    ) -> dict[str, int | None]:
        """Each object's size (None: missing), from ``listing`` (by key), else a HEAD each."""
        keys = {n: self.key_of(n) for n in names}
        listing = listing or {}
        unlisted = [k for k in keys.values() if k not in listing]
        with ThreadPoolExecutor(max(1, min(self.config.concurrency, len(unlisted)))) as pool:
            heads = dict(
                zip(unlisted, pool.map(in_context(self.store.head), unlisted), strict=True)
            )
        found = {n: listing.get(k) or heads.get(k) for n, k in keys.items()}
        return {n: None if info is None else info.size for n, info in found.items()}

    def objects(
        self, items: Sequence[Item], sizes: Mapping[str, int | None], recorded: Mapping[str, int]
    ) -> list[Item]:
        """Faults for missing objects, sizes other than ``recorded``, items past an object's
        end; returns the items that can be read."""
        add = self.faults.append
        by_object: dict[str, list[Item]] = defaultdict(list)
        for i in items:
            by_object[i.object].append(i)
        readable: list[Item] = []
        for name, size in sizes.items():
            mine, want = by_object[name], recorded.get(name)
            expected = None if want is None else f"{want} bytes"
            if size is None:
                message = f"{name} is missing ({len(mine)} items in it); the checkpoint was "
                message += "partly deleted"
                add(Fault("missing_object", name, message, None, tuple(mine), expected, "missing"))
                continue
            past = tuple(i for i in mine if i.end > size)
            readable += [i for i in mine if i.end <= size]
            if want is not None and size != want:
                what = (
                    f"truncated ({len(past)} items lie past its end)" if size < want else "changed"
                )
                message = f"object {name} has {size} bytes, {MANIFEST_NAME} recorded {want}; "
                message += f"it was {what}"
                add(Fault("object_size", name, message, None, past, expected, f"{size} bytes"))
            elif past:
                message = f"{name} has {size} bytes, too few for {len(past)} items; it is truncated"
                add(Fault("truncated", name, message, items=past))
        return readable

    def metadata(
        self, prefix: str, manifest: Manifest, listing: Mapping[str, ObjectInfo] | None = None
    ) -> None:
        """Both ``.metadata`` copies against the marker's size and CRC32C: the committed
        ``.metadata.{tag}`` (``metadata``) and the plain copy stock DCP readers load
        (``stale_metadata``). One GET each, unless ``listing`` shows it missing or resized."""
        want = f"{manifest.metadata_size} bytes, crc32c {manifest.metadata_crc32c:08x}"
        copies = {"metadata": manifest.metadata_key}
        if manifest.metadata_key != METADATA_NAME:
            copies["stale_metadata"] = METADATA_NAME
        for kind, name in copies.items():
            info = None if listing is None else listing.get(prefix + name)
            found = "missing" if listing is not None and info is None else None
            if info is not None and info.size != manifest.metadata_size:
                found = f"{info.size} bytes"
            elif found is None:
                try:
                    with expecting("not_found"):
                        raw = self.store.get(prefix + name)
                    self.count(len(raw))
                    crc = crc32c(raw)
                    if (len(raw), crc) != (manifest.metadata_size, manifest.metadata_crc32c):
                        record_checksum_failure()
                        found = f"{len(raw)} bytes, crc32c {crc:08x}"
                except ObjectNotFoundError:
                    found = "missing"
            if found is not None:
                fix = _METADATA_FIX[kind].format(key=manifest.metadata_key)
                message = f"{name} ({_METADATA_ROLE[kind]}) is {found}; "
                message += f"{MANIFEST_NAME} committed {want}: {fix}"
                self.faults.append(Fault(kind, name, message, expected=want, found=found))

    def read(self, items: Sequence[Item], *, thread_name: str = "s3ckpt-verify") -> None:
        """Read ``items`` back (coalesced ranged GETs, ``read_concurrency`` at a time) and
        compare each one's CRC32C (and framing); their faults in request order."""
        found: dict[int, list[Fault]] = defaultdict(list)

        def on_span(span: Span[Item], stream: SpanReader) -> None:
            item = span.payload
            crc = 0
            frame = _Framing(*item.framing) if item.framing is not None else None
            for piece in stream.chunks(item.name):
                crc = crc32c(piece, crc)
                if frame is not None:
                    frame.feed(piece)
            where = f"{item.name} (bytes {item.start}-{item.end - 1} of {item.object})"
            faults = []
            if frame is not None and (why := frame.error()) is not None:
                message = f"{where}: {why}; {MANIFEST_NAME} does not describe the bytes stored"
                faults.append(Fault("structure", item.object, message, item, (item,)))
            if item.crc32c is not None and crc != item.crc32c:
                record_checksum_failure()
                expected, got = f"crc32c {item.crc32c:08x}", f"crc32c {crc:08x}"
                message = f"{where}: {got}, {MANIFEST_NAME} recorded {item.crc32c:08x}; "
                message += "the data changed after it was saved"
                faults.append(Fault("checksum", item.object, message, item, (item,), expected, got))
            with self._lock:
                self.items_read += 1
                found[span.job] += faults

        def on_failure(failure: ReadFailure[Item]) -> None:
            lost = tuple(s.payload for s in failure.spans)
            names = sorted({i.name for i in lost})
            obj = failure.spans[0].name if failure.spans else None
            if failure.kind == "truncated":
                shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
                message = f"{obj} ended early while reading {len(names)} items back ({shown}); "
                message += "the object is truncated"
                first = min(lost, key=lambda i: i.name) if lost else None
                expected, got = "the recorded bytes", "the object ended early"
                fault = Fault("truncated", obj, message, first, lost, expected, got, failure.error)
            else:
                message = f"{len(names)} items of {obj} could not be read: {failure.error}"
                fault = Fault("read_error", obj, message, items=lost, error=failure.error)
            with self._lock:
                found[failure.job].append(fault)

        walk: RangeWalk[Item] = RangeWalk(
            self.store,
            self.key_of,
            config=self.config,
            on_span=on_span,
            on_failure=on_failure,
            on_bytes=self.count,
            thread_name_prefix=thread_name,
        )
        spans: dict[str, list[tuple[int, int, Item]]] = defaultdict(list)
        for i in items:
            spans[i.object].append((i.start, i.end, i))
        jobs = walk.plan(spans)
        self.total = sum(req.size for _, req in jobs)
        walk.run(jobs)
        self.faults += [f for job in range(len(jobs)) for f in found.get(job, [])]


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


def verify_wanted(store: ObjectStore, setting: bool | None, probe_key: str) -> bool:
    """Whether a save to ``store`` verifies after write.

    ``setting`` (the writer's ``S3Config.verify_after_write``), else the store's own
    ``S3Config.verify_after_write``, decides when not ``None``. Auto: off for stores
    without an S3 wire (memory, fsspec: their transports check their own bytes); on for
    an S3 store that sends no checksums (``checksum_algorithm="NONE"``) or that accepts
    an upload whose CRC32C is wrong (:meth:`S3Store.checksum_verified
    <s3ckpt.store.s3.S3Store.checksum_verified>` on ``probe_key``, the coordinator's
    heartbeat: once per endpoint and bucket and process). An echo of the checksum sent
    proves nothing: moto echoes whatever it is sent and checks none.
    """
    cfg = getattr(store, "s3_config", None)
    if setting is not None or getattr(store, "url_scheme", None) != "s3" or cfg is None:
        return bool(setting)
    if getattr(cfg, "verify_after_write", None) is not None:
        return bool(cfg.verify_after_write)
    probe = getattr(store, "checksum_verified", None)
    crc32c = getattr(cfg, "checksum_algorithm", "CRC32C") == "CRC32C"
    return not (crc32c and callable(probe) and probe(probe_key))


def verify_objects(store: ObjectStore, url: StoreURL, manifest: Manifest) -> None:
    """Read every item of the save and its ``.metadata`` back and check each CRC32C (module
    docs), with the one verifier (:class:`s3ckpt._verify.Verifier`).

    Raises:
        ChecksumMismatchError: An item (or the ``.metadata``) reads back with another
            CRC32C than the one recorded: naming the first such object, item and rank.
        CorruptCheckpointError: An object reads back shorter than written.
        StoreError: A read failed after its retries.
    """
    items = manifest_items(manifest, lambda i: repr(i.fqn))
    items += [Item(name, 0, size, crc, name) for name, size, crc in manifest.controls]
    names = {name for name, _, _ in manifest.controls}

    def key_of(name: str) -> str:
        return url.key(name) if name in names else manifest.object_key(url.prefix, name)

    v = Verifier(store, key_of, getattr(store, "transfer_config", None) or TransferConfig())
    v.read(items)
    if failed := [f.error for f in v.faults if f.kind == "read_error" and f.error is not None]:
        raise failed[0]
    if not v.faults:
        return
    first = v.faults[0]
    item = first.item or first.items[0]
    key = key_of(item.object)
    where: dict[str, Any] = {"bucket": store.bucket, "key": key, "rank": item.rank}
    if first.kind != "checksum":
        raise CorruptCheckpointError(
            f"verify after write: {key} reads back shorter than written ({first.message}); "
            "nothing was committed, the previous checkpoint is intact",
            **where,
        )
    writer = f"rank {item.rank}" if item.rank is not None else "the coordinator"
    more = len(v.faults) - 1
    raise ChecksumMismatchError(
        f"verify after write: {item.name} in {key} (written by {writer}) reads back with "
        f"{first.found}, but {first.expected} was sent (bytes {item.start}-{item.end - 1})"
        f"{f', and {more} more item(s)' if more else ''}: the bytes were corrupted on their "
        "way to the store (which did not verify the checksum sent with them). Nothing was "
        "committed and the previous checkpoint is intact; save again, and if it recurs "
        "check the network path to the store",
        item=item.name,
        **where,
    )


def verify_marker(store: ObjectStore, url: StoreURL, body: bytes) -> None:
    """After the commit: the marker must read back as ``body``. A marker that arrived
    altered (it no longer parses: the manifest checksums itself) is rewritten over itself
    (If-Match on what is there), once, and read again; a sound marker of another save (an
    overwrite that replaced ours meanwhile) is left alone. Request cost: HEAD + GET.

    Raises:
        CorruptCheckpointError: It still reads back altered (or another save replaced
            it meanwhile, which then owns the prefix).
    """
    key = url.key(MANIFEST_NAME)
    for attempt in range(2):
        info = store.head(key)
        stored = store.get(key)
        if stored == body:
            return
        with contextlib.suppress(CorruptCheckpointError):
            Manifest.from_json(stored, where=key)
            return  # a sound marker: another save (an overwrite) replaced ours meanwhile
        if attempt or info is None:
            break
        log.warning("s3ckpt: the marker of %s arrived altered; writing it again", url)
        try:
            store.put(key, body, if_match=info.etag)
        except StoreError as exc:
            log.warning("s3ckpt: rewriting the marker of %s failed: %s", url, exc)
            break
    raise CorruptCheckpointError(
        f"verify after write: the commit marker of {url} does not read back as written; "
        "the checkpoint is damaged (loads refuse it). Save again",
        bucket=store.bucket,
        key=key,
    )
