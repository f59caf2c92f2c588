"""Streaming uploads with bounded memory.

An :class:`Uploader` owns a :class:`PartPool` of part-sized buffers and a thread pool.
Each object is written through an :class:`ObjectSink` (a write-only stream): bytes are
copied into the current buffer; a full buffer becomes a part uploaded in the background
and the sink takes the next free buffer, blocking while all are in flight. Memory above
the data being saved is therefore ``n_buffers * part_size`` no matter how large the
object is.

Every multipart upload is registered the moment it is created; on any failure
:meth:`Uploader.abort` aborts the open ones and deletes the objects this uploader already
completed, so a failed save leaves nothing behind.
"""

from __future__ import annotations

import ctypes
import io
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from s3ckpt import _crc
from s3ckpt.errors import ObjectNotFoundError, S3CkptError
from s3ckpt.metrics.instrument import in_context
from s3ckpt.store.base import CompletedPart, ObjectStore
from s3ckpt.transfer._pool import PartPool

__all__ = ["ObjectSink", "Uploader", "format_leftovers"]

log = logging.getLogger(__name__)


class _PyBuffer(ctypes.Structure):
    """CPython's ``Py_buffer`` (the buffer protocol's view), to read a buffer's address."""

    _fields_ = (
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_void_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
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


class _Aborted(S3CkptError):
    """Raised inside the uploader once another task failed."""


class Uploader:
    """Uploads many objects of one rank in parallel within a fixed buffer budget.

    Args:
        store: Where to upload.
        part_size: Size of every buffer / multipart part.
        n_buffers: Buffers in the pool: ``TransferConfig.upload_buffers(part_size)``, the one
            place the count is derived (two at least).
        max_concurrency: Upload threads.
        rank: For error messages.
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        part_size: int,
        n_buffers: int,
        max_concurrency: int,
        rank: int | None = None,
    ) -> None:
        self.store = store
        self.part_size = part_size
        self.rank = rank
        self._buffers = PartPool(part_size, max(2, n_buffers))
        self._pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="s3ckpt-up")
        # Completing an object waits on its parts: a separate pool avoids starving them.
        self._completer = ThreadPoolExecutor(2, thread_name_prefix="s3ckpt-complete")
        self._lock = threading.Lock()
        self._open_uploads: dict[str, str] = {}  # key -> upload id
        self._completed: list[str] = []
        self._futures: list[Future[Any]] = []
        self._error: BaseException | None = None
        self.bytes_uploaded = 0

    # -- buffers -------------------------------------------------------------------------
    def take_buffer(self) -> bytearray:
        """A free buffer; blocks while every buffer is in flight (back-pressure), and
        raises the first background failure at once, waiting or not."""
        self.raise_if_failed()
        buf = self._buffers.take()
        if buf is None:
            self.raise_if_failed()
            raise _Aborted("upload buffers closed")  # not reached: a failure closes them
        return buf

    def give_buffer(self, buf: bytearray) -> None:
        """Return a buffer to the pool."""
        self._buffers.give(buf)

    # -- failure handling ------------------------------------------------------------------
    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            if self._error is None:
                self._error = exc
        self._buffers.close_for_failure()

    def raise_if_failed(self) -> None:
        """Re-raise the first failure of any background task."""
        if self._error is not None:
            raise self._error

    def submit(self, fn: Callable[[], Any], *, completer: bool = False) -> Future[Any]:
        """Run ``fn`` in the background, recording its failure."""

        def run() -> Any:
            if self._error is not None:
                raise _Aborted("skipped after an earlier failure")
            try:
                return fn()
            except BaseException as exc:
                self._fail(exc)
                raise

        # in_context: the part's request counts for the save that queued it (metrics).
        fut = (self._completer if completer else self._pool).submit(in_context(run))
        with self._lock:
            self._futures.append(fut)
        return fut

    # -- requests made for sinks -------------------------------------------------------------
    def start_upload(self, key: str) -> str:
        """CreateMultipartUpload for ``key``, registered so it is aborted on failure."""
        upload_id = self.store.create_multipart(key)
        with self._lock:
            self._open_uploads[key] = upload_id
        return upload_id

    def send_part(
        self,
        key: str,
        upload_id: str,
        part_no: int,
        body: memoryview,
        *,
        buffer: bytearray | None = None,
        hold: object | None = None,
    ) -> Future[CompletedPart]:
        """Upload ``body`` as part ``part_no`` in the background, with its CRC32C.

        ``buffer`` (the pool buffer ``body`` lies in) goes back to the pool once the part
        is sent; ``hold`` (the owner of borrowed memory) is kept alive until then.
        """

        def send(_owner: object | None = hold) -> CompletedPart:
            try:
                part = self.store.upload_part(
                    key, upload_id, part_no, body, crc32c=_crc.crc32c(body)
                )
                self._count(body.nbytes)
                return part
            finally:
                if buffer is not None:
                    self.give_buffer(buffer)

        return self.submit(send)

    def send_object(self, key: str, buffer: bytearray | None, size: int) -> Future[None]:
        """PUT the first ``size`` bytes of ``buffer`` (or nothing) as ``key`` in the
        background; ``buffer`` goes back to the pool afterwards."""

        def put() -> None:
            try:
                view = memoryview(buffer)[:size] if buffer is not None else memoryview(b"")
                self.store.put(key, view, crc32c=_crc.crc32c(view))
                self._count(size)
            finally:
                if buffer is not None:
                    self.give_buffer(buffer)
            self._done(key)

        return self.submit(put)

    def send_complete(
        self, key: str, upload_id: str, parts: list[Future[CompletedPart]]
    ) -> Future[None]:
        """CompleteMultipartUpload once every part in ``parts`` is sent (background)."""

        def complete() -> None:
            wait(parts)
            done = []
            for f in parts:
                exc = f.exception()
                if exc is not None:
                    raise exc
                done.append(f.result())
            _complete(self.store, key, upload_id, done)
            self._done(key)

        return self.submit(complete, completer=True)

    def _count(self, nbytes: int) -> None:
        with self._lock:
            self.bytes_uploaded += nbytes

    def _done(self, key: str) -> None:
        """Record a completed object (deleted again if the save fails)."""
        with self._lock:
            self._open_uploads.pop(key, None)
            self._completed.append(key)

    def sink(self, key: str) -> ObjectSink:
        """A stream that uploads to ``key``."""
        return ObjectSink(self, key)

    # -- end ----------------------------------------------------------------------------------
    def finish(self) -> list[str]:
        """Wait for every upload; return the completed keys. Raises the first failure."""
        while True:
            with self._lock:
                pending = [f for f in self._futures if not f.done()]
            if not pending:
                break
            wait(pending)
        self.raise_if_failed()
        self.close()
        return list(self._completed)

    def abort(self) -> list[str]:
        """Stop, abort open uploads, delete completed objects; return keys left behind."""
        self._fail(_Aborted("save aborted"))
        with self._lock:
            futures = list(self._futures)
        for fut in futures:
            fut.cancel()
        wait(futures)
        leftovers: list[str] = []
        with self._lock:
            open_uploads = dict(self._open_uploads)
            completed = list(self._completed)
        for key, upload_id in open_uploads.items():
            try:
                self.store.abort_multipart(key, upload_id)
            except Exception as exc:
                log.error("could not abort multipart upload of %s: %s", key, exc)
                leftovers.append(key)
        if completed:
            try:
                failures = self.store.delete(completed)
                leftovers.extend(f.key for f in failures)
            except Exception as exc:
                log.error("could not delete %d objects of the failed save: %s", len(completed), exc)
                leftovers.extend(completed)
        self.close()
        return leftovers

    def close(self) -> None:
        """Release threads and buffers."""
        self._pool.shutdown(wait=True)
        self._completer.shutdown(wait=True)
        self._buffers.clear()


class ObjectSink(io.RawIOBase):
    """A write-only stream uploading one object in parts; ``torch.save`` writes into it.

    Tracks CRC32C of the current *item* (a byte range the caller brackets with
    :meth:`begin_item` / :meth:`end_item`) and where a watched buffer (a tensor's storage)
    lands in the object.

    Bytes are copied into the uploader's part buffers, except a watched buffer of at least
    two parts whose owner the caller hands over (``hold``): after topping up the current
    part, whole parts of it are uploaded straight from its memory, without a copy, and
    ``hold`` is kept alive until each of those parts is sent. The caller must not change
    that memory until the upload finishes (``dcp.save`` blocks its caller; an async save
    writes from its own staged copy).
    """

    def __init__(self, uploader: Uploader, key: str) -> None:
        super().__init__()
        self._up = uploader
        self.key = key
        self._buf: bytearray | None = None
        self._buf_view = memoryview(b"")
        self._fill = 0
        self._pos = 0
        self._part_no = 0
        self._upload_id: str | None = None
        self._parts: list[Future[CompletedPart]] = []
        self._item_crc = 0
        self._in_item = False
        self._crc_from = 0  # offset in the current buffer where the item's unfolded bytes start
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
            if self._hold is not None and n >= 2 * self._up.part_size:
                self._write_borrowed(view, self._hold)
                self._pos += n
                return n
        fill = self._fill
        if self._buf is not None and n < len(self._buf) - fill:
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
                self._fill = 0
                self._crc_from = 0
            take = min(n - off, len(self._buf) - self._fill)
            # Through a memoryview: ``bytearray[a:b] = view`` first copies ``view`` into a
            # temporary bytearray (CPython), a second copy of every byte saved into freshly
            # allocated (page-faulting) memory.
            self._buf_view[self._fill : self._fill + take] = view[off : off + take]
            self._fill += take
            off += take
            if self._fill == len(self._buf):
                self._flush_part()

    def _write_borrowed(self, view: memoryview, hold: object) -> None:
        """Upload whole parts of ``view`` from its own memory (see the class docs)."""
        part_size = self._up.part_size
        n = view.nbytes
        off = 0
        if self._buf is not None and self._fill:
            off = len(self._buf) - self._fill  # top up the current part first
            self._copy(view[:off])
        while n - off >= part_size:
            segment = view[off : off + part_size]
            if self._in_item:
                self._item_crc = _crc.crc32c(segment, self._item_crc)
            self._submit_part(segment, hold=hold)
            off += part_size
        if off < n:
            self._copy(view[off:])

    def _fold_crc(self) -> None:
        """Add the item's bytes written into the current buffer since the last fold."""
        if self._in_item and self._fill > self._crc_from:
            pending = self._buf_view[self._crc_from : self._fill]
            self._item_crc = _crc.crc32c(pending, self._item_crc)
        self._crc_from = self._fill

    # item bracketing
    def begin_item(
        self, watch_ptr: int | None = None, watch_nbytes: int = 0, hold: object | None = None
    ) -> int:
        """Start an item at the current offset; optionally watch for a buffer at
        ``watch_ptr`` of ``watch_nbytes`` bytes being written, which may be uploaded from
        its own memory if ``hold`` (the object owning it) is given. Returns the offset."""
        self._item_crc = 0
        self._in_item = True
        self._crc_from = self._fill
        self._watch = (watch_ptr, watch_nbytes) if watch_ptr else None
        self._watch_pos = None
        self._hold = hold if watch_ptr else None
        return self._pos

    def end_item(self) -> tuple[int, int | None]:
        """CRC32C of the item's bytes and the offset of the watched buffer (or None)."""
        self._fold_crc()
        self._in_item = False
        self._watch = None
        self._hold = None
        return self._item_crc, self._watch_pos

    # parts
    def _flush_part(self) -> None:
        self._fold_crc()
        buf, fill = self._buf, self._fill
        assert buf is not None
        self._buf = None
        self._buf_view = memoryview(b"")
        self._fill = 0
        self._submit_part(memoryview(buf)[:fill], buffer=buf)

    def _submit_part(
        self, body: memoryview, *, buffer: bytearray | None = None, hold: object | None = None
    ) -> None:
        """Upload ``body`` as the next part; ``buffer`` goes back to the pool afterwards."""
        if self._upload_id is None:
            self._upload_id = self._up.start_upload(self.key)
        self._part_no += 1
        self._parts.append(
            self._up.send_part(
                self.key, self._upload_id, self._part_no, body, buffer=buffer, hold=hold
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
        if self._upload_id is None:
            buf, fill = self._buf, self._fill
            self._buf = None
            self.completion = up.send_object(self.key, buf, fill)
            return
        if self._fill:
            self._flush_part()
        elif self._buf is not None:
            up.give_buffer(self._buf)
            self._buf = None
        self.completion = up.send_complete(self.key, self._upload_id, list(self._parts))


def _complete(store: ObjectStore, key: str, upload_id: str, parts: list[CompletedPart]) -> None:
    """CompleteMultipartUpload, with a lost reply decided by reading back.

    When the first attempt's reply is lost after S3 assembled the object, the retry finds
    no such upload (404 NoSuchUpload). The key belongs to this save alone (it carries the
    save's tag), so an object there of exactly the parts' total size is ours: done.
    """
    try:
        store.complete_multipart(key, upload_id, parts)
    except ObjectNotFoundError:
        info = store.head(key)
        if info is None or info.size != sum(p.size for p in parts):
            raise
        log.info("complete of %s confirmed by reading it back (its reply was lost)", key)


def format_leftovers(keys: list[str]) -> str:
    """Human summary of objects a failed save could not clean up."""
    shown = ", ".join(keys[:5]) + (" ..." if len(keys) > 5 else "")
    return f"{len(keys)} object(s) could not be cleaned up ({shown}); run `s3ckpt gc`"
