"""``torch.save`` of one DCP item, without the zip CRC-32 that nothing checks.

``torch.save`` writes a zip archive and by default computes a CRC-32 over every record,
the tensor bytes included: a full pass over the data (about as costly as copying it) on
the thread that blocks ``dcp.save``. ``torch.load`` never verifies those CRCs (a changed
byte loads silently; see ``tests/unit/test_serialize.py``), whereas s3ckpt records a
CRC32C of every item's bytes, headers and tensor data alike, and verifies it on load. So
the writer builds torch's own zip writer with ``compute_crc32=False``: the bytes are the
same format and length, stock readers (``torch.load``, DCP's ``FsspecReader``,
s3torchconnector) load them unchanged; only the CRC fields are zero.

That needs two private torch names (``torch._C.PyTorchFileWriter`` and
``torch.serialization._save``). They are probed once, by a round trip through
``torch.load``; on a torch where they differ the writer falls back to plain
``torch.save``. ``torch.serialization.set_crc32_options`` is not used because it is
process-wide: flipping it would change other threads' ``torch.save`` output.

:func:`write_item` writes one DCP item (a tensor or a bytes item) into the object's
sink, through the writer's stream transforms (``_extensions``, as torch's
``FileSystemWriter`` takes them: ``ZStandard`` compression, ...) when it has any. A
transformed item's stored bytes are not the tensor's bytes: it is never uploaded from the
tensor's memory and records no ``data_offset``, so readers decode it whole (its CRC32C
is over the bytes stored, as every item's).

:class:`Framings` keeps the writing thread off torch's serialiser for most tensors: the
bytes ``torch.save`` writes around a tensor's storage (zip headers, the pickle, the
directory) depend only on the tensor's signature (dtype, shape, strides, storage size), not
on its values. The first tensor of a signature is serialised by torch and its output cut
into the framing before and after the storage bytes; every later tensor of that signature
is written as framing, its own bytes, framing: byte for byte what torch would write
(``tests/unit/test_serialize.py`` proves it over dtypes and shapes), at a few
microseconds instead of a quarter millisecond of pickling per item. A tensor whose
signature is unusual (a subclass, a non-strided layout, conjugate or negative bits,
tensor metadata, names) is serialised by torch every time.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import pickle
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.checkpoint.planner import SavePlanner, WriteItem, WriteItemType

from s3ckpt._transfer._sink import _address
from s3ckpt.dcp._finish import S3StorageInfo
from s3ckpt.errors import ConfigError

if TYPE_CHECKING:
    from s3ckpt._transfer import ItemCrc, ObjectSink
    from s3ckpt.dcp._torch import StreamTransformExtension

__all__ = [
    "Framings",
    "check_extensions",
    "estimate_size",
    "fast_path_available",
    "save_item",
    "write_item",
]

# torch.save framing around a tensor's bytes is ~1.5 KiB; used only to size objects.
_ITEM_OVERHEAD = 2048
# A framed tensor smaller than this is joined with its framing and written at once.
_JOIN_BELOW = 64 * 1024


def _save_without_crc(obj: Any, f: Any) -> None:
    ser: Any = torch.serialization
    writer = torch._C.PyTorchFileWriter(f, False, ser._get_storage_alignment())
    try:
        ser._save(obj, writer, pickle, ser.DEFAULT_PROTOCOL, False)
    except BaseException:
        # As torch.save's context manager does: finishing the archive marks the writer
        # finalized even if it fails. Otherwise its C++ destructor finishes it later, in
        # whatever thread collects it, calls ``f.write`` again, and a second failure
        # there aborts the process (std::terminate; pytorch#87997).
        with contextlib.suppress(Exception):
            writer.write_end_of_file()
        raise
    writer.write_end_of_file()


@functools.cache
def fast_path_available() -> bool:
    """Whether this torch lets items be written without the zip CRC-32 (probed once)."""
    try:
        sample = torch.arange(17, dtype=torch.float32)
        ours, stock = io.BytesIO(), io.BytesIO()
        _save_without_crc(sample, ours)
        torch.save(sample, stock)
        back = torch.load(io.BytesIO(ours.getvalue()), weights_only=True)
        return len(ours.getvalue()) == len(stock.getvalue()) and torch.equal(back, sample)
    except Exception:  # any change in the private API (a non-tensor back too): torch.save
        return False


def save_item(obj: Any, f: Any) -> None:
    """Serialise ``obj`` into the file-like ``f`` exactly as ``torch.save`` would, minus
    the zip CRC-32 where this torch allows it."""
    (_save_without_crc if fast_path_available() else torch.save)(obj, f)


class _Capture(io.RawIOBase):
    """What torch writes for one tensor, with the write of its storage left out."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        super().__init__()
        self.ptr, self.nbytes = ptr, nbytes
        self.before: list[bytes] = []
        self.after: list[bytes] | None = None

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        if self.after is None and view.nbytes == self.nbytes and _address(view) == self.ptr:
            self.after = []
        else:
            (self.before if self.after is None else self.after).append(bytes(view))
        return view.nbytes


def _signature(tensor: torch.Tensor) -> tuple[Any, ...] | None:
    """What torch's framing of ``tensor`` depends on; None where it may depend on more."""
    if (
        type(tensor) is not torch.Tensor
        or tensor.layout != torch.strided
        or tensor.is_quantized
        or tensor.requires_grad
        or tensor.is_conj()
        or tensor.is_neg()
        or any(n is not None for n in getattr(tensor, "names", ()))
        or tensor.storage_offset()
        or not tensor.numel()
        or getattr(torch._utils, "get_tensor_metadata", lambda _: True)(tensor)
    ):
        return None
    return (tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()))


class Framings:
    """torch.save's framing of a tensor per signature (see the module docs); one per save.

    At most ``limit`` signatures are kept (a state dict of more distinct shapes serialises
    the rest through torch), so memory stays a few MiB whatever the state dict."""

    def __init__(self, limit: int = 4096) -> None:
        self._cut: dict[tuple[Any, ...], tuple[bytes, bytes] | None] = {}
        self._limit = limit

    def get(self, tensor: torch.Tensor) -> tuple[bytes, bytes] | None:
        """The bytes before and after ``tensor``'s storage (a CPU tensor whose storage
        holds exactly its bytes, :func:`_tensor_for_save`), or None: serialise it whole."""
        # Without the fast path, torch.save's CRC-32 fields depend on the values.
        if not fast_path_available() or (key := _signature(tensor)) is None:
            return None
        if key in self._cut:
            return self._cut[key]
        capture = _Capture(tensor.data_ptr(), tensor.untyped_storage().nbytes())
        _save_without_crc(tensor, capture)
        cut = None if capture.after is None else (b"".join(capture.before), b"".join(capture.after))
        if len(self._cut) < self._limit:
            self._cut[key] = cut
        return cut


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    """``tensor``'s bytes (contiguous, on the CPU) as a view of its own memory."""
    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy())


# --- one DCP item into an object's sink ------------------------------------------------


def check_extensions(extensions: Sequence[Any] | None) -> tuple[StreamTransformExtension, ...]:
    """The writer's ``_extensions`` as a tuple: at most one, a stream transform
    (``transform_to`` and ``get_descriptor``, as torch's ``StreamTransformExtension``).

    Two or more are refused: torch 2.13 chains them on write so that the last one listed
    runs first, and its reader undoes them in the same order (not the reverse), so a
    checkpoint of two transforms that do not commute (``Rot13Example`` and ``ZStandard``)
    loads with no reader, stock or s3ckpt."""
    out = tuple(extensions or ())
    if len(out) > 1:
        raise ConfigError(
            f"_extensions holds {len(out)} stream transforms; pass at most one: torch's "
            "readers undo several in the order they were applied, not the reverse, so the "
            "checkpoint would not load (see docs/dcp.md, 'Stream transforms')"
        )
    for ext in out:
        if not all(callable(getattr(ext, n, None)) for n in ("transform_to", "get_descriptor")):
            raise ConfigError(
                f"_extensions holds {ext!r}, which is not a stream transform; pass instances of "
                "torch.distributed.checkpoint._extension.StreamTransformExtension (e.g. "
                "ZStandard())"
            )
    return out


class _Unclosed(io.RawIOBase):
    """The object's sink as the innermost transform sees it: closing the transforms
    finishes the item's stream (ZStandard ends its frame) and leaves the object open for the
    next item. After a failure it takes nothing more (a transform collected later that
    flushes must not write into a dead upload)."""

    def __init__(self, raw: Any) -> None:
        super().__init__()
        self.raw: Any = raw

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        if self.raw is None:
            raise ValueError("the item's stream was abandoned")
        return self.raw.write(b)

    def close(self) -> None:
        self.raw = None
        super().close()


@contextlib.contextmanager
def _through(sink: Any, extensions: Sequence[StreamTransformExtension]) -> Iterator[Any]:
    """``sink``, or the stream that writes into it through ``extensions`` (chained as
    torch's ``_StorageWriterTransforms`` chains them); the transforms are closed (flushed
    into ``sink``) when the item is written."""
    if not extensions:
        yield sink
        return
    inner = _Unclosed(sink)
    out: Any = functools.reduce(lambda stream, ext: ext.transform_to(stream), extensions, inner)
    try:
        yield out
    except BaseException:
        inner.close()
        raise
    out.close()


def _tensor_for_save(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU tensor whose storage holds exactly its bytes (torch.save writes whole storages)."""
    t = tensor.detach().to("cpu").contiguous()  # each returns the tensor itself when it is so
    return t if t.untyped_storage().nbytes() == t.numel() * t.element_size() else t.clone()


def estimate_size(item: WriteItem) -> int:
    """About how many bytes ``item`` stores (untransformed): to size the objects."""
    if item.type == WriteItemType.BYTE_IO or item.tensor_data is None:
        return _ITEM_OVERHEAD
    data = item.tensor_data
    return math.prod(data.size) * data.properties.dtype.itemsize + _ITEM_OVERHEAD


def write_item(
    sink: ObjectSink,
    planner: SavePlanner,
    item: WriteItem,
    name: str,
    rank: int,
    extensions: Sequence[StreamTransformExtension] = (),
    framings: Framings | None = None,
) -> tuple[S3StorageInfo, ItemCrc]:
    """Write ``item`` into ``sink`` (object ``name``), through ``extensions`` (a tensor's
    framing from ``framings`` where it has one): its storage info and its CRC32C (whole
    once the uploader finished: the upload threads compute the parts sent from a tensor's
    own memory)."""
    data = planner.resolve_data(item)
    if item.type == WriteItemType.BYTE_IO:
        start = sink.begin_item()
        with _through(sink, extensions) as out:
            out.write(data.getbuffer() if isinstance(data, io.BytesIO) else data)
        crc, data_offset = sink.end_item()
    else:
        tensor = _tensor_for_save(data)
        nbytes = tensor.numel() * tensor.element_size()
        # A tensor that is the caller's own memory (no device copy, no contiguous copy)
        # may be uploaded from that memory: the caller is blocked in dcp.save (or this is
        # an async save's staged copy) until write_data returns, which waits for every
        # part. A copy made here goes through the part buffers like any other bytes, so
        # memory stays bounded by the pool. A transformed tensor is not stored as its
        # bytes: nothing is watched, so no data_offset is recorded.
        own = tensor.data_ptr() == data.data_ptr() and data.device.type == "cpu"
        watch = tensor.data_ptr() if nbytes and not extensions else None
        start = sink.begin_item(watch, nbytes, hold=tensor if own else None)
        framing = framings.get(tensor) if framings is not None and not extensions else None
        if framing is not None:
            parts = (framing[0], _bytes_of(tensor), framing[1])
            # A small tensor is joined with its framing: one write, not three.
            for part in (b"".join(parts),) if nbytes < _JOIN_BELOW else parts:
                sink.write(part)
        else:
            with _through(sink, extensions) as out:
                save_item(tensor, out)
        crc, data_offset = sink.end_item()
        if framing is not None:
            data_offset = start + len(framing[0])
    info = S3StorageInfo(
        relative_path=name,
        offset=start,
        length=sink.tell() - start,
        # Left out without any transforms, as torch does.
        transform_descriptors=[ext.get_descriptor() for ext in reversed(extensions)] or None,
        data_offset=None if data_offset is None else data_offset - start,
        rank=rank,
    )
    return info, crc
