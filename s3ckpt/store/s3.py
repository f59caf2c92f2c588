"""S3Store: the one module that imports boto3.

Retries happen here, at the request level, through tenacity (exponential back-off with
full jitter) on throttling (``SlowDown``, 503), 5xx, request timeouts and connection
resets. botocore's own retries are turned off (one attempt) so the two never multiply.
A bad hostname or a refused connection is *not* retried: it fails at once with an
:class:`~s3ckpt.errors.EndpointError` that says what to check.

botocore errors become s3ckpt errors in :func:`map_error`, by error *code* and HTTP
status through one table, never by message text.
"""

from __future__ import annotations

import base64
import http.client
import io
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any, TypeVar

import boto3
import botocore.exceptions as bce
from botocore.config import Config as BotoConfig
from botocore.response import StreamingBody
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from s3ckpt import _crc
from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.errors import (
    AccessDeniedError,
    EndpointError,
    NoSuchBucketError,
    ObjectNotFoundError,
    PreconditionFailedError,
    StoreError,
    TransientStoreError,
)
from s3ckpt.store.base import (
    MAX_DELETE_BATCH,
    Buffer,
    CompletedPart,
    DeleteFailure,
    DeleteFailures,
    ObjectInfo,
    UploadInfo,
)

__all__ = ["BufferBody", "S3Store", "map_error", "is_transient"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# error code -> (s3ckpt error class, what to check). HTTP status is the fallback key.
_ERROR_TABLE: dict[str, tuple[type[StoreError], str]] = {
    "NoSuchBucket": (
        NoSuchBucketError,
        "the bucket does not exist here: check the bucket name, the region and endpoint_url / "
        "AWS_ENDPOINT_URL",
    ),
    "NoSuchKey": (ObjectNotFoundError, "the object does not exist"),
    "404": (ObjectNotFoundError, "the object does not exist"),
    "NotFound": (ObjectNotFoundError, "the object does not exist"),
    "NoSuchUpload": (ObjectNotFoundError, "the multipart upload no longer exists"),
    "AccessDenied": (
        AccessDeniedError,
        "the credentials are not allowed to do this: check the IAM policy for this bucket/prefix",
    ),
    "403": (AccessDeniedError, "access denied: check credentials and the IAM policy"),
    "InvalidAccessKeyId": (
        AccessDeniedError,
        "the access key is not valid for this endpoint: check AWS_ACCESS_KEY_ID / AWS_PROFILE",
    ),
    "SignatureDoesNotMatch": (
        AccessDeniedError,
        "the secret key does not match the access key: check AWS_SECRET_ACCESS_KEY / AWS_PROFILE",
    ),
    "ExpiredToken": (AccessDeniedError, "the session token has expired: refresh the credentials"),
    "InvalidToken": (AccessDeniedError, "the session token is not valid: refresh the credentials"),
    "AllAccessDisabled": (AccessDeniedError, "all access to this object has been disabled"),
    "KMS.AccessDeniedException": (
        AccessDeniedError,
        "not allowed to use the KMS key: check kms:GenerateDataKey / kms:Decrypt grants",
    ),
    "PreconditionFailed": (PreconditionFailedError, "the object already exists or changed"),
    "412": (PreconditionFailedError, "the object already exists or changed"),
    "ConditionalRequestConflict": (
        PreconditionFailedError,
        "a concurrent conditional write to the same key won",
    ),
    "SlowDown": (TransientStoreError, "the store kept throttling: lower max_concurrency or retry"),
    "Throttling": (TransientStoreError, "the store kept throttling: lower max_concurrency"),
    "ThrottlingException": (TransientStoreError, "the store kept throttling"),
    "RequestLimitExceeded": (TransientStoreError, "the store kept throttling"),
    "ServiceUnavailable": (TransientStoreError, "the store stayed unavailable: retry later"),
    "503": (TransientStoreError, "the store stayed unavailable: retry later"),
    "InternalError": (TransientStoreError, "the store kept failing with 500s: retry later"),
    "500": (TransientStoreError, "the store kept failing with 500s: retry later"),
    "502": (TransientStoreError, "bad gateway: retry later"),
    "504": (TransientStoreError, "gateway timeout: retry later"),
    "RequestTimeout": (TransientStoreError, "the store timed out reading the request"),
    "RequestTimeTooSkewed": (
        AccessDeniedError,
        "this machine's clock is off by more than 15 minutes: fix NTP",
    ),
}

_TRANSIENT_CODES = frozenset(
    code for code, (cls, _) in _ERROR_TABLE.items() if cls is TransientStoreError
)

_TRANSIENT_BOTOCORE = (
    bce.ConnectionClosedError,
    bce.ReadTimeoutError,
    bce.ConnectTimeoutError,
    bce.ResponseStreamingError,
    bce.IncompleteReadError,
    bce.HTTPClientError,
)


def _error_code(exc: bce.ClientError) -> tuple[str, int]:
    err = exc.response.get("Error", {}) or {}
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return str(err.get("Code", "") or status), status


def is_transient(exc: BaseException) -> bool:
    """Whether a request that raised ``exc`` is worth retrying.

    Refused connections and unknown hostnames (``EndpointConnectionError``) are not:
    retrying a typo only delays the error.
    """
    if isinstance(exc, bce.ClientError):
        code, status = _error_code(exc)
        return code in _TRANSIENT_CODES or status in (500, 502, 503, 504)
    if isinstance(exc, bce.EndpointConnectionError) and not isinstance(
        exc, bce.ConnectTimeoutError
    ):
        return False
    if isinstance(exc, _TRANSIENT_BOTOCORE):
        return True
    # urllib3 / socket resets that escape botocore's wrapping while streaming a body.
    return isinstance(exc, (ConnectionResetError, BrokenPipeError, TimeoutError)) or (
        type(exc).__name__ in ("ProtocolError", "IncompleteRead", "ReadTimeoutError")
    )


def _timeout_kind(exc: BaseException | None) -> str | None:
    """``"connect"`` or ``"read"`` when ``exc`` is (or wraps) a timeout, else ``None``."""
    for _ in range(6):  # botocore wraps urllib3 wraps socket: a short chain
        if exc is None:
            return None
        if isinstance(exc, bce.ConnectTimeoutError):
            return "connect"
        if isinstance(exc, (bce.ReadTimeoutError, TimeoutError)) or (
            type(exc).__name__ == "ReadTimeoutError"
        ):
            return "read"
        kwargs = getattr(exc, "kwargs", None)
        inner = kwargs.get("error") if isinstance(kwargs, dict) else None
        exc = inner if isinstance(inner, BaseException) else (exc.__cause__ or exc.__context__)
    return None


class _StopAtDeadline(stop_base):
    """Stop once another attempt could not finish within ``TransferConfig.request_deadline``.

    Never start an attempt after the deadline. After a *timeout* the endpoint may be
    black-holed, so the next attempt is assumed to cost a whole timeout again: stop when
    that would end past the deadline. After a quick failure (503, reset) no such cost is
    assumed, so throttling is still retried when ``read_timeout`` is close to (or above)
    the deadline.
    """

    def __init__(self, deadline: float, read_timeout: float, connect_timeout: float) -> None:
        self.deadline = deadline
        self.read_timeout = read_timeout
        self.connect_timeout = connect_timeout

    def __call__(self, retry_state: RetryCallState) -> bool:
        # upcoming_sleep: the back-off before the next attempt (tenacity >= 8.3 sets it
        # before asking stop; older versions leave it 0).
        elapsed = (retry_state.seconds_since_start or 0.0) + float(
            getattr(retry_state, "upcoming_sleep", 0.0) or 0.0
        )
        if elapsed >= self.deadline:
            return True
        outcome = retry_state.outcome
        kind = _timeout_kind(outcome.exception() if outcome is not None else None)
        if kind == "read":
            return elapsed + self.read_timeout > self.deadline
        if kind == "connect":
            return elapsed + self.connect_timeout > self.deadline
        return False


def retry_strategies(tc: TransferConfig) -> tuple[stop_base, wait_base]:
    """The one retry policy of every S3 request: ``(stop, wait)`` tenacity strategies.

    Stop after ``max_attempts`` or when another attempt could not end before
    ``request_deadline``; back off exponentially with full jitter.
    """
    stop = stop_after_attempt(tc.max_attempts) | _StopAtDeadline(
        tc.request_deadline, tc.read_timeout, tc.connect_timeout
    )
    wait = wait_random_exponential(multiplier=tc.retry_initial_delay, max=tc.retry_max_delay)
    return stop, wait


def map_error(
    exc: BaseException,
    *,
    operation: str,
    bucket: str,
    key: str | None,
    endpoint: str | None,
    attempts: int = 1,
    elapsed: float | None = None,
    transfer_config: TransferConfig | None = None,
) -> StoreError:
    """Translate a botocore exception into the s3ckpt error tree (by code, never text).

    ``elapsed`` (seconds across all attempts) and ``transfer_config`` make the message of a
    request that kept timing out say how long the endpoint stayed silent and which
    settings bound that.
    """
    where = f"{operation} s3://{bucket}/{key or ''}"
    if isinstance(exc, StoreError):
        return exc
    timeout = _timeout_kind(exc)
    if timeout is not None and elapsed is not None:
        tc = transfer_config or TransferConfig()
        limit = (
            f"connect_timeout={tc.connect_timeout:g} s"
            if timeout == "connect"
            else f"read_timeout={tc.read_timeout:g} s"
        )
        return TransientStoreError(
            f"{where}: the endpoint {endpoint or 'AWS S3'} did not answer within its "
            f"{limit} ({attempts} attempt{'s' if attempts != 1 else ''}, {elapsed:.1f} s in "
            f"all; request_deadline={tc.request_deadline:g} s): the endpoint is stalled "
            "or black-holed, or the network is dropping packets. Check endpoint_url / "
            "AWS_ENDPOINT_URL, that the server is healthy and the network path to it; on a "
            "slow link raise TransferConfig.read_timeout and request_deadline",
            bucket=bucket,
            key=key,
            operation=operation,
            code=type(exc).__name__,
        )
    if isinstance(exc, bce.ClientError):
        code, status = _error_code(exc)
        cls, hint = _ERROR_TABLE.get(code) or _ERROR_TABLE.get(
            str(status), (StoreError, "unexpected error from the store")
        )
        tries = f" after {attempts} attempts" if cls is TransientStoreError else ""
        return cls(
            f"{operation} failed with {code} (HTTP {status}){tries}: {hint}",
            bucket=bucket,
            key=key,
            operation=operation,
            code=code,
        )
    if isinstance(exc, (bce.NoCredentialsError, bce.PartialCredentialsError)):
        return AccessDeniedError(
            f"{operation}: no usable AWS credentials found; set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or run with an instance/container role",
            bucket=bucket,
            key=key,
            operation=operation,
            code="NoCredentials",
        )
    if isinstance(exc, bce.EndpointConnectionError) and not isinstance(
        exc, bce.ConnectTimeoutError
    ):
        return EndpointError(
            f"{operation}: cannot connect to endpoint {endpoint or 'AWS S3'} "
            f"({type(exc).__name__}); check endpoint_url / AWS_ENDPOINT_URL, the hostname "
            "and that the server is running",
            bucket=bucket,
            key=key,
            operation=operation,
            code="EndpointConnectionError",
        )
    if isinstance(exc, bce.ParamValidationError):
        return StoreError(
            f"{operation}: invalid request parameters: {exc}",
            bucket=bucket,
            key=key,
            operation=operation,
            code="ParamValidation",
        )
    if is_transient(exc):
        return TransientStoreError(
            f"{operation} failed after {attempts} attempts ({type(exc).__name__}): "
            f"the endpoint {endpoint or 'AWS S3'} kept timing out or resetting connections",
            bucket=bucket,
            key=key,
            operation=operation,
            code=type(exc).__name__,
        )
    return StoreError(
        f"{where} failed: {type(exc).__name__}: {exc}",
        bucket=bucket,
        key=key,
        operation=operation,
        code=type(exc).__name__,
    )


def _b64_crc(value: int) -> str:
    return base64.b64encode(value.to_bytes(4, "big")).decode("ascii")


class BufferBody(io.RawIOBase):
    """A read-only, seekable stream over a buffer: how a request body is handed to botocore.

    Passing a ``bytearray`` (or a ``bytes`` copy of a view) costs a full copy of every
    part: botocore's CRT signer, used whenever ``awscrt`` is installed, wraps any body
    without ``seek`` in ``io.BytesIO``, which copies a bytearray, and with eight parts
    in flight that was 8 x part_size of extra memory plus the page faults of touching
    it. A stream is signed (SHA-256 read through :meth:`readinto` / :meth:`read` and
    rewound) and sent in urllib3's blocks without ever holding a second copy.

    A fresh one is made for every attempt, so a retry always starts at byte 0.
    """

    def __init__(self, data: Buffer) -> None:
        super().__init__()
        self._view = memoryview(data).cast("B").toreadonly()
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def __len__(self) -> int:
        return self._view.nbytes

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._view.nbytes}
        if whence not in base:
            raise ValueError(f"invalid whence {whence!r}")
        pos = base[whence] + offset
        if pos < 0:
            raise ValueError(f"negative seek position {pos}")
        self._pos = pos
        return pos

    def readinto(self, b: Any) -> int:
        dest = memoryview(b).cast("B")
        n = max(0, min(dest.nbytes, self._view.nbytes - self._pos))
        dest[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def read(self, size: int | None = -1) -> memoryview:
        """Up to ``size`` bytes as a read-only view into the buffer, not a copy.

        urllib3 sends a file-like body in ``blocksize`` ``read()`` blocks (botocore sets
        128 KiB; urllib3's own default is 16 KiB); returning ``bytes`` would copy every
        byte uploaded once more only for ``sendall`` to copy it into the socket. Every consumer
        on the path (``sendall``, hashlib, ``chunk == b""`` loop ends) takes a view.
        """
        end = self._view.nbytes if size is None or size < 0 else self._pos + size
        chunk = self._view[self._pos : end]
        self._pos += chunk.nbytes
        return chunk


class S3Store:
    """:class:`~s3ckpt.store.base.ObjectStore` over boto3 for S3 and S3-compatible stores.

    The boto3 client is created lazily, once per process (the store pickles without it and
    rebuilds it after ``fork`` or ``spawn``), with a connection pool sized to
    ``TransferConfig.max_concurrency``.

    Args:
        bucket: The bucket every key lives in.
        s3_config: Endpoint, region, encryption and checksum settings.
        transfer_config: Concurrency, timeouts and retry budget.
        sleep: Injected into the retry policy (tests pass a no-op).
        page_size: Keys per list request (S3's maximum is 1000).
        delete_batch_size: Keys per DeleteObjects request (at most 1000).
    """

    url_scheme = "s3"

    def __init__(
        self,
        bucket: str,
        s3_config: S3Config | None = None,
        transfer_config: TransferConfig | None = None,
        *,
        sleep: Callable[[float], None] | None = None,
        page_size: int = 1000,
        delete_batch_size: int = MAX_DELETE_BATCH,
    ) -> None:
        if not 1 <= delete_batch_size <= MAX_DELETE_BATCH:
            raise ValueError(f"delete_batch_size must be 1..{MAX_DELETE_BATCH}")
        self._bucket = bucket
        self.page_size = page_size
        self.delete_batch_size = delete_batch_size
        self.s3_config = s3_config or S3Config()
        self.transfer_config = transfer_config or TransferConfig()
        self._sleep = sleep
        self._stop, self._wait = retry_strategies(self.transfer_config)
        self._lock = threading.Lock()
        self._client: Any = None
        self._pid: int | None = None

    @property
    def bucket(self) -> str:
        """The bucket."""
        return self._bucket

    # -- pickling: never ship a live client (or credentials) to another process ------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None
        state["_pid"] = None
        state["_lock"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"S3Store(bucket={self._bucket!r}, endpoint={self.endpoint_url!r})"

    @property
    def endpoint_url(self) -> str | None:
        """The endpoint in force (``None``: AWS)."""
        return self.s3_config.resolved_endpoint_url()

    @property
    def client(self) -> Any:
        """The process's boto3 S3 client (created on first use)."""
        pid = os.getpid()
        if self._client is None or self._pid != pid:
            with self._lock:
                if self._client is None or self._pid != pid:
                    self._client = self._make_client()
                    self._pid = pid
        return self._client

    def _make_client(self) -> Any:
        cfg, tc = self.s3_config, self.transfer_config
        s3_opts: dict[str, Any] = {"addressing_style": cfg.addressing_style}
        if cfg.checksum_algorithm == "CRC32C":
            # Every body we send carries a CRC32C the store verifies, so signing the
            # payload's SHA-256 as well only burns client CPU (botocore already skips it on
            # HTTPS when a checksum is present; this makes http:// endpoints match).
            s3_opts["payload_signing_enabled"] = False
        boto_cfg = BotoConfig(
            retries={"total_max_attempts": 1, "mode": "standard"},
            max_pool_connections=tc.max_concurrency + 4,
            connect_timeout=tc.connect_timeout,
            read_timeout=tc.read_timeout,
            tcp_keepalive=True,
            s3=s3_opts,
            # s3ckpt computes and checks CRC32C end to end; botocore's own default checksums
            # would hash every byte a second time.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        session = boto3.session.Session(profile_name=cfg.profile)
        region = cfg.region or session.region_name or "us-east-1"
        return session.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=region,
            config=boto_cfg,
            verify=cfg.verify_tls,
        )

    # -- retry + error mapping ---------------------------------------------------------------
    def _call(self, operation: str, key: str | None, fn: Callable[[], T]) -> T:
        return self._call_counted(operation, key, fn)[0]

    def _call_counted(self, operation: str, key: str | None, fn: Callable[[], T]) -> tuple[T, int]:
        """``fn()`` under the retry policy; returns its result and the attempts it took."""
        attempts = 0
        started = time.monotonic()

        def _before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            log.debug(
                "retrying %s s3://%s/%s after %s (attempt %d)",
                operation,
                self._bucket,
                key or "",
                type(exc).__name__,
                state.attempt_number,
            )

        retrying = Retrying(
            stop=self._stop,
            wait=self._wait,
            retry=retry_if_exception(is_transient),
            reraise=True,
            before_sleep=_before_sleep,
            sleep=self._sleep or _default_sleep,
        )
        try:
            for attempt in retrying:
                attempts = attempt.retry_state.attempt_number
                with attempt:
                    return fn(), attempts
        except Exception as exc:  # mapped at this one edge
            raise map_error(
                exc,
                operation=operation,
                bucket=self._bucket,
                key=key,
                endpoint=self.endpoint_url,
                attempts=attempts,
                elapsed=time.monotonic() - started,
                transfer_config=self.transfer_config,
            ) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _sse_args(self, *, upload: bool) -> dict[str, Any]:
        cfg = self.s3_config
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

    def _checksum_args(self, data: Buffer, crc32c: int | None) -> dict[str, Any]:
        if self.s3_config.checksum_algorithm != "CRC32C":
            return {}
        value = _crc.crc32c(data) if crc32c is None else crc32c
        return {"ChecksumAlgorithm": "CRC32C", "ChecksumCRC32C": _b64_crc(value)}

    # -- ObjectStore -------------------------------------------------------------------------
    def put(
        self,
        key: str,
        data: Buffer,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
        crc32c: int | None = None,
    ) -> str:
        """See :meth:`ObjectStore.put`."""
        args = {
            "Bucket": self._bucket,
            "Key": key,
            **self._sse_args(upload=True),
            **self._checksum_args(data, crc32c),
        }
        if if_none_match:
            args["IfNoneMatch"] = "*"
        if if_match is not None:
            args["IfMatch"] = if_match
        resp = self._call("put", key, lambda: self.client.put_object(Body=BufferBody(data), **args))
        return str(resp.get("ETag", ""))

    def create_multipart(self, key: str) -> str:
        """See :meth:`ObjectStore.create_multipart`."""
        args: dict[str, Any] = {"Bucket": self._bucket, "Key": key, **self._sse_args(upload=True)}
        if self.s3_config.checksum_algorithm == "CRC32C":
            args["ChecksumAlgorithm"] = "CRC32C"
        resp, attempts = self._call_counted(
            "create_multipart", key, lambda: self.client.create_multipart_upload(**args)
        )
        upload_id = str(resp["UploadId"])
        if attempts > 1:
            self._abort_orphan_uploads(key, upload_id)
        return upload_id

    def _abort_orphan_uploads(self, key: str, keep: str) -> None:
        """Abort uploads of exactly ``key`` other than ``keep`` (best effort).

        A retried CreateMultipartUpload may have been applied by an attempt whose reply was
        lost: that upload's id never reached us and its parts would be billed until a
        lifecycle rule removes them. s3ckpt's keys are unique per save (see
        :mod:`s3ckpt.format`), so any other upload of this very key is such an orphan.
        """
        try:
            orphans = [
                u.upload_id
                for u in self.list_multipart_uploads(key)
                if u.key == key and u.upload_id != keep
            ]
            for upload_id in orphans:
                self.abort_multipart(key, upload_id)
        except StoreError as exc:  # the save itself is fine; only cleanup is left behind
            log.warning(
                "could not abort orphaned multipart uploads of s3://%s/%s: %s",
                self._bucket,
                key,
                exc,
            )
            return
        if orphans:
            log.info(
                "aborted %d orphaned multipart upload(s) of s3://%s/%s left by a lost reply",
                len(orphans),
                self._bucket,
                key,
            )

    def upload_part(
        self, key: str, upload_id: str, part_number: int, data: Buffer, *, crc32c: int | None = None
    ) -> CompletedPart:
        """See :meth:`ObjectStore.upload_part`."""
        checksum = self._checksum_args(data, crc32c)
        args = {
            "Bucket": self._bucket,
            "Key": key,
            "UploadId": upload_id,
            "PartNumber": part_number,
            **self._sse_args(upload=False),
            **checksum,
        }
        resp = self._call(
            "upload_part", key, lambda: self.client.upload_part(Body=BufferBody(data), **args)
        )
        return CompletedPart(
            part_number=part_number,
            etag=str(resp["ETag"]),
            checksum_crc32c=resp.get("ChecksumCRC32C") or checksum.get("ChecksumCRC32C"),
            size=len(data),
        )

    def complete_multipart(
        self,
        key: str,
        upload_id: str,
        parts: Sequence[CompletedPart],
        *,
        if_none_match: bool = False,
    ) -> str:
        """See :meth:`ObjectStore.complete_multipart`."""
        body = []
        for p in sorted(parts, key=lambda p: p.part_number):
            entry: dict[str, Any] = {"PartNumber": p.part_number, "ETag": p.etag}
            if p.checksum_crc32c and self.s3_config.checksum_algorithm == "CRC32C":
                entry["ChecksumCRC32C"] = p.checksum_crc32c
            body.append(entry)
        args: dict[str, Any] = {
            "Bucket": self._bucket,
            "Key": key,
            "UploadId": upload_id,
            "MultipartUpload": {"Parts": body},
        }
        if self.s3_config.sse_customer_key is not None:
            args.update(self._sse_args(upload=False))
        if if_none_match:
            args["IfNoneMatch"] = "*"
        resp = self._call(
            "complete_multipart", key, lambda: self.client.complete_multipart_upload(**args)
        )
        return str(resp.get("ETag", ""))

    def abort_multipart(self, key: str, upload_id: str) -> None:
        """See :meth:`ObjectStore.abort_multipart`."""
        try:
            self._call(
                "abort_multipart",
                key,
                lambda: self.client.abort_multipart_upload(
                    Bucket=self._bucket, Key=key, UploadId=upload_id
                ),
            )
        except ObjectNotFoundError:
            pass

    def open_range(self, key: str, start: int = 0, length: int | None = None) -> _S3RangeReader:
        """See :meth:`ObjectStore.open_range`."""
        return _S3RangeReader(self, key, start, length)

    def _get_object(self, key: str, first: int, last: int | None) -> Any:
        rng = f"bytes={first}-{'' if last is None else last}"
        args = {"Bucket": self._bucket, "Key": key, "Range": rng, **self._sse_args(upload=False)}
        return self._call("get", key, lambda: self.client.get_object(**args))

    def get(self, key: str) -> bytes:
        """See :meth:`ObjectStore.get`."""
        args = {"Bucket": self._bucket, "Key": key, **self._sse_args(upload=False)}

        def fetch() -> bytes:
            return bytes(self.client.get_object(**args)["Body"].read())

        return self._call("get", key, fetch)

    def head(self, key: str) -> ObjectInfo | None:
        """See :meth:`ObjectStore.head`."""
        args = {"Bucket": self._bucket, "Key": key, **self._sse_args(upload=False)}
        try:
            resp = self._call("head", key, lambda: self.client.head_object(**args))
        except ObjectNotFoundError:
            return None
        lm = resp.get("LastModified")
        return ObjectInfo(
            key=key,
            size=int(resp.get("ContentLength", 0)),
            etag=resp.get("ETag"),
            last_modified=lm.timestamp() if lm is not None else None,
        )

    def _paginate(self, operation: str, prefix: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
        token_args: dict[str, Any] = {}
        while True:
            size_arg = "MaxKeys" if operation == "list_objects_v2" else "MaxUploads"
            args = {
                "Bucket": self._bucket,
                "Prefix": prefix,
                size_arg: self.page_size,
                **kwargs,
                **token_args,
            }
            call: Callable[[], Any] = partial(getattr(self.client, operation), **args)
            resp = self._call(operation, prefix, call)
            yield resp
            if not resp.get("IsTruncated"):
                return
            if operation == "list_objects_v2":
                token_args = {"ContinuationToken": resp["NextContinuationToken"]}
            else:
                token_args = {
                    "KeyMarker": resp.get("NextKeyMarker", ""),
                    "UploadIdMarker": resp.get("NextUploadIdMarker", ""),
                }

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """See :meth:`ObjectStore.list`."""
        for page in self._paginate("list_objects_v2", prefix):
            for obj in page.get("Contents", []) or []:
                lm = obj.get("LastModified")
                yield ObjectInfo(
                    key=obj["Key"],
                    size=int(obj.get("Size", 0)),
                    etag=obj.get("ETag"),
                    last_modified=lm.timestamp() if lm is not None else None,
                )

    def list_prefixes(
        self, prefix: str, delimiter: str = "/", *, start_after: str | None = None
    ) -> Iterator[str]:
        """See :meth:`ObjectStore.list_prefixes`."""
        extra: dict[str, Any] = {"Delimiter": delimiter}
        if start_after is not None:
            # Keys <= start_after only make prefixes <= start_after, so S3 may skip them.
            extra["StartAfter"] = start_after
        for page in self._paginate("list_objects_v2", prefix, **extra):
            for cp in page.get("CommonPrefixes", []) or []:
                # S3 still rolls the keys after start_after up into a prefix that starts
                # before it (start_after "a/" and key "a/1" give "a/"): not after it.
                if start_after is None or cp["Prefix"] > start_after:
                    yield cp["Prefix"]

    def delete(self, keys: Sequence[str]) -> DeleteFailures:
        """See :meth:`ObjectStore.delete`."""
        failures: DeleteFailures = []
        keys = list(keys)
        for i in range(0, len(keys), self.delete_batch_size):
            batch = keys[i : i + self.delete_batch_size]
            req = {"Objects": [{"Key": k} for k in batch], "Quiet": True}
            call: Callable[[], Any] = partial(
                self.client.delete_objects, Bucket=self._bucket, Delete=req
            )
            resp = self._call("delete", batch[0], call)
            for err in resp.get("Errors", []) or []:
                failures.append(
                    DeleteFailure(
                        key=err.get("Key", ""),
                        code=err.get("Code", ""),
                        message=err.get("Message", ""),
                    )
                )
        return failures

    def list_multipart_uploads(self, prefix: str) -> Iterator[UploadInfo]:
        """See :meth:`ObjectStore.list_multipart_uploads`."""
        for page in self._paginate("list_multipart_uploads", prefix):
            for up in page.get("Uploads", []) or []:
                init = up.get("Initiated")
                yield UploadInfo(
                    key=up["Key"],
                    upload_id=up["UploadId"],
                    initiated=init.timestamp() if init is not None else None,
                )


class _S3RangeReader:
    """A ranged GET whose body is streamed; resets mid-body resume at the current offset.

    When the range's length is known, the body is read with ``readinto`` on the standard
    library's ``http.client`` response under botocore's ``StreamingBody``, straight from the
    socket into the caller's buffer (the destination tensor). ``StreamingBody.read`` would
    allocate a fresh ``bytes`` per call in http.client, copy it once more there and again
    into the caller's buffer: three passes and two fresh allocations per chunk instead of
    one pass. A body that ends before the range does (a connection closed early) is treated
    like a reset: the GET resumes at the current offset. Any other response shape (a
    content encoding, bytes already buffered above the socket, a body wrapped by
    botocore's checksum validation, another urllib3) takes the ``StreamingBody`` path.
    """

    def __init__(self, store: S3Store, key: str, start: int, length: int | None) -> None:
        self._store = store
        self._key = key
        self._pos = start
        self._end = None if length is None else start + length  # exclusive
        self._body: Any = None
        self._raw: Any = None  # urllib3 response, when reading the socket directly
        self._direct: http.client.HTTPResponse | None = None
        self._direct_len = 0  # bytes the current response was asked for
        self._failures = 0

    def _open(self) -> None:
        last = None if self._end is None else self._end - 1
        resp = self._store._get_object(self._key, self._pos, last)
        self._body = resp["Body"]
        self._check_range(resp.get("ContentRange"))
        if self._end is not None:
            self._raw, self._direct = _socket_response(self._body)
            self._direct_len = self._end - self._pos

    def _check_range(self, content_range: str | None) -> None:
        # A server that ignores Range answers 200 with the object from byte 0.
        first = 0
        if content_range:
            try:
                first = int(content_range.split()[1].split("-")[0])
            except (IndexError, ValueError):
                first = -1
        if first != self._pos:
            self.close()
            raise StoreError(
                f"asked for bytes from {self._pos} and got {content_range or 'the whole object'}"
                "; the endpoint does not honour HTTP Range requests, which s3ckpt needs",
                bucket=self._store.bucket,
                key=self._key,
                operation="get",
            )

    def readinto(self, buffer: memoryview) -> int:
        if self._end is not None:
            want = min(len(buffer), self._end - self._pos)
            if want <= 0:
                return 0
        else:
            want = len(buffer)
        # Retry state of this call's run of failures. The deadline counts from the start of
        # this call, so a long transfer that keeps making progress is never cut by it.
        state: RetryCallState | None = None
        started = time.monotonic()
        while True:
            try:
                if self._body is None:
                    self._open()
                if self._direct is not None:
                    n = self._read_socket(buffer[:want])
                else:
                    chunk = self._body.read(want)
                    n = len(chunk)
                    buffer[:n] = chunk
                self._pos += n
                return n
            except StoreError as exc:
                if exc.code == "InvalidRange":
                    return 0  # the object ends before the range starts
                raise
            except Exception as exc:
                self.close()
                self._failures += 1
                store = self._store
                if state is None:
                    state = RetryCallState(Retrying(), fn=None, args=(), kwargs={})
                    state.start_time = started
                # Attempts count over the whole stream (as before); time over this call.
                state.attempt_number = self._failures
                state.set_exception((type(exc), exc, exc.__traceback__))
                give_up = not is_transient(exc)
                if not give_up:
                    state.upcoming_sleep = store._wait(state)
                    give_up = store._stop(state)
                if give_up:
                    raise map_error(
                        exc,
                        operation="get",
                        bucket=store.bucket,
                        key=self._key,
                        endpoint=store.endpoint_url,
                        attempts=self._failures,
                        elapsed=time.monotonic() - started,
                        transfer_config=store.transfer_config,
                    ) from exc
                log.debug(
                    "resuming GET s3://%s/%s at %d after %r",
                    self._store.bucket,
                    self._key,
                    self._pos,
                    exc,
                )
                (store._sleep or _default_sleep)(state.upcoming_sleep)

    def _read_socket(self, buffer: memoryview) -> int:
        assert self._direct is not None and self._end is not None
        try:
            n = self._direct.readinto(buffer)
        except (OSError, http.client.HTTPException) as exc:
            # What urllib3 and botocore would make of it: a failure while streaming.
            raise bce.ResponseStreamingError(error=exc) from exc
        if n <= 0:
            raise bce.IncompleteReadError(
                actual_bytes=self._pos - (self._end - self._direct_len),
                expected_bytes=self._direct_len,
            )
        if self._direct.isclosed():  # the whole body is read: the socket can be reused
            self._raw.release_conn()
        return n

    def close(self) -> None:
        self._direct = self._raw = None
        if self._body is not None:
            try:
                self._body.close()
            except Exception:  # closing a broken stream can itself fail; nothing to keep
                pass
            self._body = None


def _socket_response(body: Any) -> tuple[Any, http.client.HTTPResponse | None]:
    """The urllib3 and http.client responses under a plain, untouched ``StreamingBody``;
    ``(None, None)`` when reading the socket directly would skip a layer that matters."""
    if type(body) is not StreamingBody:
        return None, None  # e.g. botocore's checksum-validating body
    raw = getattr(body, "_raw_stream", None)
    fp = getattr(raw, "_fp", None)
    if not isinstance(fp, http.client.HTTPResponse) or not callable(
        getattr(raw, "release_conn", None)
    ):
        return None, None
    headers = getattr(raw, "headers", None)
    encoding = headers.get("content-encoding", "") if headers is not None else None
    buffered = getattr(raw, "_decoded_buffer", None)
    if encoding not in ("", "identity") or (buffered is not None and len(buffered)):
        return None, None
    if getattr(body, "_amount_read", 0):
        return None, None
    return raw, fp


def _default_sleep(seconds: float) -> None:
    time.sleep(seconds)
