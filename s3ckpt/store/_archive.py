"""Storage classes on S3: moving an object to another class in place, tagging it for a
lifecycle rule, restoring an archived one, and the error a read of an archived object is.

:class:`StorageClassRequests` is mixed into :class:`~s3ckpt.store.s3.S3Store` (it keeps
``s3.py`` to the requests every save and load makes); its requests are the store's own,
through ``S3Store._call`` (retried, counted, limited and mapped like every other).
Decisions:

* **A move is a copy onto itself.** ``CopyObject`` with the new ``StorageClass``,
  ``MetadataDirective`` and ``TaggingDirective`` ``COPY``, and no ``ChecksumAlgorithm``, so
  S3 keeps the object's CRC32C; the encryption the store writes with is restated (a copy
  without it takes the bucket's default). Above :data:`COPY_PART_LIMIT` (CopyObject's 5 GiB)
  it is a multipart copy on the source's own part boundaries (read from a HEAD of part 1), so
  a composite CRC32C comes out the same; metadata, content type and tags are carried over.
* **A lost reply is decided by reading back.** A retried copy may meet its own earlier
  success (a changed ETag under ``CopySourceIfMatch``, "must change something", a
  completed upload's ``NoSuchUpload``): when any failure leaves the object in the class
  with the size it had, the move is done.
* **Restore answers are states, not errors** (:class:`~s3ckpt.store.base.RestoreState`):
  202 started, 200 restored (a copy exists; its expiry was extended), 409
  ``RestoreAlreadyInProgress`` in progress, 403 ``InvalidObjectState`` not archived.
* **The archived-read error names the checkpoint** (:func:`archived_error`): the key's
  checkpoint prefix (its parent, or the owner of a hashed-prefix shard) goes into the
  ``s3ckpt restore`` hint, so the reader needs no handler of its own.

Also here, for :meth:`~s3ckpt.store.s3.S3Store.create_multipart` and the multipart copy:
:func:`abort_orphan_uploads`, which aborts the uploads a retried CreateMultipartUpload whose
reply was lost may have left.

No botocore here (:class:`~s3ckpt.store.memory.MemoryStore` raises :func:`archived_error`
too); the boto3 client is the store's.
"""

from __future__ import annotations

import contextlib
import logging
import urllib.parse
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from s3ckpt.config import S3Config
from s3ckpt.errors import (
    ArchivedObjectError,
    ObjectNotFoundError,
    PreconditionFailedError,
    StoreError,
)
from s3ckpt.format._names import shard_owner
from s3ckpt.metrics.instrument import in_context
from s3ckpt.store.base import ObjectInfo, ObjectStore, RestoreState, S3Requests, check_restore_args

__all__ = [
    "COPY_PART_LIMIT",
    "COPY_PART_SIZE",
    "StorageClassRequests",
    "abort_orphan_uploads",
    "archived_error",
    "checkpoint_url",
    "same_class",
]

log = logging.getLogger(__name__)

GIB = 1 << 30

#: The largest object one CopyObject moves (S3's limit); above it, a multipart copy. A module
#: constant so that tests can lower it.
COPY_PART_LIMIT = 5 * GIB

#: The part size of a multipart copy of an object that was not uploaded in parts (its source has no
#: part boundaries to keep).
COPY_PART_SIZE = 512 << 20

_MAX_COPY_PART = 5 * GIB  # UploadPartCopy's largest range
_MAX_PARTS = 10_000


def same_class(current: str | None, wanted: str) -> bool:
    """Whether an object whose HEAD or listing says ``current`` (None: ``STANDARD``) is in
    class ``wanted``."""
    return (current or "STANDARD") == wanted


def checkpoint_url(bucket: str, key: str) -> str:
    """The URL of the checkpoint ``key`` belongs to: the owner of a hashed-prefix shard
    (:func:`~s3ckpt.format.shard_owner`), else the key's parent prefix."""
    owner = shard_owner(key)
    prefix = owner.checkpoint if owner is not None else key.rpartition("/")[0] + "/"
    return f"s3://{bucket}/{prefix.lstrip('/')}"


def archived_error(
    *, bucket: str, key: str, storage_class: str | None, operation: str
) -> ArchivedObjectError:
    """The :class:`~s3ckpt.errors.ArchivedObjectError` for a read of ``key`` refused
    because its class keeps it offline, naming the ``s3ckpt restore`` command for its
    checkpoint."""
    where = checkpoint_url(bucket, key)
    cls = storage_class or "an archive class"
    err = ArchivedObjectError(
        f"{operation}: {key} is in {cls} and has no restored copy, so it cannot be read: run "
        f"`s3ckpt restore {where}` and retry once the restore completes (Standard: hours; "
        "`s3ckpt restore --wait` waits for it)",
        bucket=bucket,
        key=key,
        operation=operation,
        code="InvalidObjectState",
    )
    err.storage_class = storage_class
    err.checkpoint = where
    return err


class StorageClassRequests:
    """:meth:`~s3ckpt.store.base.ArchiveStore.set_storage_class`,
    :meth:`~s3ckpt.store.base.ArchiveStore.put_object_tags` and
    :meth:`~s3ckpt.store.base.ArchiveStore.restore_object` on S3 (mixed into
    :class:`~s3ckpt.store.s3.S3Store`)."""

    def set_storage_class(
        self: S3Requests,
        key: str,
        storage_class: str,
        *,
        etag: str | None = None,
        size: int | None = None,
    ) -> ObjectInfo:
        """See :meth:`~s3ckpt.store.base.ArchiveStore.set_storage_class`.

        Cost: one CopyObject (plus a HEAD first without ``size``); above
        :data:`COPY_PART_LIMIT`, a HEAD, a GetObjectTagging, CreateMultipartUpload, one
        UploadPartCopy per part (up to ``TransferConfig.concurrency`` at once) and Complete.
        """

        def fail(cls: type[StoreError], what: str, code: str | None = None) -> StoreError:
            return cls(what, bucket=self.bucket, key=key, operation="copy", code=code)

        if size is None:
            info = self.head(key)
            if info is None:
                raise fail(
                    ObjectNotFoundError, "set_storage_class: the object does not exist", "NoSuchKey"
                )
            if etag is not None and info.etag != etag:
                changed = f"the object changed (ETag {info.etag}, expected {etag}): list it again"
                raise fail(
                    PreconditionFailedError, f"set_storage_class: {changed}", "PreconditionFailed"
                )
            if same_class(info.storage_class, storage_class):
                return info
            size = info.size
        copy = _multipart_copy if size > COPY_PART_LIMIT else _copy
        try:
            moved = copy(self, key, storage_class, etag, size)
        except StoreError:
            done = _read_back(self, key, storage_class, size)
            if done is None:
                raise
            return done
        done = moved or _read_back(self, key, storage_class, size)
        if done is None:
            raise fail(
                ObjectNotFoundError,
                "set_storage_class: the object was copied, then deleted or replaced before it "
                "could be read back",
            )
        return done

    def put_object_tags(self: S3Requests, key: str, tags: Mapping[str, str]) -> None:
        """See :meth:`~s3ckpt.store.base.ArchiveStore.put_object_tags` (one
        PutObjectTagging; a retry after a lost reply puts the same set again)."""
        tagging = {"TagSet": [{"Key": k, "Value": v} for k, v in sorted(tags.items())]}
        args = {"Bucket": self.bucket, "Key": key, "Tagging": tagging}
        self._call("put_object_tags", key, partial(self.client.put_object_tagging, **args))

    def restore_object(
        self: S3Requests, key: str, *, days: int, tier: str = "Standard"
    ) -> RestoreState:
        """See :meth:`~s3ckpt.store.base.ArchiveStore.restore_object` (one RestoreObject;
        a retry after a lost reply answers 409 or 200, both states)."""
        check_restore_args(days, tier)
        request = {"Days": days, "GlacierJobParameters": {"Tier": tier}}

        def send() -> int:
            resp = self.client.restore_object(Bucket=self.bucket, Key=key, RestoreRequest=request)
            return int(resp.get("ResponseMetadata", {}).get("HTTPStatusCode", 202))

        try:
            status = self._call("restore", key, send)
        except StoreError as exc:
            if exc.code == "RestoreAlreadyInProgress":
                return RestoreState.IN_PROGRESS
            if exc.code == "InvalidObjectState":  # not in an archive class
                return RestoreState.NOT_ARCHIVED
            raise
        return RestoreState.RESTORED if status == 200 else RestoreState.STARTED


def _sse(cfg: S3Config, storage_class: str) -> dict[str, Any]:
    """The written object's encryption (restated: a copy takes the bucket default
    otherwise) and the class; SSE-C keys for the copy source too."""
    args = {**cfg.sse_args(upload=True), "StorageClass": storage_class}
    if cfg.sse_customer_key is not None:
        args["CopySourceSSECustomerAlgorithm"] = "AES256"
        args["CopySourceSSECustomerKey"] = cfg.sse_customer_key
    return args


def _copy(
    store: S3Requests, key: str, storage_class: str, etag: str | None, size: int
) -> ObjectInfo | None:
    """One CopyObject onto itself; the object as the reply describes it (None when the
    reply says too little: the caller HEADs)."""
    obj = {"Bucket": store.bucket, "Key": key}
    args: dict[str, Any] = {**obj, "CopySource": obj, **_sse(store.s3_config, storage_class)}
    args |= {"MetadataDirective": "COPY", "TaggingDirective": "COPY"}
    if etag is not None:
        args["CopySourceIfMatch"] = etag
    resp = store._call("copy", key, partial(store.client.copy_object, **args))
    result = resp.get("CopyObjectResult") or {}
    if not result.get("ETag"):
        return None
    modified = result.get("LastModified")
    stamp = modified.timestamp() if modified is not None else None
    cls = None if storage_class == "STANDARD" else storage_class
    return ObjectInfo(key, size, result["ETag"], stamp, cls)


def _multipart_copy(
    store: S3Requests, key: str, storage_class: str, etag: str | None, size: int
) -> None:
    """A copy onto itself above CopyObject's limit, on the source's part boundaries."""
    cfg = store.s3_config
    sse = _sse(cfg, storage_class)
    obj = {"Bucket": store.bucket, "Key": key}
    ssec = {k: v for k, v in sse.items() if k.startswith("SSECustomer")}  # the object's key
    copy_sse = {k: v for k, v in sse.items() if "SSECustomer" in k}  # and the source's
    head = partial(store.client.head_object, **obj, PartNumber=1, **ssec)
    first = store._call("head", key, head)
    part_size = int(first["ContentLength"]) if int(first.get("PartsCount") or 1) > 1 else 0
    if not 0 < part_size <= _MAX_COPY_PART or -(-size // part_size) > _MAX_PARTS:
        part_size = max(COPY_PART_SIZE, -(-size // _MAX_PARTS))
    tagging = store._call("get_object_tags", key, partial(store.client.get_object_tagging, **obj))
    create: dict[str, Any] = {**obj, "Metadata": first.get("Metadata") or {}}
    create |= {k: v for k, v in sse.items() if not k.startswith("CopySource")}
    kept = ("ContentType", "ContentEncoding", "ContentDisposition", "CacheControl")
    create |= {name: first[name] for name in kept if first.get(name)}
    if tagging.get("TagSet"):
        create["Tagging"] = urllib.parse.urlencode(
            [(t["Key"], t["Value"]) for t in tagging["TagSet"]]
        )
    crc = cfg.checksum_algorithm == "CRC32C"
    if crc:
        create["ChecksumAlgorithm"] = "CRC32C"
    created, attempts = store._call_counted(
        "create_multipart", key, partial(store.client.create_multipart_upload, **create)
    )
    upload_id = created["UploadId"]
    if attempts > 1:
        abort_orphan_uploads(store, key, upload_id)  # type: ignore[arg-type]

    def part(number: int) -> dict[str, Any]:
        start = (number - 1) * part_size
        args: dict[str, Any] = {**obj, "UploadId": upload_id, "PartNumber": number, **copy_sse}
        args["CopySource"] = obj
        args["CopySourceRange"] = f"bytes={start}-{min(size, start + part_size) - 1}"
        if etag is not None:
            args["CopySourceIfMatch"] = etag
        resp = store._call("upload_part_copy", key, partial(store.client.upload_part_copy, **args))
        result = resp.get("CopyPartResult") or {}
        entry = {"PartNumber": number, "ETag": result.get("ETag")}
        if crc and result.get("ChecksumCRC32C"):
            entry["ChecksumCRC32C"] = result["ChecksumCRC32C"]
        return entry

    numbers = range(1, -(-size // part_size) + 1)
    try:
        workers = max(1, min(store.transfer_config.concurrency, len(numbers), 16))
        with ThreadPoolExecutor(workers, thread_name_prefix="s3ckpt-copy") as pool:
            parts = list(pool.map(in_context(part), numbers))
        complete = {**obj, "UploadId": upload_id, "MultipartUpload": {"Parts": parts}, **ssec}
        store._call(
            "complete_multipart", key, partial(store.client.complete_multipart_upload, **complete)
        )
    except BaseException:
        with contextlib.suppress(StoreError):  # else billed until the abort-incomplete rule
            store.abort_multipart(key, upload_id)
        raise


def _read_back(store: S3Requests, key: str, storage_class: str, size: int) -> ObjectInfo | None:
    """The object's HEAD when it is in ``storage_class`` with ``size`` bytes (the move is
    done, whatever a lost reply or a retry said), else None."""
    with contextlib.suppress(StoreError):  # not read back: not known to be done
        info = store.head(key)
        if info is not None and info.size == size and same_class(info.storage_class, storage_class):
            return info
    return None


def abort_orphan_uploads(store: ObjectStore, key: str, keep: str) -> None:
    """Abort uploads of exactly ``key`` other than ``keep`` (best effort).

    A retried CreateMultipartUpload may have been applied by an attempt whose reply was
    lost: that upload's id never reached us and its parts would be billed until a
    lifecycle rule removes them. s3ckpt's keys are unique per save (see
    :mod:`s3ckpt.format`), so any other upload of this very key is such an orphan.
    """
    where = f"s3://{store.bucket}/{key}"
    try:
        orphans = [
            u.upload_id
            for u in store.list_multipart_uploads(key)
            if u.key == key and u.upload_id != keep
        ]
        for upload_id in orphans:
            store.abort_multipart(key, upload_id)
    except StoreError as exc:  # the save itself is fine; only cleanup is left behind
        log.warning("could not abort orphaned multipart uploads of %s: %s", where, exc)
        return
    if orphans:
        log.info(
            "aborted %d orphaned multipart upload(s) of %s left by a lost reply",
            len(orphans),
            where,
        )
