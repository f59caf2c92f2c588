"""One S3 request: its checksum arguments, and its run under the store's
retry policy (a fresh ``Retrying`` per request from the store's frozen
:class:`~s3ckpt.store.retry.RetryPolicy`), each attempt holding a slot of the store's
adaptive limiter, with the failure mapped at the store's edge."""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from tenacity import RetryCallState, retry_if_exception

from s3ckpt import _crc
from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.errors import ObjectNotFoundError, PreconditionFailedError
from s3ckpt.metrics._events import Outcome
from s3ckpt.metrics.instrument import expected_outcome, record_request
from s3ckpt.store._adaptive import AdaptiveLimiter, Slot
from s3ckpt.store._deadline import AttemptTimedOut, watching
from s3ckpt.store._errors import is_throttle, is_transient, map_error, timeout_kind
from s3ckpt.store.base import Buffer
from s3ckpt.store.retry import RetryPolicy, cleanup_end

__all__ = ["call", "checksum_args"]

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

    Every attempt runs under a total deadline (:func:`~s3ckpt.store._deadline.watching`:
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
