"""Coalesced ranged reads: the walk shared by the DCP reader and ``s3ckpt verify``.

Call sequence::

    walk = RangeWalk(store, key_of, config=..., on_span=...)   # on_failure: raise, or collect
    jobs = walk.plan({object_name: [(start, end, payload), ...]})
    walk.run(jobs)

:meth:`RangeWalk.plan` coalesces each object's spans into requests of at most
``read_request_size`` bytes (:func:`~s3ckpt._transfer.coalesce`), largest first so the long
poles start early. :meth:`RangeWalk.run` makes one ranged GET per request on a pool of
``concurrency`` threads and reads it front to back: gaps between spans are skipped, and
each span is handed to ``on_span`` with a :class:`SpanReader` that yields exactly that
span's bytes (the DCP reader streams them into tensor memory; verify through a small buffer).

Spans may share bytes (two destination shards of one saved chunk, or a damaged
``.metadata``). A span that starts before the stream's position cannot be read from that
stream: it gets a request of its own once the stream is closed.

A failure is either raised (no ``on_failure``: the first one, the other requests are
cancelled) or handed to ``on_failure`` as a :class:`ReadFailure` naming the spans it cost,
and the walk goes on.

Cost: one GET per request (plus one per span that overlaps an earlier one); memory per
thread: one ``read_chunk_size`` scratch buffer for gaps and :meth:`SpanReader.chunks`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar, cast

from s3ckpt import _crc
from s3ckpt._transfer._sink import Request, coalesce
from s3ckpt.config import TransferConfig
from s3ckpt.errors import CorruptCheckpointError, S3CkptError
from s3ckpt.metrics.instrument import in_context
from s3ckpt.store.base import ObjectStore, RangeReader

__all__ = ["RangeWalk", "ReadFailure", "Span", "SpanReader"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Span(Generic[T]):
    """One byte range ``[start, end)`` of object ``name``."""

    name: str
    start: int
    end: int
    payload: T
    job: int
    # Index in the job list given to :meth:`RangeWalk.run` of the request reading it
    # (a span read by a request of its own keeps the index of the job it came from).


@dataclass(frozen=True)
class ReadFailure(Generic[T]):
    """A request that failed, and the spans it cost.

    ``kind``: ``open`` (the GET was refused: every span of the request), ``truncated``
    (the object ended early: the span being read and every later one), ``error`` (the
    stream failed: every span of the request).
    """

    kind: Literal["open", "truncated", "error"]
    error: S3CkptError
    spans: list[Span[T]]
    job: int


class SpanReader:
    """Exact reads of the current span from one ranged stream; ``on_span`` gets one.

    Reads stop at the span's end (asking for more is a programming error); a stream that
    ends early raises :class:`~s3ckpt.errors.CorruptCheckpointError` ("the object is
    truncated").
    """

    def __init__(
        self,
        stream: RangeReader,
        key: str,
        bucket: str,
        *,
        chunk: int,
        rank: int | None = None,
        on_bytes: Callable[[int], None] | None = None,
    ) -> None:
        self._stream, self._key, self._bucket, self._rank = stream, key, bucket, rank
        self._chunk, self._on_bytes = chunk, on_bytes
        self._scratch: memoryview | None = None
        self._left = 0  # bytes of the current span not read yet
        self.truncated = False

    def _read(self, view: memoryview, missing: str) -> int:
        """Read into ``view`` (at least one byte); an early end raises "the object is
        truncated" saying what is ``missing``."""
        got = self._stream.readinto(view)
        if got <= 0:
            self.truncated = True
            raise CorruptCheckpointError(
                f"object ends early {missing}; the object is truncated",
                bucket=self._bucket,
                key=self._key,
                rank=self._rank,
            )
        if self._on_bytes is not None:
            self._on_bytes(got)
        return got

    def _buffer(self, n: int) -> memoryview:
        """The scratch buffer, at least ``min(n, read_chunk_size)`` bytes long."""
        want = min(self._chunk, max(n, 1))
        if self._scratch is None or len(self._scratch) < want:
            self._scratch = memoryview(bytearray(want))
        return self._scratch

    def readinto_all(self, view: memoryview, what: str, crc: int = 0) -> int:
        """Fill ``view`` completely with the span's next bytes; return their CRC32C
        continued from ``crc``. ``what`` names the item in a truncation error."""
        view = view.cast("B") if view.format != "B" else view
        off, n = 0, len(view)
        if n > self._left:
            raise ValueError(f"reading {n} bytes of a span with {self._left} left")
        while off < n:
            missing = f"while reading {what!r} ({n - off} of {n} bytes missing)"
            got = self._read(view[off : min(n, off + self._chunk)], missing)
            crc = _crc.crc32c(view[off : off + got], crc)
            off += got
        self._left -= n
        return crc

    def chunks(self, what: str) -> Iterator[memoryview]:
        """The rest of the span in pieces of at most ``read_chunk_size`` bytes, each valid
        until the next one (they share one buffer)."""
        buf = self._buffer(self._left)
        while self._left > 0:
            missing = f"while reading {what!r} ({self._left} bytes missing)"
            got = self._read(buf[: min(len(buf), self._left)], missing)
            self._left -= got
            yield buf[:got]

    def skip(self, n: int) -> None:
        """Discard the next ``n`` bytes of the stream (a gap between spans)."""
        if n < 0:
            raise ValueError(f"cannot skip back {-n} bytes in a stream")
        buf = self._buffer(n)
        while n > 0:
            n -= self._read(buf[: min(n, len(buf))], "(in a gap between items)")


class RangeWalk(Generic[T]):
    """Reads spans of objects with coalesced, parallel ranged GETs (see the module docs).

    Args:
        store: Where the objects are.
        key_of: The store key of an object name.
        config: ``coalesce_gap``, ``read_request_size``, ``read_chunk_size``,
            ``read_concurrency``.
        on_span: Called (from worker threads) with each span and a :class:`SpanReader`
            positioned at its first byte; what it leaves unread is skipped.
        on_failure: Called with each failed request; without it the first failure is
            raised and the requests not started yet are cancelled.
        on_bytes: Called with the size of every piece read from a stream (gaps too).
        rank: Set on s3ckpt errors raised while streaming that name no rank.
        thread_name_prefix: Names of the worker threads.

    Attributes:
        bytes_requested: Bytes of the requests that completed (gaps included).
    """

    def __init__(
        self,
        store: ObjectStore,
        key_of: Callable[[str], str],
        *,
        config: TransferConfig,
        on_span: Callable[[Span[T], SpanReader], None],
        on_failure: Callable[[ReadFailure[T]], None] | None = None,
        on_bytes: Callable[[int], None] | None = None,
        rank: int | None = None,
        thread_name_prefix: str = "s3ckpt-get",
    ) -> None:
        self.store, self.key_of, self.config, self.rank = store, key_of, config, rank
        self.on_span, self.on_failure, self.on_bytes = on_span, on_failure, on_bytes
        self.thread_name_prefix = thread_name_prefix
        self.bytes_requested = 0
        self._lock = threading.Lock()

    def plan(
        self,
        spans_by_object: Mapping[str, Iterable[tuple[int, int, T]]],
        *,
        max_size: int | None = None,
    ) -> list[tuple[str, Request[T]]]:
        """The requests that read every span, largest first (ties in object order), each
        at most ``max_size`` bytes (default ``read_request_size``) unless one span is
        larger."""
        limit = self.config.read_request_size if max_size is None else max_size
        jobs = [
            (name, req)
            for name, spans in spans_by_object.items()
            for req in coalesce(list(spans), self.config.coalesce_gap, limit)
        ]
        return sorted(jobs, key=lambda j: -j[1].size)

    def run(self, jobs: Sequence[tuple[str, Request[T]]]) -> None:
        """Make every request of ``jobs``, ``config.read_concurrency`` at a time."""
        if len(jobs) <= 1:
            for i, (name, req) in enumerate(jobs):
                self.fetch(name, req, job=i)
            return
        workers = min(self.config.read_concurrency, len(jobs))
        with ThreadPoolExecutor(workers, thread_name_prefix=self.thread_name_prefix) as pool:
            fetch = in_context(self.fetch)  # requests count for the caller's load (metrics)
            futures = [pool.submit(fetch, n, r, job=i) for i, (n, r) in enumerate(jobs)]
            try:
                _, not_done = wait(futures, return_when=FIRST_EXCEPTION)
            except BaseException:  # Ctrl-C: end with the requests in flight, start no more
                pool.shutdown(wait=True, cancel_futures=True)
                raise
            for fut in not_done:
                fut.cancel()
            for fut in futures:
                if fut.done() and not fut.cancelled() and fut.exception() is not None:
                    raise cast(BaseException, fut.exception())

    def fetch(self, name: str, req: Request[T], *, job: int = 0) -> None:
        """Make one request, then one for each span that overlaps an earlier one."""
        key = self.key_of(name)
        spans = [Span(name, s, e, p, job) for s, e, p in req.spans]
        try:
            stream = self.store.open_range(key, req.start, req.size)
        except S3CkptError as exc:
            if self.on_failure is None:
                raise
            self.on_failure(ReadFailure("open", exc, spans, job))
            return
        chunk, on_bytes = self.config.read_chunk_size, self.on_bytes
        reader = SpanReader(
            stream, key, self.store.bucket, chunk=chunk, rank=self.rank, on_bytes=on_bytes
        )
        overlapping: list[tuple[int, int, T]] = []
        i = 0
        try:
            pos = req.start
            for i, span in enumerate(spans):
                if span.start < pos:
                    # Starts inside bytes already read: the stream is past it.
                    overlapping.append(req.spans[i])
                    continue
                reader.skip(span.start - pos)
                reader._left = span.end - span.start
                self.on_span(span, reader)
                left, reader._left = reader._left, 0  # what on_span left unread: skipped
                reader.skip(left)
                pos = span.end
            with self._lock:
                self.bytes_requested += req.size
        except S3CkptError as exc:
            if self.rank is not None and exc.rank is None:
                exc.rank = self.rank
            if self.on_failure is None:
                raise
            kind: Literal["truncated", "error"] = "truncated" if reader.truncated else "error"
            self.on_failure(ReadFailure(kind, exc, spans[i:] if reader.truncated else spans, job))
        finally:
            stream.close()
        for start, end, payload in overlapping:
            self.fetch(name, Request(start, end, [(start, end, payload)]), job=job)
