"""The commit of a save, on the coordinator: :meth:`S3StorageWriter.finish
<s3ckpt.dcp.S3StorageWriter.finish>` hands it to :class:`SaveCommit`.

What each request does, what a lost reply or a crash after it leaves and who recovers it
is "The commit protocol" in docs/dcp.md. The ranks' part of a save is in
:mod:`s3ckpt.dcp.writer`; what they send the coordinator is :class:`S3StorageInfo`.
"""

from __future__ import annotations

import logging
import pickle
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.storage import WriteResult

from s3ckpt import _crc
from s3ckpt._commit import (
    Heartbeat,
    at_once,
    lost_race_error,
    read_marker,
    restore_stock_metadata,
    writer_record,
)
from s3ckpt._gc_pause import gc_paused
from s3ckpt._tombstone import Tombstone, fenced_error, read_tombstone
from s3ckpt._transfer import format_leftovers
from s3ckpt._verify import verify_marker, verify_objects, verify_wanted
from s3ckpt._version import __version__
from s3ckpt.dcp._torch import StorageInfo
from s3ckpt.errors import (
    CheckpointError,
    CheckpointExistsError,
    CorruptCheckpointError,
    ObjectNotFoundError,
    PreconditionFailedError,
    S3CkptError,
    TransientStoreError,
)
from s3ckpt.format import HashedPrefixes
from s3ckpt.format._manifest import FORMAT_VERSION, ItemRecord, Manifest, ObjectRecord
from s3ckpt.format._names import (
    MANIFEST_NAME,
    METADATA_NAME,
    heartbeat_name,
    items_name,
    metadata_name,
    object_key,
    save_tag,
)
from s3ckpt.metrics.instrument import expecting, in_context
from s3ckpt.store import ObjectStore
from s3ckpt.store.base import DeleteFailure, DeleteFailures, ObjectInfo
from s3ckpt.uri import StoreURL

__all__ = ["S3StorageInfo", "SaveCommit", "delete_own"]

log = logging.getLogger(__name__)

_DCP_VERSION = "1.0.0"

_LIST_WORKERS = 16
# Requests sent in parallel by the object check of a hashed-prefix save (a LIST per shard
# folder it used, and a HEAD).


@dataclass
class S3StorageInfo(StorageInfo):
    """torch's per-item storage info plus what s3ckpt records in ``s3ckpt.json``.

    Only the plain :class:`StorageInfo` part goes into ``.metadata`` (so stock readers can
    read it); the rest travels to the coordinator inside the write results.
    """

    crc32c: int = 0
    data_offset: int | None = None
    object_size: int = 0
    rank: int = 0

    def plain(self) -> StorageInfo:
        return StorageInfo(self.relative_path, self.offset, self.length, self.transform_descriptors)


class SaveCommit:
    """The coordinator's commit of one save (:meth:`S3StorageWriter.finish
    <s3ckpt.dcp.S3StorageWriter.finish>`, whose docstring lists its steps).

    Attributes:
        manifest: The committed manifest, set at the commit point (None before).
        left_behind: Whether a failed commit may have left objects of this save behind
            (True until its own objects are deleted without a failure): what the writer
            records a failure for.
    """

    def __init__(self, writer: Any) -> None:
        """``writer``: the :class:`~s3ckpt.dcp.S3StorageWriter` whose save this commits (its
        store, URL, save id, overwrite, rank, step, metrics, user metadata, layout and
        ``verify_after_write``)."""
        self.store, self.url, self.save_id = writer.store, writer.url, writer.save_id
        self.overwrite, self.rank, self.step = writer.overwrite, writer.rank, writer.step
        self.metrics, self.user = writer.metrics, writer.user_metadata
        self.layout: HashedPrefixes | None = writer.prefix_strategy
        self.verify_after_write: bool | None = writer.s3_config.verify_after_write
        self.tag = save_tag(self.save_id)
        self.marker = self.url.key(MANIFEST_NAME)
        self.manifest: Manifest | None = None
        self.left_behind = True

    def run(
        self,
        metadata: Metadata,
        results: list[list[WriteResult]],
        storage_meta: StorageMeta | None,
    ) -> None:
        """Describe the save, commit its marker, then finish up (see the class docs)."""
        # Pickling .metadata and building the manifest allocate a few objects per item and
        # make no cycles: with the collector running they set off full collections over
        # every object in the process (see s3ckpt._gc_pause).
        with gc_paused():
            meta_bytes, objects, items = self._describe(metadata, results, storage_meta)
        tag = self.tag
        world = len(results)
        meta_name = metadata_name(tag)
        heartbeats = [self.url.key(heartbeat_name(tag, r)) for r in range(world)]
        records = self.url.key(items_name(tag))
        own = [object_key(self.url.prefix, name, self.layout) for name in objects]
        own += [self.url.key(meta_name), records, *heartbeats]
        manifest = Manifest(
            save_id=self.save_id,
            created=time.time(),
            world_size=world,
            metadata_key=meta_name,
            metadata_crc32c=_crc.crc32c(meta_bytes),
            metadata_size=len(meta_bytes),
            objects=tuple(sorted(objects.values(), key=lambda o: (o.rank, o.name))),
            items=tuple(items),
            step=self.step,
            metrics=self.metrics,
            user=self.user,
            versions={"s3ckpt": __version__, "torch": torch.__version__},
            writer=writer_record(),
            format_version=FORMAT_VERSION,
            layout=self.layout,
        )
        manifest, items_bytes = manifest.split_items(items_name(tag))
        items_crc = manifest.items_ref.crc32c if manifest.items_ref else None  # computed once
        beat = Heartbeat(self.store, self.url, tag, self.rank, self.step).beat
        try:
            at_once(
                lambda: at_once(
                    beat, lambda: self.store.put(records, items_bytes, crc32c=items_crc)
                ),
                lambda: self.store.put(
                    self.url.key(meta_name), meta_bytes, crc32c=manifest.metadata_crc32c
                ),
            )
            # Both reads, at once: the conditional marker PUT below, not their order, is
            # what fences a save whose objects a deleter reaped meanwhile.
            _, previous = at_once(lambda: self._check_objects(manifest), self._previous_marker)
            verify = verify_wanted(self.store, self.verify_after_write, heartbeats[self.rank])
            if verify:
                verify_objects(self.store, self.url, manifest)
            manifest_bytes = manifest.to_json()
            retracted = self._retract_stock_metadata(previous)
        except BaseException:
            self._discard(own)
            raise
        try:
            self._commit_marker(manifest_bytes, previous, own)
        except BaseException:
            if retracted:
                self._republish_stock_metadata()
            raise
        self.manifest = manifest
        if verify:
            verify_marker(self.store, self.url, manifest_bytes)
        self._after_commit(manifest, meta_bytes, heartbeats, previous)

    def _check_objects(self, manifest: Manifest) -> None:
        """Every object the manifest names exists with its recorded size.

        A save whose objects vanished (a gc or lifecycle rule with too short a grace, a
        person) must not commit a marker that points at nothing.

        Request cost: ``ceil(keys / 1000)`` LISTs of the prefix; with hashed prefixes
        instead :meth:`_hashed_sizes`.
        """
        prefix = self.url.prefix
        wanted = [(manifest.object_key(prefix, o.name), o.name, o.size) for o in manifest.objects]
        control = [(self.url.key(n), n, size) for n, size, _ in manifest.controls]
        if manifest.layout is None:
            sizes = {o.key: o.size for o in self.store.list(prefix)}
        else:
            sizes = self._hashed_sizes(manifest.layout, manifest, [k for k, _, _ in control])
        wanted += control
        seen = {k: f"{n} bytes" for k, n in sizes.items()}
        bad = [
            (key, f"{name} ({seen.get(key, 'missing')}, expected {size} bytes)")
            for key, name, size in wanted
            if sizes.get(key) != size
        ]
        if bad:
            raise CheckpointError(
                f"not committing {self.url}: {len(bad)} object(s) of this save are missing or "
                f"changed before the commit: {', '.join(b for _, b in bad[:5])}"
                f"{' ...' if len(bad) > 5 else ''}. "
                "Something deleted them while the save ran (a gc/prune or lifecycle rule, or "
                "a person); nothing was committed, the previous checkpoint is intact",
                bucket=self.store.bucket,
                key=bad[0][0],
                rank=self.rank,
            )

    def _hashed_sizes(
        self, layout: HashedPrefixes, manifest: Manifest, heads: list[str]
    ) -> dict[str, int]:
        """Sizes of a hashed-prefix save's objects: one listing of each shard folder it used
        and a HEAD of each of ``heads`` (its ``.metadata.{tag}`` and item records), in
        parallel.

        Request cost: ``ceil(objects in the folder / 1000)`` LISTs per shard folder used (at
        most ``fanout``, and never more than the save's objects, so never more requests
        than a HEAD per object) plus two HEADs; the checkpoint prefix itself, which holds a
        heartbeat per rank, is not listed.
        """
        prefix = self.url.prefix
        folders = sorted({layout.folder(prefix, o.name) for o in manifest.objects})
        sizes: dict[str, int] = {}
        with ThreadPoolExecutor(max(1, min(_LIST_WORKERS, len(folders)))) as pool:
            infos = [pool.submit(in_context(self.store.head), key) for key in heads]
            for listing in pool.map(in_context(self._listing), folders):
                sizes.update((o.key, o.size) for o in listing)
            sizes.update((i.key, i.size) for f in infos if (i := f.result()) is not None)
        return sizes

    def _listing(self, folder: str) -> list[ObjectInfo]:
        return list(self.store.list(folder))

    def _previous_marker(self) -> tuple[Manifest | None, str | None] | None:
        """The marker being replaced (its manifest and ETag), or None on a fresh prefix.

        An overwrite of a checkpoint whose marker cannot be parsed (damaged, forged)
        still replaces it, by its ETag, but removes none of its objects: only names a
        readable manifest lists are ever deleted (gc reclaims the rest by their tags). Any
        save replaces a finished tombstone by its ETag (:mod:`s3ckpt._tombstone`)."""
        try:
            found: tuple[Manifest | None, str | None] | None = read_marker(self.store, self.url)
        except CorruptCheckpointError as exc:
            gone = self._refuse_tombstone(exc)
            if gone is not None:
                return (None, gone)
            if not self.overwrite:
                raise
            info = self.store.head(self.marker)
            if info is None:
                return None
            log.warning("s3ckpt: replacing %s, whose marker is unreadable: %s", self.url, exc)
            found = (None, info.etag)
        if found is not None and found[0] is not None and self.tag in found[0].reaped:
            raise self._fenced(Tombstone("", "gc", (self.tag,)))
        if found is not None and not self.overwrite:
            raise self._exists_error("another save committed it first", found[0])
        return found

    def _fenced(self, tomb: Tombstone) -> CheckpointError:
        where = {"bucket": self.store.bucket, "key": self.marker, "rank": self.rank}
        return fenced_error(self.url, tomb, self.tag, self.step, **where)

    def _refuse_tombstone(self, cause: BaseException) -> str | None:
        """Never compare-and-swap over an unfinished tombstone (:mod:`s3ckpt._tombstone`):
        a deleter owns the marker until it is done. Returns the ETag of a finished one
        this save may replace; None when the marker is no tombstone."""
        found = read_tombstone(self.store, self.marker)
        if found is None:
            return None
        if found[0].done and self.tag not in found[0].reaped and found[1]:
            return found[1]
        raise self._fenced(found[0]) from cause

    def _retract_stock_metadata(self, previous: tuple[Manifest | None, str | None] | None) -> bool:
        """Before an overwrite's marker: empty the plain ``.metadata`` copy of the save
        being replaced, so that from here until this save's own copy lands, stock DCP
        readers fail loudly instead of silently loading the replaced state (a kill in
        between is repaired by the next s3ckpt load or gc, which copy the committed
        ``.metadata.{tag}`` back). A PUT, not a delete: a trainer role may write but not
        delete. Not for a format-1 commit, whose plain ``.metadata`` is the committed one.
        """
        if previous is None or previous[0] is None or previous[0].metadata_key == METADATA_NAME:
            return False
        self.store.put(self.url.key(METADATA_NAME), b"")
        return True

    def _republish_stock_metadata(self) -> None:
        """After a failed commit that retracted the stock copy: publish the copy of whatever
        is committed now (the replaced save, or a racing winner). Best effort: readers and
        gc do the same."""
        try:
            found = read_marker(self.store, self.url)
            if found is not None:
                restore_stock_metadata(self.store, self.url, found[0])
        except S3CkptError as exc:
            log.warning("s3ckpt: could not put %s/.metadata back (%s); gc will", self.url, exc)

    def _exists_error(self, why: str, winner: Manifest | None = None) -> CheckpointExistsError:
        """A lost race: who won (the marker's writer) and what to do (:mod:`s3ckpt._commit`)."""
        return lost_race_error(self.url, winner, why, bucket=self.store.bucket, rank=self.rank)

    def _commit_marker(
        self,
        body: bytes,
        previous: tuple[Manifest | None, str | None] | None,
        own: list[str],
    ) -> None:
        """The single commit point, with unknown outcomes decided by reading back.

        A conditional PUT that fails (412, 404 for If-Match on a vanished marker, or
        retries exhausted) is followed by a read of the marker: our save id means the PUT
        was applied and its reply lost (committed). Otherwise, for an overwrite, a marker
        that vanished (pruned or removed meanwhile) or was rewritten in place by the same
        save (``attach_metrics``) is compared-and-swapped again; another save's marker means
        we lost the race, provably, and only our own objects are removed.
        """
        replaced_id = previous[0].save_id if previous is not None and previous[0] else None
        for _ in range(3):
            etag = previous[1] if previous is not None else None
            try:
                # A 412 (or a 404 on If-Match) is a race this loop decides: not a failure.
                with expecting("not_found", "precondition_failed"):
                    if previous is not None and etag:
                        self.store.put(self.marker, body, if_match=etag)
                    else:
                        self.store.put(self.marker, body, if_none_match=previous is None)
                return
            except (PreconditionFailedError, ObjectNotFoundError, TransientStoreError) as exc:
                failure: BaseException = exc
            except (KeyboardInterrupt, SystemExit):
                raise  # the PUT may be on the wire and applied: keep what the marker names
            except BaseException:
                self._discard(own)  # the request was never sent, or was refused outright
                raise
            # A 412 may be our own marker (the first attempt's reply was lost and the retry
            # found it); a transient failure may have been applied. Read back to decide.
            try:
                found = read_marker(self.store, self.url)
            except S3CkptError as exc:
                if isinstance(exc, CorruptCheckpointError):
                    try:  # a deleter fenced the prefix first: this save lost
                        if self._refuse_tombstone(exc) is not None:
                            raise self._exists_error("a deleter fenced it meanwhile") from exc
                    except CheckpointError:
                        self._discard(own)
                        raise
                raise CheckpointError(
                    f"the commit of {self.url} has an unknown outcome: the marker PUT failed "
                    f"({failure}) and reading it back gave no answer ({exc}). This save's "
                    "objects were kept; `s3ckpt ls` shows whether it committed, and "
                    "`s3ckpt gc` removes them if it did not",
                    bucket=self.store.bucket,
                    key=self.marker,
                    rank=self.rank,
                ) from failure
            if found is not None and found[0].save_id == self.save_id:
                log.info("s3ckpt: commit of %s confirmed by reading the marker back", self.url)
                return
            if found is not None and self.tag in found[0].reaped:
                self._discard(own)  # gc took this save for dead and deleted its objects
                raise self._fenced(Tombstone("", "gc", (self.tag,))) from failure
            if isinstance(failure, TransientStoreError):
                # Not there now, but the PUT may still be applied: keep our objects (gc
                # removes them once the save's heartbeats are old and no marker names them).
                raise failure
            if self.overwrite and (found is None or found[0].save_id == replaced_id):
                previous = found  # vanished, or rewritten in place: swap against what is there
                continue
            break
        self._discard(own)  # someone else's marker is there: we lost, provably
        raise self._exists_error(
            "a concurrent save committed first", found and found[0]
        ) from failure

    def _after_commit(
        self,
        manifest: Manifest,
        meta_bytes: bytes,
        heartbeats: list[str],
        previous: tuple[Manifest | None, str | None] | None,
    ) -> None:
        """Publish the stock ``.metadata`` copy and clean up; never fails the save."""
        try:
            stale = list(heartbeats)
            if previous is not None and previous[0] is not None:
                stale += self._replaced(previous[0], manifest)
            _, failures = at_once(
                lambda: self.store.put(
                    self.url.key(METADATA_NAME), meta_bytes, crc32c=manifest.metadata_crc32c
                ),
                lambda: self.store.delete(stale),
            )
            if failures:
                # A trainer role without s3:DeleteObject (the default of terraform/) is
                # expected to leave these to `s3ckpt gc`: say so quietly.
                denied = all(f.code == "AccessDenied" for f in failures)
                level = logging.INFO if denied else logging.WARNING
                left = format_leftovers([f.key for f in failures])
                log.log(level, "%s committed, but %s", self.url, left)
        except S3CkptError as exc:
            why = "Readers and `s3ckpt gc` roll it forward"
            log.warning("s3ckpt: %s committed; finishing it failed (%s). %s", self.url, exc, why)

    def _replaced(self, previous: Manifest, current: Manifest) -> list[str]:
        """Keys of the replaced save that the new one does not use (its data objects where
        its own layout put them)."""
        prefix = self.url.prefix
        keep = {current.object_key(prefix, o.name) for o in current.objects}
        keep |= {self.url.key(n) for n, _, _ in current.controls} | {self.url.key(METADATA_NAME)}
        keys = [previous.object_key(prefix, o.name) for o in previous.objects]
        keys += [self.url.key(n) for n, _, _ in previous.controls]
        if previous.tag != current.tag:
            keys += [
                self.url.key(heartbeat_name(previous.tag, r)) for r in range(previous.world_size)
            ]
        return [k for k in keys if k not in keep]

    def _describe(
        self,
        metadata: Metadata,
        results: list[list[WriteResult]],
        storage_meta: StorageMeta | None,
    ) -> tuple[bytes, dict[str, ObjectRecord], list[ItemRecord]]:
        """The pickled ``.metadata`` and the manifest's object and item records."""
        infos: dict[Any, S3StorageInfo] = {wr.index: wr.storage_data for rs in results for wr in rs}
        metadata.version = _DCP_VERSION
        metadata.storage_data = {idx: info.plain() for idx, info in infos.items()}
        metadata.storage_meta = storage_meta
        meta_bytes = pickle.dumps(metadata, protocol=pickle.HIGHEST_PROTOCOL)
        objects: dict[str, ObjectRecord] = {}
        items: list[ItemRecord] = []
        for idx, info in infos.items():
            name = info.relative_path
            objects[name] = ObjectRecord(name, info.object_size, info.rank)
            offset = tuple(idx.offset) if idx.offset is not None else None
            args = (name, info.offset, info.length, info.crc32c, info.data_offset)
            items.append(ItemRecord(idx.fqn, offset, *args))
        return meta_bytes, objects, items

    def _discard(self, keys: list[str]) -> None:
        failures = delete_own(self.store, self.url, keys)
        self.left_behind = bool(failures)
        if failures:
            log.error("%s", format_leftovers([f.key for f in failures]))


def delete_own(store: ObjectStore, url: StoreURL, keys: list[str]) -> DeleteFailures:
    """Delete a save's own ``keys``; a failure is reported, never raised (gc removes what
    is left once the save's heartbeats are old)."""
    try:
        return store.delete(keys)
    except S3CkptError as exc:
        log.error("could not remove objects of the failed save at %s: %s", url, exc)
        code = getattr(exc, "code", None) or type(exc).__name__
        return [DeleteFailure(k, code, str(exc)) for k in keys]
