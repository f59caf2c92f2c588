"""Verify after write: the coordinator reads a save back before its commit marker.

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
from typing import Any

from s3ckpt._verify import Item, Verifier, manifest_items
from s3ckpt.config import TransferConfig
from s3ckpt.errors import ChecksumMismatchError, CorruptCheckpointError, StoreError
from s3ckpt.format._manifest import Manifest
from s3ckpt.format._names import MANIFEST_NAME
from s3ckpt.store import ObjectStore
from s3ckpt.uri import StoreURL

__all__ = ["verify_marker", "verify_objects", "verify_wanted"]

log = logging.getLogger(__name__)


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
