"""S3StorageWriter: torch.distributed.checkpoint shards streamed straight to S3.

Call sequence (torch's ``StorageWriter`` contract, with what each step does here):

0. ``__init__`` / ``reset(checkpoint_id)`` (all ranks): take the location (one
   :class:`~s3ckpt.store.Location`, :mod:`s3ckpt.dcp._located`); unless
   ``overwrite``, read the commit marker's first byte and raise
   :class:`CheckpointExistsError` at once (fail fast, before any byte is uploaded). A
   ``reset`` to the location the writer already points at (compared parsed, so
   ``s3://b/run/step_4`` is ``s3://b/run/step_4/``) only starts a new save: no request.
1. ``set_up_storage_writer`` (all ranks): remember rank and role.
2. ``prepare_local_plan`` (all ranks): nothing to add.
3. ``prepare_global_plan`` (coordinator): check the marker, unless step 0 checked it for
   this save (so a save checks it once; a writer reused for another save checks again
   here), pick this save's tag, PUT the first heartbeat ``s3ckpt.alive.{tag}.{rank}``
   (the save is visibly alive before its first byte), hand each rank its plan data.
4. ``write_data`` (all ranks): pack the rank's items into a few objects balanced by size
   and stream each as a multipart upload (parts in parallel, bounded buffers, CRC32C per
   item and per part; whole parts of a large contiguous CPU tensor are sent from its own
   memory, see :class:`~s3ckpt._transfer.ObjectSink`, unless ``_extensions`` transform
   the items: :func:`~s3ckpt.dcp._serialize.write_item`), beating the rank's heartbeat
   every 15 s meanwhile. On any failure (Ctrl-C included): abort open uploads, delete
   completed objects; where anything of the save may be left (a delete failed, or other
   ranks uploaded), record the failure (``s3ckpt.failed.{tag}.{rank}``, best effort;
   :func:`~s3ckpt._commit.record_failure`); re-raise.
5. ``finish`` (coordinator): the commit (:class:`~s3ckpt.dcp._finish.SaveCommit`); see
   :meth:`S3StorageWriter.finish` and "The commit protocol" in docs/dcp.md.

Metrics (:mod:`s3ckpt.metrics`): a save made inside a Checkpointer's save counts for the
Checkpointer's event. Otherwise the writer publishes a ``"save"`` event of its own: on the
coordinator when ``finish`` ends (committed or failed), on other ranks when ``write_data``
ends (their part is uploaded; DCP does not tell them about the commit), and on a failure at
construction. The requests of every step count, on torch's threads too (each callback is
a step of the save, :func:`~s3ckpt.dcp._located.reported`).

Every name a save writes carries its tag (``s3ckpt.format``): data objects
``__{rank}_{i}.{tag}.distcp`` (with ``prefix_strategy=HashedPrefixes(...)``,
``__{rank}_{i}.{tag}.shard`` in the run's shard folder ``{run}/s3ckpt-shards/{h}/{ckpt}/``),
``.metadata.{tag}``, heartbeats. An overwrite (or a second job racing on the same prefix)
never writes under the keys a committed save uses, a failed save deletes only its own
names, and gc can prove what is s3ckpt's. A failed overwrite therefore leaves the previous
checkpoint loadable.

Known limit: when one rank fails, DCP does not tell the other ranks, so objects they
already completed stay behind, uncommitted (no marker refers to them). The failing rank's
failure record makes ``s3ckpt gc`` remove them a minute later (``ls`` lists the prefix as failed);
without the record (it could not be written, the process was killed) gc removes them once
the save's heartbeats are older than its grace period.

Ctrl-C: a ``KeyboardInterrupt`` in ``write_data`` gets the cleanup above; one during the
commit's marker PUT keeps this save's objects (the PUT may have been applied: the marker
decides, and gc removes them if it is not there). DCP wraps the interrupt in its
``CheckpointException``: :func:`~s3ckpt.errors.find_interrupt` digs it out (the
Checkpointer re-raises it as ``KeyboardInterrupt``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, SupportsFloat

from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

from s3ckpt._commit import Heartbeat, heartbeat_body, lost_race_error, read_marker, record_failure
from s3ckpt._tombstone import step_taken
from s3ckpt._transfer import ItemCrc, Uploader, format_leftovers, pack
from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.dcp._finish import S3StorageInfo, SaveCommit, delete_own
from s3ckpt.dcp._located import Located, reported
from s3ckpt.dcp._serialize import Framings, check_extensions, estimate_size, write_item
from s3ckpt.errors import (
    ConfigError,
    S3CkptError,
)
from s3ckpt.format import HashedPrefixes
from s3ckpt.format._manifest import Manifest, check_metrics
from s3ckpt.format._names import (
    MANIFEST_NAME,
    check_checkpoint_prefix,
    check_prefix_strategy,
    data_name,
    heartbeat_name,
    object_key,
    save_tag,
    shard_name,
)
from s3ckpt.metrics.instrument import Participant
from s3ckpt.store import Location, ObjectStore
from s3ckpt.store._capabilities import require_conditional_writes
from s3ckpt.store._location import LocationLike

if TYPE_CHECKING:
    from s3ckpt.dcp._torch import StreamTransformExtension

__all__ = ["S3StorageWriter"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _RankPlan:
    """What the coordinator tells each rank in ``SavePlan.storage_data``."""

    rank: int
    tag: str
    layout: HashedPrefixes | None = None
    # Where data objects go: the coordinator's choice, so every rank follows one layout.
    world: int = 1
    # Ranks in the save (a failing rank records the failure when others may leave data).


class S3StorageWriter(Located, StorageWriter):
    """Write a DCP checkpoint to ``s3://bucket/prefix`` (or any fsspec URL).

    Example::

        import torch.distributed.checkpoint as dcp
        from s3ckpt import S3StorageWriter

        dcp.save(state_dict, storage_writer=S3StorageWriter("s3://bucket/run/step_100"))

    Args:
        path: The checkpoint prefix: a URL string, a parsed :class:`~s3ckpt.uri.StoreURL`,
            a local path (``os.PathLike``) or a :class:`~s3ckpt.store.Location` (which
            brings its store and settings: then pass none of ``s3_config``,
            ``transfer_config``, ``store``).
        s3_config: Endpoint, region, encryption, storage class, checksums.
        transfer_config: Part size, concurrency, memory bound, retries.
        overwrite: Replace a committed checkpoint at ``path`` (safely: the old one stays
            loadable until the new one commits). Otherwise saving into a committed prefix
            raises :class:`~s3ckpt.errors.CheckpointExistsError`.
        step: Training step recorded in ``s3ckpt.json``.
        metrics: Numbers recorded in ``s3ckpt.json`` (for retention's "best by").
        user_metadata: JSON-serialisable data recorded in ``s3ckpt.json``.
        store: Use this store instead of the process's shared one for ``path`` (tests,
            custom clients).
        prefix_strategy: Where the data objects go: ``None`` (default) directly under
            ``path``, as torch's FileSystemWriter lays them out; or
            :class:`~s3ckpt.HashedPrefixes` to spread them over hashed prefixes of the run
            (``{run}/s3ckpt-shards/{h}/{ckpt}/``) for saves of many ranks that S3 would
            otherwise throttle. Such a checkpoint is read through its ``s3ckpt.json`` (by
            s3ckpt only, not by stock DCP readers); see docs/dcp.md, "Hashed prefixes".
        _extensions: Stream transforms every item is written through, as torch's
            ``FileSystemWriter`` takes them (EXPERIMENTAL there too): e.g.
            ``[ZStandard()]`` from ``torch.distributed.checkpoint._extension``. Each
            item's ``.metadata`` record names them, so any reader undoes them (stock
            readers included); such items are stored compressed, uploaded through the part
            buffers and decoded whole on load (see docs/dcp.md, "Stream transforms").

    The settings in force are the location's (``writer.location``: its store's, or those
    given with a store of your own); ``url``, ``store``, ``s3_config`` and
    ``transfer_config`` read them.

    Requests: one client per process (stores of equal settings share it, see
    :mod:`s3ckpt.store.s3`), and one fail-fast read of the marker per save: at
    construction (or a ``reset`` to another location), else when the save is planned. A
    ``reset`` to the same location (``dcp.save(..., checkpoint_id=...)`` naming the
    writer's own path, with or without the trailing slash) reads nothing. The commit
    reads the marker once more and writes it conditionally (:meth:`finish`): that read,
    not the fail-fast one, is what keeps a save from replacing a commit.

    Raises:
        CheckpointExistsError: at construction, if ``path`` is committed and not
            ``overwrite``.
        ConfigError: ``prefix_strategy`` is not ``None`` or a :class:`HashedPrefixes`, or
            an ``_extensions`` entry is not a stream transform, or
            ``path`` lies in a folder named ``s3ckpt-shards`` (reserved), or is the bucket's
            root with hashed prefixes.
    """

    def __init__(
        self,
        path: LocationLike,
        *,
        s3_config: S3Config | None = None,
        transfer_config: TransferConfig | None = None,
        overwrite: bool = False,
        step: int | None = None,
        metrics: Mapping[str, SupportsFloat] | None = None,
        user_metadata: dict[str, Any] | None = None,
        store: ObjectStore | None = None,
        prefix_strategy: HashedPrefixes | None = None,
        _extensions: Sequence[StreamTransformExtension] | None = None,
    ) -> None:
        super().__init__()
        self.prefix_strategy = check_prefix_strategy(prefix_strategy)
        self.extensions = check_extensions(_extensions)
        self.overwrite, self.step, self.metrics = overwrite, step, check_metrics(metrics)
        self.user_metadata = dict(user_metadata or {})
        self.rank, self.is_coordinator = 0, True
        self.last_manifest: Manifest | None = None
        self.bytes_written = 0
        # Bytes of data objects this rank uploaded in the last save.
        self._report = Participant("save")
        self._open(
            Location.of(path, s3_config=s3_config, transfer_config=transfer_config, store=store)
        )

    # -- location (reset, validate_checkpoint_id: dcp/_located.py) ----------------------------
    def _point(self, location: Location) -> None:
        """A new location: check its prefix and, unless ``overwrite``, its marker."""
        check_checkpoint_prefix(location.url.prefix, self.prefix_strategy)
        self.location = location
        self._restart()
        # The marker was read for the next save already (at construction or a reset to a
        # new location), so planning it need not read it again.
        self._marker_checked = False
        if not self.overwrite:
            self._refuse_if_committed()
            self._marker_checked = True

    def _refuse_if_committed(self) -> None:
        if not step_taken(self.store, self.url.key(MANIFEST_NAME)):  # a finished tombstone: free
            return
        winner = None
        # Who committed it: the error says (only this job's own marker means overwrite).
        with contextlib.suppress(S3CkptError):
            winner = (read_marker(self.store, self.url) or (None, None))[0]
        raise lost_race_error(
            self.url, winner, "found before the save started", bucket=self.store.bucket, rank=None
        )

    def _restart(self) -> None:
        """A new save at the same location (``reset`` to it): nothing is read."""
        self.save_id = uuid.uuid4().hex
        self.bytes_written = 0

    def _moved(self) -> int:
        return self.bytes_written

    def storage_meta(self) -> StorageMeta | None:
        """Recorded in ``.metadata`` (the URL, never credentials)."""
        return StorageMeta(checkpoint_id=self.checkpoint_id, save_id=self.save_id)

    # -- planning ---------------------------------------------------------------------------
    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Remember role and rank."""
        self.is_coordinator, self.rank = is_coordinator, int(kwargs.get("rank", 0) or 0)
        if kwargs.get("use_collectives", True) is False:
            raise ConfigError(
                "S3StorageWriter needs use_collectives=True (one .metadata per checkpoint)",
                rank=self.rank,
            )

    @reported()
    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """Check the prefix is free (or overwrite is on; not again when construction or
        a reset just did), beat once (the save is alive before its first byte), and give
        every rank its tag."""
        if not self.overwrite and not self._marker_checked:
            self._refuse_if_committed()
        self._marker_checked = False  # used by this save: the next one checks again
        tag = save_tag(self.save_id)
        # Refuse, before any data is written, on a store that ignores If-None-Match /
        # If-Match (probed once per endpoint and bucket with the coordinator's heartbeat;
        # see s3ckpt.store._capabilities); single-writer mode warns instead.
        require_conditional_writes(
            self.store,
            self.url.key(heartbeat_name(tag, self.rank)),
            what=f"a save to {self.url}",
            body=heartbeat_body(tag, self.rank, self.step),
            single_writer=self.s3_config.single_writer or None,
        )
        Heartbeat(self.store, self.url, tag, self.rank, self.step).beat()
        return [
            dataclasses.replace(
                plan,
                storage_data=_RankPlan(
                    rank=i, tag=tag, layout=self.prefix_strategy, world=len(plans)
                ),
            )
            for i, plan in enumerate(plans)
        ]

    # -- data -------------------------------------------------------------------------------
    # A rank's part ends with its upload: finish runs on the coordinator.
    @reported(ends=lambda writer: not writer.is_coordinator)
    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Stream this rank's items as a few multipart objects; see the module docs."""
        rank_plan: _RankPlan = plan.storage_data
        rank, tag, layout = rank_plan.rank, rank_plan.tag, rank_plan.layout
        tc = self.location.transfer_config  # the store's, as given to Location.of
        sizes = [estimate_size(item) for item in plan.items]
        n_objects = max(1, min(len(plan.items), math.ceil(sum(sizes) / tc.target_object_size)))
        bins = pack(sizes, n_objects) if plan.items else []
        bin_sizes = [sum(sizes[i] for i in b) for b in bins]
        part_size = tc.part_size_for(max(bin_sizes, default=0))
        uploader = Uploader(
            self.store,
            part_size=part_size,
            n_buffers=tc.upload_buffers(part_size),
            max_concurrency=tc.read_concurrency,  # a save's connections are a load's
            rank=rank,
            expected_bytes=sum(sizes),
        )
        results: list[WriteResult] = []
        crcs: list[tuple[S3StorageInfo, ItemCrc]] = []  # some finished by the upload threads
        heartbeat = Heartbeat(self.store, self.url, tag, rank, self.step).start()
        framings = Framings()
        try:
            for i, (indices, bin_size) in enumerate(zip(bins, bin_sizes, strict=True)):
                name = (data_name if layout is None else shard_name)(rank, i, tag)
                sink = uploader.sink(object_key(self.url.prefix, name, layout), bin_size)
                first = len(crcs)
                for idx in indices:
                    item = plan.items[idx]
                    info, crc = write_item(
                        sink, planner, item, name, rank, self.extensions, framings
                    )
                    crcs.append((info, crc))
                    results.append(WriteResult(item.index, info.length, info))
                for info, _ in crcs[first:]:
                    info.object_size = sink.tell()
                sink.close()
            uploader.finish()
            for info, crc in crcs:
                info.crc32c = crc.value()
        except BaseException as exc:
            heartbeat.stop()
            leftovers = uploader.abort()
            # The save is dead on this rank: its heartbeat must not keep it looking alive.
            leftovers += [f.key for f in delete_own(self.store, self.url, [heartbeat.key])]
            if leftovers:
                log.error("rank %d: %s", rank, format_leftovers(leftovers))
            if isinstance(exc, S3CkptError) and exc.rank is None:
                exc.rank = rank
            # This save can never commit now (DCP fails it on every rank): where anything
            # of it may be left (here, or by the other ranks), say so, so that it is not
            # "in progress" until the grace period ends.
            if leftovers or rank_plan.world > 1:
                record_failure(self.store, self.url, tag, rank, self.step, exc)
            raise
        finally:
            heartbeat.stop()
            self.bytes_written = uploader.bytes_uploaded
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    # -- commit -------------------------------------------------------------------------------
    @reported(ends=lambda _: True)
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
        commit = SaveCommit(self)
        try:
            commit.run(metadata, results, self.storage_meta())
        except BaseException as exc:
            # Not committed by us (a marker that landed anyway wins over the record), and
            # its objects kept (an unknown outcome) or not all deleted.
            if commit.manifest is None and commit.left_behind:
                tag = save_tag(self.save_id)
                record_failure(self.store, self.url, tag, self.rank, self.step, exc)
            raise
        finally:
            if commit.manifest is not None:
                self.last_manifest = commit.manifest
