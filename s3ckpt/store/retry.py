"""The one retry policy of s3ckpt: tenacity ``Retrying`` objects built from a
:class:`~s3ckpt.config.TransferConfig`.

Every retry in the package comes from :func:`retrying`: the S3 store's requests, the
resumption of a ranged GET whose body broke off, and retention's rounds of per-key
``DeleteObjects`` failures. They share one shape: stop after ``max_attempts`` (or the
caller's count) or, for requests, when another attempt could not end before
``request_deadline``; back off exponentially from ``retry_initial_delay`` up to
``retry_max_delay`` with full jitter. :data:`TRANSIENT_CODES` is the one list of S3
error codes worth retrying.

One policy serves many calls at once: an S3 store builds its ``Retrying`` once and runs
every request (on any thread) through it. What belongs to one call (when its deadline
started, the time it waited in the client's own queue, attempts an earlier loop already
spent, its log line) rides on the :class:`RetryCall` that is the call's function: tenacity
hands it to the strategies as ``retry_state.fn``, and makes one ``RetryCallState`` per call.
The strategies keep no state of their own between calls, and tenacity keeps its
statistics and per-iteration state thread-local (checked in tenacity 9.2), so threads
never share mutable state through the policy.

This module imports neither boto3/botocore nor torch: retention uses it, and retention
runs without either.
"""

from __future__ import annotations

import contextlib
import contextvars
import random
import time
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    wait_exponential,
    wait_random_exponential,
)
from tenacity.retry import retry_base
from tenacity.stop import stop_base

from s3ckpt.config import TransferConfig

__all__ = [
    "THROTTLE_CODES",
    "TRANSIENT_CODES",
    "RetryCall",
    "TimeoutKind",
    "cleanup",
    "cleanup_end",
    "retrying",
]

T = TypeVar("T")

TRANSIENT_CODES: frozenset[str] = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "ServiceUnavailable",
        "InternalError",
        "RequestTimeout",
        "BadDigest",
        "XAmzContentSHA256Mismatch",
        "500",
        "502",
        "503",
        "504",
    }
)
"""S3 error codes (HTTP statuses where the store gave no code) worth retrying: throttling,
server errors, a request the store timed out reading, and a body that reached the store
with another checksum than the one sent (``BadDigest``: corrupted in transit). The store's
error table maps exactly these to :class:`~s3ckpt.errors.TransientStoreError`; retention
retries per-key ``DeleteObjects`` failures with these codes."""

THROTTLE_CODES: frozenset[str] = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "ServiceUnavailable",
        "503",
    }
)
"""The :data:`TRANSIENT_CODES` that mean "too many requests": the store asks the client to
slow down (S3's ``503 Slow Down``; ``ServiceUnavailable`` is the 503 S3 documents as
"reduce your request rate"). The S3 store's adaptive limiter
(:mod:`s3ckpt.store._adaptive`) narrows its window on these, and on any HTTP 503; never on
500s, timeouts or resets, which say nothing about the request rate."""

TimeoutKind = Callable[[BaseException | None], str | None]
"""``timeout_kind(exc)``: ``"connect"`` or ``"read"`` when ``exc`` is (or wraps) a
timeout, else ``None``. The store's is :func:`s3ckpt.store._errors.timeout_kind`."""


class RetryCall(Generic[T]):
    """One call under a shared policy: ``policy(RetryCall(attempt, ...))`` runs ``attempt()``
    until it succeeds or the policy stops, and holds what is this call's own.

    Args:
        attempt: One attempt (no arguments).
        since: The :func:`time.monotonic` time this call's deadline counts from (default:
            its first attempt).
        attempts_used: Attempts already spent on the same work (a ranged GET resumed more
            than once): they count towards the policy's attempts, and the back-off goes
            on growing from where they left it.
        before_sleep: Called before each back-off of this call (a log line, a count); the
            policy's own ``before_sleep`` is not called for it then.
        end: A :func:`time.monotonic` time past which no attempt starts (a short budget:
            :func:`cleanup`, or an endpoint that went silent); ``None``: only the deadline.

    Attributes:
        queued: Seconds this call's attempts waited in the client's own queue (the
            adaptive limiter): the caller adds to it, the deadline leaves it out.
        attempts: Attempts made so far.
    """

    __slots__ = ("attempt", "attempts", "attempts_used", "before_sleep", "end", "queued", "since")

    def __init__(
        self,
        attempt: Callable[[], T],
        *,
        since: float | None = None,
        attempts_used: int = 0,
        before_sleep: Callable[[RetryCallState], None] | None = None,
        end: float | None = None,
    ) -> None:
        self.attempt = attempt
        self.end = end
        self.since = since
        self.attempts_used = attempts_used
        self.before_sleep = before_sleep
        self.queued = 0.0
        self.attempts = 0

    def __call__(self) -> T:
        self.attempts += 1
        return self.attempt()


def _call_of(retry_state: RetryCallState) -> RetryCall[object] | None:
    """The :class:`RetryCall` tenacity is running in ``retry_state``, if it is one."""
    fn = retry_state.fn
    return fn if isinstance(fn, RetryCall) else None


_JITTER = random.Random()


class _FullJitter(wait_random_exponential):
    """tenacity's full-jitter back-off, drawn from a generator of s3ckpt's own: tenacity
    draws from the global ``random``, and a retry (in a background upload or retention
    thread too) would otherwise move the training job's Python RNG. A call that already
    spent attempts (:attr:`RetryCall.attempts_used`) backs off as the later attempts of
    one long loop would."""

    def __call__(self, retry_state: RetryCallState) -> float:
        high = wait_exponential.__call__(self, retry_state)
        call = _call_of(retry_state)
        if call is not None and call.attempts_used:
            high = min(self.max, high * 2.0**call.attempts_used)
        return _JITTER.uniform(self.min, high)


class _StopAfterAttempts(stop_base):
    """Stop once ``attempts`` attempts were made, counting those the call already spent
    (:attr:`RetryCall.attempts_used`)."""

    def __init__(self, attempts: int) -> None:
        self.attempts = attempts

    def __call__(self, retry_state: RetryCallState) -> bool:
        call = _call_of(retry_state)
        used = call.attempts_used if call is not None else 0
        return retry_state.attempt_number >= self.attempts - used


def _before_sleep(
    default: Callable[[RetryCallState], None] | None,
) -> Callable[[RetryCallState], None]:
    """The policy's ``before_sleep``: the call's own (:attr:`RetryCall.before_sleep`), else
    ``default``."""

    def before_sleep(retry_state: RetryCallState) -> None:
        call = _call_of(retry_state)
        own = call.before_sleep if call is not None else None
        hook = own or default
        if hook is not None:
            hook(retry_state)

    return before_sleep


def _no_timeout(exc: BaseException | None) -> str | None:
    return None


def _default_sleep(seconds: float) -> None:
    time.sleep(seconds)


class _StopAtDeadline(stop_base):
    """Stop once another attempt could not finish within ``TransferConfig.request_deadline``.

    Never start an attempt after the deadline. After a *timeout* the endpoint may be
    black-holed, so the next attempt is assumed to cost a whole timeout again: stop when
    that would end past the deadline. After a quick failure (503, reset) no such cost is
    assumed, so throttling is still retried when ``read_timeout`` is close to (or above)
    the deadline.

    The deadline counts from the call's ``since`` (:class:`RetryCall`), else the policy's
    (a :func:`time.monotonic` value), else from the call's first attempt, less the seconds
    the call queued (:attr:`RetryCall.queued`, plus the policy's ``queued()``): time the
    request spent waiting in the client's own queue (the adaptive limiter's window and
    pacing), which says nothing about the endpoint.
    """

    def __init__(
        self,
        deadline: float,
        read_timeout: float,
        connect_timeout: float,
        timeout_kind: TimeoutKind,
        since: float | None = None,
        queued: Callable[[], float] | None = None,
    ) -> None:
        self.deadline = deadline
        self.read_timeout = read_timeout
        self.connect_timeout = connect_timeout
        self.timeout_kind = timeout_kind
        self.since = since
        self.queued = queued

    def __call__(self, retry_state: RetryCallState) -> bool:
        call = _call_of(retry_state)
        since = call.since if call is not None and call.since is not None else self.since
        if since is None:
            spent = retry_state.seconds_since_start or 0.0
        else:
            spent = (retry_state.outcome_timestamp or time.monotonic()) - since
        if self.queued is not None:
            spent -= self.queued()
        if call is not None:
            spent -= call.queued
        # upcoming_sleep: the back-off before the next attempt (tenacity >= 8.3 sets it
        # before asking stop; older versions leave it 0).
        upcoming = float(getattr(retry_state, "upcoming_sleep", 0.0) or 0.0)
        elapsed = spent + upcoming
        if elapsed >= self.deadline:
            return True
        if call is not None and call.end is not None and time.monotonic() + upcoming >= call.end:
            return True  # a short budget is spent
        outcome = retry_state.outcome
        kind = self.timeout_kind(outcome.exception() if outcome is not None else None)
        if kind == "read":
            return elapsed + self.read_timeout > self.deadline
        if kind == "connect":
            return elapsed + self.connect_timeout > self.deadline
        return False


def retrying(
    config: TransferConfig | None = None,
    *,
    retry: retry_base,
    sleep: Callable[[float], None] | None = None,
    before_sleep: Callable[[RetryCallState], None] | None = None,
    attempts: int | None = None,
    attempts_used: int = 0,
    deadline: bool = True,
    since: float | None = None,
    timeout_kind: TimeoutKind | None = None,
    queued: Callable[[], float] | None = None,
) -> Retrying:
    """A tenacity ``Retrying`` with s3ckpt's retry policy, built from ``config``.

    Build it once and run many calls through it, from any thread: ``policy(fn)``, or
    ``policy(RetryCall(fn, since=..., attempts_used=..., before_sleep=...))`` for a call
    with its own deadline start, spent attempts, queued time or log line (the arguments
    of the same names here are the defaults for calls without their own).

    Stops after ``attempts`` (default ``config.max_attempts``, first try included) or,
    with ``deadline``, when another attempt could not end before
    ``config.request_deadline`` (after a timeout, as ``timeout_kind`` tells one, the next
    attempt is assumed to take a whole ``read_timeout`` / ``connect_timeout``). Waits
    ``wait_random_exponential(retry_initial_delay, max=retry_max_delay)``: full jitter.
    The last exception is re-raised as itself (``reraise=True``), never as tenacity's
    ``RetryError``.

    Args:
        config: Attempts, back-off and deadline (default :class:`TransferConfig`).
        retry: Which outcomes are retried (a tenacity ``retry_*`` strategy).
        sleep: Sleeps the back-off (tests pass a no-op or a recorder).
        before_sleep: Called before each back-off (for a log line).
        attempts: Attempts in all, instead of ``config.max_attempts``.
        attempts_used: Attempts already spent on the same work (a ranged GET resumed
            more than once): they count towards ``attempts`` and the back-off goes on
            growing from where they left it.
        deadline: Whether ``config.request_deadline`` bounds the attempts.
        since: The :func:`time.monotonic` time the deadline counts from (default: the
            first attempt).
        timeout_kind: Classifies a failure as a connect or read timeout (default: none
            is).
        queued: Seconds spent so far waiting in the client's own queue (the adaptive
            limiter): not counted towards the deadline.
    """
    tc = config or TransferConfig()
    total = tc.max_attempts if attempts is None else attempts
    stop: stop_base = _StopAfterAttempts(total - attempts_used)
    if deadline:
        stop = stop | _StopAtDeadline(
            tc.request_deadline,
            tc.read_timeout,
            tc.connect_timeout,
            timeout_kind or _no_timeout,
            since,
            queued,
        )
    # Attempt n of this loop backs off like attempt n + attempts_used of one long loop.
    wait = _FullJitter(multiplier=tc.retry_initial_delay * 2**attempts_used, max=tc.retry_max_delay)
    return Retrying(
        stop=stop,
        wait=wait,
        retry=retry,
        reraise=True,
        before_sleep=_before_sleep(before_sleep),
        sleep=sleep or _default_sleep,
    )


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
    if _cleanup.get() is not None:
        yield
        return
    token = _cleanup.set([None])
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
