"""botocore, urllib3 and socket exceptions to s3ckpt errors: the S3 store's one edge.

Client errors are mapped by error *code* (HTTP status where the store sent none) through
:data:`_ERROR_TABLE`, never by message text; ``InvalidObjectState`` (a read of an archived
object) becomes :func:`~s3ckpt.store._archive.archived_error`, which names the restore.
Exceptions without a code are classified by *type*, as httpx's ``map_exceptions`` does:
:data:`_RETRIED` holds the lower-layer exception types worth retrying, and
:func:`timeout_kind` tells the timeouts.
"""

from __future__ import annotations

import http.client

import botocore.exceptions as bce
import urllib3.exceptions as u3e
from botocore.parsers import ResponseParserError

from s3ckpt._units import plural
from s3ckpt.config import TransferConfig
from s3ckpt.errors import (
    AccessDeniedError,
    EndpointError,
    NoSuchBucketError,
    ObjectNotFoundError,
    PreconditionFailedError,
    StoreError,
    TransientStoreError,
    UnsupportedOperationError,
)
from s3ckpt.store._archive import archived_error
from s3ckpt.store._reply import IncompleteReplyError, WireChecksumError
from s3ckpt.store.retry import THROTTLE_CODES, TRANSIENT_CODES

__all__ = ["is_throttle", "is_transient", "map_error", "timeout_kind"]

# What to check when a transient code persisted through every retry; the codes are
# retry.TRANSIENT_CODES (a code without a hint here fails at import).
_THROTTLED = "the store kept throttling: lower max_concurrency or retry"
_REWRITTEN = "check the network path (a proxy rewriting bodies, faulty hardware)"
_TRANSIENT_HINTS: dict[str, str] = {
    **dict.fromkeys(THROTTLE_CODES - {"ServiceUnavailable", "503"}, _THROTTLED),
    **dict.fromkeys(("ServiceUnavailable", "503"), "the store stayed unavailable: retry later"),
    **dict.fromkeys(("InternalError", "500"), "the store kept failing with 500s: retry later"),
    "502": "bad gateway: retry later",
    "504": "gateway timeout: retry later",
    "RequestTimeout": "the store timed out reading the request",
    "BadDigest": f"the body kept arriving with another checksum than the one sent: {_REWRITTEN}",
    "XAmzContentSHA256Mismatch": "the body kept arriving with another SHA-256 than the one "
    f"signed: {_REWRITTEN}",
}

_WRONG_REGION = (
    "the bucket is in another region than the one requested: pass --region REGION or "
    "S3Config(region=REGION) (or set AWS_REGION)"
)

# s3ckpt error class -> error code -> what to check. HTTP status is the fallback code.
_HINTS: dict[type[StoreError], dict[str, str]] = {
    NoSuchBucketError: {
        "NoSuchBucket": "the bucket does not exist here: check the bucket name, the region and "
        "endpoint_url / AWS_ENDPOINT_URL",
    },
    ObjectNotFoundError: {
        **dict.fromkeys(("NoSuchKey", "404", "NotFound"), "the object does not exist"),
        "NoSuchUpload": "the multipart upload no longer exists",
    },
    AccessDeniedError: {
        "AccessDenied": "the credentials are not allowed to do this: check the IAM policy for "
        "this bucket/prefix",
        "403": "access denied: check credentials and the IAM policy",
        "InvalidAccessKeyId": "the access key is not valid for this endpoint: check "
        "AWS_ACCESS_KEY_ID / AWS_PROFILE",
        "SignatureDoesNotMatch": "the secret key does not match the access key: check "
        "AWS_SECRET_ACCESS_KEY / AWS_PROFILE",
        "ExpiredToken": "the session token has expired: refresh the credentials",
        "InvalidToken": "the session token is not valid: refresh the credentials",
        "AllAccessDisabled": "all access to this object has been disabled",
        "KMS.AccessDeniedException": "not allowed to use the KMS key: check "
        "kms:GenerateDataKey / kms:Decrypt grants",
        "RequestTimeTooSkewed": "this machine's clock is off by more than 15 minutes: fix NTP",
    },
    PreconditionFailedError: {
        **dict.fromkeys(("PreconditionFailed", "412"), "the object already exists or changed"),
        "ConditionalRequestConflict": "a concurrent conditional write to the same key won",
    },
    TransientStoreError: {code: _TRANSIENT_HINTS[code] for code in sorted(TRANSIENT_CODES)},
    UnsupportedOperationError: {
        "NotImplemented": "this store does not implement the request (S3-compatible stores differ)",
        "501": "this store does not implement the request",
    },
    StoreError: dict.fromkeys(
        ("PermanentRedirect", "301", "AuthorizationHeaderMalformed"), _WRONG_REGION
    ),
}
# error code -> (s3ckpt error class, what to check)
_ERROR_TABLE = {code: (cls, hint) for cls, hints in _HINTS.items() for code, hint in hints.items()}

# Exception types worth retrying. A refused connection or an unknown hostname
# (EndpointConnectionError, whose ConnectTimeoutError alone is here) is not: retrying a typo
# only delays the error. The urllib3, http.client and socket types are resets that escape
# botocore's wrapping while a body streams. A reply cut short or garbled (store/_reply.py, a
# body botocore cannot parse) is a transport error like a reset.
_RETRIED: tuple[type[BaseException], ...] = (
    IncompleteReplyError,
    WireChecksumError,
    ResponseParserError,
    bce.ConnectTimeoutError,
    bce.HTTPClientError,  # ConnectionClosedError, ReadTimeoutError, ResponseStreamingError
    bce.IncompleteReadError,
    u3e.ProtocolError,
    u3e.ReadTimeoutError,
    http.client.IncompleteRead,
    ConnectionResetError,
    BrokenPipeError,
    TimeoutError,
)
_READ_TIMEOUTS = (bce.ReadTimeoutError, u3e.ReadTimeoutError, TimeoutError)

_SERVER_ERRORS = (500, 502, 503, 504)


def _error_code(exc: bce.ClientError) -> tuple[str, int]:
    err = exc.response.get("Error", {}) or {}
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return str(err.get("Code", "") or status), status


def _bucket_region(exc: bce.ClientError) -> str | None:
    """The bucket's region as S3 names it in a redirect: the ``x-amz-bucket-region``
    header (a HEAD's 301 has no body), else the error's ``Region``; only a plausible name."""
    headers = exc.response.get("ResponseMetadata", {}).get("HTTPHeaders", {}) or {}
    region = headers.get("x-amz-bucket-region") or (exc.response.get("Error") or {}).get("Region")
    ok = isinstance(region, str) and 0 < len(region) <= 32 and region.replace("-", "").isalnum()
    return region if ok else None


def is_transient(exc: BaseException) -> bool:
    """Whether a request that raised ``exc`` is worth retrying: a code in
    :data:`~s3ckpt.store.retry.TRANSIENT_CODES`, a 5xx, a timeout or a reset.

    Refused connections and unknown hostnames (``EndpointConnectionError``) are not:
    retrying a typo only delays the error.
    """
    if isinstance(exc, bce.ClientError):
        code, status = _error_code(exc)
        return code in TRANSIENT_CODES or status in _SERVER_ERRORS
    return isinstance(exc, _RETRIED)


def is_throttle(exc: BaseException) -> bool:
    """Whether ``exc`` is the store asking for fewer requests: an error code in
    :data:`~s3ckpt.store.retry.THROTTLE_CODES` or an HTTP 503. Not 500s, timeouts or
    resets: those are retried (:func:`is_transient`), but say nothing about the request
    rate."""
    if not isinstance(exc, bce.ClientError):
        return False
    code, status = _error_code(exc)
    return code in THROTTLE_CODES or status == 503


def timeout_kind(exc: BaseException | None) -> str | None:
    """``"connect"`` or ``"read"`` when ``exc`` is (or wraps) a timeout, else ``None``."""
    for _ in range(6):  # botocore wraps urllib3 wraps socket: a short chain
        if exc is None:
            return None
        if isinstance(exc, (bce.ConnectTimeoutError, _READ_TIMEOUTS)):
            return "connect" if isinstance(exc, bce.ConnectTimeoutError) else "read"
        kwargs = getattr(exc, "kwargs", None)  # botocore keeps the wrapped error there
        inner = kwargs.get("error") if isinstance(kwargs, dict) else None
        exc = inner if isinstance(inner, BaseException) else (exc.__cause__ or exc.__context__)
    return None


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
    if isinstance(exc, StoreError):
        return exc
    cls: type[StoreError] = StoreError
    code = name = type(exc).__name__
    where = endpoint or "AWS S3"
    timeout = timeout_kind(exc)
    if timeout is not None and elapsed is not None:
        tc = transfer_config or TransferConfig()
        limit = (
            f"connect_timeout={tc.connect_timeout:g} s"
            if timeout == "connect"
            else f"read_timeout={tc.read_timeout:g} s to the first byte and "
            f"min_rate={tc.min_rate:g} B/s after it"
        )
        cls = TransientStoreError
        message = (
            f"{operation} s3://{bucket}/{key or ''}: the endpoint {where} did not answer within "
            f"its {limit} ({plural(attempts, 'attempt')}, {elapsed:.1f} s in all; "
            f"request_deadline={tc.request_deadline:g} s): the endpoint is stalled or black-holed, "
            "or the network is dropping packets. Check endpoint_url / AWS_ENDPOINT_URL, that the "
            "server is healthy and the network path to it; on a slow link raise "
            "TransferConfig.read_timeout and request_deadline, or lower min_rate"
        )
    elif isinstance(exc, bce.ClientError):
        code, status = _error_code(exc)
        if code == "InvalidObjectState":  # an archived object: its class, and what to run
            cls_ = (exc.response.get("Error") or {}).get("StorageClass")
            return archived_error(
                bucket=bucket, key=key or "", storage_class=cls_, operation=operation
            )
        cls, hint = _ERROR_TABLE.get(code) or _ERROR_TABLE.get(
            str(status), (StoreError, "unexpected error from the store")
        )
        if hint is _WRONG_REGION and (region := _bucket_region(exc)):
            hint = (
                f"the bucket is in region {region}: pass --region {region} or "
                f"S3Config(region={region!r}) (or set AWS_REGION={region})"
            )
        tries = f" after {attempts} attempts" if cls is TransientStoreError else ""
        message = f"{operation} failed with {code} (HTTP {status}){tries}: {hint}"
    elif isinstance(exc, (bce.NoCredentialsError, bce.PartialCredentialsError)):
        cls, code = AccessDeniedError, "NoCredentials"
        message = (
            f"{operation}: no usable AWS credentials found; set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or run with an instance/container role"
        )
    elif isinstance(exc, bce.EndpointConnectionError) and not isinstance(
        exc, bce.ConnectTimeoutError
    ):
        cls, code = EndpointError, "EndpointConnectionError"
        message = (
            f"{operation}: cannot connect to endpoint {where} ({name}); check "
            "endpoint_url / AWS_ENDPOINT_URL, the hostname and that the server is running"
        )
    elif isinstance(exc, bce.ParamValidationError):
        code, message = "ParamValidation", f"{operation}: invalid request parameters: {exc}"
    elif is_transient(exc):
        cls = TransientStoreError
        message = (
            f"{operation} failed after {attempts} attempts ({name}): the endpoint {where} kept "
            "timing out or resetting connections"
        )
    else:
        message = f"{operation} s3://{bucket}/{key or ''} failed: {name}: {exc}"
    return cls(message, bucket=bucket, key=key, operation=operation, code=code)
