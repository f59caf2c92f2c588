"""Adaptive concurrency under throttling: one AIMD limiter per process and (endpoint,
bucket).

S3 answers ``503 Slow Down`` when a prefix gets more requests per second than it serves
(3,500 writes or 5,500 reads per second per partition, more once S3 has split it).
Retrying each request with exponential back-off alone leaves every thread knocking at the
same rate, so most attempts are refused for as long as the throttling lasts. The limiter
narrows how many requests the process has in flight instead, as TCP does with its
congestion window:

* Every request *attempt* takes a slot (:meth:`AdaptiveLimiter.acquire`) before it is sent
  and gives it back with its outcome (:meth:`~AdaptiveLimiter.succeeded`,
  :meth:`~AdaptiveLimiter.throttled`, :meth:`~AdaptiveLimiter.failed`).
* The **window** (a float) bounds the attempts in flight to ``floor(window)``. It starts at
  the store's thread count (the *ceiling*), and while it is there nothing is limited: an
  attempt costs one lock to take its slot and one to give it back, and never waits.
* **Multiplicative decrease**, once per congestion event: a throttled attempt that started
  after the last decrease halves the window (from the attempts in flight when those are
  fewer, as TCP halves its flight size), down to 1. A throttled attempt that started
  before the last decrease belongs to the event already answered: it is only counted.
* Once the window is 1 and throttling goes on, request starts are **paced** (a token
  bucket of one token): the rate starts at half of what one request at a time achieves
  (one over the average time of an answered attempt), and each further congestion event
  halves it, down to :data:`MIN_RATE`.
* **Additive increase** on each success of an attempt started since the last decrease:
  ``window += 1 / window``, about one slot more per window of successes; back at the
  ceiling, the limiter stops limiting. While pacing, the rate grows with time, by what one
  request at a time started per :data:`RATE_RECOVERY` seconds (at most doubling per
  success, so a rate deep down does not leap past what was throttled), and pacing ends
  once the rate is twice what one request at a time started: seconds from any depth,
  never minutes.
* Other outcomes (500s, resets, timeouts, 404s) change nothing: they say nothing about the
  request rate.

The retry of a throttled attempt still waits its back-off (:mod:`s3ckpt.store.retry`)
before it queues for a slot again; the time a request spends queued here does not count
towards its ``request_deadline``. Each process (rank) adapts on its own, as TCP flows do.

:func:`shared_limiter` hands every store of a process that talks to one (endpoint, bucket)
the same limiter; a forked child starts afresh. This module imports neither boto3 nor
torch.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from urllib.parse import urlsplit

from s3ckpt.store._cache import ProcessCache

__all__ = [
    "MIN_RATE",
    "RATE_RECOVERY",
    "AdaptiveLimiter",
    "Slot",
    "ThrottleStats",
    "forget_limiters",
    "shared_limiter",
]

log = logging.getLogger(__name__)

#: Slowest pacing, in request starts per second. Below it a process waits on the retries' own
#: back-off (up to ``retry_max_delay``) instead, and a rate this low grows back in seconds once the
#: throttling ends.
MIN_RATE = 1.0

#: Seconds in which pacing grows back by the rate one request at a time started (the rate pacing
#: began from): from half of it, pacing ends 3 s after the last decrease.
RATE_RECOVERY = 2.0

#: Seconds between two INFO lines about decreases (the ones between are summed up).
LOG_INTERVAL = 5.0

_WEIGHT = 0.2  # weight of the newest sample in a moving average
_MIN_GAP = 1e-3  # seconds: no pacing starts faster than 1,000 requests per second


@dataclass(frozen=True)
class ThrottleStats:
    """What an :class:`AdaptiveLimiter` has seen and where it stands (a snapshot)."""

    #: Attempts answered with throttling (each was retried or failed its request).
    throttles: int

    #: Congestion events answered: halvings of the window or of the pacing rate.
    decreases: int

    #: Attempts allowed in flight (``floor(window)``); the ceiling when not limited.
    window: float

    #: Pacing, in request starts per second; ``None`` when starts are not paced.
    rate: float | None

    #: Attempts holding a slot now.
    in_flight: int

    #: Whether the window or pacing holds attempts back now (``False`` at the ceiling).
    limited: bool

    #: The window when nothing is throttled: the thread count of the stores using it.
    ceiling: int


@dataclass(slots=True, eq=False)
class Slot:
    """One attempt's hold on the limiter, from :meth:`AdaptiveLimiter.acquire`.

    Attributes:
        epoch: Decreases before this attempt started: a throttle of an older epoch is old news.
        started: Clock time the attempt was let go.
        queued: Seconds it waited for the window and for pacing.
    """

    epoch: int
    started: float
    queued: float


class AdaptiveLimiter:
    """AIMD window and pacing over the request attempts of one process to one bucket.

    See the module docs for the algorithm. Thread-safe; every method takes one lock.

    Args:
        concurrency: The ceiling: threads of the store(s) using it; the window starts here.
        name: How log lines name the bucket (no credentials).
        clock: Seconds, monotonic (tests pass a fake).
        sleep: Sleeps the pacing delay when :meth:`acquire` is given none (tests pass a
            fake that moves their clock).
    """

    def __init__(
        self,
        concurrency: int,
        *,
        name: str = "",
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.name = name
        self._clock = clock
        self._sleep = sleep
        self._cond = threading.Condition(threading.Lock())
        self._ceiling = concurrency
        self._window = float(concurrency)
        self._limited = False
        self._rate: float | None = None
        self._rate_at = 0.0  # clock time the rate last changed
        self._paced_at = -math.inf  # clock time of the last paced start
        self._last_start: float | None = None
        self._gap: float | None = None  # average seconds between starts
        self._latency: float | None = None  # average seconds of an answered attempt
        self._in_flight = 0
        self._epoch = 0
        self._throttles = 0
        self._decreases = 0
        self._logged_at = -math.inf
        self._unlogged = 0

    # -- configuration ---------------------------------------------------------------------
    def widen(self, concurrency: int) -> None:
        """Raise the ceiling to ``concurrency`` (a store with more threads joined)."""
        with self._cond:
            if concurrency <= self._ceiling:
                return
            self._ceiling = concurrency
            if not self._limited:
                self._window = float(concurrency)

    # -- slots -----------------------------------------------------------------------------
    def acquire(self, sleep: Callable[[float], None] | None = None) -> Slot:
        """A slot for one attempt: waits while the window is full, then sleeps (``sleep``,
        else the limiter's) until pacing lets the attempt start. Free and immediate while
        the limiter is not limited.

        Give it back with exactly one of :meth:`succeeded`, :meth:`throttled` or
        :meth:`failed`.
        """
        with self._cond:
            asked = self._clock()
            while self._limited and self._in_flight >= int(self._window):
                self._cond.wait()
            now = self._clock() if self._limited else asked
            start = now
            if self._rate is not None:
                # At the rate in force now: a rate that grew since the last start counts.
                start = max(now, self._paced_at + 1.0 / self._rate)
                self._paced_at = start
            self._in_flight += 1
            last = self._last_start
            if last is not None:
                self._gap = _average(self._gap, max(0.0, start - last))
            if last is None or start > last:
                self._last_start = start
            slot = Slot(self._epoch, start, start - asked)
        if start > now:
            try:
                (sleep or self._sleep)(start - now)
            except BaseException:
                self.failed(slot)
                raise
        return slot

    def succeeded(self, slot: Slot) -> None:
        """Give ``slot`` back: its attempt got an answer that was not throttling."""
        now = self._clock()
        with self._cond:
            self._in_flight -= 1
            self._latency = _average(self._latency, max(0.0, now - slot.started))
            if self._limited and slot.epoch == self._epoch:
                if self._rate is not None:
                    cap = self._one_at_a_time()  # pacing ends at twice this
                    grown = cap * (now - self._rate_at) / RATE_RECOVERY
                    self._rate += min(self._rate, grown)
                    self._rate_at = now
                    if self._rate >= 2.0 * cap:
                        self._rate = None  # one at a time starts no faster than this
                else:
                    self._window += 1.0 / self._window
                    if self._window >= self._ceiling:
                        self._window = float(self._ceiling)
                        self._limited = False
            self._cond.notify_all()

    def failed(self, slot: Slot) -> None:
        """Give ``slot`` back: its attempt failed in a way that says nothing about the
        request rate (a 500, a reset, a timeout, a 404), or never went out."""
        with self._cond:
            self._in_flight -= 1
            self._cond.notify_all()

    def throttled(self, slot: Slot) -> None:
        """Give ``slot`` back: its attempt was throttled. Decreases the window (or the
        pacing rate) when the attempt started after the last decrease."""
        with self._cond:
            in_flight = self._in_flight  # this attempt included
            self._in_flight -= 1
            self._throttles += 1
            self._cond.notify_all()  # the waiters run once this block has released the lock
            if slot.epoch != self._epoch:  # the event was answered already
                return
            self._epoch += 1
            self._decreases += 1
            self._limited = True
            before = self._describe()
            if self._window > 1.0:
                self._window = max(1.0, min(self._window, float(in_flight)) / 2.0)
            else:
                first = self._rate is None  # pacing starts at half of one at a time
                self._rate = max(MIN_RATE, (self._rate or self._one_at_a_time()) / 2.0)
                self._rate_at = self._clock()
                if first:
                    self._paced_at = self._rate_at  # the next start waits one interval
            line = self._log_line(before)
        if line is not None:
            log.info("%s", line)

    # -- reporting ---------------------------------------------------------------------------
    def stats(self) -> ThrottleStats:
        """A snapshot of the counters and the current window and rate."""
        with self._cond:  # each field is the private attribute of its name
            return ThrottleStats(
                **{f.name: getattr(self, f"_{f.name}") for f in fields(ThrottleStats)}
            )

    def __repr__(self) -> str:
        return f"AdaptiveLimiter({self.name or '?'}, {self._describe()})"

    # -- internals (called with the lock held) -----------------------------------------------
    def _one_at_a_time(self) -> float:
        """Starts per second with one request at a time: one per answered attempt's
        average time (before any answer, the average gap between starts)."""
        return 1.0 / max(self._latency or self._gap or _MIN_GAP, _MIN_GAP)

    def _describe(self) -> str:
        if self._rate is not None:
            return f"1 request at a time, {self._rate:.2f} starts/s"
        return f"{int(self._window)} request(s) in flight"

    def _log_line(self, before: str) -> str | None:
        """The INFO line for the decrease just made, at most one per LOG_INTERVAL."""
        now = self._clock()
        self._unlogged += 1
        if now - self._logged_at < LOG_INTERVAL:
            return None
        more = self._unlogged - 1
        self._logged_at, self._unlogged = now, 0
        return (
            f"S3 is throttling {self.name or 'the bucket'} (503 SlowDown): {before} -> "
            f"{self._describe()}; {self._throttles} throttled attempt(s) so far"
            + (f", {more} more decrease(s) since the last report" if more else "")
        )


def _average(average: float | None, sample: float) -> float:
    """The moving average with ``sample`` added (``sample`` alone when there was none)."""
    return sample if average is None else average + _WEIGHT * (sample - average)


# -- one limiter per process and (endpoint, bucket) --------------------------------------------
#: Limiters :func:`shared_limiter` keeps (least recently used out); a store keeps the one it was
#: given.
MAX_SHARED_LIMITERS = 64

_limiters: ProcessCache[tuple[str | None, str], AdaptiveLimiter] = ProcessCache(MAX_SHARED_LIMITERS)


def _name(endpoint: str | None, bucket: str) -> str:
    """``s3://bucket`` and the endpoint's host (never its user info) for log lines."""
    if not endpoint:
        return f"s3://{bucket}"
    parts = urlsplit(endpoint)
    host = parts.hostname or "?"
    return f"s3://{bucket} at {host}" + (f":{parts.port}" if parts.port else "")


def shared_limiter(endpoint: str | None, bucket: str, concurrency: int) -> AdaptiveLimiter:
    """The process's limiter for ``bucket`` at ``endpoint`` (``None``: AWS), its ceiling
    raised to ``concurrency`` if that is more. Thread-safe."""
    limiter = _limiters.get(
        (endpoint, bucket), lambda: AdaptiveLimiter(concurrency, name=_name(endpoint, bucket))
    )
    limiter.widen(concurrency)
    return limiter


def forget_limiters() -> None:
    """Drop every shared limiter: the next :func:`shared_limiter` starts afresh (a forked
    child does so by itself; tests)."""
    _limiters.clear()
