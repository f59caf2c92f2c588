"""MemoryStore: an in-process object store with fault injection, for fast unit tests
(ours and users').

Storage classes are kept per object as S3 keeps them: a move replaces the object's class
(its ETag and bytes stay), a read of an object in an archive class fails with
:class:`~s3ckpt.errors.ArchivedObjectError` until a restore is asked for and
``restore_seconds`` (of the store's clock) have passed.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from s3ckpt.errors import (
    ObjectNotFoundError,
    PreconditionFailedError,
    StoreError,
    UnsupportedOperationError,
)
from s3ckpt.store._archive import archived_error, same_class
from s3ckpt.store.base import (
    MAX_DELETE_BATCH,
    Buffer,
    CompletedPart,
    DeleteFailure,
    DeleteFailures,
    ObjectInfo,
    RestoreState,
    UploadInfo,
    check_restore_args,
    common_prefixes,
    restore_state,
)

__all__ = ["MemoryStore", "Fault"]


@dataclass
class Fault:
    """Raise ``error`` on the next ``times`` calls of ``operation`` whose key matches
    ``key_glob``. ``operation`` is an :class:`ObjectStore` method name, or ``"*"``."""

    operation: str
    error: Callable[[str], BaseException]
    key_glob: str = "*"
    times: int = 1
    hits: int = field(default=0, init=False)


@dataclass
class _Obj:
    data: bytes
    etag: str
    mtime: float
    storage_class: str | None = None  # None: STANDARD (as a HEAD says)
    restore_until: float | None = None  # when a restore asked for completes
    tags: dict[str, str] = field(default_factory=dict)


class MemoryStore:
    """A thread-safe :class:`~s3ckpt.store.base.ObjectStore` holding objects in a dict.

    Follows S3 semantics where s3ckpt relies on them: conditional puts, multipart uploads
    invisible until completed, ranged reads clipped at the object's end, deleting a
    missing key succeeds. ``inject`` arms faults; ``calls`` counts requests per operation.

    Args:
        bucket: The bucket name (informational).
        clock: Where object times come from.
        ignore_conditions: Accept ``If-None-Match`` / ``If-Match`` and ignore them, like
            s3rver: simulates a store without conditional writes.
        conditional_deletes: Support :meth:`delete_if_match` (else it answers 501
            ``NotImplemented``, as a store without conditional deletes).
        list_uploads: Support :meth:`list_multipart_uploads` (else 501 ``NotImplemented``).
        restore_seconds: How long after :meth:`restore_object` an archived object's
            temporary copy is readable (by ``clock``).
    """

    url_scheme = "memory"

    def __init__(
        self,
        bucket: str = "memory",
        *,
        clock: Callable[[], float] = time.time,
        ignore_conditions: bool = False,
        conditional_deletes: bool = True,
        list_uploads: bool = True,
        restore_seconds: float = 0.0,
    ) -> None:
        self.bucket = bucket
        self._clock = clock
        self._ignore_conditions = ignore_conditions
        self._conditional_deletes = conditional_deletes
        self._list_uploads = list_uploads
        self._restore_seconds = restore_seconds
        self._lock = threading.Lock()
        self.objects: dict[str, _Obj] = {}
        self.uploads: dict[str, tuple[str, dict[int, bytes], float]] = {}
        self.faults: list[Fault] = []
        self.calls: dict[str, int] = {}

    def now(self) -> float:
        """The store's clock (the one its objects' times come from), seconds since the epoch."""
        return self._clock()

    def inject(
        self,
        operation: str,
        error: Callable[[str], BaseException] | None = None,
        *,
        key_glob: str = "*",
        times: int = 1,
    ) -> Fault:
        """Arm a fault; by default a :class:`~s3ckpt.errors.StoreError` naming the key."""

        def default(key: str) -> BaseException:
            return StoreError(f"injected fault in {operation}", bucket=self.bucket, key=key)

        fault = Fault(operation, error or default, key_glob, times)
        with self._lock:
            self.faults.append(fault)
        return fault

    def _changed(self, key: str, what: str = "object changed") -> PreconditionFailedError:
        return PreconditionFailedError(what, bucket=self.bucket, key=key, code="PreconditionFailed")

    def _unsupported(self, operation: str, key: str, name: str) -> UnsupportedOperationError:
        return UnsupportedOperationError(
            f"{name} failed with NotImplemented (HTTP 501)",
            bucket=self.bucket,
            key=key,
            operation=operation,
            code="NotImplemented",
        )

    def _enter(self, operation: str, key: str) -> None:
        with self._lock:
            self.calls[operation] = self.calls.get(operation, 0) + 1
            armed = (f for f in self.faults if f.hits < f.times and f.operation in ("*", operation))
            if fault := next((f for f in armed if fnmatch.fnmatchcase(key, f.key_glob)), None):
                fault.hits += 1
                raise fault.error(key)

    def _store(
        self, key: str, data: bytes, if_none_match: bool, if_match: str | None = None
    ) -> str:
        with self._lock:
            if self._ignore_conditions:  # a store that accepts the headers and ignores them
                if_none_match, if_match = False, None
            if if_none_match and key in self.objects:
                raise self._changed(key, "object already exists")
            if if_match is not None and self._object(key).etag != if_match:
                raise self._changed(key)
            etag = '"' + hashlib.md5(data, usedforsecurity=False).hexdigest() + '"'
            self.objects[key] = _Obj(data, etag, self._clock())
            return etag

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
        self._enter("put", key)
        return self._store(key, bytes(data), if_none_match, if_match)

    def create_multipart(self, key: str) -> str:
        """See :meth:`ObjectStore.create_multipart`."""
        self._enter("create_multipart", key)
        upload_id = uuid.uuid4().hex
        with self._lock:
            self.uploads[upload_id] = (key, {}, self._clock())
        return upload_id

    def upload_part(
        self, key: str, upload_id: str, part_number: int, data: Buffer, *, crc32c: int | None = None
    ) -> CompletedPart:
        """See :meth:`ObjectStore.upload_part`."""
        self._enter("upload_part", key)
        payload = bytes(data)
        with self._lock:
            self._upload(key, upload_id)[part_number] = payload
        etag = hashlib.md5(payload, usedforsecurity=False).hexdigest()
        return CompletedPart(part_number, etag, None, len(payload))

    def complete_multipart(
        self,
        key: str,
        upload_id: str,
        parts: Sequence[CompletedPart],
        *,
        if_none_match: bool = False,
    ) -> str:
        """See :meth:`ObjectStore.complete_multipart`."""
        self._enter("complete_multipart", key)
        with self._lock:
            stored = self._upload(key, upload_id)
            numbers = sorted(p.part_number for p in parts)
            if missing := [n for n in numbers if n not in stored]:
                raise StoreError(
                    f"parts {missing} were never uploaded", bucket=self.bucket, key=key
                )
            data = b"".join(stored[n] for n in numbers)
        etag = self._store(key, data, if_none_match)
        with self._lock:
            self.uploads.pop(upload_id, None)
        return etag

    def _upload(self, key: str, upload_id: str) -> dict[int, bytes]:
        if upload_id not in self.uploads:
            raise ObjectNotFoundError("no such upload", bucket=self.bucket, key=key)
        return self.uploads[upload_id][1]

    def abort_multipart(self, key: str, upload_id: str) -> None:
        """See :meth:`ObjectStore.abort_multipart`."""
        self._enter("abort_multipart", key)
        with self._lock:
            self.uploads.pop(upload_id, None)

    def open_range(self, key: str, start: int = 0, length: int | None = None) -> io.BytesIO:
        """See :meth:`ObjectStore.open_range`."""
        data = self._readable(key).data
        return io.BytesIO(data[start : None if length is None else start + length])

    def get(self, key: str) -> bytes:
        """See :meth:`ObjectStore.get`."""
        return self._readable(key).data

    def head(self, key: str) -> ObjectInfo | None:
        """See :meth:`ObjectStore.head`."""
        self._enter("head", key)
        with self._lock:
            obj = self.objects.get(key)
        return None if obj is None else self._info(key, obj)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """See :meth:`ObjectStore.list`."""
        self._enter("list", prefix)
        with self._lock:
            items = sorted((k, o) for k, o in self.objects.items() if k.startswith(prefix))
        for k, o in items:
            yield ObjectInfo(k, len(o.data), o.etag, o.mtime, o.storage_class)

    def list_prefixes(
        self, prefix: str, delimiter: str = "/", *, start_after: str | None = None
    ) -> Iterator[str]:
        """See :meth:`ObjectStore.list_prefixes`."""
        yield from common_prefixes(self.list(prefix), prefix, delimiter, start_after)

    def delete(self, keys: Sequence[str]) -> DeleteFailures:
        """See :meth:`ObjectStore.delete`."""
        failures: DeleteFailures = []
        keys = list(keys)
        for i in range(0, len(keys), MAX_DELETE_BATCH):
            batch = keys[i : i + MAX_DELETE_BATCH]
            self._enter("delete", batch[0] if batch else "")
            for k in batch:
                try:
                    self._enter("delete_key", k)
                except StoreError as exc:
                    failures.append(DeleteFailure(k, exc.code or "InjectedFault", str(exc)))
                    continue
                with self._lock:
                    self.objects.pop(k, None)
        return failures

    def delete_if_match(self, key: str, etag: str) -> None:
        """See :meth:`ObjectStore.delete_if_match`; without ``conditional_deletes`` the
        store answers like one without them (``UnsupportedOperationError``), and with
        ``ignore_conditions`` it deletes whatever the ETag."""
        self._enter("delete_if_match", key)
        if not self._conditional_deletes:
            raise self._unsupported("delete", key, "delete_if_match")
        with self._lock:
            if self._object(key).etag != etag and not self._ignore_conditions:
                raise self._changed(key)
            del self.objects[key]

    def list_multipart_uploads(self, prefix: str) -> Iterator[UploadInfo]:
        """See :meth:`ObjectStore.list_multipart_uploads`."""
        self._enter("list_multipart_uploads", prefix)
        if not self._list_uploads:
            raise self._unsupported("list_multipart_uploads", prefix, "list_multipart_uploads")
        with self._lock:
            ups = [(uid, k, t) for uid, (k, _, t) in self.uploads.items() if k.startswith(prefix)]
        for uid, k, t in sorted(ups, key=lambda u: (u[1], u[0])):
            yield UploadInfo(k, uid, t)

    # -- storage classes -----------------------------------------------------------------------
    def _info(self, key: str, obj: _Obj) -> ObjectInfo:
        restore = None
        if obj.restore_until is not None:
            ongoing = "true" if self._clock() < obj.restore_until else "false"
            restore = f'ongoing-request="{ongoing}"'
        return ObjectInfo(key, len(obj.data), obj.etag, obj.mtime, obj.storage_class, restore)

    def _readable(self, key: str) -> _Obj:
        self._enter("get", key)
        with self._lock:
            obj = self._object(key)
        if restore_state(self._info(key, obj)) in (RestoreState.ARCHIVED, RestoreState.IN_PROGRESS):
            raise archived_error(
                bucket=self.bucket, key=key, storage_class=obj.storage_class, operation="get"
            )
        return obj

    def _object(self, key: str) -> _Obj:
        obj = self.objects.get(key)
        if obj is None:
            raise ObjectNotFoundError(
                "object not found", bucket=self.bucket, key=key, code="NoSuchKey"
            )
        return obj

    def set_storage_class(
        self, key: str, storage_class: str, *, etag: str | None = None, size: int | None = None
    ) -> ObjectInfo:
        """See :meth:`ArchiveStore.set_storage_class`: the object keeps its bytes and ETag;
        an archived one being restored loses its temporary copy (as a copy on S3 does)."""
        self._enter("set_storage_class", key)
        with self._lock:
            obj = self._object(key)
            if etag is not None and obj.etag != etag and not self._ignore_conditions:
                raise self._changed(key)
            if not same_class(obj.storage_class, storage_class):
                obj.storage_class = None if storage_class == "STANDARD" else storage_class
                obj.restore_until = None
                obj.mtime = self._clock()
            return self._info(key, obj)

    def put_object_tags(self, key: str, tags: Mapping[str, str]) -> None:
        """See :meth:`ArchiveStore.put_object_tags`."""
        self._enter("put_object_tags", key)
        with self._lock:
            self._object(key).tags = dict(tags)

    def restore_object(self, key: str, *, days: int, tier: str = "Standard") -> RestoreState:
        """See :meth:`ArchiveStore.restore_object`: the copy is readable ``restore_seconds``
        after the first request."""
        check_restore_args(days, tier)
        self._enter("restore", key)
        with self._lock:
            obj = self._object(key)
            state = restore_state(self._info(key, obj))  # not archived, in progress or restored
            if state is RestoreState.ARCHIVED:  # no restore asked for yet
                obj.restore_until = self._clock() + self._restore_seconds
                return RestoreState.STARTED
            return state

    def __getstate__(self) -> dict[str, object]:
        raise TypeError(
            "MemoryStore lives in one process and cannot be pickled; use S3Store (or an "
            "fsspec URL) for multi-process saves"
        )
