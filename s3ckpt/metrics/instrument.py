"""The hooks s3ckpt's own modules (and integrations) report through.

A :class:`Recorder` collects what one operation costs: the S3 requests made in its
context, the bytes it moved, the checksum failures it met. The recorder in effect is a
:mod:`contextvars` variable, so attribution follows the code, not the thread:

* :func:`operation` makes a recorder current for a block and publishes its event when
  the block ends (the retention engine's ``prune`` and ``gc``);
* :func:`bound` makes a recorder someone holds current (a DCP writer binds the one it
  captured at construction inside torch's threads);
* :func:`in_context` carries the caller's context into a worker thread (every pool and
  thread s3ckpt starts goes through it), so a part uploaded on the upload pool counts for
  the save that queued it.

A request counts for the innermost recorder of its context only. Two operations that
overlap on different threads (an async save uploading while the next step's load runs,
retention running in the background after a commit) each count their own requests: each
has its own context. Requests made outside any operation (``s3ckpt ls``, ``verify``) count
in :func:`~s3ckpt.metrics.totals` only.

Whether a 404 or a 412 is a failure is for the code that sent the request to say: a
block under :func:`expecting` counts those answers as the expected outcomes
``"not_found"`` / ``"precondition_failed"`` (:data:`~s3ckpt.metrics.Outcome`), apart from
failures; ``store/_request.call`` asks :func:`expected_outcome` when a request ends so.

Cost: with no recorder current, a request costs one context-variable read and one lock
for the totals; with one, one more lock. Nothing is done per byte.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal, ParamSpec, TypeVar, get_args

from s3ckpt.metrics._events import Kind, OperationMetrics, Outcome, add_totals, publish

__all__ = [
    "Expectable",
    "Participant",
    "Recorder",
    "bound",
    "expected_outcome",
    "expecting",
    "in_context",
    "operation",
    "record_checksum_failure",
    "record_request",
    "record_retry",
]

P = ParamSpec("P")
R = TypeVar("R")

_current: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar(
    "s3ckpt_metrics_recorder", default=None
)

Expectable = Literal["not_found", "precondition_failed"]
# The answers a caller may expect: a 404 (``"not_found"``) or a 412
# (``"precondition_failed"``).

_expected: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "s3ckpt_metrics_expected", default=frozenset()
)


@contextmanager
def expecting(*outcomes: Expectable) -> Iterator[None]:
    """Count the requests of the block that are answered 404 (``"not_found"``) or 412
    (``"precondition_failed"``) as that expected outcome, not as failures.

    For the code that sends a request and handles that answer as a normal state of the
    bucket: a probe for an object that may not exist yet, a put-if-absent that may lose
    its race, a compare-and-swap that may find the object changed. Keep the block around
    those requests only (it is a context variable: it follows the block's code, and
    threads started inside it through :func:`in_context`)::

        with expecting("not_found"):
            try:
                raw = store.get(pointer_key)
            except ObjectNotFoundError:
                raw = None
    """
    token = _expected.set(_expected.get() | frozenset(outcomes))
    try:
        yield
    finally:
        _expected.reset(token)


def expected_outcome(answer: Expectable) -> Outcome:
    """``answer`` when the code in this context expects it (:func:`expecting`), else
    ``"failed"``: how ``store/_request.call`` counts a request answered 404 or 412."""
    return answer if answer in _expected.get() else "failed"


class Recorder:
    """What one operation costs, counted from any thread; :meth:`finish` publishes it.

    Args:
        kind: The operation (:data:`~s3ckpt.metrics.Kind`).
        url: The checkpoint, run or prefix it acts on.
        step: The checkpoint's step, when known.
        rank: The reporting rank.
    """

    def __init__(self, kind: Kind, url: str, *, step: int | None = None, rank: int = 0) -> None:
        self.kind: Kind = kind
        self.url = url
        self.step = step
        self.rank = rank
        self.started_at = time.time()
        self._t0 = time.monotonic()
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.finished = False

    def add(self, **counts: int) -> None:
        """Add ``counts``: :class:`~s3ckpt.metrics.RequestCounts` fields (``requests``,
        ``failed``, ...), ``checksum_failures`` or ``bytes`` (written or read)."""
        with self._lock:
            self.counts.update(counts)

    def finish(
        self, error: BaseException | str | None = None, **fields: Any
    ) -> OperationMetrics | None:
        """Publish the operation's event (once; later calls return ``None``).

        Args:
            error: The exception it failed with (or its name), ``None`` when it succeeded.
            fields: Other :class:`~s3ckpt.metrics.OperationMetrics` fields (``blocked_s``,
                ``deleted``, ``bytes_freed``, ``lease_wait_s``, ``lease_busy``,
                ``dry_run``, ``ok``; ``step`` and ``rank`` override the recorder's).
        """
        with self._lock:
            if self.finished:
                return None
            self.finished = True
            counted = dict(self.counts)
        counted["failed_requests"] = counted.pop("failed", 0)
        name = error if isinstance(error, str) or error is None else type(error).__name__
        fields = {"step": self.step, "rank": self.rank, "ok": name is None, **fields}
        event = OperationMetrics(
            kind=self.kind,
            url=self.url,
            error=name,
            started_at=self.started_at,
            duration_s=time.monotonic() - self._t0,
            **{**counted, **fields},
        )
        publish(event)
        return event


class Participant:
    """The save or load a DCP writer or reader takes part in (:mod:`s3ckpt.dcp._located`
    runs each of its DCP callbacks under :meth:`active`): the operation of its kind current
    where it begins (a Checkpointer's save or load, whose owner publishes the event), else
    one of its own, which :meth:`end` publishes (plain ``dcp.save`` / ``dcp.load``).

    Pickles without its recorder (a lock, and this process's subscribers): in the process
    that unpickles it (DCP's process executor) the next :meth:`begin` starts its own.
    """

    def __init__(self, kind: Kind) -> None:
        self.kind: Kind = kind
        self.recorder: Recorder | None = None
        self.owned = False

    def __getstate__(self) -> dict[str, Any]:
        return {"kind": self.kind, "recorder": None, "owned": False}

    def begin(self, url: str, *, step: int | None = None, rank: int = 0) -> None:
        """A save or load of ``url`` begins: join the current operation of this kind; else
        keep our own while it is unfinished (now of ``url``); else start a new one."""
        outer = _current.get()
        if outer is not None and outer.kind == self.kind:
            self.recorder, self.owned = outer, False
        elif not self.owned or self.recorder is None or self.recorder.finished:
            self.recorder, self.owned = Recorder(self.kind, url, step=step, rank=rank), True
        else:
            self.recorder.url = url

    @contextmanager
    def active(self, on_error: Callable[[BaseException], None]) -> Iterator[None]:
        """The recorder current for the block; if the block raises, ``on_error(exc)`` (which
        ends the operation, :meth:`end`) runs before the exception propagates."""
        try:
            with bound(self.recorder):
                yield
        except BaseException as exc:
            on_error(exc)
            raise

    def end(self, error: BaseException | None = None, *, moved: int = 0, **fields: Any) -> None:
        """Count the ``moved`` data bytes (a save's uploads, a load's ranged GETs) and
        publish our own operation's event (:meth:`Recorder.finish`); a joined one is its
        owner's to publish."""
        if self.recorder is not None:
            self.recorder.add(bytes=moved)
            if self.owned:
                self.recorder.finish(error, **fields)


@contextmanager
def bound(recorder: Recorder | None) -> Iterator[None]:
    """Make ``recorder`` current for the block (``None``: leave the context as it is)."""
    if recorder is None or _current.get() is recorder:
        yield
        return
    token = _current.set(recorder)
    try:
        yield
    finally:
        _current.reset(token)


@contextmanager
def operation(
    kind: Kind, url: str, *, step: int | None = None, rank: int = 0
) -> Iterator[Recorder]:
    """Run the block as one operation: a new :class:`Recorder` is current inside it, and
    its event is published when the block ends (``ok=False`` with the exception's name if
    it raised, unless the block called :meth:`Recorder.finish` itself)."""
    recorder = Recorder(kind, url, step=step, rank=rank)
    try:
        with bound(recorder):
            yield recorder
    except BaseException as exc:
        recorder.finish(exc)
        raise
    recorder.finish()


def in_context(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn``, to run on another thread in (a copy of) the caller's context, so that its
    requests count for the caller's operation. Each call runs in its own copy, so the
    result may be handed to a pool's ``map`` or called from several threads at once.
    Returns ``fn`` itself when no recorder is current (nothing to carry)."""
    if _current.get() is None:
        return fn
    ctx = contextvars.copy_context()

    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        return ctx.copy().run(fn, *args, **kwargs)

    return run


def _count(operation: str, **counts: int) -> None:
    """Add ``counts`` to the process's totals and to the current recorder, if any."""
    add_totals(operation, counts)
    if (recorder := _current.get()) is not None:
        recorder.add(**counts)


def record_request(operation: str, attempts: int, throttled: int, outcome: Outcome) -> None:
    """Count one S3 request that ended with ``outcome`` (an :data:`~s3ckpt.metrics.Outcome`;
    another string raises ``ValueError``). ``store/_request.call`` calls it for every
    request."""
    if outcome not in get_args(Outcome):
        raise ValueError(f"unknown request outcome {outcome!r}")
    ended = {} if outcome == "ok" else {outcome: 1}
    _count(operation, requests=1, retries=attempts - 1, throttled=throttled, **ended)


def record_retry(operation: str) -> None:
    """Count one more attempt of a request already counted (a ranged GET resumed after
    its body broke off)."""
    _count(operation, retries=1)


def record_checksum_failure() -> None:
    """Count a CRC32C mismatch: in the totals, and for the current recorder. Every place
    s3ckpt compares a CRC32C with the recorded one calls this."""
    _count("", checksum_failures=1)
