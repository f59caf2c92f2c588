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
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import botocore.exceptions as bce

from s3ckpt import _crc
from s3ckpt.config import S3Config
from s3ckpt.store._body import BufferBody
from s3ckpt.store._request import sse_args

__all__ = ["checksum_verified", "forget_checksum_probes"]

T = TypeVar("T")


class _ProbedStore(Protocol):
    """What the probe needs of :class:`~s3ckpt.store.s3.S3Store` (named here, not
    imported: s3.py imports this module)."""

    s3_config: S3Config

    @property
    def bucket(self) -> str: ...

    @property
    def endpoint_url(self) -> str | None: ...

    @property
    def client(self) -> Any: ...

    def get(self, key: str) -> bytes: ...

    def put(self, key: str, data: bytes) -> str: ...

    def _call(self, operation: str, key: str | None, fn: Callable[[], T]) -> T: ...


_REFUSALS = frozenset(
    {"BadDigest", "InvalidRequest", "XAmzContentChecksumMismatch", "InvalidDigest"}
)

_lock = threading.Lock()
_known: dict[tuple[str | None, str], bool] = {}


def forget_checksum_probes() -> None:
    """Forget every probe (tests)."""
    with _lock:
        _known.clear()


def checksum_verified(store: _ProbedStore, key: str) -> bool:
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


def _refused(store: _ProbedStore, key: str, body: bytes, args: dict[str, Any]) -> bool:
    """Send the wrong-checksum PUT: whether the store refused it.

    The PUT is one request of the store's own (``S3Store._call``): counted, paced by
    the adaptive limiter and retried under the one retry policy on a reset, a throttle or
    a 5xx. A 400 is an answer, never retried: a refusal for the checksum proves the store
    verifies; a 400 for any other reason proves nothing, so it counts as "not verified"
    (the safe side: the save then re-reads what it wrote)."""

    def send() -> bool:
        try:
            store.client.put_object(Body=BufferBody(body), **args)
        except bce.ClientError as exc:
            err = exc.response.get("Error", {}) or {}
            meta = exc.response.get("ResponseMetadata", {}) or {}
            if err.get("Code") in _REFUSALS:
                return True
            if int(meta.get("HTTPStatusCode", 0) or 0) == 400:
                return False
            raise
        return False

    return store._call("put", key, send)
