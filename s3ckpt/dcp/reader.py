"""S3StorageReader: a DCP checkpoint read back with parallel, coalesced ranged GETs.

Call sequence (torch's ``StorageReader`` contract):

0. ``__init__`` / ``reset(checkpoint_id)``: take the location (one
   :class:`~s3ckpt.store.Location`, :mod:`s3ckpt.dcp._located`), read ``s3ckpt.json`` (if any)
   and the ``.metadata`` it commits (:func:`~s3ckpt.dcp._locate.locate`), eagerly, so a
   missing, corrupt or unsafe checkpoint raises a typed s3ckpt error before DCP wraps it.
   A ``reset`` to the location already read (compared parsed: ``s3://b/run/step_4`` is
   ``s3://b/run/step_4/``) reads nothing again; one to another location in the same bucket
   keeps the store.
1. ``read_metadata`` (all ranks): the metadata, unpickled by an allow-list.
2. ``set_up_storage_reader``: index saved chunks (dtype, shape) for direct streaming.
3. ``prepare_local_plan``: nothing to add. ``prepare_global_plan`` (coordinator), with
   ``fan_out``: the items two or more ranks read, cut into pieces each read by one rank
   for the group (:mod:`s3ckpt.dcp._fanout_plan`), in every rank's plan.
4. ``read_data``: group read items by object, sort by offset, coalesce near ranges into
   requests of at most the load's piece size (:func:`~s3ckpt._transfer.read_piece_size`:
   the bytes to load over twice the connections, 8 MiB .. ``read_request_size``), cut
   items larger than that into pieces read in parallel and landing in place
   (:mod:`s3ckpt.dcp._split`: one connection carries ~85 MB/s on S3, so one GET per large
   tensor would leave most connections idle), fetch requests in parallel
   (:class:`~s3ckpt._transfer.RangeWalk`, the walk ``s3ckpt verify`` uses too),
   and hand each item's bytes to the span decoder (:class:`~s3ckpt.dcp._decode.SpanDecoder`):
   it streams tensor bytes straight into destination tensors when dtype and layout allow,
   and checks every item's CRC32C. Non-tensor items are checked by
   :func:`~s3ckpt.dcp._safe.check_item` before the planner unpickles them.
   With a fan-out table, the shared items come from the group's broadcasts instead and
   go through the same decoder (:class:`~s3ckpt.dcp._fanout.FanOutRead`).

Reads checkpoints from other DCP writers too (torch's FileSystemWriter/FsspecWriter,
s3torchconnector): without ``s3ckpt.json`` there are no checksums to check, and items go
through the same safe loader. Items saved through stream transforms (a writer's
``_extensions``, e.g. ZStandard) are read whole and undone with the reader's
``_extension_registry`` before they are decoded, tensors and non-tensor items alike.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.metadata import (
    Metadata,
    StorageMeta,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from s3ckpt._gc_pause import gc_paused
from s3ckpt._transfer import RangeWalk, read_piece_size
from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.dcp._decode import ItemKey, SpanDecoder, SpansByObject
from s3ckpt.dcp._fanout import FanOutRead
from s3ckpt.dcp._fanout_plan import DEFAULT_PIECE_SIZE, MIN_PIECE_SIZE, FanOutPlan, plan_fan_out
from s3ckpt.dcp._locate import locate, object_keys
from s3ckpt.dcp._located import Located, reported
from s3ckpt.dcp._match import mismatch_error, planned_shapes
from s3ckpt.dcp._safe import SafeGlobal, load_metadata
from s3ckpt.dcp._split import Piece, split_spans
from s3ckpt.errors import CheckpointNotFoundError, ConfigError, CorruptCheckpointError
from s3ckpt.format._manifest import ItemRecord
from s3ckpt.metrics.instrument import Participant
from s3ckpt.store import Location, ObjectStore
from s3ckpt.store._location import LocationLike

if TYPE_CHECKING:
    from s3ckpt.dcp._torch import ExtensionRegistry

__all__ = ["S3StorageReader"]


class S3StorageReader(Located, StorageReader):
    """Read a DCP checkpoint from ``s3://bucket/prefix`` (or any fsspec URL).

    Example::

        dcp.load(state_dict, storage_reader=S3StorageReader("s3://bucket/run/step_100"))

    Args:
        path: The checkpoint prefix: a URL string, a parsed :class:`~s3ckpt.uri.StoreURL`,
            a local path (``os.PathLike``) or a :class:`~s3ckpt.store.Location` (which
            brings its store and settings: then pass none of ``s3_config``,
            ``transfer_config``, ``store``). The settings in force are the location's
            (``reader.location``); ``url``, ``store``, ``s3_config`` and ``transfer_config``
            read them.
        s3_config: Endpoint, region, SSE-C key, ...
        transfer_config: Concurrency, request sizes, retries.
        verify_checksums: Check every item's CRC32C against ``s3ckpt.json`` (default on).
        allow_unsafe_pickle: Load non-tensor items with full pickle, unchecked. Only for
            checkpoints from a bucket you trust (it can run any code the pickle names).
        safe_globals: Your own classes (or ``(class, "dotted.name")`` pairs, as
            ``torch.serialization.add_safe_globals`` takes) that non-tensor items may
            rebuild, on top of :data:`~s3ckpt.dcp.SAFE_GLOBALS`; for this reader only.
        allow_uncommitted: Load an s3ckpt save that never committed (no ``s3ckpt.json``;
            killed, failed or still running). Nothing is checksummed then. Off by default:
            such a prefix raises :class:`~s3ckpt.errors.UncommittedCheckpointError`.
            Checkpoints written by stock DCP (no s3ckpt objects) load either way.
        roll_forward: When the plain ``.metadata`` (what stock DCP readers open) is not
            the committed one, put the committed copy back (best effort; needs
            s3:PutObject). ``s3ckpt verify`` turns this off to report instead.
        store: Use this store instead of one built from ``path``.
        fan_out: Read each stored item that several ranks load (replicated parameters,
            data-parallel replicas, a checkpoint saved on fewer ranks than load it) from
            the store once per process group, and broadcast it to the ranks that need it
            (:mod:`s3ckpt.dcp._fanout`). Off by default. It pays when the store's
            bandwidth or request rate is the bottleneck and the group's links are faster
            (NCCL over NVLink / InfiniBand; gloo over the host network): the group reads
            those bytes once instead of once per rank. Items one rank loads are read
            directly, as without it. Memory: up to ``3 * fan_out_piece_size`` more per
            rank (plus one piece on the GPU with NCCL). Every rank still checks the
            CRC32C of every item it loads. Without an initialised process group, with one
            rank or with ``dcp.load(..., no_dist=True)`` every rank reads directly (logged
            at DEBUG).
        process_group: The group of the fan-out collectives: the group ``dcp.load`` runs
            on (``None``: the default group). NCCL groups broadcast through CUDA memory
            (``torch.cuda.current_device()``), others through CPU memory.
        fan_out_piece_size: The most bytes one broadcast carries (and an owning rank
            reads in one go); pieces are smaller when the shared bytes spread over the
            ranks need less.
        _extension_registry: Where the stream transforms an item was saved through
            (``.metadata``'s ``transform_descriptors``) are looked up, as torch's
            ``FileSystemReader`` takes it: ``None`` is torch's default registry (which
            knows ``ZStandard``); register your own extension classes on an
            ``ExtensionRegistry`` and pass it. Transformed items (tensors and non-tensor
            items alike) are read whole and undone before they are checked and loaded.

    Non-tensor items (anything in the state dict that is not a tensor) are loaded by DCP's
    planner with full pickle, so each one is first loaded with torch's restricted
    unpickler, ``torch.load(weights_only=True)``, allowing torch's defaults, the globals
    the process registered with ``torch.serialization.add_safe_globals``,
    :data:`~s3ckpt.dcp.SAFE_GLOBALS` (paths, ``argparse.Namespace``, ``datetime`` types, ...)
    and ``safe_globals``. Anything else raises :class:`~s3ckpt.errors.UnsafeCheckpointError`
    naming the object, the item and the global. A framework's ``weights_only`` maps so:

    * ``weights_only=True`` or ``None`` (torch's default since 2.6): this safe loader, with
      the framework's or user's extra classes as ``safe_globals``;
    * ``weights_only=False``: ``allow_unsafe_pickle=True`` (the user trusts the bucket).

    Requests: the marker and ``.metadata`` are read once per location (at construction;
    a ``reset`` to the same location reads neither again), through one client per process
    (:mod:`s3ckpt.store.s3`). To see a checkpoint rewritten since, construct a new reader.
    With ``fan_out``, the items several ranks load cost one read per group instead of one
    per rank.

    Counters (cumulative over the reader's loads): ``bytes_read``, the bytes this rank
    requested from the store (gaps between coalesced items included); ``bytes_received``,
    the bytes it received from other ranks instead (``fan_out``).

    Raises:
        CheckpointNotFoundError: nothing committed (and no ``.metadata``) at ``path``.
        UncommittedCheckpointError: an s3ckpt save without its commit marker is at
            ``path`` (see ``allow_uncommitted``).
        CorruptCheckpointError: the marker or metadata is malformed or inconsistent.
        UnsafeCheckpointError: ``.metadata`` asks to unpickle a non-DCP type (and, while
            loading, a non-tensor item a global outside the allow-list).
        StateMismatchError: while loading, a destination of another shape than saved
            (a planner without torch's size check; ``check_state_dict`` checks up front).
    """

    def __init__(
        self,
        path: LocationLike,
        *,
        s3_config: S3Config | None = None,
        transfer_config: TransferConfig | None = None,
        verify_checksums: bool = True,
        allow_unsafe_pickle: bool = False,
        allow_uncommitted: bool = False,
        roll_forward: bool = True,
        store: ObjectStore | None = None,
        safe_globals: Sequence[SafeGlobal] = (),
        fan_out: bool = False,
        process_group: dist.ProcessGroup | None = None,
        fan_out_piece_size: int = DEFAULT_PIECE_SIZE,
        _extension_registry: ExtensionRegistry | None = None,
    ) -> None:
        super().__init__()
        self.extension_registry = _extension_registry
        if fan_out_piece_size < MIN_PIECE_SIZE:
            raise ConfigError(
                f"fan_out_piece_size must be >= {MIN_PIECE_SIZE} bytes, got {fan_out_piece_size}"
            )
        self.fan_out, self.process_group = fan_out, process_group
        self.fan_out_piece_size = fan_out_piece_size
        self.verify_checksums, self.allow_unsafe_pickle = verify_checksums, allow_unsafe_pickle
        self.safe_globals: tuple[SafeGlobal, ...] = tuple(safe_globals)
        self.allow_uncommitted, self.roll_forward = allow_uncommitted, roll_forward
        self.rank = self.bytes_read = self.bytes_received = 0
        self._report = Participant("load")
        self._open(
            Location.of(path, s3_config=s3_config, transfer_config=transfer_config, store=store)
        )

    # -- location & metadata (reset, validate_checkpoint_id: dcp/_located.py) -----------------
    def _point(self, location: Location) -> None:
        """A new location: read its marker and ``.metadata``."""
        self.location = location
        self._restart()
        manifest, meta_key, raw = locate(
            self.store,
            self.url,
            allow_uncommitted=self.allow_uncommitted,
            roll_forward=self.roll_forward,
        )
        metadata = load_metadata(raw, bucket=self.store.bucket, key=meta_key)
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        if not isinstance(metadata.storage_data, dict):
            raise CorruptCheckpointError(
                f"{meta_key.rpartition('/')[2]} has no storage_data; it was not written by a "
                "file-style DCP writer",
                bucket=self.store.bucket,
                key=meta_key,
            )
        # A data object's key by its .metadata name (the marker's layout may place it).
        names = (i.relative_path for i in metadata.storage_data.values())
        self.object_key = object_keys(self.store, self.url, manifest, names)
        self.manifest, self.metadata = manifest, metadata
        self._records: dict[ItemKey, ItemRecord] = {} if manifest is None else manifest.item_index()

    def _restart(self) -> None:
        """A new load of the same location (``reset`` to it): nothing is read again."""
        self.load_id = uuid.uuid4().hex
        self._read_before = self.bytes_read

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The checkpoint's metadata (read at construction)."""
        if kwargs.get("rank") is not None:
            raise CheckpointNotFoundError("s3ckpt checkpoints have no rank-local metadata")
        return self.metadata

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        """Index saved chunks (dtype and shape) for direct streaming."""
        self.rank, self.metadata = int(kwargs.get("rank", 0) or 0), metadata
        with gc_paused():  # a tuple per chunk, no cycles (see s3ckpt._gc_pause)
            self._chunks: dict[ItemKey, tuple[torch.dtype, torch.Size]] = {
                (fqn, tuple(chunk.offsets)): (md.properties.dtype, chunk.sizes)
                for fqn, md in metadata.state_dict_metadata.items()
                if isinstance(md, TensorStorageMetadata)
                for chunk in md.chunks
            }

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """With ``fan_out``: which stored items two or more ranks read, and which rank
        reads each piece of them for the group (:func:`~s3ckpt.dcp._fanout_plan.plan_fan_out`)."""
        if not self.fan_out:
            return plans
        storage_data = self.metadata.storage_data
        return plan_fan_out(
            plans, storage_data, piece_size=self.fan_out_piece_size, group=self.process_group
        )

    # -- data -----------------------------------------------------------------------------------
    @reported(ends=lambda _: True)
    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Fetch every item of ``plan`` into the planner's tensors; see the module docs.

        Without a Checkpointer around it, publishes this rank's ``"load"`` event
        (:mod:`s3ckpt.metrics`) when it ends."""
        if shapes := planned_shapes(plan, planner, self.metadata):  # before any byte
            raise mismatch_error(shapes, [], [], self.url, self.rank)
        decoder = SpanDecoder(self, planner)
        if isinstance(plan.storage_data, FanOutPlan):
            fan = FanOutRead(self, plan.storage_data, decoder)
            try:
                fan.run(plan)
            finally:
                self.bytes_read += fan.bytes_read
                self.bytes_received += fan.bytes_received
        else:
            with gc_paused():
                per_object = decoder.group(plan)
            self._read_direct(per_object, decoder)
        result: Future[None] = Future()
        result.set_result(None)
        return result

    def _read_direct(self, per_object: SpansByObject, decoder: SpanDecoder) -> None:
        """Read ``per_object`` from the store, decoding each span with ``decoder``: requests
        of at most the load's piece size (:func:`~s3ckpt._transfer.read_piece_size`), large
        items cut into pieces read in parallel (:mod:`s3ckpt.dcp._split`)."""
        walk = self._walk()
        tc = self.transfer_config
        total = sum(s.info.length for spans in per_object.values() for s in spans.values())
        piece = read_piece_size(total, tc.read_concurrency, ceiling=tc.read_request_size)
        with gc_paused():  # a few objects per item, in a burst (see s3ckpt._gc_pause)
            spans = split_spans(per_object, decoder, piece_size=piece, key_of=self.object_key)
            jobs = walk.plan(spans, max_size=piece)
        try:
            walk.run(jobs)
        finally:
            self.bytes_read += walk.bytes_requested

    def _moved(self) -> int:
        return self.bytes_read - self._read_before

    def _walk(self) -> RangeWalk[Piece]:
        """The ranged-read walk that decodes each span with ``decoder`` (a piece of a large
        item lands in its place, :mod:`s3ckpt.dcp._split`); the first failure is raised."""
        return RangeWalk(
            self.store,
            self.object_key,
            config=self.transfer_config,
            on_span=lambda span, source: span.payload.read(source),
            rank=self.rank,
        )
