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

import itertools
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from s3ckpt import _crc
from s3ckpt._transfer._sink import ObjectSink, PartCrc
from s3ckpt.config import MAX_PARTS, MIN_PART_SIZE
from s3ckpt.errors import ObjectNotFoundError, S3CkptError
from s3ckpt.metrics.instrument import in_context
from s3ckpt.store.base import CompletedPart, ObjectStore

__all__ = ["PartPool", "Uploader", "format_leftovers"]

log = logging.getLogger(__name__)


class PartPool:
    """``n_buffers`` part-sized buffers; :meth:`take` blocks while every one is in flight.

    Back-pressure by a semaphore, as s3transfer's ``BoundedExecutor`` does: a slot is
    acquired before a buffer is taken and released when the buffer comes back (its part
    was sent). Buffers are allocated on first use and reused, so memory is at most
    ``n_buffers * part_size``. :meth:`close_for_failure` wakes every waiter at once.
    """

    def __init__(self, part_size: int, n_buffers: int) -> None:
        self.part_size = part_size
        self._slots = threading.Semaphore(n_buffers)
        self._lock = threading.Lock()
        self._free: list[bytearray] = []
        self._failed = False

    def take(self) -> bytearray | None:
        """A free buffer; blocks while all are in flight. None once the pool has failed."""
        self._slots.acquire()
        if self._failed:
            self._slots.release()  # pass the wake-up on to the next waiter
            return None
        with self._lock:
            return self._free.pop() if self._free else bytearray(self.part_size)

    def give(self, buf: bytearray) -> None:
        """Return a buffer taken with :meth:`take` (its part was sent, or not needed)."""
        with self._lock:
            self._free.append(buf)
        self._slots.release()

    def close_for_failure(self) -> None:
        """Make every current and future :meth:`take` return None without waiting."""
        with self._lock:
            if self._failed:
                return
            self._failed = True
        self._slots.release()  # each woken waiter releases again: all of them wake

    def clear(self) -> None:
        """Drop the free buffers."""
        with self._lock:
            self._free.clear()


#: Task priorities of the upload threads, most urgent first: a creation (its parts wait
#: for it), a part or object in a pool buffer (the writer waits for the buffer), a part
#: sent from a tensor's own memory (nobody waits for it).
CREATE, BUFFERED, BORROWED = 0, 1, 2

TAIL_SHARE = 4
"""A save's last ``TAIL_SHARE`` full parts' worth of bytes is cut into smaller parts
(:meth:`Uploader.next_part_size`). Measured on s3sim's S3 shaping (``dcp.save`` of 1 GiB,
2 cores, 28 connections, 3 saves each): large5 758-766 MB/s against 709-747 uncut, mix
718-764 against 675-727, for 4 more requests."""


class _Lanes:
    """``n`` upload threads that take the most urgent queued task first (:data:`CREATE`,
    :data:`BUFFERED`, :data:`BORROWED`; in order of submission within a priority).

    In first-come order, a large tensor's parts (sent from its own memory, many at once)
    would queue ahead of the parts that hold pool buffers, and the writing thread would
    wait for a free buffer while those went out; taken by urgency, the buffers come back
    as fast as a connection frees and the tensor's parts fill every other connection. A
    creation always goes first, so a part waiting for its upload id never waits on a
    task still in the queue."""

    def __init__(self, n: int, name: str) -> None:
        self._queue: queue.PriorityQueue[tuple[int, int, Any, Any]] = queue.PriorityQueue()
        self._order = itertools.count()
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}_{i}", daemon=True) for i in range(n)
        ]
        self._started: bool | None = False  # None: shut down
        self._lock = threading.Lock()

    def submit(self, fn: Callable[[], Any], priority: int) -> Future[Any]:
        """Queue ``fn``; the threads start with the first task."""
        fut: Future[Any] = Future()
        with self._lock:
            if self._started is None:
                raise RuntimeError("upload threads already shut down")
            self._queue.put((priority, next(self._order), fut, fn))
            if not self._started:
                self._started = True
                for t in self._threads:
                    t.start()
        return fut

    def _work(self) -> None:
        while True:
            _, _, fut, fn = self._queue.get()
            if fut is None:
                return
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as exc:
                    fut.set_exception(exc)

    def shutdown(self) -> None:
        """Let the threads end once the queue is empty, and wait for them."""
        with self._lock:
            started, self._started = self._started, None
            if started:
                for _ in self._threads:
                    self._queue.put((BORROWED + 1, next(self._order), None, None))
        if started:
            for t in self._threads:
                t.join()


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
        expected_bytes: What the save will send, when known (an estimate will do): its
            last parts are cut smaller (:meth:`next_part_size`).
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        part_size: int,
        n_buffers: int,
        max_concurrency: int,
        rank: int | None = None,
        expected_bytes: int = 0,
    ) -> None:
        self.store, self.part_size, self.rank = store, part_size, rank
        self._left = expected_bytes  # not yet cut into parts (the writing thread's count)
        # The most parts the smaller last parts can add to one object.
        self._tail_parts = TAIL_SHARE * -(-part_size // MIN_PART_SIZE) if expected_bytes else 0
        self._buffers = PartPool(part_size, max(2, n_buffers))
        self._pool = _Lanes(max_concurrency, "s3ckpt-up")
        # Completing an object waits on its parts: a separate pool avoids starving them, and
        # one thread per connection lets the objects whose last parts land together complete
        # together, not one round trip after another at the end of the save.
        self._completer = ThreadPoolExecutor(
            max(2, max_concurrency), thread_name_prefix="s3ckpt-complete"
        )
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
        if (buf := self._buffers.take()) is None:
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

    def submit(
        self, fn: Callable[[], Any], *, completer: bool = False, priority: int = BUFFERED
    ) -> Future[Any]:
        """Run ``fn`` in the background (on an upload thread by ``priority``, or on the
        completer), recording its failure."""

        def run() -> Any:
            if self._error is not None:
                raise _Aborted("skipped after an earlier failure")
            try:
                return fn()
            except BaseException as exc:
                self._fail(exc)
                raise

        # in_context: the part's request counts for the save that queued it (metrics).
        if completer:
            fut = self._completer.submit(in_context(run))
        else:
            fut = self._pool.submit(in_context(run), priority)
        with self._lock:
            self._futures.append(fut)
        return fut

    # -- requests made for sinks -------------------------------------------------------------
    def next_part_size(self, part_no: int) -> int:
        """Where to cut an object's next part (``part_no`` parts so far): :attr:`part_size`
        until the bytes not yet cut no longer fill :data:`TAIL_SHARE` parts, then that
        remainder shared among them, down to S3's 5 MiB minimum.

        A save's last part ends it one part's upload time after the writing thread cut it
        (a 16 MiB part is ~0.25 s on S3, a 5 MiB one ~0.1 s), and on a busy machine the
        writing thread cuts the last parts one by one, copying small items: so the last
        parts are cut small. Always :attr:`part_size` when the save's size was not given,
        once more than it was sent (an estimate short of a large byte item: what is left is
        unknown), or when the object could pass S3's 10,000 parts."""
        if not self._tail_parts or self._left <= 0 or part_no + self._tail_parts >= MAX_PARTS:
            return self.part_size
        return min(self.part_size, max(MIN_PART_SIZE, self._left // TAIL_SHARE))

    def begin_upload(self, key: str) -> Future[str]:
        """CreateMultipartUpload for ``key`` in the background, registered so it is aborted
        on failure: the upload id, which the object's parts wait for. Queued before them, so
        it starts first; a creation that fails, is skipped or cancelled fails them too."""

        def create() -> str:
            upload_id = self.store.create_multipart(key)
            with self._lock:
                self._open_uploads[key] = upload_id
            return upload_id

        return self.submit(create, priority=CREATE)

    def send_part(
        self,
        key: str,
        upload: Future[str],
        part_no: int,
        body: memoryview,
        *,
        buffer: bytearray | None = None,
        hold: object | None = None,
        crc: PartCrc | None = None,
    ) -> Future[CompletedPart]:
        """Upload ``body`` as part ``part_no`` of ``upload`` (:meth:`begin_upload`) in the
        background, with its CRC32C (also stored in ``crc`` when given).

        ``buffer`` (the pool buffer ``body`` lies in) goes back to the pool once the part
        is sent; ``hold`` (the owner of borrowed memory) is kept alive until then.
        """

        self._left -= body.nbytes

        def send(_owner: object | None = hold) -> CompletedPart:
            try:
                upload_id = upload.result()
                value = _crc.crc32c(body)
                if crc is not None:
                    crc.value = value
                part = self.store.upload_part(key, upload_id, part_no, body, crc32c=value)
                self._count(body.nbytes)
                return part
            finally:
                if buffer is not None:
                    self.give_buffer(buffer)

        return self.submit(send, priority=BUFFERED if buffer is not None else BORROWED)

    def send_object(self, key: str, buffer: bytearray | None, size: int) -> Future[None]:
        """PUT the first ``size`` bytes of ``buffer`` (or nothing) as ``key`` in the
        background; ``buffer`` goes back to the pool afterwards."""
        self._left -= size

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

    def _count(self, nbytes: int) -> None:
        with self._lock:
            self.bytes_uploaded += nbytes

    def send_complete(
        self, key: str, upload: Future[str], parts: list[Future[CompletedPart]]
    ) -> Future[None]:
        """CompleteMultipartUpload once every part in ``parts`` is sent (background).

        When the first attempt's reply is lost after S3 assembled the object, the retry finds
        no such upload (404 NoSuchUpload). The key belongs to this save alone (it carries the
        save's tag), so an object there of exactly the parts' total size is ours: done.
        """

        def complete() -> None:
            wait(parts)
            upload_id, done = upload.result(), [f.result() for f in parts]
            try:
                self.store.complete_multipart(key, upload_id, done)
            except ObjectNotFoundError:
                info = self.store.head(key)
                if info is None or info.size != sum(p.size for p in done):
                    raise
                log.info("complete of %s confirmed by reading it back (its reply was lost)", key)
            self._done(key)

        return self.submit(complete, completer=True)

    def _done(self, key: str) -> None:
        """Record a completed object (deleted again if the save fails)."""
        with self._lock:
            self._open_uploads.pop(key, None)
            self._completed.append(key)

    def sink(self, key: str, size_hint: int = 0) -> ObjectSink:
        """A stream that uploads to ``key``. An object expected to fill more than one part
        (``size_hint`` bytes) creates its multipart upload at once, so the round trip
        overlaps filling its first part."""
        sink = ObjectSink(self, key)
        if size_hint > self.part_size:
            sink.begin()
        return sink

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
                leftovers.extend(f.key for f in self.store.delete(completed))
            except Exception as exc:
                log.error("could not delete %d objects of the failed save: %s", len(completed), exc)
                leftovers.extend(completed)
        self.close()
        return leftovers

    def close(self) -> None:
        """Release threads and buffers."""
        self._pool.shutdown()
        self._completer.shutdown(wait=True)
        self._buffers.clear()


def format_leftovers(keys: list[str]) -> str:
    """Human summary of objects a failed save could not clean up."""
    shown = ", ".join(keys[:5]) + (" ..." if len(keys) > 5 else "")
    return f"{len(keys)} object(s) could not be cleaned up ({shown}); run `s3ckpt gc`"
