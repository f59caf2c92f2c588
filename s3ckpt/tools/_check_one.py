"""One committed checkpoint under ``s3ckpt check``: what is checked, and the sample of items.

For a checkpoint the catalog lists as committed, in order:

1. **Listing** (one LIST of its prefix): the marker is still there, and no object is in an
   archive class (:data:`~s3ckpt.store.base.ARCHIVE_CLASSES`: such a checkpoint is skipped,
   not read).
2. **Marker**: ``s3ckpt.json`` parses and matches its own ``digest``
   (:meth:`~s3ckpt.format.Manifest.from_json`).
3. **Objects**: every data object the marker names exists with the recorded size, from the
   listing; a HEAD only for an object the listing does not show (hashed-prefix saves keep
   their objects in the run's shard folder: one HEAD each there).
4. **Metadata**: the ``.metadata.{tag}`` the marker commits and the plain ``.metadata`` copy
   for stock DCP readers both have the recorded size and CRC32C (one GET each).
5. **Data** (``fraction > 0``): a random sample of items (:func:`sample_items`) is read back
   with the coalesced ranged reads of ``s3ckpt verify`` (:class:`~s3ckpt.transfer.RangeWalk`)
   and each item's CRC32C compared with the marker's. Memory: one ``read_chunk_size``
   buffer per reading thread (``concurrency`` of them).

A finding other than a read error is damage. Before a checkpoint with findings is reported,
its marker is HEADed again: a marker deleted or rewritten meanwhile (a prune, a re-save,
``attach_metrics``) makes it *skipped*, not damaged, so a check racing a job never reports
damage that is not there.

No torch: the check runs in the retention cron's image. Unlike ``verify`` it reads no
``.metadata`` pickle and so checks no tensor framing; ``s3ckpt verify`` does that too.
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from s3ckpt._crc import crc32c
from s3ckpt._time import iso_z
from s3ckpt.config import TransferConfig
from s3ckpt.errors import CorruptCheckpointError, ObjectNotFoundError
from s3ckpt.format import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    METADATA_NAME,
    ItemRecord,
    Manifest,
    manifest_digest,
)
from s3ckpt.metrics.instrument import expecting, in_context, record_checksum_failure
from s3ckpt.retention import CheckpointInfo
from s3ckpt.store import ObjectStore
from s3ckpt.store.base import ARCHIVE_CLASSES, ObjectInfo
from s3ckpt.tools._check_result import CheckpointCheck, Finding, SkippedCheckpoint
from s3ckpt.transfer import RangeWalk, ReadFailure, Span, SpanReader

__all__ = ["check_checkpoint", "sample_items"]

_ORDER = {k: n for n, k in enumerate(("marker", "missing_object", "object_size", "metadata"))}
"""Findings sort by kind (these first, the rest after), then object and item."""


def sample_items(
    items: Sequence[ItemRecord], fraction: float, rng: random.Random
) -> list[ItemRecord]:
    """Items to read back: a ``fraction`` of the checkpoint's item bytes, chosen at random.

    Items are taken in a random order until their bytes reach ``fraction`` of all items'
    bytes (at least one item when ``fraction > 0``): the sample is sized by bytes, what a
    read costs in time and transfer, so a checkpoint of many tiny values and a few large
    tensors is not read as ten times cheaper than it is. ``fraction >= 1`` takes every item;
    ``0`` none. Returned in the marker's order (for coalesced reads).
    """
    if fraction <= 0 or not items:
        return []
    if fraction >= 1:
        return list(items)
    order = list(range(len(items)))
    rng.shuffle(order)
    want = fraction * sum(i.length for i in items)
    taken: list[int] = []
    got = 0
    for i in order:
        if taken and got >= want:
            break
        taken.append(i)
        got += items[i].length
    return [items[i] for i in sorted(taken)]


def _item_name(item: ItemRecord) -> str:
    if item.offset and any(item.offset):
        return f"{item.fqn} (chunk at {list(item.offset)})"
    return item.fqn


@dataclass
class _State:
    """One checkpoint's check while it runs (its counts are updated from reading threads)."""

    findings: list[Finding] = field(default_factory=list)
    items_read: int = 0
    bytes_read: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def check_checkpoint(
    store: ObjectStore,
    info: CheckpointInfo,
    run: str,
    *,
    fraction: float,
    rng: random.Random,
    config: TransferConfig,
    on_bytes: Callable[[int], None] | None = None,
) -> CheckpointCheck | SkippedCheckpoint:
    """Check one committed checkpoint (see the module docs); never raises for damage.

    Raises:
        StoreError: A listing, HEAD or metadata GET failed after its retries (the check of
            the rest cannot be trusted to be complete).

    Request cost: one LIST, one GET of the marker, one or two GETs of ``.metadata``, a HEAD
    per object the listing does not show, the ranged GETs of the sample, and one HEAD of the
    marker when anything was found.
    """
    now = iso_z(datetime.now(UTC))
    url, prefix = str(info.url), info.url.prefix
    marker_key = prefix + MANIFEST_NAME
    st = _State()

    def done(**kw: Any) -> CheckpointCheck:
        findings = sorted(
            st.findings, key=lambda f: (_ORDER.get(f.kind, 9), f.object or "", f.item or "")
        )
        return CheckpointCheck(
            url,
            run,
            info.name,
            info.step,
            info.tag,
            now,
            items_read=st.items_read,
            bytes_read=st.bytes_read,
            findings=tuple(findings),
            **kw,
        )

    def skipped(reason: str, detail: str) -> SkippedCheckpoint:
        return SkippedCheckpoint(url, run, info.name, reason, detail)

    def count(n: int) -> None:
        with st.lock:
            st.bytes_read += n
        if on_bytes is not None:
            on_bytes(n)

    if info.error is not None:  # the marker cannot be read: nothing else can be checked
        st.findings.append(
            Finding(
                "marker", MANIFEST_NAME, None, "a readable marker", "unreadable", info.error or ""
            )
        )
        return done(marker_etag=info.marker_etag)
    listing = {o.key: o for o in store.list(prefix)}
    marker = listing.get(marker_key)
    if marker is None:
        return skipped("changed", "its commit marker was deleted since the scan (a prune or rm)")
    archived = [o for o in listing.values() if o.storage_class in ARCHIVE_CLASSES]
    if archived:
        classes = ", ".join(sorted({str(o.storage_class) for o in archived}))
        return skipped(
            "archived",
            f"{len(archived)} of its objects are in {classes}: not read (restore them first, "
            f"s3ckpt restore {url})",
        )
    manifest, digest = _read_marker(store, marker_key, marker, st, count)
    if manifest is None:
        if not st.findings:
            return skipped("changed", "its commit marker was deleted while it was checked")
        return _confirmed(store, marker_key, marker, done(marker_etag=marker.etag), skipped)
    sizes = _object_sizes(store, prefix, manifest, listing, config.concurrency)
    readable = _check_objects(manifest, sizes, st)
    _check_metadata(store, prefix, manifest, listing, st, count)
    sample = [i for i in sample_items(manifest.items, fraction, rng) if i.object in readable]
    sample = [i for i in sample if i.start + i.length <= readable[i.object]]
    if sample:
        _read_items(store, prefix, manifest, sample, config, st, count)
    result = done(
        marker_digest=digest,
        marker_etag=marker.etag,
        objects=len(manifest.objects),
        items=len(manifest.items),
    )
    if not result.findings:
        return result
    return _confirmed(store, marker_key, marker, result, skipped)


def _confirmed(
    store: ObjectStore,
    marker_key: str,
    marker: ObjectInfo,
    result: CheckpointCheck,
    skipped: Callable[[str, str], SkippedCheckpoint],
) -> CheckpointCheck | SkippedCheckpoint:
    """``result`` if the marker is still the one listed, else skipped (see the module docs)."""
    now = store.head(marker_key)
    if now is None:
        return skipped("changed", "its commit marker was deleted while it was checked")
    if now.etag is not None and marker.etag is not None and now.etag != marker.etag:
        return skipped(
            "changed",
            "its commit marker was rewritten while it was checked (a new save or "
            "attach_metrics); the next check reads the new one",
        )
    return result


def _read_marker(
    store: ObjectStore,
    key: str,
    listed: ObjectInfo,
    st: _State,
    count: Callable[[int], None],
) -> tuple[Manifest | None, str | None]:
    """The marker and its digest; (None, None) with a finding when it is damaged, or with
    none when it vanished."""
    if listed.size > MAX_MANIFEST_BYTES:
        st.findings.append(
            Finding(
                "marker",
                MANIFEST_NAME,
                None,
                f"at most {MAX_MANIFEST_BYTES} bytes",
                f"{listed.size} bytes",
                f"{key} is larger than a commit marker may be; not read",
            )
        )
        return None, None
    try:
        with expecting("not_found"):
            raw = store.get(key)
    except ObjectNotFoundError:
        return None, None
    count(len(raw))
    try:
        manifest = Manifest.from_json(raw, where=key)
    except CorruptCheckpointError as exc:
        st.findings.append(
            Finding("marker", MANIFEST_NAME, None, "a valid marker", "damaged", exc.message)
        )
        return None, None
    return manifest, manifest_digest(json.loads(raw))


def _object_sizes(
    store: ObjectStore,
    prefix: str,
    manifest: Manifest,
    listing: dict[str, ObjectInfo],
    concurrency: int,
) -> dict[str, int | None]:
    """Each data object's size (None: missing), from the listing, else one HEAD each."""
    keys = {o.name: manifest.object_key(prefix, o.name) for o in manifest.objects}
    unlisted = [k for k in keys.values() if k not in listing]
    heads: dict[str, ObjectInfo | None] = {}
    if unlisted:
        with ThreadPoolExecutor(max(1, min(concurrency, len(unlisted)))) as pool:
            heads = dict(zip(unlisted, pool.map(in_context(store.head), unlisted), strict=True))
    out: dict[str, int | None] = {}
    for name, key in keys.items():
        info = listing.get(key) or heads.get(key)
        out[name] = None if info is None else info.size
    return out


def _check_objects(manifest: Manifest, sizes: dict[str, int | None], st: _State) -> dict[str, int]:
    """Findings for missing and resized objects; the objects that can be read, with sizes."""
    per_object: dict[str, list[ItemRecord]] = {}
    for item in manifest.items:
        per_object.setdefault(item.object, []).append(item)
    readable: dict[str, int] = {}
    for o in manifest.objects:
        size = sizes[o.name]
        items = per_object.get(o.name, [])
        if size is None:
            st.findings.append(
                Finding(
                    "missing_object",
                    o.name,
                    None,
                    f"{o.size} bytes",
                    "missing",
                    f"{o.name} is missing ({len(items)} items in it); the checkpoint was "
                    "partly deleted",
                )
            )
            continue
        readable[o.name] = size
        if size != o.size:
            past = sum(1 for i in items if i.start + i.length > size)
            what = f"truncated ({past} items lie past its end)" if size < o.size else "changed"
            st.findings.append(
                Finding(
                    "object_size",
                    o.name,
                    None,
                    f"{o.size} bytes",
                    f"{size} bytes",
                    f"{o.name} has {size} bytes, {MANIFEST_NAME} recorded {o.size}; it was {what}",
                )
            )
    return readable


def _check_metadata(
    store: ObjectStore,
    prefix: str,
    manifest: Manifest,
    listing: dict[str, ObjectInfo],
    st: _State,
    count: Callable[[int], None],
) -> None:
    """The committed ``.metadata.{tag}`` and the plain copy against the marker's record."""
    names = [(manifest.metadata_key, "metadata")]
    if manifest.metadata_key != METADATA_NAME:
        names.append((METADATA_NAME, "stale_metadata"))
    want = f"{manifest.metadata_size} bytes, crc32c {manifest.metadata_crc32c:08x}"
    for name, kind in names:
        hint = (
            "; s3ckpt gc --apply rewrites it from the committed copy"
            if kind == "stale_metadata"
            else "; load an earlier checkpoint"
        )
        info = listing.get(prefix + name)
        found: str | None = None
        if info is None:
            found = "missing"
        elif info.size != manifest.metadata_size:
            found = f"{info.size} bytes"
        else:
            try:
                with expecting("not_found"):
                    raw = store.get(prefix + name)
            except ObjectNotFoundError:
                raw = None
            if raw is None:
                found = "missing"
            else:
                count(len(raw))
                crc = crc32c(raw)
                if len(raw) != manifest.metadata_size or crc != manifest.metadata_crc32c:
                    record_checksum_failure()
                    found = f"{len(raw)} bytes, crc32c {crc:08x}"
        if found is not None:
            st.findings.append(
                Finding(
                    kind,
                    name,
                    None,
                    want,
                    found,
                    f"{name} is {found}; {MANIFEST_NAME} committed {want}{hint}",
                )
            )


def _read_items(
    store: ObjectStore,
    prefix: str,
    manifest: Manifest,
    sample: list[ItemRecord],
    config: TransferConfig,
    st: _State,
    count: Callable[[int], None],
) -> None:
    """Read ``sample`` back with the verify walk and compare each item's CRC32C."""

    def on_span(span: Span[ItemRecord], stream: SpanReader) -> None:
        item = span.payload
        crc = 0
        for piece in stream.chunks(item.fqn):
            crc = crc32c(piece, crc)
        bad = crc != item.crc32c
        if bad:
            record_checksum_failure()
        with st.lock:
            st.items_read += 1
            if bad:
                st.findings.append(
                    Finding(
                        "checksum",
                        item.object,
                        _item_name(item),
                        f"crc32c {item.crc32c:08x}",
                        f"crc32c {crc:08x}",
                        f"{_item_name(item)} (bytes {span.start}-{span.end - 1} of "
                        f"{item.object}): crc32c {crc:08x}, {MANIFEST_NAME} recorded "
                        f"{item.crc32c:08x}; the data changed after it was saved",
                    )
                )

    def on_failure(failure: ReadFailure[ItemRecord]) -> None:
        names = sorted({_item_name(s.payload) for s in failure.spans})
        obj = failure.spans[0].name if failure.spans else None
        if failure.kind == "truncated":
            found = Finding(
                "truncated",
                obj,
                names[0] if names else None,
                "the recorded bytes",
                "the object ended early",
                f"{obj} ended early while reading {len(names)} items back ({', '.join(names[:3])}"
                f"{', ...' if len(names) > 3 else ''}); the object is truncated",
            )
        else:
            found = Finding(
                "read_error",
                obj,
                None,
                None,
                None,
                f"{len(names)} items of {obj} could not be read: {failure.error}",
            )
        with st.lock:
            st.findings.append(found)

    walk: RangeWalk[ItemRecord] = RangeWalk(
        store,
        lambda name: manifest.object_key(prefix, name),
        config=config,
        on_span=on_span,
        on_failure=on_failure,
        on_bytes=count,
        thread_name_prefix="s3ckpt-check",
    )
    spans: dict[str, list[tuple[int, int, ItemRecord]]] = {}
    for item in sample:
        spans.setdefault(item.object, []).append((item.start, item.start + item.length, item))
    walk.run(walk.plan(spans))
