"""S3Store: s3ckpt's requests to S3, on the process's shared boto3 client
(:mod:`s3ckpt.store._client`).

Every request is retried on its own (:func:`s3ckpt.store._request.call`), under the one
retry policy of :mod:`s3ckpt.store.retry` (exponential back-off with full jitter), on
throttling (``SlowDown``, 503), 5xx, request timeouts and connection resets; the store
builds that tenacity ``Retrying`` once and every request runs through it. botocore's
own retries are turned off (one attempt) so the two never multiply; the attempts come from
``TransferConfig.max_attempts``, ``AWS_MAX_ATTEMPTS`` or the profile's ``max_attempts``, in
that order, resolved once when the store is built (:attr:`S3Store.transfer_config` never
changes after). A bad hostname or a refused connection is *not* retried: it fails at once with an
:class:`~s3ckpt.errors.EndpointError` that says what to check.

Throttling is met by an adaptive limiter (:mod:`s3ckpt.store._adaptive`, on unless
``TransferConfig.adaptive`` is off): the request attempts of all stores of a process that
talk to one (endpoint, bucket) share a congestion window that halves on ``503 SlowDown``
and grows back on success; :meth:`S3Store.throttle_stats` reports it.

Storage-class moves, tags and restores come from the mixin
:class:`~s3ckpt.store._archive.StorageClassRequests`, the bucket's versioning and its
noncurrent versions from :class:`~s3ckpt.store._versions.VersionRequests`, through the
same ``_call``.

botocore errors become s3ckpt errors in :func:`s3ckpt.store._errors.map_error`, by error
*code* and HTTP status through one table, never by message text. Request bodies are
:class:`~s3ckpt.store._body.BufferBody` streams; ranged reads are
:class:`~s3ckpt.store._body.S3RangeReader` streams.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any, TypeVar

from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.store import _archive, _reply, _versions
from s3ckpt.store._adaptive import AdaptiveLimiter, ThrottleStats, shared_limiter
from s3ckpt.store._body import BufferBody, S3RangeReader
from s3ckpt.store._capabilities import checksum_verified
from s3ckpt.store._client import profile_attempts, shared_client
from s3ckpt.store._errors import timeout_kind
from s3ckpt.store._request import call, checksum_args
from s3ckpt.store.base import (
    MAX_DELETE_BATCH,
    Buffer,
    CompletedPart,
    DeleteFailure,
    DeleteFailures,
    ObjectInfo,
    UploadInfo,
    if_found,
)
from s3ckpt.store.retry import RetryPolicy

__all__ = ["S3Store", "shared_client"]

_HEAD_EXTRA = ("StorageClass", "Restore")  # ObjectInfo's storage_class and restore


def _unchecked(resp: Any, *, bucket: str, prefix: str) -> None:
    """A ListObjectVersions page (only counted, for a report: not checked)."""


# A listing -> its reply check, its page-size argument and the markers it goes on with (the
# reply's ``Next...`` of each).
_PAGES: dict[str, tuple[Callable[..., None], str, tuple[str, ...]]] = {
    "list_objects_v2": (_reply.check_list_page, "MaxKeys", ("ContinuationToken",)),
    "list_multipart_uploads": (
        _reply.check_uploads_page,
        "MaxUploads",
        ("KeyMarker", "UploadIdMarker"),
    ),
    "list_object_versions": (_unchecked, "MaxKeys", ("KeyMarker", "VersionIdMarker")),
}

T = TypeVar("T")


class S3Store(_archive.StorageClassRequests, _versions.VersionRequests):
    """:class:`~s3ckpt.store.base.ObjectStore` over boto3 for S3 and S3-compatible stores.

    The boto3 client is fetched lazily, once per process, from :func:`shared_client` (the
    store pickles without it and fetches one again after ``fork`` or ``spawn``): stores of
    one process with equal settings share one client, whose connection pool is sized to
    ``TransferConfig.read_concurrency`` (stores busy at once share that pool). Stores of one
    process and (endpoint, bucket) share one adaptive limiter the same way
    (:meth:`throttle_stats`).

    Its settings never change: :attr:`transfer_config` is the one given with the AWS
    profile's ``max_attempts`` applied here (:func:`~s3ckpt.store._client.profile_attempts`),
    and :attr:`retry_policy` (a frozen :class:`~s3ckpt.store.retry.RetryPolicy`), built
    from it here, gives every request a fresh ``Retrying``.

    Args:
        bucket: The bucket every key lives in.
        s3_config: Endpoint, region, encryption and checksum settings.
        transfer_config: Concurrency, timeouts and retry budget.
        sleep: Sleeps the retry back-off and the adaptive limiter's pacing (tests pass a
            no-op).
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
        self.bucket = bucket
        self.page_size = page_size
        self.delete_batch_size = delete_batch_size
        self.s3_config = s3_config or S3Config()
        self.transfer_config = profile_attempts(self.s3_config, transfer_config or TransferConfig())
        self.retry_policy = RetryPolicy.of(
            self.transfer_config, timeout_kind=timeout_kind, sleep=sleep
        )
        self._bound: dict[str, tuple[int, Any]] = {}  # client, limiter -> (process id, it)

    # -- pickling: never ship a live client (or credentials) to another process ------------
    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_bound": {}}

    def __repr__(self) -> str:
        return f"S3Store(bucket={self.bucket!r}, endpoint={self.endpoint_url!r})"

    @property
    def endpoint_url(self) -> str | None:
        """The endpoint in force (``None``: AWS)."""
        return self.s3_config.resolved_endpoint_url()

    def _per_process(self, slot: str, make: Callable[[], T]) -> T:
        """The object in ``slot`` built by ``make`` in this process (again after a fork or
        in a spawned child). One assignment: another thread sees the old pair or the new
        one, never a parent's object next to this process's id."""
        bound = self._bound.get(slot)
        if bound is None or bound[0] != os.getpid():
            bound = self._bound[slot] = (os.getpid(), make())
        return bound[1]

    @property
    def client(self) -> Any:
        """The process's boto3 S3 client (:func:`shared_client`, fetched on first use and
        again in a new process)."""
        return self._per_process(
            "client", lambda: shared_client(self.s3_config, self.transfer_config)
        )

    @property
    def limiter(self) -> AdaptiveLimiter | None:
        """The process's adaptive limiter for this endpoint and bucket
        (:func:`~s3ckpt.store._adaptive.shared_limiter`, fetched on first use and again in
        a new process); ``None`` when ``TransferConfig.adaptive`` is off."""
        tc = self.transfer_config
        if not tc.adaptive:
            return None
        make = partial(shared_limiter, self.endpoint_url, self.bucket, tc.read_concurrency)
        return self._per_process("limiter", make)

    def throttle_stats(self) -> ThrottleStats | None:
        """Throttling seen by this process's requests to this endpoint and bucket (every
        store sharing the limiter counts), and the limiter's window and pacing now;
        ``None`` when ``TransferConfig.adaptive`` is off."""
        limiter = self.limiter
        return None if limiter is None else limiter.stats()

    # -- retry + error mapping ---------------------------------------------------------------
    def _call(self, operation: str, key: str | None, fn: Callable[[], T]) -> T:
        return self._call_counted(operation, key, fn)[0]

    def _call_counted(self, operation: str, key: str | None, fn: Callable[[], T]) -> tuple[T, int]:
        """``fn()`` under the retry policy; returns its result and the attempts it took."""
        # The client first, outside the retries: an unknown profile is a ConfigError at once.
        _ = self.client
        return call(
            fn,
            operation=operation,
            bucket=self.bucket,
            key=key,
            endpoint=self.endpoint_url,
            config=self.transfer_config,
            policy=self.retry_policy,
            limiter=self.limiter,
        )

    def _args(self, key: str, *, upload: bool = False, **extra: Any) -> dict[str, Any]:
        """A request's Bucket, Key and encryption (and storage class, on ``upload``)."""
        return {
            "Bucket": self.bucket,
            "Key": key,
            **self.s3_config.sse_args(upload=upload),
            **extra,
        }

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
        return self.put_echoed(
            key, data, if_none_match=if_none_match, if_match=if_match, crc32c=crc32c
        )[0]

    def put_echoed(
        self, key: str, data: Buffer, *, if_match: str | None = None, **cond: Any
    ) -> tuple[str, bool | None]:
        """:meth:`put`, and whether the reply echoed the CRC32C sent (None: none was sent):
        what the capability probe asks."""
        crc = checksum_args(self.s3_config, data, cond.get("crc32c"))
        args = self._args(key, upload=True, **crc)
        if cond.get("if_none_match"):
            args["IfNoneMatch"] = "*"
        if if_match is not None:
            args["IfMatch"] = if_match
        sent = args.get("ChecksumCRC32C")

        def send() -> tuple[str, bool | None]:
            resp = self.client.put_object(Body=BufferBody(data), **args)
            etag = _reply.check_written(
                resp, operation="put", bucket=self.bucket, key=key, sent_crc32c=sent
            )
            return etag, None if sent is None else resp.get("ChecksumCRC32C") == sent

        return self._call("put", key, send)

    def create_multipart(self, key: str) -> str:
        """See :meth:`ObjectStore.create_multipart`."""
        args = self._args(key, upload=True)
        if self.s3_config.checksum_algorithm == "CRC32C":
            args["ChecksumAlgorithm"] = "CRC32C"

        def send() -> str:
            resp = self.client.create_multipart_upload(**args)
            return _reply.check_create(resp, bucket=self.bucket, key=key)

        upload_id, attempts = self._call_counted("create_multipart", key, send)
        if attempts > 1:
            _archive.abort_orphan_uploads(self, key, upload_id)
        return upload_id

    def upload_part(
        self, key: str, upload_id: str, part_number: int, data: Buffer, *, crc32c: int | None = None
    ) -> CompletedPart:
        """See :meth:`ObjectStore.upload_part`."""
        checksum = checksum_args(self.s3_config, data, crc32c)
        args = self._args(key, UploadId=upload_id, PartNumber=part_number, **checksum)
        sent = checksum.get("ChecksumCRC32C")

        def send() -> CompletedPart:
            resp = self.client.upload_part(Body=BufferBody(data), **args)
            etag = _reply.check_written(
                resp, operation="upload_part", bucket=self.bucket, key=key, sent_crc32c=sent
            )
            crc = resp.get("ChecksumCRC32C") or sent
            return CompletedPart(part_number, etag, crc, len(data))

        return self._call("upload_part", key, send)

    def complete_multipart(
        self,
        key: str,
        upload_id: str,
        parts: Sequence[CompletedPart],
        *,
        if_none_match: bool = False,
    ) -> str:
        """See :meth:`ObjectStore.complete_multipart`."""
        crc = self.s3_config.checksum_algorithm == "CRC32C"
        body = [
            {"PartNumber": p.part_number, "ETag": p.etag}
            | ({"ChecksumCRC32C": p.checksum_crc32c} if p.checksum_crc32c and crc else {})
            for p in sorted(parts, key=lambda p: p.part_number)
        ]
        # SSE-C keys only (no SSE-KMS arguments on a download-side request).
        args = self._args(key, UploadId=upload_id, MultipartUpload={"Parts": body})
        if if_none_match:
            args["IfNoneMatch"] = "*"
        checksums = [str(e["ChecksumCRC32C"]) for e in body if "ChecksumCRC32C" in e]
        sent = checksums if len(checksums) == len(body) else None

        def send() -> str:
            resp = self.client.complete_multipart_upload(**args)
            return _reply.check_complete(resp, bucket=self.bucket, key=key, part_checksums=sent)

        return self._call("complete_multipart", key, send)

    def checksum_verified(self, key: str) -> bool:
        """Whether the store refuses an upload whose CRC32C does not match its body: one
        PUT of ``key`` (the caller's own object, re-sent as it is) with a wrong checksum,
        once per (endpoint, bucket) and process
        (:func:`~s3ckpt.store._capabilities.checksum_verified`)."""
        return checksum_verified(self, key)

    def abort_multipart(self, key: str, upload_id: str) -> None:
        """See :meth:`ObjectStore.abort_multipart`."""
        args = {"Bucket": self.bucket, "Key": key, "UploadId": upload_id}
        abort = partial(self.client.abort_multipart_upload, **args)
        if_found(partial(self._call, "abort_multipart", key, abort))  # gone already: aborted

    def open_range(self, key: str, start: int = 0, length: int | None = None) -> S3RangeReader:
        """See :meth:`ObjectStore.open_range`."""
        return S3RangeReader(self, key, start, length)

    def _get(self, key: str, read: Callable[[Any], T], **extra: Any) -> T:
        """``read`` of a checked GetObject reply (``extra``: a ``Range="bytes=a-b"``), inside
        the attempt: a body that breaks off is retried with the request."""
        args = self._args(key, **extra)

        def fetch() -> T:
            resp = self.client.get_object(**args)
            _reply.check_body(resp, bucket=self.bucket, key=key)
            return read(resp)

        return self._call("get", key, fetch)

    def _get_object(self, key: str, first: int, last: int | None) -> Any:
        return self._get(key, lambda r: r, Range=f"bytes={first}-{'' if last is None else last}")

    def get(self, key: str) -> bytes:
        """See :meth:`ObjectStore.get`."""
        return self._get(key, lambda resp: bytes(resp["Body"].read()))

    def head(self, key: str) -> ObjectInfo | None:
        """See :meth:`ObjectStore.head`."""
        args = self._args(key)

        def fetch() -> Any:
            resp = self.client.head_object(**args)
            _reply.check_head(resp, bucket=self.bucket, key=key)
            return resp

        resp = if_found(partial(self._call, "head", key, fetch))  # 404 is an answer
        if resp is None:
            return None
        size, etag, stamp = int(resp["ContentLength"]), resp["ETag"], resp["LastModified"]
        return ObjectInfo(key, size, etag, stamp.timestamp(), *map(resp.get, _HEAD_EXTRA))

    def _paginate(self, operation: str, prefix: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
        """Every page of the listing ``operation`` of ``prefix``, each reply checked
        (:mod:`~s3ckpt.store._reply`), :attr:`page_size` keys a page."""
        check, size, markers = _PAGES[operation]
        args = {"Bucket": self.bucket, "Prefix": prefix, size: self.page_size, **kwargs}

        def fetch() -> Any:
            resp = getattr(self.client, operation)(**args)
            check(resp, bucket=self.bucket, prefix=prefix)
            return resp

        while True:
            resp = self._call(operation, prefix, fetch)
            yield resp
            if not resp.get("IsTruncated"):
                return
            args.update((m, resp.get(f"Next{m}", "")) for m in markers)

    def dated_list(self, prefix: str) -> tuple[str | None, float, float]:
        """The ``Date`` header of one ListObjectsV2 of ``prefix`` (one key at most), and this
        host's clock just before and after the attempt that answered: the store's time, for
        :func:`s3ckpt.store._clock.store_time`. ListBucket on the prefix is what every role
        that lists checkpoints already has (HeadBucket needs it on the whole bucket)."""

        def fn() -> tuple[Any, float, float]:
            sent = time.time()
            resp = self.client.list_objects_v2(Bucket=self.bucket, Prefix=prefix, MaxKeys=1)
            return resp, sent, time.time()

        resp, sent, received = self._call("list_objects_v2", prefix, fn)
        headers = (resp.get("ResponseMetadata") or {}).get("HTTPHeaders") or {}
        return headers.get("date"), sent, received

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """See :meth:`ObjectStore.list`."""
        for page in self._paginate("list_objects_v2", prefix):
            yield from map(_reply.listed_object, page.get("Contents") or [])

    def list_prefixes(
        self, prefix: str, delimiter: str = "/", *, start_after: str | None = None
    ) -> Iterator[str]:
        """See :meth:`ObjectStore.list_prefixes`."""
        # Keys <= start_after only make prefixes <= start_after, so S3 may skip them.
        extra = {"StartAfter": start_after} if start_after is not None else {}
        for page in self._paginate("list_objects_v2", prefix, Delimiter=delimiter, **extra):
            for cp in page.get("CommonPrefixes") or []:
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
            # Not quiet: a reply cut short must not read as "all deleted" (_reply).
            req = {"Objects": [{"Key": k} for k in batch], "Quiet": False}

            def send(req: dict[str, Any] = req, batch: list[str] = batch) -> Any:
                resp = self.client.delete_objects(Bucket=self.bucket, Delete=req)
                _reply.check_deleted(resp, bucket=self.bucket, keys=batch)
                return resp

            for e in self._call("delete", batch[0], send).get("Errors") or []:
                failures.append(DeleteFailure(*(e.get(f, "") for f in ("Key", "Code", "Message"))))
        return failures

    def delete_if_match(self, key: str, etag: str) -> None:
        """See :meth:`ObjectStore.delete_if_match`."""
        args = {"Bucket": self.bucket, "Key": key, "IfMatch": etag}
        self._call("delete", key, partial(self.client.delete_object, **args))

    def list_multipart_uploads(self, prefix: str) -> Iterator[UploadInfo]:
        """See :meth:`ObjectStore.list_multipart_uploads`."""
        for page in self._paginate("list_multipart_uploads", prefix):
            for up in page.get("Uploads") or []:
                init = up.get("Initiated")
                yield UploadInfo(up["Key"], up["UploadId"], init.timestamp() if init else None)
