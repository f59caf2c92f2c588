"""The total deadline of one S3 request attempt, and of one streamed body.

A socket's read timeout starts again with every byte, so a reply that drips a byte a
second never times out. A :class:`Watch` gives an attempt a total deadline instead,
``read_timeout + bytes / min_rate`` (``TransferConfig``'s two fields), and one daemon
thread per process shuts down the sockets of a watch whose deadline passed, which wakes
the thread blocked on them. The S3 client's connections register with the watch of the
attempt running on their thread (:func:`current_watch`, :mod:`s3ckpt.store._client`);
:mod:`s3ckpt.store._request` runs every attempt under :func:`watching`, and
:mod:`s3ckpt.store._range` watches each streamed body (:func:`start_watch`).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator

__all__ = ["AttemptTimedOut", "Watch", "current_watch", "start_watch", "watching"]


class AttemptTimedOut(TimeoutError):
    """An attempt cut at its total deadline (:class:`Watch`): no reply within the first-byte
    timeout, or a reply (or a request body) that moved slower than ``min_rate``. A
    ``TimeoutError``, so it is retried and reported as a read timeout."""


class Watch:
    """The total deadline of one attempt (or one read of a streamed body): ``first_byte``
    seconds plus ``nbytes / rate`` for the bytes it moves, cut at ``end`` (plus the same
    transfer allowance) when a short budget holds. When it passes, every socket
    registered with :meth:`guard` is shut down, so a thread blocked in ``recv``/``send``
    on a reply that drips a byte at a time (which a per-``recv`` read timeout never
    ends) wakes at once; its caller raises :class:`AttemptTimedOut`.

    One process-wide daemon thread watches every live :class:`Watch`.
    """

    def __init__(
        self, first_byte: float, rate: float, end: float | None = None, nbytes: int = 0
    ) -> None:
        self.started = time.monotonic()
        self.first_byte = first_byte
        self.rate = rate
        self.end = end
        self.nbytes = max(0, nbytes)
        self.expired = False
        self._done = False
        self._aborts: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._paused = 0.0  # seconds the reader spent away from the body (not the network's)
        self._paused_at: float | None = None

    @property
    def deadline(self) -> float:
        """The :func:`time.monotonic` time this watch expires. While paused it moves on
        with the clock, and lies at least a second ahead (the watchdog looks again then)."""
        paused, at = self._paused, self._paused_at
        now = time.monotonic() if at is not None else 0.0
        if at is not None:
            paused += now - at
        allowance = self.nbytes / self.rate + paused
        own = self.started + self.first_byte + allowance
        deadline = own if self.end is None else min(own, self.end + allowance)
        return deadline if at is None else max(deadline, now + 1.0)

    def pause(self) -> None:
        """The reader stops reading the body for a while (it works on what it has read):
        that time is the reader's, not the endpoint's, and does not count."""
        with self._lock:
            if self._paused_at is None:
                self._paused_at = time.monotonic()

    def resume(self) -> None:
        """The reader reads the body again: the clock runs on from where it paused."""
        with self._lock:
            if self._paused_at is not None:
                self._paused += time.monotonic() - self._paused_at
                self._paused_at = None

    @property
    def limit(self) -> float:
        """Seconds from the start to the deadline (for messages)."""
        return self.deadline - self.started

    def add_bytes(self, nbytes: int) -> None:
        """Allow ``nbytes / rate`` more seconds: bytes this attempt sends or receives."""
        if nbytes > 0:
            with self._lock:
                self.nbytes += nbytes

    def guard(self, abort: Callable[[], None]) -> None:
        """Call ``abort`` (shut a socket down) when the deadline passes; at once when it
        already has."""
        with self._lock:
            if not self.expired:
                self._aborts.append(abort)
                return
        with contextlib.suppress(Exception):  # a socket already closed: nothing left to wake
            abort()

    def _fire(self) -> bool:
        """Expire now unless done or extended; ``True`` when it did (or is settled)."""
        with self._lock:
            if self._done:
                return True
            if time.monotonic() < self.deadline:
                return False
            self.expired = True
            # Under the lock: once finish() has returned no abort runs, so a socket the
            # finished attempt handed back to the pool is never shut under another request.
            for abort in self._aborts:
                with contextlib.suppress(Exception):  # a socket already closed
                    abort()
            self._aborts = []
        return True

    def finish(self) -> None:
        """The attempt ended: nothing is aborted after this."""
        with self._lock:
            self._done = True
            self._aborts = []


# One daemon thread per process fires every live Watch at its deadline (_run).
_heap: list[tuple[float, int, Watch]] = []
_order = itertools.count()
_cond = threading.Condition()
_pid = -1  # the process whose thread runs


def _add(watch: Watch) -> None:
    global _pid
    with _cond:
        if _pid != os.getpid():  # first use, or a forked child: a thread of its own
            _pid = os.getpid()
            _heap.clear()
            threading.Thread(target=_run, name="s3ckpt-deadlines", daemon=True).start()
        heapq.heappush(_heap, (watch.deadline, next(_order), watch))
        _cond.notify()


def _run() -> None:
    with _cond:
        while True:
            now = time.monotonic()
            while _heap and _heap[0][0] <= now:
                _, _, watch = heapq.heappop(_heap)
                if not watch._fire():  # extended meanwhile: watch on
                    heapq.heappush(_heap, (watch.deadline, next(_order), watch))
            _cond.wait(_heap[0][0] - now if _heap else None)


_current = threading.local()


def start_watch(first_byte: float, rate: float, nbytes: int = 0, end: float | None = None) -> Watch:
    """A :class:`Watch` that starts now, for a streamed body read outside any attempt;
    :meth:`Watch.finish` it when the body is read or closed."""
    watch = Watch(first_byte, rate, end, nbytes)
    _add(watch)
    return watch


@contextlib.contextmanager
def watching(first_byte: float, rate: float, end: float | None = None) -> Iterator[Watch]:
    """Run the block as one attempt under a :class:`Watch` (the thread's current one, which
    the S3 client's connections register their sockets and byte counts with)."""
    watch = start_watch(first_byte, rate, end=end)
    outer = getattr(_current, "watch", None)
    _current.watch = watch
    try:
        yield watch
    finally:
        watch.finish()
        _current.watch = outer


def current_watch() -> Watch | None:
    """The :class:`Watch` of the attempt running on this thread, if any."""
    return getattr(_current, "watch", None)
