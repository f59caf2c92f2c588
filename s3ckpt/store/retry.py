"""The one retry policy of s3ckpt: tenacity ``Retrying`` objects built from a
:class:`~s3ckpt.config.TransferConfig`.

Every retry in the package comes from :func:`retrying`: the S3 store's requests, the
resumption of a ranged GET whose body broke off, and retention's rounds of per-key
``DeleteObjects`` failures. They share one shape: stop after ``max_attempts`` (or the
caller's count) or, for requests, when another attempt could not end before
``request_deadline``; back off exponentially from ``retry_initial_delay`` up to
``retry_max_delay`` with full jitter. :data:`TRANSIENT_CODES` is the one list of S3
error codes worth retrying.

This module imports neither boto3/botocore nor torch: retention uses it, and retention
runs without either.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from tenacity import (
    RetryCallState,
    Retrying,
    stop_after_attempt,
    wait_exponential,
    wait_random_exponential,
)
from tenacity.retry import retry_base
from tenacity.stop import stop_base

from s3ckpt.config import TransferConfig

__all__ = ["THROTTLE_CODES", "TRANSIENT_CODES", "TimeoutKind", "retrying"]

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


_JITTER = random.Random()


class _FullJitter(wait_random_exponential):
    """tenacity's full-jitter back-off, drawn from a generator of s3ckpt's own: tenacity
    draws from the global ``random``, and a retry (in a background upload or retention
    thread too) would otherwise move the training job's Python RNG."""

    def __call__(self, retry_state: RetryCallState) -> float:
        high = wait_exponential.__call__(self, retry_state)
        return _JITTER.uniform(self.min, high)


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

    The deadline counts from ``since`` (a :func:`time.monotonic` value) when given, else
    from the first attempt, less the seconds ``queued()`` reports: time the request spent
    waiting in the client's own queue (the adaptive limiter's window and pacing), which
    says nothing about the endpoint.
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
        if self.since is None:
            spent = retry_state.seconds_since_start or 0.0
        else:
            spent = (retry_state.outcome_timestamp or time.monotonic()) - self.since
        if self.queued is not None:
            spent -= self.queued()
        # upcoming_sleep: the back-off before the next attempt (tenacity >= 8.3 sets it
        # before asking stop; older versions leave it 0).
        elapsed = spent + float(getattr(retry_state, "upcoming_sleep", 0.0) or 0.0)
        if elapsed >= self.deadline:
            return True
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
    stop: stop_base = stop_after_attempt(
        (tc.max_attempts if attempts is None else attempts) - attempts_used
    )
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
        before_sleep=before_sleep,
        sleep=sleep or _default_sleep,
    )
