"""Whether an S3 store checks the CRC32C sent with an upload: probed once per (endpoint,
bucket) and process by :meth:`~s3ckpt.store.s3.S3Store.checksum_verified`.

An echo proves nothing: moto (and some S3-compatible servers) store and echo back whatever
``x-amz-checksum-crc32c`` they are sent without checking it against the body. The probe
therefore sends one PUT whose CRC32C is wrong on purpose: a store that verifies refuses it
(``400 BadDigest``, ``InvalidRequest``) and keeps the object as it was; one that does not
accepts it, and the object is put back at once with its right checksum. The key is the
caller's own object (the save's coordinator heartbeat), re-sent with the body it holds.

Request cost: GET + PUT (+ PUT) the first time per (endpoint, bucket) and process.
"""

from __future__ import annotations

import base64
import threading
import time
from typing import TYPE_CHECKING, Any

import botocore.exceptions as bce

from s3ckpt import _crc
from s3ckpt.store._body import BufferBody
from s3ckpt.store._errors import is_transient, map_error
from s3ckpt.store._request import sse_args

if TYPE_CHECKING:
    from s3ckpt.store.s3 import S3Store

__all__ = ["checksum_verified", "forget_checksum_probes"]

_REFUSALS = frozenset(
    {"BadDigest", "InvalidRequest", "XAmzContentChecksumMismatch", "InvalidDigest"}
)

_lock = threading.Lock()
_known: dict[tuple[str | None, str], bool] = {}


def forget_checksum_probes() -> None:
    """Forget every probe (tests)."""
    with _lock:
        _known.clear()


def checksum_verified(store: S3Store, key: str) -> bool:
    """Whether ``store`` refuses an upload whose CRC32C does not match its body (see the
    module docs); ``key`` must exist and be the caller's own object.

    Raises:
        StoreError: The probe's requests failed otherwise (access denied, endpoint).
    """
    where = (store.endpoint_url, store.bucket)
    with _lock:
        known = _known.get(where)
    if known is not None:
        return known
    body = store.get(key)
    wrong = (_crc.crc32c(body) ^ 0xFFFFFFFF).to_bytes(4, "big")
    args = {
        "Bucket": store.bucket,
        "Key": key,
        "ChecksumAlgorithm": "CRC32C",
        "ChecksumCRC32C": base64.b64encode(wrong).decode("ascii"),
        **sse_args(store.s3_config, upload=True),
    }
    verified = _refused(store, key, body, args)
    if not verified:
        store.put(key, body)  # the object back with its right checksum
    with _lock:
        _known[where] = verified
    return verified


def _refused(store: S3Store, key: str, body: bytes, args: dict[str, Any]) -> bool:
    """Send the wrong-checksum PUT (a reset or 5xx is retried, a refusal never is):
    whether the store refused it."""
    attempts = max(1, store.transfer_config.max_attempts)
    for attempt in range(attempts):
        try:
            store.client.put_object(Body=BufferBody(body), **args)
            return False
        except bce.ClientError as exc:
            err = exc.response.get("Error", {}) or {}
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
            if err.get("Code") in _REFUSALS:
                return True
            if status == 400:  # refused for another reason: not proof, verify (safe side)
                return False
            failure: Exception = exc
        except Exception as exc:
            failure = exc
        if not is_transient(failure) or attempt == attempts - 1:
            raise map_error(
                failure, operation="put", bucket=store.bucket, key=key, endpoint=store.endpoint_url
            ) from failure
        time.sleep(min(store.transfer_config.retry_max_delay, 0.1 * 2**attempt))
    raise AssertionError("unreachable")  # pragma: no cover
