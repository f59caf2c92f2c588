"""One S3 request: its checksum arguments, and its run under the store's retry policy (a
fresh ``Retrying`` per request from the store's frozen
:class:`~s3ckpt.store.retry.RetryPolicy`), each attempt holding a slot of the store's
adaptive limiter and watched to its total deadline, with the failure mapped at the store's
edge.

The total deadline of an attempt, and of one streamed body: a socket's read timeout starts
again with every byte, so a reply that drips a byte a second never times out. A
:class:`Watch` gives an attempt a total deadline instead, ``read_timeout + bytes /
min_rate`` (``TransferConfig``'s two fields), and one daemon thread per process shuts down
the sockets of a watch whose deadline passed, which wakes the thread blocked on them. The S3
client's connections register with the watch of the attempt running on their thread
(:func:`current_watch`, :mod:`s3ckpt.store._client`); :func:`call` runs every attempt under
:func:`watching`, and :mod:`s3ckpt.store._body` watches each streamed body
(:func:`start_watch`).
"""

from __future__ import annotations

import base64
import contextlib
import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from tenacity import RetryCallState, retry_if_exception

from s3ckpt import _crc
from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.errors import ObjectNotFoundError, PreconditionFailedError
from s3ckpt.metrics._events import Outcome
from s3ckpt.metrics.instrument import expected_outcome, record_request
from s3ckpt.store._adaptive import AdaptiveLimiter, Slot
from s3ckpt.store._errors import is_throttle, is_transient, map_error, timeout_kind
from s3ckpt.store.base import Buffer
from s3ckpt.store.retry import RetryPolicy, cleanup_end

__all__ = [
    "AttemptTimedOut", "Watch", "call", "checksum_args", "current_watch", "start_watch",
    "watching",
]


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


log = logging.getLogger(__name__)

T = TypeVar("T")


def checksum_args(cfg: S3Config, data: Buffer, crc32c: int | None) -> dict[str, Any]:
    """The CRC32C of a body (``crc32c`` when the caller has it) for the store to verify."""
    if cfg.checksum_algorithm != "CRC32C":
        return {}
    value = _crc.crc32c(data) if crc32c is None else crc32c
    crc = base64.b64encode(value.to_bytes(4, "big")).decode("ascii")
    return {"ChecksumAlgorithm": "CRC32C", "ChecksumCRC32C": crc}


# Endpoints (and buckets) that stopped answering: a request that gave up on timeouts with no
# reply from the endpoint since it began marks it silent; any reply clears it. While silent,
# requests get a short budget (_budget_end) instead of a whole ``request_deadline`` each, so
# the requests a failing command still makes (its cleanup) end soon after.
_silence_lock = threading.Lock()
_silent_since: dict[tuple[str | None, str], float] = {}  # first silent give-up
_answered_at: dict[tuple[str | None, str], float] = {}  # last reply


def _answered(where: tuple[str | None, str]) -> None:
    with _silence_lock:
        _answered_at[where] = time.monotonic()
        _silent_since.pop(where, None)


def _gave_up(where: tuple[str | None, str], started: float) -> None:
    with _silence_lock:
        if _answered_at.get(where, float("-inf")) < started:
            _silent_since.setdefault(where, time.monotonic())


def _budget_end(config: TransferConfig, silent_since: float | None) -> float | None:
    """When this request's short budget ends: a :func:`~s3ckpt.store.retry.cleanup` block
    shares one; requests to a silent endpoint share the ``cleanup_timeout`` after it went
    silent, and past that get a tenth of it each (one quick try that finds an endpoint
    come back); ``None``: neither."""
    shared = cleanup_end(config.cleanup_timeout)
    if silent_since is None:
        return shared
    short = config.cleanup_timeout
    own = max(silent_since + short, time.monotonic() + short / 10)
    return own if shared is None else min(own, shared)


def call(
    fn: Callable[[], T],
    *,
    operation: str,
    bucket: str,
    key: str | None,
    endpoint: str | None,
    config: TransferConfig,
    policy: RetryPolicy,
    limiter: AdaptiveLimiter | None = None,
) -> tuple[T, int]:
    """``fn()`` retried on transient failures (:func:`is_transient`) under ``policy``
    (built from ``config``, which error messages quote); its result and the attempts it
    took.

    With a ``limiter`` every attempt takes one of its slots before ``fn()`` and gives it
    back with the outcome (throttled, answered, or failed otherwise); the time an attempt
    waits for its slot (and for pacing, slept with the policy's ``sleep``) does not count towards
    ``config.request_deadline``.

    Every attempt runs under a total deadline (:func:`~s3ckpt.store._request.watching`:
    ``read_timeout`` to the first byte plus its bytes at ``min_rate``; the client's
    connections register their sockets and byte counts, :mod:`s3ckpt.store._client`), cut
    earlier by a short budget: a :func:`~s3ckpt.store.retry.cleanup` block, or an endpoint
    that gave no reply to a request that gave up (``_silent_since``).

    Every request is counted once, when it ends, by
    :func:`~s3ckpt.metrics.instrument.record_request` (its attempts, how many were
    throttled, and its outcome), for the operation running in this context. A 404 or 412
    counts as the expected outcome where the caller said so
    (:func:`~s3ckpt.metrics.instrument.expecting`), else as a failure.

    Raises:
        StoreError: The last failure, mapped by :func:`~s3ckpt.store._errors.map_error`.
    """
    started = time.monotonic()
    where = (endpoint, bucket)
    end = _budget_end(config, _silent_since.get(where))
    attempts = throttled = 0  # throttled: attempts answered with a throttling code (metrics)
    queued = 0.0  # seconds the attempts waited for the limiter: left out of the deadline
    outcome: Outcome = "failed"

    def before_sleep(state: RetryCallState) -> None:
        nonlocal throttled
        exc = state.outcome.exception() if state.outcome else None
        throttled += exc is not None and is_throttle(exc)
        what = f"{operation} s3://{bucket}/{key or ''}"
        log.debug(
            "retrying %s after %s (attempt %d)", what, type(exc).__name__, state.attempt_number
        )

    def one(slot: Slot | None) -> T:
        """One attempt under its total deadline, its limiter ``slot`` given back with the
        outcome; a reply (anything but a timeout) tells that the endpoint answers."""
        try:
            with watching(config.read_timeout, config.min_rate, end) as watch:
                try:
                    result = fn()
                except BaseException as exc:
                    if watch.expired:
                        raise AttemptTimedOut(
                            f"no complete reply within {watch.limit:.1f} s (read_timeout="
                            f"{config.read_timeout:g} s + {watch.nbytes} bytes at min_rate="
                            f"{config.min_rate:g} B/s)"
                        ) from exc
                    if timeout_kind(exc) is None:
                        _answered(where)
                    raise
        except BaseException as exc:
            if limiter is not None and slot is not None:
                (limiter.throttled if is_throttle(exc) else limiter.failed)(slot)
            raise
        _answered(where)
        if limiter is not None and slot is not None:
            limiter.succeeded(slot)
        return result

    retrying = policy.retrying(
        retry=retry_if_exception(is_transient),
        queued=lambda: queued,
        end=end,
        before_sleep=before_sleep,
    )
    try:
        for attempt in retrying:
            with attempt:
                attempts += 1
                slot = None if limiter is None else limiter.acquire(policy.sleep)
                queued += 0.0 if slot is None else slot.queued
                result = one(slot)
        outcome = "ok"
        return result, attempts
    except Exception as exc:  # mapped at this one edge
        throttled += is_throttle(exc)  # the last attempt (before_sleep saw the others)
        if timeout_kind(exc) is not None:
            _gave_up(where, started)
        mapped = map_error(
            exc,
            operation=operation,
            bucket=bucket,
            key=key,
            endpoint=endpoint,
            attempts=attempts,
            elapsed=time.monotonic() - started,
            transfer_config=config,
        )
        if isinstance(mapped, ObjectNotFoundError):
            outcome = expected_outcome("not_found")
        elif isinstance(mapped, PreconditionFailedError):
            outcome = expected_outcome("precondition_failed")
        raise mapped from exc
    finally:
        record_request(operation, max(attempts, 1), throttled, outcome)
