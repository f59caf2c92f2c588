"""The write side of one object: :class:`ObjectSink`, the stream ``torch.save`` writes an
object's items into, cut into parts for the :class:`~s3ckpt._transfer.Uploader`, and the
CRC32C of each item it brackets (:class:`ItemCrc`).

CPU on the writing thread is the save's critical path (it serialises every item), so the
sink keeps off it what can run elsewhere: a large tensor's whole parts are sent from the
tensor's own memory (no copy), their CRC32C is computed by the upload thread once for both
the part's checksum and the item's (:class:`PartCrc`, combined into the item's by
:func:`s3ckpt._crc.crc32c_combine` when the save has finished sending), and the object's
multipart upload is created in the background.

With it, the pure planning helpers of both directions: :func:`pack` (items into objects of
balanced size, for the writer) and :func:`coalesce` (byte ranges into ranged requests, for
the :class:`~s3ckpt._transfer.RangeWalk`).
"""

from __future__ import annotations

import ctypes
import heapq
import io
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from s3ckpt import _crc
from s3ckpt.config import MiB
from s3ckpt.store.base import CompletedPart

__all__ = [
    "MIN_READ_PIECE", "ItemCrc", "ObjectSink", "PartCrc", "Request", "coalesce", "pack",
    "read_piece_size",
]


T = TypeVar("T")

MIN_READ_PIECE = 8 * MiB
# The smallest ranged GET a load cuts a large item into: S3's guidance (8-16 MB byte-range
# fetches); below it a request's time to first byte (~30 ms) costs more than a connection more
# earns.

READS_PER_CONNECTION = 2
# Ranged GETs per connection a load aims for: enough that a slow request leaves no
# connection idle for long, few enough that each request is long next to its first byte.


def read_piece_size(total: int, connections: int, *, ceiling: int) -> int:
    """The most bytes one ranged GET of a load reads: ``total`` (the bytes to load) spread
    over :data:`READS_PER_CONNECTION` requests per connection, rounded up to a MiB, within
    :data:`MIN_READ_PIECE` .. ``ceiling`` (``TransferConfig.read_request_size``).

    S3 gives one connection about 85 MB/s whatever the object, so the load's speed is the
    connections kept busy: 1 GiB on 14 connections reads in 37 MiB pieces (28 GETs, two
    rounds; the first byte's ~30 ms is 7 % of each), where one GET per 192 MiB tensor kept
    five busy."""
    want = -(-total // (connections * READS_PER_CONNECTION))
    want = -(-want // MiB) * MiB
    return max(min(MIN_READ_PIECE, ceiling), min(want, ceiling))


def pack(sizes: Sequence[int], n_bins: int) -> list[list[int]]:
    """Split item indices into ``n_bins`` bins of near-equal total size.

    Largest first into the lightest bin (LPT); within a bin, indices keep their original
    order so related items (a module's parameters) stay adjacent. Empty bins are dropped.
    """
    heap: list[tuple[int, int]] = [(0, b) for b in range(n_bins)]
    bins: list[list[int]] = [[] for _ in range(n_bins)]
    for idx in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        load, b = heapq.heappop(heap)
        bins[b].append(idx)
        heapq.heappush(heap, (load + sizes[idx], b))
    return [sorted(b) for b in bins if b]


@dataclass(slots=True)
class Request(Generic[T]):
    """One ranged GET covering ``[start, end)`` and the spans inside it, sorted."""

    start: int
    end: int
    spans: list[tuple[int, int, T]] = field(default_factory=list)

    @property
    def size(self) -> int:
        """Bytes the request transfers (gaps included)."""
        return self.end - self.start


def coalesce(spans: Sequence[tuple[int, int, T]], gap: int, max_size: int) -> list[Request[T]]:
    """Merge byte ranges ``(start, end, payload)`` of one object into requests.

    Adjacent or overlapping ranges, or ranges at most ``gap`` bytes apart, share a
    request while the request stays within ``max_size`` bytes; a single range larger
    than ``max_size`` gets a request of its own. Every input span appears in exactly one
    request, in start order.
    """
    out: list[Request[T]] = []
    for start, end, payload in sorted(spans, key=lambda s: (s[0], s[1])):
        if end < start:
            raise ValueError(f"bad range [{start}, {end})")
        cur = out[-1] if out else None
        if cur is not None and start <= cur.end + gap and max(end, cur.end) - cur.start <= max_size:
            cur.end = max(cur.end, end)
            cur.spans.append((start, end, payload))
        else:
            out.append(Request(start, end, [(start, end, payload)]))
    return out


class PartCrc:
    """The CRC32C of one part, set by the thread that uploads it (before the request)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: int | None = None


class ItemCrc:
    """An item's CRC32C from its pieces in order: ``(crc, length)``, where a part sent from
    the item's own memory has its :class:`PartCrc` (filled by its upload thread)."""

    __slots__ = ("_pieces",)

    def __init__(self, pieces: Sequence[tuple[int | PartCrc, int]]) -> None:
        self._pieces = tuple(pieces)

    def value(self) -> int:
        """The item's CRC32C; every part of it must have been sent."""
        total = 0
        for crc, length in self._pieces:
            if isinstance(crc, PartCrc):
                if crc.value is None:
                    raise RuntimeError("an item's CRC32C was read before its parts were sent")
                crc = crc.value
            total = _crc.crc32c_combine(total, crc, length)
        return total


class _PyBuffer(ctypes.Structure):
    """CPython's ``Py_buffer`` (the buffer protocol's view), to read a buffer's address."""

    _fields_ = (
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len_itemsize", ctypes.c_ssize_t * 2),
        ("readonly_ndim", ctypes.c_int * 2),
        ("format_shape_strides_suboffsets_internal", ctypes.c_void_p * 5),
    )


# Prototypes of our own: argtypes set on ctypes.pythonapi's would change them process-wide.
_get_buffer = ctypes.PYFUNCTYPE(
    ctypes.c_int, ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int
)(("PyObject_GetBuffer", ctypes.pythonapi))
_release_buffer = ctypes.PYFUNCTYPE(None, ctypes.POINTER(_PyBuffer))(
    ("PyBuffer_Release", ctypes.pythonapi)
)
_PYBUF_SIMPLE = 0  # a contiguous buffer of bytes, read-only allowed


def _address(view: memoryview) -> int:
    """The address of the first byte of a C-contiguous ``view`` (0 for an empty one).

    Read through the buffer protocol, so read-only buffers (``bytes``, a read-only mmap)
    work as well as writable ones.
    """
    if not view.nbytes:
        return 0
    buf = _PyBuffer()
    # PyObject_GetBuffer raises (through ctypes.pythonapi) for a non-contiguous view.
    _get_buffer(view, ctypes.byref(buf), _PYBUF_SIMPLE)
    try:
        return buf.buf or 0
    finally:
        _release_buffer(ctypes.byref(buf))


class ObjectSink(io.RawIOBase):
    """A write-only stream uploading one object in parts; ``torch.save`` writes into it.

    Tracks CRC32C of the current *item* (a byte range the caller brackets with
    :meth:`begin_item` / :meth:`end_item`) and where a watched buffer (a tensor's storage)
    lands in the object.

    Bytes are copied into the uploader's part buffers, except a watched buffer of at least
    one part whose owner the caller hands over (``hold``): after topping up the current
    part, whole parts of it are uploaded straight from its memory, without a copy, and
    ``hold`` is kept alive until each of those parts is sent. The caller must not change
    that memory until the upload finishes (``dcp.save`` blocks its caller; an async save
    writes from its own staged copy). The CRC32C of such a part is computed once, by the
    thread that uploads it, and serves both the part's checksum and the item's: the
    item's CRC is then an :class:`ItemCrc`, whole once the uploader finished.

    The object's multipart upload is created in the background when its first part is
    sent (:meth:`Uploader.begin_upload`): the writer goes on filling the next part instead
    of waiting for CreateMultipartUpload's round trip.
    """

    def __init__(self, uploader: Any, key: str) -> None:
        """``uploader``: the :class:`~s3ckpt._transfer.Uploader` that sends its parts."""
        super().__init__()
        self._up, self.key = uploader, key
        self._buf: bytearray | None = None
        self._buf_view = memoryview(b"")
        self._fill = self._pos = self._part_no = 0
        self._cap = 0  # where the current buffer's part is cut (Uploader.next_part_size)
        self._upload: Future[str] | None = None
        self._parts: list[Future[CompletedPart]] = []
        # _item_run: bytes folded into _item_crc since the item's last borrowed part;
        # _crc_from: offset in the current buffer where the item's unfolded bytes start.
        self._item_crc = self._item_run = self._crc_from = 0
        self._item_pieces: list[tuple[int | PartCrc, int]] = []
        self._in_item = False
        self._watch: tuple[int, int] | None = None
        self._watch_pos: int | None = None
        self._hold: object | None = None
        self.completion: Future[Any] | None = None

    # io.RawIOBase protocol
    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._pos

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        n = view.nbytes
        watch = self._watch
        if (
            watch is not None
            and n == watch[1]
            and self._watch_pos is None
            and _address(view) == watch[0]
        ):
            self._watch_pos = self._pos
            if self._hold is not None and n >= self._up.part_size:
                self._write_borrowed(view, self._hold)
                self._pos += n
                return n
        fill = self._fill
        if self._buf is not None and n < self._cap - fill:
            # The common case (torch's zip writer makes ~40 small writes per item): one copy,
            # no part boundary. The item CRC is folded later over the buffer, in one call per
            # item or part instead of one per write.
            self._buf_view[fill : fill + n] = view
            self._fill = fill + n
        else:
            self._copy(view)
        self._pos += n
        return n

    def _copy(self, view: memoryview) -> None:
        """Copy ``view`` into part buffers, flushing each one that fills."""
        n = view.nbytes
        off = 0
        while off < n:
            if self._buf is None:
                self._buf = self._up.take_buffer()
                self._buf_view = memoryview(self._buf)
                self._fill = self._crc_from = 0
                self._cap = self._up.next_part_size(self._part_no)
            take = min(n - off, self._cap - self._fill)
            # Through a memoryview: ``bytearray[a:b] = view`` first copies ``view`` into a
            # temporary bytearray (CPython), a second copy of every byte saved into freshly
            # allocated (page-faulting) memory.
            self._buf_view[self._fill : self._fill + take] = view[off : off + take]
            self._fill += take
            off += take
            if self._fill == self._cap:
                self._flush_part()

    def _write_borrowed(self, view: memoryview, hold: object) -> None:
        """Upload whole parts of ``view`` from its own memory (see the class docs)."""
        n = view.nbytes
        off = 0
        if self._buf is not None and self._fill:
            off = self._cap - self._fill  # top up the current part first
            self._copy(view[:off])
        while n - off >= (size := self._up.next_part_size(self._part_no)):
            segment = view[off : off + size]
            crc = PartCrc()
            if self._in_item:
                self._fold_crc()
                self._item_pieces += [(self._item_crc, self._item_run), (crc, size)]
                self._item_crc = self._item_run = 0
            self._submit_part(segment, hold=hold, crc=crc)
            off += size
        if off < n:
            self._copy(view[off:])

    def _fold_crc(self) -> None:
        """Add the item's bytes written into the current buffer since the last fold."""
        if self._in_item and self._fill > self._crc_from:
            pending = self._buf_view[self._crc_from : self._fill]
            self._item_crc = _crc.crc32c(pending, self._item_crc)
            self._item_run += self._fill - self._crc_from
        self._crc_from = self._fill

    # item bracketing
    def begin_item(
        self, watch_ptr: int | None = None, watch_nbytes: int = 0, hold: object | None = None
    ) -> int:
        """Start an item at the current offset; optionally watch for a buffer at
        ``watch_ptr`` of ``watch_nbytes`` bytes being written, which may be uploaded from
        its own memory if ``hold`` (the object owning it) is given. Returns the offset."""
        self._item_crc = self._item_run = 0
        self._item_pieces, self._in_item, self._crc_from = [], True, self._fill
        self._watch = (watch_ptr, watch_nbytes) if watch_ptr else None
        self._watch_pos, self._hold = None, hold if watch_ptr else None
        return self._pos

    def end_item(self) -> tuple[ItemCrc, int | None]:
        """CRC32C of the item's bytes (an :class:`ItemCrc`: read :meth:`ItemCrc.value`
        once the uploader finished) and the offset of the watched buffer (or None)."""
        self._fold_crc()
        self._in_item, self._watch, self._hold = False, None, None
        return ItemCrc([*self._item_pieces, (self._item_crc, self._item_run)]), self._watch_pos

    # parts
    def _flush_part(self) -> None:
        self._fold_crc()
        buf, fill = self._buf, self._fill
        assert buf is not None
        self._buf, self._buf_view, self._fill = None, memoryview(b""), 0
        self._submit_part(memoryview(buf)[:fill], buffer=buf)

    def begin(self) -> None:
        """Create the object's multipart upload now (in the background), not at its first
        part: the object will not fit one buffer."""
        if self._upload is None:
            self._upload = self._up.begin_upload(self.key)

    def _submit_part(
        self,
        body: memoryview,
        *,
        buffer: bytearray | None = None,
        hold: object | None = None,
        crc: PartCrc | None = None,
    ) -> None:
        """Upload ``body`` as the next part; ``buffer`` goes back to the pool afterwards."""
        self.begin()
        self._part_no += 1
        self._parts.append(
            self._up.send_part(
                self.key, self._upload, self._part_no, body, buffer=buffer, hold=hold, crc=crc
            )
        )

    def close(self) -> None:
        """Finish the object: one PUT if it fit in a buffer, else the last part and a
        background CompleteMultipartUpload."""
        if self.closed:
            return
        super().close()
        self._buf_view = memoryview(b"")
        up = self._up
        up.raise_if_failed()
        if self._upload is None:
            self.completion, self._buf = up.send_object(self.key, self._buf, self._fill), None
            return
        if self._fill:
            self._flush_part()
        elif self._buf is not None:
            up.give_buffer(self._buf)
            self._buf = None
        self.completion = up.send_complete(self.key, self._upload, list(self._parts))
