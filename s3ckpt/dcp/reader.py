"""S3StorageReader: a DCP checkpoint read back with parallel, coalesced ranged GETs.

Call sequence (torch's ``StorageReader`` contract):

0. ``__init__`` / ``reset(checkpoint_id)``: parse the URL, read ``s3ckpt.json`` (if any)
   and the ``.metadata`` it commits (:func:`~s3ckpt.dcp._locate.locate`), eagerly, so a
   missing, corrupt or unsafe checkpoint raises a typed s3ckpt error before DCP wraps it.
   A ``reset`` to the location already read (compared parsed: ``s3://b/run/step_4`` is
   ``s3://b/run/step_4/``) reads nothing again; one to another location in the same bucket
   keeps the store.
1. ``read_metadata`` (all ranks): the metadata, unpickled by an allow-list.
2. ``set_up_storage_reader``: index saved chunks (dtype, shape) for direct streaming.
3. ``prepare_local_plan``: nothing to add. ``prepare_global_plan`` (coordinator), with
   ``fan_out``: the items two or more ranks read, cut into pieces each read by one rank
   for the group (:mod:`s3ckpt.dcp._fanout`), in every rank's plan.
4. ``read_data``: group read items by object, sort by offset, coalesce near ranges into
   requests of at most ``read_request_size`` (a whole-object GET when everything fits, so
   stores that serve ranges slowly, like moto, read each byte once), fetch requests in
   parallel (:class:`~s3ckpt.transfer.RangeWalk`, the walk ``s3ckpt verify`` uses too),
   stream tensor bytes straight into destination tensors when dtype and layout allow,
   and check every item's CRC32C. Non-tensor items are checked by
   :func:`~s3ckpt.dcp._safe.check_item` before the planner unpickles them.
   With a fan-out table, the shared items come from the group's broadcasts instead and
   go through the same decoding and checks (:class:`~s3ckpt.dcp._fanout.FanOutRead`).

Reads checkpoints from other DCP writers too (torch's FileSystemWriter/FsspecWriter,
s3torchconnector): without ``s3ckpt.json`` there are no checksums to check, and items go
through the same safe loader.
"""

from __future__ import annotations

import io
import logging
import os
import threading
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any, cast

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.metadata import (
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.dcp._fanout import (
    DEFAULT_PIECE_SIZE,
    MIN_PIECE_SIZE,
    ByteSource,
    FanOutPlan,
    FanOutRead,
    plan_fan_out,
)
from s3ckpt.dcp._locate import locate, object_keys, open_location, parse_location
from s3ckpt.dcp._match import mismatch_error, planned_shapes
from s3ckpt.dcp._safe import (
    SAFE_GLOBALS,
    SafeGlobal,
    check_item,
    global_name,
    missing_globals,
    reason,
)
from s3ckpt.dcp._torch import StorageInfo, transform_load_stream
from s3ckpt.dcp._unpickler import load_metadata
from s3ckpt.errors import (
    CheckpointNotFoundError,
    ChecksumMismatchError,
    ConfigError,
    CorruptCheckpointError,
    StateMismatchError,
    UnsafeCheckpointError,
)
from s3ckpt.format import (
    MANIFEST_NAME,
    METADATA_NAME,
    ItemRecord,
    Manifest,
    tensor_framing_error,
)
from s3ckpt.metrics import instrument
from s3ckpt.store import ObjectStore
from s3ckpt.transfer import RangeWalk, Request, SpanReader
from s3ckpt.transfer import Span as WalkSpan
from s3ckpt.uri import StoreURL

__all__ = ["S3StorageReader"]

log = logging.getLogger(__name__)

_Key = tuple[str, tuple[int, ...] | None]


@dataclass
class _Span:
    """One stored item (a byte range of an object) and every read item that needs it."""

    info: StorageInfo
    record: ItemRecord | None
    reads: list[ReadItem] = field(default_factory=list)


class S3StorageReader(StorageReader):
    """Read a DCP checkpoint from ``s3://bucket/prefix`` (or any fsspec URL).

    Example::

        dcp.load(state_dict, storage_reader=S3StorageReader("s3://bucket/run/step_100"))

    Args:
        path: Checkpoint prefix URL, as a string or a parsed :class:`~s3ckpt.uri.StoreURL`.
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
        path: str | os.PathLike[str] | StoreURL,
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
    ) -> None:
        super().__init__()
        if fan_out_piece_size < MIN_PIECE_SIZE:
            raise ConfigError(
                f"fan_out_piece_size must be >= {MIN_PIECE_SIZE} bytes, got {fan_out_piece_size}"
            )
        self.fan_out = fan_out
        self.process_group = process_group
        self.fan_out_piece_size = fan_out_piece_size
        self.s3_config = s3_config or S3Config()
        self.transfer_config = transfer_config or TransferConfig()
        self.verify_checksums = verify_checksums
        self.allow_unsafe_pickle = allow_unsafe_pickle
        self.safe_globals: tuple[SafeGlobal, ...] = tuple(safe_globals)
        self.allow_uncommitted = allow_uncommitted
        self.roll_forward = roll_forward
        self._given_store = store
        self.rank = 0
        self.bytes_read = 0
        self.bytes_received = 0
        self._report = instrument.Participant("load")
        self._point(path)

    # -- location & metadata ------------------------------------------------------------------
    def _point(self, path: str | os.PathLike[str] | StoreURL) -> None:
        self.url: StoreURL
        self.store: ObjectStore
        current = (self.url, self.store) if hasattr(self, "url") else None
        self.url, self.store = open_location(
            path, self._given_store, self.s3_config, self.transfer_config, current=current
        )
        self.checkpoint_id = str(self.url)
        self.load_id = uuid.uuid4().hex
        self._begin_metrics()
        with self._report.active(self._end_metrics):
            self.manifest, self.metadata = self._load()
        # A data object's key by its .metadata name (the marker's layout may place it).
        names = (i.relative_path for i in self.metadata.storage_data.values())
        self.object_key = object_keys(self.store, self.url, self.manifest, names)
        self._records: dict[_Key, ItemRecord] = (
            self.manifest.item_index() if self.manifest is not None else {}
        )

    def _load(self) -> tuple[Manifest | None, Metadata]:
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
        return manifest, metadata

    def _begin_metrics(self) -> None:
        self._report.begin(str(self.url), rank=self.rank)

    def _end_metrics(self, error: BaseException | None = None) -> None:
        manifest: Manifest | None = getattr(self, "manifest", None)
        self._report.end(error, rank=self.rank, step=manifest.step if manifest else None)

    def reset(self, checkpoint_id: str | os.PathLike[str] | StoreURL | None = None) -> None:
        """Start a new load, optionally of another checkpoint.

        ``checkpoint_id`` is compared with the current location parsed (a missing trailing
        slash, ``s3a://`` or a :class:`StoreURL` name the same place): the same location
        reads nothing again; another one reads its marker and ``.metadata``.
        """
        if checkpoint_id is not None and parse_location(checkpoint_id) != self.url:
            self._point(checkpoint_id)
        else:
            self.load_id = uuid.uuid4().hex
            self._begin_metrics()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str] | StoreURL) -> bool:
        """True for ``s3://`` URLs."""
        return str(checkpoint_id).startswith(("s3://", "s3a://"))

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The checkpoint's metadata (read at construction)."""
        if kwargs.get("rank") is not None:
            raise CheckpointNotFoundError("s3ckpt checkpoints have no rank-local metadata")
        return self.metadata

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        """Index saved chunks (dtype and shape) for direct streaming."""
        self.rank = int(kwargs.get("rank", 0) or 0)
        self.metadata = metadata
        self._chunks: dict[_Key, tuple[torch.dtype, torch.Size]] = {}
        for fqn, md in metadata.state_dict_metadata.items():
            if isinstance(md, TensorStorageMetadata):
                for chunk in md.chunks:
                    key = (fqn, tuple(chunk.offsets))
                    self._chunks[key] = (md.properties.dtype, chunk.sizes)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """No storage-specific planning."""
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """With ``fan_out``: which stored items two or more ranks read, and which rank
        reads each piece of them for the group (:func:`~s3ckpt.dcp._fanout.plan_fan_out`)."""
        if not self.fan_out:
            return plans
        storage_data = cast(dict[MetadataIndex, StorageInfo], self.metadata.storage_data)
        return plan_fan_out(
            plans, storage_data, piece_size=self.fan_out_piece_size, group=self.process_group
        )

    # -- data -----------------------------------------------------------------------------------
    def _key_of(self, index: MetadataIndex) -> _Key:
        return (index.fqn, tuple(index.offset) if index.offset is not None else None)

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Fetch every item of ``plan`` into the planner's tensors; see the module docs.

        Without a Checkpointer around it, publishes this rank's ``"load"`` event
        (:mod:`s3ckpt.metrics`) when it ends."""
        with self._report.active(self._end_metrics):
            if shapes := planned_shapes(plan, planner, self.metadata):  # before any byte
                raise mismatch_error(shapes, [], [], self.url, self.rank)
            if isinstance(plan.storage_data, FanOutPlan):
                FanOutRead(self, plan.storage_data, planner).run(plan)
            else:
                self._read_direct(self._group(plan), planner, threading.Lock())
        self._end_metrics()
        result: Future[None] = Future()
        result.set_result(None)
        return result

    def _group(self, plan: LoadPlan) -> dict[str, dict[tuple[int, int], _Span]]:
        """The plan's stored items by object, each checked against its manifest row."""
        storage_data = cast(dict[MetadataIndex, StorageInfo], self.metadata.storage_data)
        per_object: dict[str, dict[tuple[int, int], _Span]] = defaultdict(dict)
        for read in plan.items:
            info = storage_data.get(read.storage_index)
            if info is None:
                raise CorruptCheckpointError(
                    f"{read.storage_index.fqn} is in the plan but not in .metadata",
                    bucket=self.store.bucket,
                    key=self.url.key(METADATA_NAME),
                    rank=self.rank,
                )
            spans = per_object[info.relative_path]
            span = spans.get((info.offset, info.length))
            if span is None:
                record = self._records.get(self._key_of(read.storage_index))
                if self.manifest is not None and record is None and self.verify_checksums:
                    raise CorruptCheckpointError(
                        f"{read.storage_index.fqn} is not recorded in {MANIFEST_NAME}",
                        bucket=self.store.bucket,
                        key=self.url.key(MANIFEST_NAME),
                        rank=self.rank,
                    )
                if record is not None and (record.object, record.start, record.length) != (
                    info.relative_path,
                    info.offset,
                    info.length,
                ):
                    raise CorruptCheckpointError(
                        f"{read.storage_index.fqn}: {MANIFEST_NAME} places it at "
                        f"{record.object}[{record.start}:+{record.length}], .metadata at "
                        f"{info.relative_path}[{info.offset}:+{info.length}]; one of them was "
                        "changed after the save. Load an earlier checkpoint",
                        bucket=self.store.bucket,
                        key=self.url.key(MANIFEST_NAME),
                        rank=self.rank,
                    )
                span = spans[(info.offset, info.length)] = _Span(info, record)
            span.reads.append(read)
        return per_object

    def _read_direct(
        self,
        per_object: dict[str, dict[tuple[int, int], _Span]],
        planner: LoadPlanner,
        lock: threading.Lock,
    ) -> None:
        """Read ``per_object`` from the store, streaming each span through
        :meth:`_read_span`."""
        walk = self._walk(planner, lock)
        jobs = walk.plan(
            {
                name: [(s.info.offset, s.info.offset + s.info.length, s) for s in spans.values()]
                for name, spans in per_object.items()
            }
        )
        try:
            walk.run(jobs)
        finally:
            self._count(walk.bytes_requested)

    def _count(self, nbytes: int) -> None:
        self.bytes_read += nbytes
        self._report.add_bytes(nbytes)

    def _walk(self, planner: LoadPlanner, lock: threading.Lock) -> RangeWalk[_Span]:
        """The ranged-read walk that streams each span through :meth:`_read_span`; the
        first failure is raised."""

        def on_span(span: WalkSpan[_Span], reader: SpanReader) -> None:
            self._read_span(reader, span.key, span.payload, planner, lock)

        return RangeWalk(
            self.store,
            self.object_key,
            config=self.transfer_config,
            on_span=on_span,
            rank=self.rank,
        )

    def _fetch(
        self, name: str, req: Request[_Span], planner: LoadPlanner, lock: threading.Lock
    ) -> None:
        """Read one request (and its overlapping spans' own requests) into the planner."""
        walk = self._walk(planner, lock)
        try:
            walk.fetch(name, req)
        finally:
            self._count(walk.bytes_requested)

    def _read_span(
        self,
        reader: ByteSource,
        key: str,
        span: _Span,
        planner: LoadPlanner,
        lock: threading.Lock,
    ) -> None:
        info, record = span.info, span.record
        fqn = span.reads[0].storage_index.fqn
        target = self._direct_target(span, planner, lock)
        if target is not None and record is not None and record.data_offset is not None:
            nbytes = target.numel() * target.element_size()
            tail_len = info.length - record.data_offset - nbytes
            if tail_len < 0:
                raise CorruptCheckpointError(
                    f"{fqn}: {MANIFEST_NAME} places {nbytes} tensor bytes past the item's end",
                    bucket=self.store.bucket,
                    key=key,
                    rank=self.rank,
                )
            head = bytearray(record.data_offset)
            crc = reader.readinto_all(memoryview(head), fqn, 0)
            if nbytes:
                view = memoryview(target.view(-1).view(torch.uint8).numpy())
                crc = reader.readinto_all(view, fqn, crc)
            tail = bytearray(tail_len)
            crc = reader.readinto_all(memoryview(tail), fqn, crc)
            self._check(crc, record, key, fqn)
            self._check_framing(head, tail, nbytes, key, fqn)
            with lock:
                planner.commit_tensor(span.reads[0], target)
            return

        buf = bytearray(info.length)
        crc = reader.readinto_all(memoryview(buf), fqn, 0)
        if record is not None:
            self._check(crc, record, key, fqn)
        first = span.reads[0]
        if first.type == LoadItemType.BYTE_IO:
            self._check_safe(buf, key, fqn)
            for read in span.reads:
                with lock:
                    planner.load_bytes(read, io.BytesIO(buf))
            return
        tensor = self._decode_tensor(buf, span, key)
        for read in span.reads:
            piece = _narrow(tensor, read.storage_offsets, read.lengths)
            with lock:
                dest = planner.resolve_tensor(read).detach()
            if dest.size() != piece.size():  # a planner that skipped torch's size check
                shape = (tuple(piece.size()), tuple(dest.size()))
                raise StateMismatchError(
                    f"{read.storage_index.fqn}: saved as {shape[0]}, destination {shape[1]}: "
                    "the checkpoint does not fit the state dict. Load one saved from this model",
                    bucket=self.store.bucket,
                    key=key,
                    rank=self.rank,
                    shapes={read.storage_index.fqn: shape},
                )
            dest.copy_(piece)
            with lock:
                planner.commit_tensor(read, dest)

    def _direct_target(
        self, span: _Span, planner: LoadPlanner, lock: threading.Lock
    ) -> torch.Tensor | None:
        """The destination tensor if the saved bytes can stream straight into it."""
        if len(span.reads) != 1 or span.info.transform_descriptors:
            return None
        read = span.reads[0]
        if read.type != LoadItemType.TENSOR:
            return None
        chunk = self._chunks.get(self._key_of(read.storage_index))
        if chunk is None:
            return None
        dtype, sizes = chunk
        if any(read.storage_offsets) or tuple(read.lengths) != tuple(sizes):
            return None
        with lock:
            target = planner.resolve_tensor(read).detach()
        if (
            target.device.type != "cpu"
            or target.dtype != dtype
            or not target.is_contiguous()
            or tuple(target.size()) != tuple(sizes)
        ):
            return None
        return target

    def _check(self, crc: int, record: ItemRecord, key: str, fqn: str) -> None:
        if self.verify_checksums and crc != record.crc32c:
            instrument.record_checksum_failure(self._report.recorder)
            raise ChecksumMismatchError(
                f"checksum mismatch in {fqn!r}: crc32c {crc:08x}, recorded {record.crc32c:08x} "
                f"(bytes {record.start}-{record.start + record.length - 1}); the object was "
                "corrupted after it was written. Restore it or load an earlier checkpoint",
                bucket=self.store.bucket,
                key=key,
                rank=self.rank,
                item=fqn,
            )

    def _check_framing(self, head: Any, tail: Any, nbytes: int, key: str, fqn: str) -> None:
        """The item's own zip framing must put the tensor where the manifest says (see
        :func:`~s3ckpt.format.tensor_framing_error`): a manifest edited and re-sealed
        cannot make a reader take other bytes for the tensor."""
        why = tensor_framing_error(head, tail, nbytes)
        if why is not None:
            raise CorruptCheckpointError(
                f"{fqn}: {why}; {MANIFEST_NAME} does not describe the bytes stored (it was "
                "changed after the save). Load an earlier checkpoint",
                bucket=self.store.bucket,
                key=key,
                rank=self.rank,
            )

    def _check_safe(self, buf: bytearray, key: str, fqn: str) -> None:
        if self.allow_unsafe_pickle:
            return
        allowed = (*SAFE_GLOBALS, *self.safe_globals)
        try:
            check_item(buf, allowed)
        except Exception as exc:
            names = missing_globals(buf, allowed, exc)
            if names:
                name = ", ".join(names)
                what = f"needs {name}, which the safe loader does not allow"
                kinds = "these are plain value types" if names[1:] else "it is a plain value type"
                allow = (
                    f"If {kinds}, pass safe_globals=[{name}] to the reader (Checkpointer.load "
                    "takes it too)"
                )
            else:
                what = f"does not load with torch.load(weights_only=True): {reason(exc)}"
                allow = "If the types it holds are plain values, pass them as safe_globals=[...]"
            raise UnsafeCheckpointError(
                f"non-tensor item {fqn!r} {what} (torch's weights_only defaults, "
                f"s3ckpt.dcp.SAFE_GLOBALS{self._listed()}). {allow}; if you trust this "
                "bucket, pass allow_unsafe_pickle=True",
                bucket=self.store.bucket,
                key=key,
                rank=self.rank,
            ) from exc

    def _listed(self) -> str:
        if not self.safe_globals:
            return ""
        return " and safe_globals=[" + ", ".join(map(global_name, self.safe_globals)) + "]"

    def _decode_tensor(self, buf: bytearray, span: _Span, key: str) -> torch.Tensor:
        read = span.reads[0]
        record = span.record
        chunk = self._chunks.get(self._key_of(read.storage_index))
        if (
            record is not None
            and record.data_offset is not None
            and chunk is not None
            and not span.info.transform_descriptors
        ):
            dtype, sizes = chunk
            numel = 1
            for s in sizes:
                numel *= s
            if numel == 0:
                return torch.empty(tuple(sizes), dtype=dtype)
            nbytes = numel * torch.empty((), dtype=dtype).element_size()
            at = record.data_offset
            self._check_framing(
                memoryview(buf)[:at],
                memoryview(buf)[at + nbytes :],
                nbytes,
                key,
                read.storage_index.fqn,
            )
            flat = torch.frombuffer(buf, dtype=dtype, count=numel, offset=record.data_offset)
            return flat.view(tuple(sizes))
        stream: IO[bytes] = io.BytesIO(buf)
        if span.info.transform_descriptors:
            stream = transform_load_stream(read, span.info.transform_descriptors, stream)
            stream = io.BytesIO(stream.read())
        try:
            return cast(torch.Tensor, torch.load(stream, map_location="cpu", weights_only=True))
        except Exception as exc:
            raise CorruptCheckpointError(
                f"{read.storage_index.fqn}: cannot decode the saved tensor ({type(exc).__name__}: "
                f"{exc})",
                bucket=self.store.bucket,
                key=key,
                rank=self.rank,
            ) from exc


def _narrow(tensor: torch.Tensor, offsets: Any, lengths: Any) -> torch.Tensor:
    for dim, (start, length) in enumerate(zip(offsets, lengths, strict=True)):
        if start != 0 or length != tensor.size(dim):
            tensor = torch.narrow(tensor, dim, start, length)
    return tensor
