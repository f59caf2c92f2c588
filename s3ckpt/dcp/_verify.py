"""Verify after write: the coordinator reads a save back before its commit marker.

A store that ignores the CRC32C sent with each upload (moto, some S3-compatible servers)
stores whatever bytes reach it: a byte flipped in transit commits corrupt data that only
a load notices, later. With ``S3Config.verify_after_write`` on (auto: where the store is
not known to verify checksums, see :func:`verify_wanted`) the coordinator re-reads every
data object and the ``.metadata`` of the save and checks each item's CRC32C recorded in
the manifest before it writes the marker; a mismatch fails the save with a
:class:`~s3ckpt.errors.ChecksumMismatchError` naming the object, the item and the rank
that wrote it, and the previous checkpoint stays committed. After the marker is written,
it is read back too: a marker that arrived altered is rewritten (If-Match on the altered
one) before the save reports success.

Cost: one more read of every byte the save wrote, all of it through the coordinator
(the simplest way to know that what is committed is what every rank sent), in parallel
over ``TransferConfig.concurrency`` objects at a time, each streamed through one
:data:`CHUNK` buffer: memory ``concurrency * CHUNK`` at most. At the coordinator's
download bandwidth B, a save of S bytes takes S / B longer (e.g. 10 GB at 1 GB/s: 10 s).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from s3ckpt import _crc
from s3ckpt.errors import ChecksumMismatchError, CorruptCheckpointError, StoreError
from s3ckpt.format import MANIFEST_NAME, ItemRecord, Manifest
from s3ckpt.metrics.instrument import in_context
from s3ckpt.store import ObjectStore
from s3ckpt.uri import StoreURL

__all__ = ["CHUNK", "verify_marker", "verify_objects", "verify_wanted"]

log = logging.getLogger(__name__)

CHUNK = 8 * 1024 * 1024
"""Bytes one verifying thread reads at a time (its one buffer)."""

_DEFAULT_WORKERS = 8


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
    if setting is not None:
        return setting
    cfg = getattr(store, "s3_config", None)
    if getattr(store, "url_scheme", None) != "s3" or cfg is None:
        return False
    own = getattr(cfg, "verify_after_write", None)
    if own is not None:
        return bool(own)
    if getattr(cfg, "checksum_algorithm", "CRC32C") != "CRC32C":
        return True
    probe = getattr(store, "checksum_verified", None)
    return not (callable(probe) and probe(probe_key))


@dataclass(frozen=True)
class _Check:
    """One object to read back: its key, size, the rank that wrote it, and the
    ``(start, length, crc32c, what)`` ranges to check in it."""

    key: str
    size: int
    rank: int | None
    ranges: tuple[tuple[int, int, int, str], ...]


def _checks(manifest: Manifest, url: StoreURL) -> list[_Check]:
    by_object: dict[str, list[ItemRecord]] = {}
    for item in manifest.items:
        by_object.setdefault(item.object, []).append(item)
    checks = [
        _Check(
            manifest.object_key(url.prefix, o.name),
            o.size,
            o.rank,
            tuple(
                (i.start, i.length, i.crc32c, repr(i.fqn))
                for i in sorted(by_object.get(o.name, ()), key=lambda i: i.start)
            ),
        )
        for o in manifest.objects
    ]
    checks.append(
        _Check(
            url.key(manifest.metadata_key),
            manifest.metadata_size,
            None,
            ((0, manifest.metadata_size, manifest.metadata_crc32c, manifest.metadata_key),),
        )
    )
    return checks


def _read_back(store: ObjectStore, check: _Check) -> list[tuple[str, int, int, int, int]]:
    """Stream ``check``'s object once; the ranges whose CRC32C differs, as ``(what,
    start, length, found, recorded)``."""
    crcs = [0] * len(check.ranges)
    buf = bytearray(min(CHUNK, max(check.size, 1)))
    view = memoryview(buf)
    pos = 0
    first = 0  # ranges before this one end at or before pos
    reader = store.open_range(check.key, 0, check.size)
    try:
        while pos < check.size:
            n = reader.readinto(view[: min(len(buf), check.size - pos)])
            if not n:
                break
            end = pos + n
            j = first
            while j < len(check.ranges) and check.ranges[j][0] < end:
                start, length, _, _ = check.ranges[j]
                lo, hi = max(start, pos), min(start + length, end)
                if lo < hi:
                    crcs[j] = _crc.crc32c(view[lo - pos : hi - pos], crcs[j])
                j += 1
            while first < len(check.ranges) and sum(check.ranges[first][:2]) <= end:
                first += 1
            pos = end
    finally:
        reader.close()
    if pos != check.size:
        raise CorruptCheckpointError(
            f"verify after write: {check.key} reads back {pos} bytes, {check.size} were "
            "written; nothing was committed, the previous checkpoint is intact",
            bucket=store.bucket,
            key=check.key,
            rank=check.rank,
        )
    return [
        (what, start, length, found, recorded)
        for (start, length, recorded, what), found in zip(check.ranges, crcs, strict=True)
        if found != recorded
    ]


def verify_objects(
    store: ObjectStore, url: StoreURL, manifest: Manifest, *, workers: int | None = None
) -> None:
    """Read every object of the save back and check each item's CRC32C (module docs).

    Raises:
        ChecksumMismatchError: An item (or the ``.metadata``) reads back with another
            CRC32C than the one recorded: naming the first such object, item and rank.
        CorruptCheckpointError: An object reads back shorter than written.
        StoreError: A read failed after its retries.
    """
    checks = _checks(manifest, url)
    if workers is None:
        tc = getattr(store, "transfer_config", None)
        workers = int(getattr(tc, "concurrency", _DEFAULT_WORKERS) or _DEFAULT_WORKERS)
    bad: list[tuple[_Check, Sequence[tuple[str, int, int, int, int]]]] = []
    with ThreadPoolExecutor(max(1, min(workers, len(checks)))) as pool:
        read = in_context(lambda c: (c, _read_back(store, c)))
        for check, wrong in pool.map(read, checks):
            if wrong:
                bad.append((check, wrong))
    if not bad:
        return
    first_check, first_wrong = bad[0]
    check = first_check
    what, start, length, found, recorded = first_wrong[0]
    writer = f"rank {check.rank}" if check.rank is not None else "the coordinator"
    more = sum(len(w) for _, w in bad) - 1
    raise ChecksumMismatchError(
        f"verify after write: {what} in {check.key} (written by {writer}) reads back with "
        f"crc32c {found:08x}, but {recorded:08x} was sent (bytes {start}-{start + length - 1})"
        f"{f', and {more} more item(s)' if more else ''}: the bytes were corrupted on their "
        "way to the store (which did not verify the checksum sent with them). Nothing was "
        "committed and the previous checkpoint is intact; save again, and if it recurs "
        "check the network path to the store",
        bucket=store.bucket,
        key=check.key,
        rank=check.rank,
        item=what,
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
        try:
            Manifest.from_json(stored, where=key)
            return  # a sound marker: another save (an overwrite) replaced ours meanwhile
        except CorruptCheckpointError:
            pass
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
