"""The events, their subscribers and the process-wide totals.

Dispatch reads an immutable tuple of callbacks (replaced, never changed in place, under a
lock), so publishing an event takes no lock; the totals take one lock per S3 request.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "Kind",
    "OperationMetrics",
    "Outcome",
    "RequestCounts",
    "Subscription",
    "Totals",
    "capture",
    "subscribe",
    "totals",
]

log = logging.getLogger("s3ckpt.metrics")

Kind = Literal["save", "load", "prune", "gc"]
# What finished: a save (every rank), a load (every rank), a retention prune of one run,
# or a gc of a prefix.

Outcome = Literal["ok", "not_found", "precondition_failed", "failed"]
# How one S3 request ended.
#
# * ``"ok"``: answered with success (after however many attempts).
# * ``"not_found"``: answered 404 where the code that sent it asked whether the object
#   exists (a HEAD, a probe for a commit marker or a ``latest`` pointer not written yet,
#   aborting an upload that is gone): an answer, not a failure.
# * ``"precondition_failed"``: answered 412 to a conditional request that may lose by
#   design (``If-None-Match: *`` on a marker or lease another writer holds, a
#   compare-and-swap on an object that changed, the capability probe's requests that must
#   be refused): an answer, not a failure.
# * ``"failed"``: every other failure after its last attempt, a 404 or 412 nobody expected
#   included (a data object a committed manifest lists, an upload that should exist).
#
# Alert on ``"failed"`` (:attr:`RequestCounts.failed`, :attr:`Totals.failed`,
# :attr:`OperationMetrics.failed_requests`); a healthy job has none.


@dataclass(frozen=True)
class OperationMetrics:
    """One finished save, load, prune or gc: what it cost and what it did.

    Requests are counted per logical S3 request (one ``PutObject``, one ``UploadPart``,
    however many attempts it took); ``retries`` counts the attempts after the first
    (``requests + retries`` HTTP requests were sent), a resumed ranged GET included.

    Attributes:
        kind: ``"save"``, ``"load"``, ``"prune"`` or ``"gc"``.
        url: The checkpoint (save, load), the run (prune) or the prefix (gc).
        step: The checkpoint's step, when known (save, load).
        rank: The rank that reports (saves and loads report on every rank; 0 otherwise).
        ok: Whether the operation succeeded (a save: committed; a prune: every delete
            succeeded and the lease was free).
        error: The failure's exception class name (``"ChecksumMismatchError"``), else
            ``None``. A prune whose deletes partly failed is ``ok=False`` with ``error``
            ``"DeleteFailures"``.
        started_at: Wall-clock start (seconds since the epoch).
        duration_s: Seconds from start to finish (a save: until committed or failed).
        bytes: Bytes this rank wrote (save: its data objects) or read (load: the ranged
            GETs of its items) to or from the store.
        blocked_s: Saves only: seconds the training loop was held (a synchronous save: all
            of it; an async save: until staged, any wait for the previous save included).
        requests: S3 requests made for the operation in this process.
        failed_requests: Those that failed after their last attempt (outcome
            ``"failed"``; expected 404s and 412s are not failures).
        not_found: Those answered with an expected 404 (a probe for an object not
            written yet, :data:`Outcome`).
        precondition_failed: Those answered with an expected 412 (a conditional write
            that lost by design).
        retries: Attempts after the first, over those requests.
        throttled: Attempts answered 503 SlowDown (or another throttling code).
        checksum_failures: CRC32C mismatches detected (loads).
        deleted: Checkpoints deleted (prune: planned and resumed; gc: abandoned saves
            removed and a dead pruner's checkpoints finished).
        bytes_freed: Bytes under the deleted checkpoints.
        lease_wait_s: Seconds spent taking the run's lease (prune, gc).
        lease_busy: Runs skipped because another pruner held their lease (prune: 0 or 1).
        dry_run: A prune or gc that only planned (deleted nothing).
    """

    kind: Kind
    url: str
    step: int | None = None
    rank: int = 0
    ok: bool = True
    error: str | None = None
    started_at: float = 0.0
    duration_s: float = 0.0
    bytes: int = 0
    blocked_s: float | None = None
    requests: int = 0
    retries: int = 0
    throttled: int = 0
    checksum_failures: int = 0
    deleted: int = 0
    bytes_freed: int = 0
    lease_wait_s: float = 0.0
    lease_busy: int = 0
    dry_run: bool = False
    failed_requests: int = 0
    not_found: int = 0
    precondition_failed: int = 0

    @property
    def bucket(self) -> str:
        """The bucket (or host) of :attr:`url`; ``""`` for a local path."""
        return self.url.partition("://")[2].partition("/")[0]


@dataclass(frozen=True)
class RequestCounts:
    """Requests of one S3 operation (``"put"``, ``"get"``, ``"upload_part"``, ...).

    Every request has one :data:`Outcome`: ``requests`` is the sum of ``failed``,
    ``not_found``, ``precondition_failed`` and the ones that succeeded.

    Attributes:
        requests: Logical requests made.
        retries: Attempts after the first.
        throttled: Attempts answered with a throttling code (503 SlowDown).
        failed: Requests that failed after their last attempt (outcome ``"failed"``): what
            to alert on. Expected 404s and 412s are not in it.
        not_found: Requests answered with an expected 404 (outcome ``"not_found"``).
        precondition_failed: Requests answered with an expected 412 (outcome
            ``"precondition_failed"``).
    """

    requests: int = 0
    retries: int = 0
    throttled: int = 0
    failed: int = 0
    not_found: int = 0
    precondition_failed: int = 0

    @property
    def expected(self) -> int:
        """Requests answered with an expected 404 or 412 (not failures)."""
        return self.not_found + self.precondition_failed


@dataclass(frozen=True)
class Totals:
    """Process-wide counts since the process started (monotonic, for exporters).

    Attributes:
        operations: Requests by S3 operation name.
        checksum_failures: CRC32C mismatches detected (loads and ``verify``).
    """

    operations: Mapping[str, RequestCounts] = field(default_factory=dict)
    checksum_failures: int = 0

    def _sum(self, name: str) -> int:
        return sum(getattr(c, name) for c in self.operations.values())

    requests = property(lambda self: self._sum("requests"), doc="All requests.")
    retries = property(lambda self: self._sum("retries"), doc="All retries.")
    throttled = property(lambda self: self._sum("throttled"), doc="All throttled attempts.")
    failed = property(
        lambda self: self._sum("failed"),
        doc="All requests that failed (expected 404s and 412s not included): alert on this.",
    )
    not_found = property(
        lambda self: self._sum("not_found"), doc="All requests answered with an expected 404."
    )
    precondition_failed = property(
        lambda self: self._sum("precondition_failed"),
        doc="All requests answered with an expected 412.",
    )

    expected = RequestCounts.expected  # all requests answered with an expected 404 or 412


# -- totals ------------------------------------------------------------------------------------
_totals_lock = threading.Lock()
_totals: dict[str, Counter[str]] = {}
# RequestCounts fields by S3 operation name; the checksum failures under "".


def add_totals(operation: str, counts: Mapping[str, int]) -> None:
    """Add ``counts`` (:class:`RequestCounts` fields) to the totals of ``operation``
    (``""``: ``checksum_failures``)."""
    with _totals_lock:
        _totals.setdefault(operation, Counter()).update(counts)


def totals() -> Totals:
    """The process's cumulative request, retry, throttle and checksum-failure counts.

    Counted whether or not anybody subscribes; every S3 request of every store in the
    process is in them, whichever operation (if any) it belonged to. Each request is
    counted under its :data:`Outcome`: a healthy job's expected 404s and 412s are in
    ``not_found`` and ``precondition_failed``, never in ``failed``.
    """
    with _totals_lock:
        ops = {name: RequestCounts(**row) for name, row in _totals.items() if name}
        failures = _totals.get("", Counter())["checksum_failures"]
        return Totals(operations=ops, checksum_failures=failures)


# -- subscribers -------------------------------------------------------------------------------
Callback = Callable[[OperationMetrics], object]

_subscribers_lock = threading.Lock()
_subscribers: tuple[Callback, ...] = ()


class Subscription:
    """A registered callback; :meth:`close` (or leaving its ``with`` block) removes it.

    Attributes:
        closed: Whether :meth:`close` was called.
    """

    def __init__(self, callback: Callback) -> None:
        self.callback = callback
        self.closed = False

    def close(self) -> None:
        """Stop receiving events (idempotent)."""
        global _subscribers
        with _subscribers_lock:
            if self.closed:
                return
            self.closed = True
            i = _subscribers.index(self.callback)
            _subscribers = _subscribers[:i] + _subscribers[i + 1 :]

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def subscribe(callback: Callback) -> Subscription:
    """Call ``callback(event)`` with an :class:`OperationMetrics` for every operation that
    finishes in this process, until the returned :class:`Subscription` is closed.

    Callbacks run synchronously on the thread that finishes the operation (a save's
    upload thread for an async save, a rank's own thread for a load), before the save's
    handle resolves or the call returns: keep them short (hand the event to a queue for
    slow work). An exception in a callback is logged and otherwise ignored: it never fails
    a save, a load or a prune.
    """
    global _subscribers
    sub = Subscription(callback)
    with _subscribers_lock:
        _subscribers = (*_subscribers, callback)
    return sub


@contextmanager
def capture() -> Iterator[list[OperationMetrics]]:
    """Collect the events of every operation that finishes in the block (any thread).

    ::

        with s3ckpt.metrics.capture() as events:
            ckpt.save(100, model)
        assert events[0].kind == "save" and events[0].requests > 0
    """
    events: list[OperationMetrics] = []
    with subscribe(events.append):
        yield events


def publish(event: OperationMetrics) -> None:
    """Hand ``event`` to every subscriber; a subscriber's exception is logged, never raised."""
    for callback in _subscribers:
        try:
            callback(event)
        except Exception:
            log.exception("s3ckpt.metrics: a subscriber failed on a %s event", event.kind)
