"""The span decoder: a load plan's stored items as spans, and each span's bytes decoded into
the planner's items, checked.

A span (:class:`ItemSpan`) is one stored item, a byte range of an object as ``.metadata``
places it, with every read item that needs it (two destination shards may read one saved
chunk: it is read once and copied into both). :class:`SpanDecoder` makes the spans of a
plan (:meth:`~SpanDecoder.group`, each checked against its ``s3ckpt.json`` row), says where
a span's bytes land (:meth:`~SpanDecoder.direct`) and turns them into the planner's items
(:meth:`~SpanDecoder.finish_direct`, :meth:`~SpanDecoder.decode_buffer`), whatever
:class:`ByteSource` they came from (:mod:`s3ckpt.dcp._split` reads them): a ranged GET of a
direct read (:class:`~s3ckpt._transfer.SpanReader`, :mod:`s3ckpt.dcp.reader`) or the fan-out
stream (:mod:`s3ckpt.dcp._fanout`). One decoder
for both, so an item is checked the same way however its bytes came: its CRC32C against
``s3ckpt.json``, the zip framing around the tensor, the safe loader for non-tensor items,
the destination's shape.

Decoding, per span: a tensor whose one destination is contiguous, on the CPU and of the
saved dtype and shape is streamed straight into the destination's memory (the zip header
and tail go through two small buffers); anything else is read whole into one buffer (the
item's length) and decoded from it, then copied into each destination. An item saved
through stream transforms (``.metadata``'s ``transform_descriptors``: a writer's
``_extensions``, e.g. ``ZStandard``) is always read whole and its transforms undone
(:meth:`SpanDecoder.untransform`, the reader's extension registry) before it is decoded,
tensor or bytes alike; its CRC32C is checked over the bytes stored, before that.
"""

from __future__ import annotations

import io
import math
import threading
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast

import torch
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem

from s3ckpt._verify import tensor_framing_error
from s3ckpt.dcp._safe import (
    SAFE_GLOBALS,
    check_item,
    global_name,
    missing_globals,
    reason,
)
from s3ckpt.dcp._torch import StorageInfo, transform_load_stream
from s3ckpt.errors import (
    ChecksumMismatchError,
    ConfigError,
    CorruptCheckpointError,
    S3CkptError,
    StateMismatchError,
    UnsafeCheckpointError,
)
from s3ckpt.format._manifest import ItemRecord
from s3ckpt.format._names import MANIFEST_NAME, METADATA_NAME
from s3ckpt.metrics.instrument import record_checksum_failure

__all__ = [
    "ByteSource",
    "DirectTarget",
    "ItemKey",
    "ItemSpan",
    "SpanDecoder",
    "SpansByObject",
    "item_key",
]

_E = TypeVar("_E", bound=S3CkptError)

ItemKey = tuple[str, tuple[int, ...] | None]
# A stored item by ``(fqn, chunk offsets)``: how ``s3ckpt.json`` rows and saved chunks are
# looked up (``None`` offsets for a non-tensor item).


def item_key(index: MetadataIndex) -> ItemKey:
    """The :data:`ItemKey` of a plan item's ``storage_index``."""
    return (index.fqn, tuple(index.offset) if index.offset is not None else None)


class ByteSource(Protocol):
    """What a span is decoded from: a ranged GET (:class:`~s3ckpt._transfer.SpanReader`) or
    the fan-out stream."""

    def readinto_all(self, view: memoryview, what: str, crc: int = 0) -> int:
        """Fill ``view`` with the span's next bytes; their CRC32C continued from ``crc``."""


@dataclass(slots=True)
class ItemSpan:
    """One stored item (a byte range of an object) and every read item that needs it."""

    info: StorageInfo
    record: ItemRecord | None
    reads: list[ReadItem] = field(default_factory=list)


@dataclass(frozen=True)
class DirectTarget:
    """A tensor item streamed straight into its destination: its framing before the tensor
    data (into ``head``), ``nbytes`` of tensor data (into ``tensor``'s memory), its framing
    after (into ``tail``)."""

    tensor: torch.Tensor
    head: bytearray
    nbytes: int
    tail: bytearray

    def data(self) -> memoryview:
        """The destination's bytes, writable."""
        return memoryview(self.tensor.view(-1).view(torch.uint8).numpy())


SpansByObject = dict[str, dict[tuple[int, int], ItemSpan]]
# A plan's spans: by object name (``.metadata``'s), then by ``(offset, length)``.


class SpanDecoder:
    """One load's spans and their decoding on one rank (see the module docs).

    Args:
        reader: The :class:`~s3ckpt.dcp.S3StorageReader` loading: the checkpoint (its URL
            and bucket name the marker and ``.metadata`` in errors), this rank, what it read
            (``.metadata``, the committed ``s3ckpt.json`` and its rows, the saved chunks'
            dtypes and shapes) and the checks it was asked for (``verify_checksums``,
            ``allow_unsafe_pickle``, ``safe_globals``, ``extension_registry``).
        planner: DCP's load planner the items are decoded into (guarded by :attr:`lock`:
            spans are decoded on several threads).
    """

    def __init__(self, reader: Any, planner: LoadPlanner) -> None:
        self.reader, self.planner, self.lock = reader, planner, threading.Lock()
        self.url, self.bucket, self.rank = reader.url, reader.store.bucket, reader.rank

    # -- a plan as spans ----------------------------------------------------------------------
    def group(self, plan: LoadPlan) -> SpansByObject:
        """The plan's stored items by object, each checked against its manifest row."""
        per_object: SpansByObject = defaultdict(dict)
        reader = self.reader
        for read in plan.items:
            if (info := reader.metadata.storage_data.get(read.storage_index)) is None:
                raise self._error(
                    CorruptCheckpointError,
                    f"{read.storage_index.fqn} is in the plan but not in .metadata",
                    self.url.key(METADATA_NAME),
                )
            spans = per_object[info.relative_path]
            if (span := spans.get((info.offset, info.length))) is None:
                record = reader._records.get(item_key(read.storage_index))
                if reader.manifest is not None and record is None and reader.verify_checksums:
                    raise self._error(
                        CorruptCheckpointError,
                        f"{read.storage_index.fqn} is not recorded in {MANIFEST_NAME}",
                        self.url.key(MANIFEST_NAME),
                    )
                where = (info.relative_path, info.offset, info.length)
                if record is not None and (record.object, record.start, record.length) != where:
                    raise self._error(
                        CorruptCheckpointError,
                        f"{read.storage_index.fqn}: {MANIFEST_NAME} places it at "
                        f"{record.object}[{record.start}:+{record.length}], .metadata at "
                        f"{info.relative_path}[{info.offset}:+{info.length}]; one of them was "
                        "changed after the save. Load an earlier checkpoint",
                        self.url.key(MANIFEST_NAME),
                    )
                span = spans[(info.offset, info.length)] = ItemSpan(info, record)
            span.reads.append(read)
        return per_object

    # -- a span's bytes into the planner ----------------------------------------------------
    def direct(self, span: ItemSpan, key: str) -> DirectTarget | None:
        """Where ``span``'s bytes land when its tensor streams straight into the destination
        (see the module docs), or None when the item must be read whole and decoded."""
        read, layout = span.reads[0], self._layout(span)
        if (
            len(span.reads) != 1
            or read.type != LoadItemType.TENSOR
            or layout is None
            or any(read.storage_offsets)
            or tuple(read.lengths) != tuple(layout[1])
        ):
            return None
        dtype, sizes, data_offset = layout
        with self.lock:
            target = self.planner.resolve_tensor(read).detach()
        found = (target.device.type, target.dtype, target.is_contiguous(), tuple(target.size()))
        if found != ("cpu", dtype, True, tuple(sizes)):
            return None
        nbytes = target.numel() * target.element_size()
        if (tail_len := span.info.length - data_offset - nbytes) < 0:
            raise self._error(
                CorruptCheckpointError,
                f"{read.storage_index.fqn}: {MANIFEST_NAME} places {nbytes} tensor "
                "bytes past the item's end",
                key,
            )
        return DirectTarget(target, bytearray(data_offset), nbytes, bytearray(tail_len))

    def finish_direct(self, span: ItemSpan, key: str, direct: DirectTarget, crc: int) -> None:
        """Check a directly streamed item (its CRC32C ``crc``, its framing) and commit its
        tensor."""
        fqn = span.reads[0].storage_index.fqn
        self._check(crc, span.record, key, fqn)
        self._check_framing(direct.head, direct.tail, direct.nbytes, key, fqn)
        with self.lock:
            self.planner.commit_tensor(span.reads[0], direct.tensor)

    def decode_buffer(
        self,
        span: ItemSpan,
        key: str,
        buf: memoryview,
        crc: int,
    ) -> None:
        """Check and decode an item read whole into ``buf`` (``crc``: its CRC32C) into
        every read item that needs it."""
        fqn = span.reads[0].storage_index.fqn
        self._check(crc, span.record, key, fqn)
        data = self.untransform(span, key, buf)
        if span.reads[0].type == LoadItemType.BYTE_IO:
            self._check_safe(data, key, fqn)
            for read in span.reads:
                with self.lock:
                    self.planner.load_bytes(read, io.BytesIO(data))
            return
        tensor = self._decode_tensor(data, span, key)
        for read in span.reads:
            index = zip(read.storage_offsets, read.lengths, strict=True)
            piece = tensor[tuple(slice(start, start + n) for start, n in index)]
            with self.lock:
                dest = self.planner.resolve_tensor(read).detach()
            if dest.size() != piece.size():  # a planner that skipped torch's size check
                shape = (tuple(piece.size()), tuple(dest.size()))
                raise self._error(
                    StateMismatchError,
                    f"{read.storage_index.fqn}: saved as {shape[0]}, destination {shape[1]}: "
                    "the checkpoint does not fit the state dict. Load one saved from this model",
                    key,
                    shapes={read.storage_index.fqn: shape},
                )
            dest.copy_(piece)
            with self.lock:
                self.planner.commit_tensor(read, dest)

    # -- checks -------------------------------------------------------------------------------
    def _error(self, cls: type[_E], message: str, key: str, **extra: Any) -> _E:
        """``cls(message)`` about object ``key`` on this rank."""
        return cls(message, bucket=self.bucket, key=key, rank=self.rank, **extra)

    def _check(self, crc: int, record: ItemRecord | None, key: str, fqn: str) -> None:
        """``crc`` against the item's manifest row (none: nothing to check against)."""
        if record is not None and self.reader.verify_checksums and crc != record.crc32c:
            record_checksum_failure()  # for the load current here
            raise self._error(
                ChecksumMismatchError,
                f"checksum mismatch in {fqn!r}: crc32c {crc:08x}, recorded {record.crc32c:08x} "
                f"(bytes {record.start}-{record.start + record.length - 1}); the object was "
                "corrupted after it was written. Restore it or load an earlier checkpoint",
                key,
                item=fqn,
            )

    def _check_framing(self, head: Any, tail: Any, nbytes: int, key: str, fqn: str) -> None:
        """The item's own zip framing must put the tensor where the manifest says (see
        :func:`~s3ckpt._verify.tensor_framing_error`): a manifest edited and re-sealed
        cannot make a reader take other bytes for the tensor."""
        if (why := tensor_framing_error(head, tail, nbytes)) is not None:
            raise self._error(
                CorruptCheckpointError,
                f"{fqn}: {why}; {MANIFEST_NAME} does not describe the bytes stored (it was "
                "changed after the save). Load an earlier checkpoint",
                key,
            )

    def _check_safe(self, buf: bytes | memoryview, key: str, fqn: str) -> None:
        if self.reader.allow_unsafe_pickle:
            return
        allowed = (*SAFE_GLOBALS, *self.reader.safe_globals)
        try:
            check_item(buf, allowed)
        except Exception as exc:
            if names := missing_globals(buf, allowed, exc):
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
            own = ", ".join(map(global_name, self.reader.safe_globals))
            listed = f" and safe_globals=[{own}]" if own else ""
            raise self._error(
                UnsafeCheckpointError,
                f"non-tensor item {fqn!r} {what} (torch's weights_only defaults, "
                f"s3ckpt.dcp.SAFE_GLOBALS{listed}). {allow}; if you trust this "
                "bucket, pass allow_unsafe_pickle=True",
                key,
            ) from exc

    # -- a stored item's bytes ---------------------------------------------------------------
    def _layout(self, span: ItemSpan) -> tuple[torch.dtype, Sequence[int], int] | None:
        """The saved chunk's dtype and sizes and where its data starts in the item, when
        ``.metadata`` and ``s3ckpt.json`` say so and no stream transform changed the bytes."""
        record = span.record
        chunk = self.reader._chunks.get(item_key(span.reads[0].storage_index))
        if record is None or record.data_offset is None or chunk is None:
            return None
        return None if span.info.transform_descriptors else (*chunk, record.data_offset)

    def untransform(self, span: ItemSpan, key: str, buf: memoryview) -> bytes | memoryview:
        """The item's bytes with its stream transforms undone (``buf`` itself without any)."""
        if not (descriptors := span.info.transform_descriptors):
            return buf
        read, fqn = span.reads[0], span.reads[0].storage_index.fqn
        try:
            stream = transform_load_stream(
                read, descriptors, io.BytesIO(buf), self.reader.extension_registry
            )
        except ValueError as exc:  # a descriptor the registry does not know, or cannot serve
            raise self._error(
                ConfigError,
                f"{fqn}: saved through stream transforms {list(descriptors)}, which this reader "
                f"cannot undo ({exc}). Install what the extension needs (ZStandard: the "
                "zstandard package), or pass _extension_registry= with its class registered "
                "(ExtensionRegistry().register(cls))",
                key,
            ) from exc
        try:
            return cast(bytes, stream.read(-1))
        except Exception as exc:
            raise self._error(
                CorruptCheckpointError,
                f"{fqn}: cannot undo its stream transforms {list(descriptors)} "
                f"({type(exc).__name__}: {exc}); the stored bytes are damaged. Load an "
                "earlier checkpoint",
                key,
            ) from exc

    def _decode_tensor(self, buf: bytes | memoryview, span: ItemSpan, key: str) -> torch.Tensor:
        """``buf``, an item's bytes with its transforms undone, as the saved tensor."""
        read, layout = span.reads[0], self._layout(span)
        if layout is not None:
            dtype, sizes, at = layout
            numel = math.prod(sizes)
            if numel == 0:
                return torch.empty(tuple(sizes), dtype=dtype)
            nbytes = numel * dtype.itemsize
            self._check_framing(buf[:at], buf[at + nbytes :], nbytes, key, read.storage_index.fqn)
            return torch.frombuffer(buf, dtype=dtype, count=numel, offset=at).view(tuple(sizes))
        try:
            loaded = torch.load(io.BytesIO(buf), map_location="cpu", weights_only=True)
            return cast(torch.Tensor, loaded)
        except Exception as exc:
            raise self._error(
                CorruptCheckpointError,
                f"{read.storage_index.fqn}: cannot decode the saved tensor ({type(exc).__name__}: "
                f"{exc})",
                key,
            ) from exc
