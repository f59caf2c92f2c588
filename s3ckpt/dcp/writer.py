"""S3StorageWriter: torch.distributed.checkpoint shards streamed straight to S3.

Call sequence (torch's ``StorageWriter`` contract, with what each step does here):

0. ``__init__`` / ``reset(checkpoint_id)`` (all ranks): parse the URL; unless
   ``overwrite``, HEAD the commit marker and raise :class:`CheckpointExistsError` at once.
1. ``set_up_storage_writer`` (all ranks): remember rank and role.
2. ``prepare_local_plan`` (all ranks): nothing to add.
3. ``prepare_global_plan`` (coordinator): check the marker again, pick this save's tag,
   PUT the first heartbeat ``s3ckpt.alive.{tag}.{rank}`` (the save is visibly alive before
   its first byte), hand each rank its plan data.
4. ``write_data`` (all ranks): pack the rank's items into a few objects balanced by size
   and stream each as a multipart upload (parts in parallel, bounded buffers, CRC32C per
   item and per part; whole parts of a large contiguous CPU tensor are sent from its own
   memory, see :class:`~s3ckpt.transfer.ObjectSink`), beating the rank's heartbeat
   every 15 s meanwhile. On any failure: abort open uploads, delete completed objects.
5. ``finish`` (coordinator): the commit; see :meth:`S3StorageWriter.finish` and "The
   commit protocol" in docs/dcp.md.

Every name a save writes carries its tag (``s3ckpt.format``): data objects
``__{rank}_{i}.{tag}.distcp``, ``.metadata.{tag}``, heartbeats. An overwrite (or a second
job racing on the same prefix) never writes under the keys a committed save uses, a failed
save deletes only its own names, and gc can prove what is s3ckpt's. A failed overwrite
therefore leaves the previous checkpoint loadable.

Known limit: when one rank fails, DCP does not tell the other ranks, so objects they
already completed stay behind, uncommitted (no marker refers to them). ``s3ckpt gc``
removes them once the save's heartbeats are older than its grace period.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import math
import os
import pickle
import time
import uuid
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

from s3ckpt import _crc
from s3ckpt._commit import Heartbeat, read_marker, restore_stock_metadata
from s3ckpt._gc import gc_paused
from s3ckpt._version import __version__
from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.dcp._serialize import save_item
from s3ckpt.errors import (
    CheckpointError,
    CheckpointExistsError,
    ConfigError,
    CorruptCheckpointError,
    ObjectNotFoundError,
    PreconditionFailedError,
    S3CkptError,
    TransientStoreError,
)
from s3ckpt.format import (
    MANIFEST_NAME,
    METADATA_NAME,
    ItemRecord,
    Manifest,
    ObjectRecord,
    check_metrics,
    data_name,
    heartbeat_name,
    metadata_name,
    save_tag,
)
from s3ckpt.store import ObjectStore, open_store
from s3ckpt.store.base import DeleteFailure, DeleteFailures
from s3ckpt.transfer import Uploader, format_leftovers, pack
from s3ckpt.uri import StoreURL

__all__ = ["S3StorageWriter"]

log = logging.getLogger(__name__)

# torch.save framing around a tensor's bytes is ~1.5 KiB; used only to size objects.
_ITEM_OVERHEAD = 2048
_DCP_VERSION = "1.0.0"


@dataclass(frozen=True)
class _RankPlan:
    """What the coordinator tells each rank in ``SavePlan.storage_data``."""

    rank: int
    tag: str


@dataclass
class _S3StorageInfo(_StorageInfo):
    """torch's per-item storage info plus what s3ckpt records in ``s3ckpt.json``.

    Only the plain ``_StorageInfo`` part goes into ``.metadata`` (so stock readers can
    read it); the rest travels to the coordinator inside the write results.
    """

    crc32c: int = 0
    data_offset: int | None = None
    object_size: int = 0
    rank: int = 0

    def plain(self) -> _StorageInfo:
        return _StorageInfo(
            self.relative_path, self.offset, self.length, self.transform_descriptors
        )


def _exists(store: ObjectStore, key: str) -> bool:
    """Whether ``key`` exists, by a 1-byte ranged GET.

    Unlike HEAD (whose 404 has no body), a GET tells a missing key from a missing bucket,
    so a wrong bucket name fails here with NoSuchBucketError, and it needs only
    s3:GetObject.
    """
    try:
        reader = store.open_range(key, 0, 1)
        try:
            reader.readinto(memoryview(bytearray(1)))
        finally:
            reader.close()
    except ObjectNotFoundError:
        return False
    return True


def _tensor_for_save(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU tensor whose storage holds exactly its bytes (torch.save writes whole storages)."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    if not t.is_contiguous():
        t = t.contiguous()
    if t.untyped_storage().nbytes() != t.numel() * t.element_size():
        t = t.clone()
    return t


class S3StorageWriter(StorageWriter):
    """Write a DCP checkpoint to ``s3://bucket/prefix`` (or any fsspec URL).

    Example::

        import torch.distributed.checkpoint as dcp
        from s3ckpt import S3StorageWriter

        dcp.save(state_dict, storage_writer=S3StorageWriter("s3://bucket/run/step_100"))

    Args:
        path: Checkpoint prefix URL.
        s3_config: Endpoint, region, encryption, storage class, checksums.
        transfer_config: Part size, concurrency, memory bound, retries.
        overwrite: Replace a committed checkpoint at ``path`` (safely: the old one stays
            loadable until the new one commits). Otherwise saving into a committed prefix
            raises :class:`~s3ckpt.errors.CheckpointExistsError`.
        step: Training step recorded in ``s3ckpt.json``.
        metrics: Numbers recorded in ``s3ckpt.json`` (for retention's "best by").
        user_metadata: JSON-serialisable data recorded in ``s3ckpt.json``.
        store: Use this store instead of one built from ``path`` (tests, custom clients).

    Raises:
        CheckpointExistsError: at construction, if ``path`` is committed and not
            ``overwrite``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        s3_config: S3Config | None = None,
        transfer_config: TransferConfig | None = None,
        overwrite: bool = False,
        step: int | None = None,
        metrics: dict[str, float] | None = None,
        user_metadata: dict[str, Any] | None = None,
        store: ObjectStore | None = None,
    ) -> None:
        super().__init__()
        self.s3_config = s3_config or S3Config()
        self.transfer_config = transfer_config or TransferConfig()
        self.overwrite = overwrite
        self.step = step
        self.metrics = check_metrics(metrics)
        self.user_metadata = dict(user_metadata or {})
        self._given_store = store
        self.rank = 0
        self.is_coordinator = True
        self.last_manifest: Manifest | None = None
        self._point(str(path))

    # -- location ---------------------------------------------------------------------------
    def _point(self, path: str) -> None:
        store, url = open_store(
            path, s3_config=self.s3_config, transfer_config=self.transfer_config
        )
        self.url: StoreURL = url
        self.store: ObjectStore = self._given_store or store
        self.checkpoint_id = str(url)
        self.save_id = uuid.uuid4().hex
        if not self.overwrite:
            self._refuse_if_committed()

    def _refuse_if_committed(self) -> None:
        if _exists(self.store, self.url.key(MANIFEST_NAME)):
            raise CheckpointExistsError(
                f"a committed checkpoint already exists at {self.url}; pass overwrite=True "
                "to replace it, or save to a new prefix",
                bucket=self.store.bucket,
                key=self.url.key(MANIFEST_NAME),
            )

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """Start a new save, optionally at a new location."""
        if checkpoint_id is not None:
            self._point(str(checkpoint_id))
        else:
            self.save_id = uuid.uuid4().hex

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        """True for ``s3://`` URLs."""
        return str(checkpoint_id).startswith(("s3://", "s3a://"))

    def storage_meta(self) -> StorageMeta | None:
        """Recorded in ``.metadata`` (the URL, never credentials)."""
        return StorageMeta(checkpoint_id=self.checkpoint_id, save_id=self.save_id)

    # -- planning ---------------------------------------------------------------------------
    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Remember role and rank."""
        self.is_coordinator = is_coordinator
        self.rank = int(kwargs.get("rank", 0) or 0)
        if kwargs.get("use_collectives", True) is False:
            raise ConfigError(
                "S3StorageWriter needs use_collectives=True (one .metadata per checkpoint)",
                rank=self.rank,
            )

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """No storage-specific local planning."""
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """Check the prefix is free (or overwrite is on), beat once (the save is alive
        before its first byte), and give every rank its tag."""
        if not self.overwrite:
            self._refuse_if_committed()
        tag = save_tag(self.save_id)
        self._beat()
        return [
            dataclasses.replace(plan, storage_data=_RankPlan(rank=i, tag=tag))
            for i, plan in enumerate(plans)
        ]

    # -- data -------------------------------------------------------------------------------
    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Stream this rank's items as a few multipart objects; see the module docs."""
        rank_plan: _RankPlan = plan.storage_data
        tc = self.transfer_config
        sizes = [self._estimate(item) for item in plan.items]
        total = sum(sizes)
        n_objects = max(1, min(len(plan.items), math.ceil(total / tc.target_object_size)))
        bins = pack(sizes, n_objects) if plan.items else []
        part_size = tc.part_size_for(max((sum(sizes[i] for i in b) for b in bins), default=0))
        uploader = Uploader(
            self.store,
            part_size=part_size,
            n_buffers=max(1, tc.max_inflight_bytes // part_size) + 1,
            max_concurrency=tc.max_concurrency,
            rank=rank_plan.rank,
        )
        results: list[WriteResult] = []
        heartbeat = Heartbeat(self.store, self.url, rank_plan.tag, rank_plan.rank, self.step)
        heartbeat.start()
        try:
            for i, indices in enumerate(bins):
                name = data_name(rank_plan.rank, i, rank_plan.tag)
                sink = uploader.sink(self.url.key(name))
                infos: list[_S3StorageInfo] = []
                for idx in indices:
                    item = plan.items[idx]
                    info = self._write_item(sink, planner, item, name, rank_plan.rank)
                    infos.append(info)
                    results.append(WriteResult(item.index, info.length, info))
                size = sink.tell()
                for info in infos:
                    info.object_size = size
                sink.close()
            uploader.finish()
        except BaseException as exc:
            heartbeat.stop()
            leftovers = uploader.abort()
            # The save is dead on this rank: its heartbeat must not keep it looking alive.
            leftovers += [f.key for f in self._delete_quietly([heartbeat.key])]
            if leftovers:
                log.error("rank %d: %s", rank_plan.rank, format_leftovers(leftovers))
            if isinstance(exc, S3CkptError) and exc.rank is None:
                exc.rank = rank_plan.rank
            raise
        finally:
            heartbeat.stop()
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    @staticmethod
    def _estimate(item: Any) -> int:
        if item.type == WriteItemType.BYTE_IO or item.tensor_data is None:
            return _ITEM_OVERHEAD
        props = item.tensor_data.properties
        numel = math.prod(item.tensor_data.size)
        return numel * torch.empty((), dtype=props.dtype).element_size() + _ITEM_OVERHEAD

    @staticmethod
    def _write_item(
        sink: Any, planner: SavePlanner, item: Any, name: str, rank: int
    ) -> _S3StorageInfo:
        data = planner.resolve_data(item)
        if item.type == WriteItemType.BYTE_IO:
            start = sink.begin_item()
            sink.write(data.getbuffer() if isinstance(data, io.BytesIO) else data)
            crc, data_offset = sink.end_item()
        else:
            tensor = _tensor_for_save(data)
            nbytes = tensor.numel() * tensor.element_size()
            # A tensor that is the caller's own memory (no device copy, no contiguous
            # copy) may be uploaded from that memory: the caller is blocked in dcp.save (or
            # this is an async save's staged copy) until write_data returns, which waits
            # for every part. A copy made here is copied into part buffers as before, so
            # memory stays bounded by the pool.
            own = tensor.data_ptr() == data.data_ptr() and data.device.type == "cpu"
            start = sink.begin_item(
                tensor.data_ptr() if nbytes else None, nbytes, hold=tensor if own else None
            )
            save_item(tensor, sink)
            crc, data_offset = sink.end_item()
            del tensor
        length = sink.tell() - start
        return _S3StorageInfo(
            relative_path=name,
            offset=start,
            length=length,
            crc32c=crc,
            data_offset=None if data_offset is None else data_offset - start,
            rank=rank,
        )

    # -- commit -------------------------------------------------------------------------------
    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Commit (coordinator); see "The commit protocol" in docs/dcp.md.

        1. beat, then PUT ``.metadata.{tag}`` (this save's own key: no conflict possible);
        2. list the prefix: every object the manifest will name exists with its size;
        3. read the marker back: refuse (not ``overwrite``) or remember its ETag; an
           overwrite empties the replaced save's plain ``.metadata`` copy, so stock readers
           never silently load the replaced state once this save may have committed;
        4. PUT ``s3ckpt.json`` conditionally (If-None-Match, or If-Match on the replaced
           marker's ETag). An unknown outcome (a 412 after a retry, or retries exhausted)
           is decided by reading the marker back: ours means committed;
        5. after the commit: the plain ``.metadata`` copy, heartbeats removed, replaced
           objects removed. A failure here never fails the save: gc and readers roll it
           forward.

        Before step 4 every failure removes this save's own objects (only names carrying
        its tag); after an unknown outcome nothing is removed (the marker may yet name them).
        """
        # Pickling .metadata and building the manifest allocate a few objects per item and
        # make no cycles: with the collector running they set off full collections over
        # every object in the process (see s3ckpt._gc).
        with gc_paused():
            meta_bytes, objects, items = self._describe(metadata, results)
        tag = save_tag(self.save_id)
        world = len(results)
        meta_name = metadata_name(tag)
        heartbeats = [self.url.key(heartbeat_name(tag, r)) for r in range(world)]
        own = [self.url.key(name) for name in objects] + [self.url.key(meta_name), *heartbeats]
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
            user=self.user_metadata,
            versions={"s3ckpt": __version__, "torch": torch.__version__},
        )
        try:
            self._beat()
            self.store.put(self.url.key(meta_name), meta_bytes, crc32c=manifest.metadata_crc32c)
            self._check_objects(manifest)
            previous = self._previous_marker()
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
        self.last_manifest = manifest
        self._after_commit(manifest, meta_bytes, heartbeats, previous)

    def _beat(self) -> None:
        Heartbeat(self.store, self.url, save_tag(self.save_id), self.rank, self.step).beat()

    def _check_objects(self, manifest: Manifest) -> None:
        """Every object the manifest names exists with its recorded size (one listing).

        A save whose objects vanished (a gc or lifecycle rule with too short a grace, a
        person) must not commit a marker that points at nothing.
        """
        sizes = {o.key: o.size for o in self.store.list(self.url.prefix)}
        wanted = [(o.name, o.size) for o in manifest.objects]
        wanted.append((manifest.metadata_key, manifest.metadata_size))
        bad = []
        for name, size in wanted:
            found = sizes.get(self.url.key(name))
            if found != size:
                seen = "missing" if found is None else f"{found} bytes"
                bad.append(f"{name} ({seen}, expected {size} bytes)")
        if bad:
            raise CheckpointError(
                f"not committing {self.url}: {len(bad)} object(s) of this save are missing or "
                f"changed before the commit: {', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''}. "
                "Something deleted them while the save ran (a gc/prune or lifecycle rule, or "
                "a person); nothing was committed, the previous checkpoint is intact",
                bucket=self.store.bucket,
                key=self.url.key(bad[0].split(" ")[0]),
                rank=self.rank,
            )

    def _previous_marker(self) -> tuple[Manifest | None, str | None] | None:
        """The marker being replaced (its manifest and ETag), or None on a fresh prefix.

        An overwrite of a checkpoint whose marker cannot be parsed (damaged, forged)
        still replaces it, by its ETag, but removes none of its objects: only names a
        readable manifest lists are ever deleted (gc reclaims the rest by their tags).
        """
        try:
            found: tuple[Manifest | None, str | None] | None = read_marker(self.store, self.url)
        except CorruptCheckpointError as exc:
            if not self.overwrite:
                raise
            info = self.store.head(self.url.key(MANIFEST_NAME))
            if info is None:
                return None
            log.warning("s3ckpt: replacing %s, whose marker is unreadable: %s", self.url, exc)
            found = (None, info.etag)
        if found is not None and not self.overwrite:
            raise self._exists_error("another save committed it first")
        return found

    def _retract_stock_metadata(self, previous: tuple[Manifest | None, str | None] | None) -> bool:
        """Before an overwrite's marker: empty the plain ``.metadata`` copy of the save
        being replaced, so that from here until this save's own copy lands, stock DCP
        readers fail loudly instead of silently loading the replaced state (a kill in
        between is repaired by the next s3ckpt load or gc, which copy the committed
        ``.metadata.{tag}`` back). A PUT, not a delete: a trainer role may write but not
        delete. Not for a format-1 commit, whose plain ``.metadata`` is the committed one.
        """
        if previous is None or previous[0] is None:
            return False
        if previous[0].metadata_key == METADATA_NAME:
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

    def _exists_error(self, why: str) -> CheckpointExistsError:
        return CheckpointExistsError(
            f"a committed checkpoint already exists at {self.url} ({why}); this save was "
            "discarded. Pass overwrite=True to replace it, or save to a new prefix",
            bucket=self.store.bucket,
            key=self.url.key(MANIFEST_NAME),
            rank=self.rank,
        )

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
        marker = self.url.key(MANIFEST_NAME)
        replaced_id = previous[0].save_id if previous is not None and previous[0] else None
        for _ in range(3):
            etag = previous[1] if previous is not None else None
            try:
                if previous is not None and etag:
                    self.store.put(marker, body, if_match=etag)
                else:
                    self.store.put(marker, body, if_none_match=previous is None)
                return
            except (PreconditionFailedError, ObjectNotFoundError, TransientStoreError) as exc:
                failure: BaseException = exc
            except BaseException:
                self._discard(own)  # the request was never sent, or was refused outright
                raise
            # A 412 may be our own marker (the first attempt's reply was lost and the retry
            # found it); a transient failure may have been applied. Read back to decide.
            try:
                found = read_marker(self.store, self.url)
            except S3CkptError as exc:
                raise CheckpointError(
                    f"the commit of {self.url} has an unknown outcome: the marker PUT failed "
                    f"({failure}) and reading it back failed too ({exc}). This save's "
                    "objects were kept; `s3ckpt ls` shows whether it committed, and "
                    "`s3ckpt gc` removes them if it did not",
                    bucket=self.store.bucket,
                    key=marker,
                    rank=self.rank,
                ) from failure
            if found is not None and found[0].save_id == self.save_id:
                log.info("s3ckpt: commit of %s confirmed by reading the marker back", self.url)
                return
            if isinstance(failure, TransientStoreError):
                # Not there now, but the PUT may still be applied: keep our objects (gc
                # removes them once the save's heartbeats are old and no marker names them).
                raise failure
            if self.overwrite and (found is None or found[0].save_id == replaced_id):
                previous = found  # vanished, or rewritten in place: swap against what is there
                continue
            break
        self._discard(own)  # someone else's marker is there: we lost, provably
        raise self._exists_error("a concurrent save committed first") from failure

    def _after_commit(
        self,
        manifest: Manifest,
        meta_bytes: bytes,
        heartbeats: list[str],
        previous: tuple[Manifest | None, str | None] | None,
    ) -> None:
        """Publish the stock ``.metadata`` copy and clean up; never fails the save."""
        try:
            self.store.put(self.url.key(METADATA_NAME), meta_bytes, crc32c=manifest.metadata_crc32c)
            stale = list(heartbeats)
            if previous is not None and previous[0] is not None:
                stale += self._replaced(previous[0], manifest)
            failures = self.store.delete(stale)
            if failures:
                # A trainer role without s3:DeleteObject (the default of terraform/) is
                # expected to leave these to `s3ckpt gc`: say so quietly.
                denied = all(f.code == "AccessDenied" for f in failures)
                log.log(
                    logging.INFO if denied else logging.WARNING,
                    "%s committed, but %s",
                    self.url,
                    format_leftovers([f.key for f in failures]),
                )
        except S3CkptError as exc:
            log.warning(
                "s3ckpt: %s committed; finishing it failed (%s). Readers and `s3ckpt gc` "
                "roll it forward",
                self.url,
                exc,
            )

    def _replaced(self, previous: Manifest, current: Manifest) -> list[str]:
        """Keys of the replaced save that the new one does not use."""
        keep = {o.name for o in current.objects} | {current.metadata_key, METADATA_NAME}
        names = [o.name for o in previous.objects]
        names.append(previous.metadata_key)
        if previous.tag != current.tag:
            names += [heartbeat_name(previous.tag, r) for r in range(previous.world_size)]
        return [self.url.key(n) for n in names if n not in keep]

    def _describe(
        self, metadata: Metadata, results: list[list[WriteResult]]
    ) -> tuple[bytes, dict[str, ObjectRecord], list[ItemRecord]]:
        """The pickled ``.metadata`` and the manifest's object and item records."""
        infos: dict[Any, _S3StorageInfo] = {}
        for rank_results in results:
            for wr in rank_results:
                infos[wr.index] = wr.storage_data
        metadata.version = _DCP_VERSION
        metadata.storage_data = {idx: info.plain() for idx, info in infos.items()}
        metadata.storage_meta = self.storage_meta()
        meta_bytes = pickle.dumps(metadata, protocol=pickle.HIGHEST_PROTOCOL)
        objects: dict[str, ObjectRecord] = {}
        items: list[ItemRecord] = []
        for idx, info in infos.items():
            objects[info.relative_path] = ObjectRecord(
                info.relative_path, info.object_size, info.rank
            )
            items.append(
                ItemRecord(
                    fqn=idx.fqn,
                    offset=tuple(idx.offset) if idx.offset is not None else None,
                    object=info.relative_path,
                    start=info.offset,
                    length=info.length,
                    crc32c=info.crc32c,
                    data_offset=info.data_offset,
                )
            )
        return meta_bytes, objects, items

    def _discard(self, keys: list[str]) -> None:
        failures = self._delete_quietly(keys)
        if failures:
            log.error("%s", format_leftovers([f.key for f in failures]))

    def _delete_quietly(self, keys: list[str]) -> DeleteFailures:
        """Delete this save's own ``keys``; a failure is reported, never raised (gc
        removes what is left once the save's heartbeats are old)."""
        try:
            return self.store.delete(keys)
        except S3CkptError as exc:
            log.error("could not remove objects of the failed save at %s: %s", self.url, exc)
            code = getattr(exc, "code", None) or type(exc).__name__
            return [DeleteFailure(k, code, str(exc)) for k in keys]
