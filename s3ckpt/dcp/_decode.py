"""The span decoder: a load plan's stored items as spans, and each span's bytes decoded into
the planner's items, checked.

A span (:class:`ItemSpan`) is one stored item, a byte range of an object as ``.metadata``
places it, with every read item that needs it (two destination shards may read one saved
chunk: it is read once and copied into both). :class:`SpanDecoder` makes the spans of a
plan (:meth:`~SpanDecoder.group`, each checked against its ``s3ckpt.json`` row) and turns
the bytes of one span into the planner's items (:meth:`~SpanDecoder.decode`), from any
:class:`ByteSource`: a ranged GET of a direct read (:class:`~s3ckpt.transfer.SpanReader`,
:mod:`s3ckpt.dcp.reader`) or the fan-out stream (:mod:`s3ckpt.dcp._fanout`). One decoder
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
import threading
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem

from s3ckpt.dcp._safe import (
    SAFE_GLOBALS,
    SafeGlobal,
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
from s3ckpt.uri import StoreURL

if TYPE_CHECKING:
    from s3ckpt.dcp._torch import ExtensionRegistry

__all__ = [
    "ByteSource",
    "DirectTarget",
    "ItemKey",
    "ItemSpan",
    "SpanDecoder",
    "SpansByObject",
    "item_key",
]

ItemKey = tuple[str, tuple[int, ...] | None]
"""A stored item by ``(fqn, chunk offsets)``: how ``s3ckpt.json`` rows and saved chunks are
looked up (``None`` offsets for a non-tensor item)."""


def item_key(index: MetadataIndex) -> ItemKey:
    """The :data:`ItemKey` of a plan item's ``storage_index``."""
    return (index.fqn, tuple(index.offset) if index.offset is not None else None)


class ByteSource(Protocol):
    """What a span is decoded from: a ranged GET (:class:`~s3ckpt.transfer.SpanReader`) or
    the fan-out stream."""

    def readinto_all(self, view: memoryview, what: str, crc: int = 0) -> int:
        """Fill ``view`` with the span's next bytes; their CRC32C continued from ``crc``."""
        ...


@dataclass
class ItemSpan:
    """One stored item (a byte range of an object) and every read item that needs it."""

    info: StorageInfo
    record: ItemRecord | None
    reads: list[ReadItem] = field(default_factory=list)


@dataclass(frozen=True)
class DirectTarget:
    """A tensor item streamed straight into its destination: ``head_len`` bytes of framing,
    ``nbytes`` of tensor data (into ``tensor``'s memory), ``tail_len`` of framing."""

    tensor: torch.Tensor
    head_len: int
    nbytes: int
    tail_len: int

    def data(self) -> memoryview:
        """The destination's bytes, writable."""
        return memoryview(self.tensor.view(-1).view(torch.uint8).numpy())


SpansByObject = dict[str, dict[tuple[int, int], ItemSpan]]
"""A plan's spans: by object name (``.metadata``'s), then by ``(offset, length)``."""


@dataclass(frozen=True)
class SpanDecoder:
    """One load's spans and their decoding on one rank (see the module docs).

    Attributes:
        url: The checkpoint (names the marker and ``.metadata`` in errors).
        bucket: The store's bucket, for errors.
        rank: This rank, for errors.
        storage_data: ``.metadata``'s storage records, by plan index.
        manifest: The committed ``s3ckpt.json``; ``None`` for other writers (no checksums).
        records: The manifest's rows by :data:`ItemKey`.
        chunks: Saved tensor chunks' ``(dtype, shape)`` by :data:`ItemKey`.
        verify_checksums: Check each item's CRC32C against its row.
        allow_unsafe_pickle: Skip the safe loader for non-tensor items.
        safe_globals: The reader's own globals, on top of :data:`~s3ckpt.dcp.SAFE_GLOBALS`.
        recorder: The load's metrics recorder (checksum failures are counted there).
        extension_registry: Where stream transforms are looked up (``None``: torch's
            default registry).
    """

    url: StoreURL
    bucket: str
    rank: int
    storage_data: Mapping[MetadataIndex, StorageInfo]
    manifest: Manifest | None
    records: Mapping[ItemKey, ItemRecord]
    chunks: Mapping[ItemKey, tuple[torch.dtype, torch.Size]]
    verify_checksums: bool
    allow_unsafe_pickle: bool
    safe_globals: Sequence[SafeGlobal]
    recorder: instrument.Recorder | None
    extension_registry: ExtensionRegistry | None = None

    # -- a plan as spans ----------------------------------------------------------------------
    def group(self, plan: LoadPlan) -> SpansByObject:
        """The plan's stored items by object, each checked against its manifest row."""
        per_object: SpansByObject = defaultdict(dict)
        for read in plan.items:
            info = self.storage_data.get(read.storage_index)
            if info is None:
                raise CorruptCheckpointError(
                    f"{read.storage_index.fqn} is in the plan but not in .metadata",
                    bucket=self.bucket,
                    key=self.url.key(METADATA_NAME),
                    rank=self.rank,
                )
            spans = per_object[info.relative_path]
            span = spans.get((info.offset, info.length))
            if span is None:
                record = self.records.get(item_key(read.storage_index))
                if self.manifest is not None and record is None and self.verify_checksums:
                    raise CorruptCheckpointError(
                        f"{read.storage_index.fqn} is not recorded in {MANIFEST_NAME}",
                        bucket=self.bucket,
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
                        bucket=self.bucket,
                        key=self.url.key(MANIFEST_NAME),
                        rank=self.rank,
                    )
                span = spans[(info.offset, info.length)] = ItemSpan(info, record)
            span.reads.append(read)
        return per_object

    # -- a span's bytes into the planner ----------------------------------------------------
    def decode(
        self,
        source: ByteSource,
        key: str,
        span: ItemSpan,
        planner: LoadPlanner,
        lock: threading.Lock,
    ) -> None:
        """Read ``span`` (of object ``key``) from ``source`` into ``planner``'s items, checked;
        ``lock`` guards the planner (spans are decoded on several threads)."""
        fqn = span.reads[0].storage_index.fqn
        direct = self.direct(span, key, planner, lock)
        if direct is not None:
            head, tail = bytearray(direct.head_len), bytearray(direct.tail_len)
            crc = source.readinto_all(memoryview(head), fqn, 0)
            if direct.nbytes:
                crc = source.readinto_all(direct.data(), fqn, crc)
            crc = source.readinto_all(memoryview(tail), fqn, crc)
            self.finish_direct(span, key, direct, head, tail, crc, planner, lock)
            return
        buf = bytearray(span.info.length)
        crc = source.readinto_all(memoryview(buf), fqn, 0)
        self.decode_buffer(span, key, buf, crc, planner, lock)

    def direct(
        self, span: ItemSpan, key: str, planner: LoadPlanner, lock: threading.Lock
    ) -> DirectTarget | None:
        """Where ``span``'s bytes land when its tensor streams straight into the destination
        (see the module docs), or None when the item must be read whole and decoded."""
        record = span.record
        target = self._direct_target(span, planner, lock)
        if target is None or record is None or record.data_offset is None:
            return None
        nbytes = target.numel() * target.element_size()
        tail_len = span.info.length - record.data_offset - nbytes
        if tail_len < 0:
            raise CorruptCheckpointError(
                f"{span.reads[0].storage_index.fqn}: {MANIFEST_NAME} places {nbytes} tensor "
                "bytes past the item's end",
                bucket=self.bucket,
                key=key,
                rank=self.rank,
            )
        return DirectTarget(target, record.data_offset, nbytes, tail_len)

    def finish_direct(
        self,
        span: ItemSpan,
        key: str,
        direct: DirectTarget,
        head: Any,
        tail: Any,
        crc: int,
        planner: LoadPlanner,
        lock: threading.Lock,
    ) -> None:
        """Check a directly streamed item (its CRC32C ``crc``, its framing ``head`` and
        ``tail``) and commit its tensor."""
        assert span.record is not None  # direct() needs the record
        fqn = span.reads[0].storage_index.fqn
        self._check(crc, span.record, key, fqn)
        self._check_framing(head, tail, direct.nbytes, key, fqn)
        with lock:
            planner.commit_tensor(span.reads[0], direct.tensor)

    def decode_buffer(
        self,
        span: ItemSpan,
        key: str,
        buf: bytearray,
        crc: int,
        planner: LoadPlanner,
        lock: threading.Lock,
    ) -> None:
        """Check and decode an item read whole into ``buf`` (``crc``: its CRC32C) into
        every read item that needs it."""
        record = span.record
        fqn = span.reads[0].storage_index.fqn
        if record is not None:
            self._check(crc, record, key, fqn)
        data = self.untransform(span, key, buf)
        first = span.reads[0]
        if first.type == LoadItemType.BYTE_IO:
            self._check_safe(data, key, fqn)
            for read in span.reads:
                with lock:
                    planner.load_bytes(read, io.BytesIO(data))
            return
        tensor = self._decode_tensor(data, span, key)
        for read in span.reads:
            piece = _narrow(tensor, read.storage_offsets, read.lengths)
            with lock:
                dest = planner.resolve_tensor(read).detach()
            if dest.size() != piece.size():  # a planner that skipped torch's size check
                shape = (tuple(piece.size()), tuple(dest.size()))
                raise StateMismatchError(
                    f"{read.storage_index.fqn}: saved as {shape[0]}, destination {shape[1]}: "
                    "the checkpoint does not fit the state dict. Load one saved from this model",
                    bucket=self.bucket,
                    key=key,
                    rank=self.rank,
                    shapes={read.storage_index.fqn: shape},
                )
            dest.copy_(piece)
            with lock:
                planner.commit_tensor(read, dest)

    def _direct_target(
        self, span: ItemSpan, planner: LoadPlanner, lock: threading.Lock
    ) -> torch.Tensor | None:
        """The destination tensor if the saved bytes can stream straight into it."""
        if len(span.reads) != 1 or span.info.transform_descriptors:
            return None
        read = span.reads[0]
        if read.type != LoadItemType.TENSOR:
            return None
        chunk = self.chunks.get(item_key(read.storage_index))
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

    # -- checks -------------------------------------------------------------------------------
    def _check(self, crc: int, record: ItemRecord, key: str, fqn: str) -> None:
        if self.verify_checksums and crc != record.crc32c:
            instrument.record_checksum_failure(self.recorder)
            raise ChecksumMismatchError(
                f"checksum mismatch in {fqn!r}: crc32c {crc:08x}, recorded {record.crc32c:08x} "
                f"(bytes {record.start}-{record.start + record.length - 1}); the object was "
                "corrupted after it was written. Restore it or load an earlier checkpoint",
                bucket=self.bucket,
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
                bucket=self.bucket,
                key=key,
                rank=self.rank,
            )

    def _check_safe(self, buf: bytes | bytearray, key: str, fqn: str) -> None:
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
                bucket=self.bucket,
                key=key,
                rank=self.rank,
            ) from exc

    def _listed(self) -> str:
        if not self.safe_globals:
            return ""
        return " and safe_globals=[" + ", ".join(map(global_name, self.safe_globals)) + "]"

    # -- a whole item's bytes ----------------------------------------------------------------
    def untransform(self, span: ItemSpan, key: str, buf: bytearray) -> bytes | bytearray:
        """The item's bytes with its stream transforms undone (``buf`` itself without any)."""
        descriptors = span.info.transform_descriptors
        if not descriptors:
            return buf
        read = span.reads[0]
        fqn = read.storage_index.fqn
        try:
            stream = transform_load_stream(
                read, descriptors, io.BytesIO(buf), self.extension_registry
            )
        except ValueError as exc:  # a descriptor the registry does not know, or cannot serve
            raise ConfigError(
                f"{fqn}: saved through stream transforms {list(descriptors)}, which this reader "
                f"cannot undo ({exc}). Install what the extension needs (ZStandard: the "
                "zstandard package), or pass _extension_registry= with its class registered "
                "(ExtensionRegistry().register(cls))",
                bucket=self.bucket,
                key=key,
                rank=self.rank,
            ) from exc
        try:
            return cast(bytes, stream.read(-1))
        except Exception as exc:
            raise CorruptCheckpointError(
                f"{fqn}: cannot undo its stream transforms {list(descriptors)} "
                f"({type(exc).__name__}: {exc}); the stored bytes are damaged. Load an "
                "earlier checkpoint",
                bucket=self.bucket,
                key=key,
                rank=self.rank,
            ) from exc

    def _decode_tensor(self, buf: bytes | bytearray, span: ItemSpan, key: str) -> torch.Tensor:
        """``buf``, an item's bytes with its transforms undone, as the saved tensor."""
        read = span.reads[0]
        record = span.record
        chunk = self.chunks.get(item_key(read.storage_index))
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
        try:
            loaded = torch.load(io.BytesIO(buf), map_location="cpu", weights_only=True)
            return cast(torch.Tensor, loaded)
        except Exception as exc:
            raise CorruptCheckpointError(
                f"{read.storage_index.fqn}: cannot decode the saved tensor ({type(exc).__name__}: "
                f"{exc})",
                bucket=self.bucket,
                key=key,
                rank=self.rank,
            ) from exc


def _narrow(tensor: torch.Tensor, offsets: Any, lengths: Any) -> torch.Tensor:
    for dim, (start, length) in enumerate(zip(offsets, lengths, strict=True)):
        if start != 0 or length != tensor.size(dim):
            tensor = torch.narrow(tensor, dim, start, length)
    return tensor
