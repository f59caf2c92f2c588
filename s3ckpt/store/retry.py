"""The one retry policy of s3ckpt: a frozen :class:`RetryPolicy` built from a
:class:`~s3ckpt.config.TransferConfig`, and a fresh tenacity ``Retrying`` per call built
from it (:meth:`RetryPolicy.retrying`), as tenacity's own docs use it.

Every retry in the package comes from here: the S3 store's requests
(:mod:`s3ckpt.store._request`), the resumption of a ranged GET whose body broke off
(:mod:`s3ckpt.store._body`), and retention's rounds of per-key ``DeleteObjects``
failures (:mod:`s3ckpt.retention._deleter`). Each call's ``Retrying`` stops after the
policy's ``attempts`` (counting the ``attempts_used`` an earlier loop already spent on the
same work), or when another attempt could not end before the policy's ``deadline``
(counted from ``since``, or the first attempt, less the seconds the call ``queued`` in the
client's own queue), and backs off with full jitter from ``initial_delay`` doubling up to
``max_delay``. Its stop and wait are plain functions closed over that call's values.
Which outcomes are retried is the caller's ``retry`` (a 404 or 412 the caller expects is
not a transient failure, so it is never retried or counted as one).

This module imports neither boto3/botocore nor torch: retention uses it, and retention
runs without either.
"""

from __future__ import annotations

import contextlib
import contextvars
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tenacity import RetryCallState, Retrying
from tenacity.retry import retry_base

from s3ckpt.config import TransferConfig

__all__ = [
    "THROTTLE_CODES",
    "TRANSIENT_CODES",
    "RetryPolicy",
    "TimeoutKind",
    "cleanup",
    "cleanup_end",
    "retrying",
]

#: S3 error codes (HTTP statuses where the store gave no code) worth retrying: throttling, server
#: errors, a request the store timed out reading, and a body that reached the store with another
#: checksum than the one sent (``BadDigest``: corrupted in transit). The store's error table maps
#: exactly these to :class:`~s3ckpt.errors.TransientStoreError`; retention retries per-key
#: ``DeleteObjects`` failures with these codes.
TRANSIENT_CODES: frozenset[str] = frozenset(
    "SlowDown Throttling ThrottlingException RequestLimitExceeded ServiceUnavailable "  # noqa: SIM905
    "InternalError RequestTimeout BadDigest XAmzContentSHA256Mismatch 500 502 503 504".split()
)

#: The :data:`TRANSIENT_CODES` that mean "too many requests" (S3's ``503 Slow Down``;
#: ``ServiceUnavailable`` is the 503 S3 documents as "reduce your request rate"). The S3 store's
#: adaptive limiter (:mod:`s3ckpt.store._adaptive`) narrows its window on these, and on any HTTP
#: 503; never on 500s, timeouts or resets.
THROTTLE_CODES: frozenset[str] = frozenset(
    "SlowDown Throttling ThrottlingException RequestLimitExceeded ServiceUnavailable 503".split()  # noqa: SIM905
)

#: ``timeout_kind(exc)``: ``"connect"`` or ``"read"`` when ``exc`` is (or wraps) a timeout, else
#: ``None``. The store's is :func:`s3ckpt.store._errors.timeout_kind`.
TimeoutKind = Callable[[BaseException | None], str | None]

#: s3ckpt's own generator: a retry (in a background upload or retention thread too) must not move
#: the training job's global ``random`` state.
_JITTER = random.Random()


def _no_timeout(exc: BaseException | None) -> str | None:
    return None


@dataclass(frozen=True)
class RetryPolicy:
    """Attempts, back-off and deadline of s3ckpt's retries (from a ``TransferConfig``).

    Attributes:
        attempts: Attempts in all, the first included.
        initial_delay / max_delay: Full-jitter back-off: attempt ``n`` waits a uniform
            draw from ``[0, min(max_delay, initial_delay * 2**(n-1))]``.
        deadline: Seconds after which no attempt starts (``None``: no deadline). After a
            timeout the endpoint may be black-holed, so the next attempt is assumed to
            cost a whole ``read_timeout`` / ``connect_timeout`` and the loop stops when
            that would end past the deadline; after a quick failure (503, reset) no such
            cost is assumed.
        timeout_kind: Tells a connect or read timeout (default: nothing is one).
        sleep: Sleeps the back-off (tests pass a no-op or a recorder).
    """

    attempts: int
    initial_delay: float
    max_delay: float
    deadline: float | None
    read_timeout: float = 0.0
    connect_timeout: float = 0.0
    timeout_kind: TimeoutKind = field(default=_no_timeout, compare=False)
    sleep: Callable[[float], None] | None = field(default=None, compare=False)

    @classmethod
    def of(
        cls,
        config: TransferConfig | None = None,
        *,
        deadline: bool = True,
        timeout_kind: TimeoutKind | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> RetryPolicy:
        """The policy of ``config`` (default :class:`TransferConfig`): its
        ``max_attempts``, back-off, and ``request_deadline`` (none without ``deadline``)."""
        tc = config or TransferConfig()
        return cls(
            attempts=tc.max_attempts,
            initial_delay=tc.retry_initial_delay,
            max_delay=tc.retry_max_delay,
            deadline=tc.request_deadline if deadline else None,
            read_timeout=tc.read_timeout,
            connect_timeout=tc.connect_timeout,
            timeout_kind=timeout_kind or _no_timeout,
            sleep=sleep,
        )

    def retrying(
        self,
        *,
        retry: retry_base,
        attempts_used: int = 0,
        since: float | None = None,
        queued: Callable[[], float] | None = None,
        end: float | None = None,
        before_sleep: Callable[[RetryCallState], None] | None = None,
    ) -> Retrying:
        """A fresh ``Retrying`` for one call: ``policy.retrying(retry=...)(fn)`` or
        ``for attempt in policy.retrying(retry=...)``. The last exception is re-raised as
        itself, never as tenacity's ``RetryError``.

        Args:
            retry: Which outcomes are retried (a tenacity ``retry_*`` strategy).
            attempts_used: Attempts already spent on the same work (a ranged GET resumed
                more than once): they count towards :attr:`attempts`, and the back-off
                goes on growing from where they left it.
            since: The :func:`time.monotonic` time the deadline counts from (default: the
                first attempt).
            queued: Seconds this call has waited so far in the client's own queue (the
                adaptive limiter): left out of the deadline.
            end: A :func:`time.monotonic` time past which no attempt starts (a short
                budget: :func:`cleanup`, or an endpoint that went silent).
            before_sleep: Called before each back-off (a log line, a count).
        """

        def stop(state: RetryCallState) -> bool:
            if state.attempt_number >= self.attempts - attempts_used:
                return True
            if self.deadline is None:
                return False
            if since is None:
                spent = state.seconds_since_start or 0.0
            else:
                spent = (state.outcome_timestamp or time.monotonic()) - since
            elapsed = spent - (queued() if queued is not None else 0.0) + state.upcoming_sleep
            short = end is not None and time.monotonic() + state.upcoming_sleep >= end
            if elapsed >= self.deadline or short:  # the deadline, or a short budget, is spent
                return True
            outcome = state.outcome
            kind = self.timeout_kind(outcome.exception() if outcome is not None else None)
            cost = {"read": self.read_timeout, "connect": self.connect_timeout}.get(kind or "")
            return cost is not None and elapsed + cost > self.deadline

        def wait(state: RetryCallState) -> float:
            n = min(state.attempt_number - 1 + attempts_used, 64)
            return _JITTER.uniform(0.0, min(self.max_delay, self.initial_delay * 2.0**n))

        return Retrying(
            stop=stop,
            wait=wait,
            retry=retry,
            reraise=True,
            before_sleep=before_sleep,
            sleep=self.sleep or time.sleep,
        )


def retrying(config: TransferConfig | None = None, **options: Any) -> Retrying:
    """``RetryPolicy.of(config, ...).retrying(...)`` in one call: a tenacity ``Retrying``
    with s3ckpt's retry policy. ``options`` are :meth:`RetryPolicy.of`'s (``deadline``,
    ``timeout_kind``, ``sleep``) and :meth:`RetryPolicy.retrying`'s (``retry``,
    ``attempts_used``, ``since``, ...)."""
    of = {k: options.pop(k) for k in ("deadline", "timeout_kind", "sleep") if k in options}
    return RetryPolicy.of(config, **of).retrying(**options)


# -- short budgets for cleanup ---------------------------------------------------------------

_cleanup: contextvars.ContextVar[list[float | None] | None] = contextvars.ContextVar(
    "s3ckpt_cleanup", default=None
)


@contextlib.contextmanager
def cleanup() -> Iterator[None]:
    """Requests made in the block (releasing a lease, aborting uploads, recording a
    failure) share one short budget, ``TransferConfig.cleanup_timeout`` from the first of
    them, instead of a whole ``request_deadline`` each: a store that cannot be reached is
    not waited for again. A nested block shares the outer one's budget."""
    token = _cleanup.set(_cleanup.get() or [None])  # a nested block: the outer one's budget
    try:
        yield
    finally:
        _cleanup.reset(token)


def cleanup_end(seconds: float) -> float | None:
    """The end of the current :func:`cleanup` budget (started now, ``seconds`` long, by
    the first request that asks); ``None`` outside one."""
    box = _cleanup.get()
    if box is None:
        return None
    if box[0] is None:
        box[0] = time.monotonic() + seconds
    return box[0]
