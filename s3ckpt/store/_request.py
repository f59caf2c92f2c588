"""One S3 request: its encryption and checksum arguments, and its run under the store's
retry policy (built once per store, :func:`store_retrying`), each attempt holding a slot
of the store's adaptive limiter, with the failure mapped at the store's edge."""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception

from s3ckpt import _crc
from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.errors import ObjectNotFoundError, PreconditionFailedError
from s3ckpt.metrics import Outcome
from s3ckpt.metrics.instrument import expected_outcome, record_request
from s3ckpt.store._adaptive import AdaptiveLimiter
from s3ckpt.store._errors import is_throttle, is_transient, map_error, timeout_kind
from s3ckpt.store.base import Buffer
from s3ckpt.store.retry import RetryCall, retrying

__all__ = ["call", "checksum_args", "sse_args", "store_retrying"]

log = logging.getLogger(__name__)

T = TypeVar("T")


def sse_args(cfg: S3Config, *, upload: bool) -> dict[str, Any]:
    """Encryption (SSE-C on every request, SSE-KMS on uploads) and storage-class arguments."""
    args: dict[str, Any] = {}
    if cfg.sse_customer_key is not None:
        args["SSECustomerAlgorithm"] = "AES256"
        args["SSECustomerKey"] = cfg.sse_customer_key
    elif upload and cfg.sse_kms_key_id is not None:
        args["ServerSideEncryption"] = "aws:kms"
        args["SSEKMSKeyId"] = cfg.sse_kms_key_id
    if upload and cfg.storage_class is not None:
        args["StorageClass"] = cfg.storage_class
    return args


def checksum_args(cfg: S3Config, data: Buffer, crc32c: int | None) -> dict[str, Any]:
    """The CRC32C of a body (``crc32c`` when the caller has it) for the store to verify."""
    if cfg.checksum_algorithm != "CRC32C":
        return {}
    value = _crc.crc32c(data) if crc32c is None else crc32c
    crc = base64.b64encode(value.to_bytes(4, "big")).decode("ascii")
    return {"ChecksumAlgorithm": "CRC32C", "ChecksumCRC32C": crc}


def store_retrying(config: TransferConfig, sleep: Callable[[float], None] | None) -> Retrying:
    """The S3 store's retry policy (:func:`~s3ckpt.store.retry.retrying`), built once per
    store and shared by its requests and resumed reads on every thread: transient failures
    only (:func:`is_transient`), timeouts told apart for the deadline
    (:func:`timeout_kind`). Each call brings its own state as a
    :class:`~s3ckpt.store.retry.RetryCall`."""
    return retrying(
        config,
        retry=retry_if_exception(is_transient),
        sleep=sleep,
        timeout_kind=timeout_kind,
    )


def call(
    fn: Callable[[], T],
    *,
    operation: str,
    bucket: str,
    key: str | None,
    endpoint: str | None,
    config: TransferConfig,
    policy: Retrying,
    sleep: Callable[[float], None] | None = None,
    limiter: AdaptiveLimiter | None = None,
) -> tuple[T, int]:
    """``fn()`` under the store's retry ``policy`` (:func:`store_retrying`, built from
    ``config``, which error messages quote); its result and the attempts it took.

    With a ``limiter`` every attempt takes one of its slots before ``fn()`` and gives it
    back with the outcome (throttled, answered, or failed otherwise); the time an attempt
    waits for its slot (and for pacing, slept with ``sleep``) does not count towards
    ``config.request_deadline``.

    Every request is counted once, when it ends, by
    :func:`~s3ckpt.metrics.instrument.record_request` (its attempts, how many were
    throttled, and its outcome), for the operation running in this context. A 404 or 412
    counts as the expected outcome where the caller said so
    (:func:`~s3ckpt.metrics.instrument.expecting`), else as a failure.

    Raises:
        StoreError: The last failure, mapped by :func:`~s3ckpt.store._errors.map_error`.
    """
    started = time.monotonic()
    throttled = [0]  # attempts answered with a throttling code (metrics)
    outcome: Outcome = "failed"

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        if exc is not None and is_throttle(exc):
            throttled[0] += 1
        log.debug(
            "retrying %s s3://%s/%s after %s (attempt %d)",
            operation,
            bucket,
            key or "",
            type(exc).__name__,
            state.attempt_number,
        )

    def attempt() -> T:
        if limiter is None:
            return fn()
        slot = limiter.acquire(sleep)
        request.queued += slot.queued  # read by the deadline
        try:
            result = fn()
        except BaseException as exc:
            if is_throttle(exc):
                limiter.throttled(slot)
            else:
                limiter.failed(slot)
            raise
        limiter.succeeded(slot)
        return result

    request = RetryCall(attempt, before_sleep=before_sleep)
    try:
        result: T = policy(request)
        outcome = "ok"
        return result, request.attempts
    except Exception as exc:  # mapped at this one edge
        if is_throttle(exc):  # the last attempt (before_sleep saw the others)
            throttled[0] += 1
        mapped = map_error(
            exc,
            operation=operation,
            bucket=bucket,
            key=key,
            endpoint=endpoint,
            attempts=request.attempts,
            elapsed=time.monotonic() - started,
            transfer_config=config,
        )
        if isinstance(mapped, ObjectNotFoundError):
            outcome = expected_outcome("not_found")
        elif isinstance(mapped, PreconditionFailedError):
            outcome = expected_outcome("precondition_failed")
        raise mapped from exc
    finally:
        record_request(operation, max(request.attempts, 1), throttled[0], outcome)
