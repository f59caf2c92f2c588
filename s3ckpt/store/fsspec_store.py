"""FsspecStore: any fsspec URL that is not ``s3://`` (``gs://``, ``az://``, ``file://``,
``memory://`` ...).

Multipart uploads are streamed into one open fsspec file: parts may arrive out of order
(they are uploaded in parallel), so early ones wait in memory until their turn; the
writer's in-flight bound caps that at ``TransferConfig.max_inflight_bytes``. Every change
of a key goes through the backend's committer (:mod:`s3ckpt.store._fsspec_commit`), which
makes conditional puts and deletes atomic with the backend's own primitive (``file://``,
``memory://``, ``az://``, ``gs://``) and says which conditions it enforces
(:attr:`FsspecStore.enforces`); elsewhere they are a check-then-write that the capability
probe reports as ignored, so saves are refused unless single-writer mode is chosen.
Storage classes, tags and restores are S3's: this store is no
:class:`~s3ckpt.store.base.ArchiveStore`, so the tiers and restore refuse it with a
``ConfigError`` naming the URL.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import fsspec

from s3ckpt.errors import (
    AccessDeniedError,
    ObjectNotFoundError,
    PreconditionFailedError,
    StoreError,
    UnsupportedOperationError,
)
from s3ckpt.store._fsspec_commit import Committer, Conflict, committer_for, md5_etag
from s3ckpt.store.base import (
    Buffer,
    CompletedPart,
    DeleteFailure,
    DeleteFailures,
    ObjectInfo,
    UploadInfo,
    common_prefixes,
)

__all__ = ["FsspecStore"]


_MAPPED: dict[type[BaseException], tuple[type[StoreError], str]] = {
    Conflict: (
        PreconditionFailedError,
        "the condition did not hold (another writer changed the object)",
    ),
    NotImplementedError: (
        UnsupportedOperationError,
        "{exc} is not supported by this store; s3ckpt never sends it",
    ),
    FileNotFoundError: (ObjectNotFoundError, "not found"),
    PermissionError: (AccessDeniedError, "permission denied; check credentials and permissions"),
}


def _map(exc: BaseException, operation: str, bucket: str, key: str) -> StoreError:
    if isinstance(exc, StoreError):
        return exc
    cls, text = StoreError, f"{operation} failed: {type(exc).__name__}: {exc}"
    for kind, (mapped, template) in _MAPPED.items():
        if isinstance(exc, kind):
            cls, text = mapped, f"{operation}: " + template.format(exc=exc)
            break
    return cls(text, bucket=bucket, key=key, operation=operation)


@dataclass
class _Upload:
    handle: Any
    key: str
    tmp: str
    next_part: int = 1
    pending: dict[int, bytes] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


class FsspecStore:
    """:class:`~s3ckpt.store.base.ObjectStore` over an fsspec filesystem.

    Args:
        protocol: The fsspec protocol (``gs``, ``file``, ``memory`` ...).
        bucket: The bucket / container / root folder; keys are joined below it.
        storage_options: Passed to ``fsspec.filesystem``.
    """

    def __init__(self, protocol: str, bucket: str, **storage_options: Any) -> None:
        self.url_scheme = protocol
        self.bucket = bucket
        self._options = storage_options
        self._uploads: dict[str, _Upload] = {}
        self._lock = threading.Lock()

    @functools.cached_property
    def fs(self) -> Any:
        """The fsspec filesystem (created lazily per process)."""
        return fsspec.filesystem(self.url_scheme, **self._options)

    @functools.cached_property
    def committer(self) -> Committer:
        """How this backend changes a key (:mod:`s3ckpt.store._fsspec_commit`)."""
        return committer_for(self.url_scheme, self.fs)

    @property
    def enforces(self) -> frozenset[str]:
        """The conditions this backend enforces atomically (``create``, ``replace``,
        ``delete``): what the capability probe may report, whatever its requests saw."""
        return self.committer.enforces

    def __reduce__(self) -> tuple[Any, ...]:
        return functools.partial(FsspecStore, self.url_scheme, self.bucket, **self._options), ()

    @contextlib.contextmanager
    def _mapped(self, operation: str, key: str) -> Iterator[None]:
        """Raise what the block raises as the store error it means (:func:`_map`)."""
        try:
            yield
        except Exception as exc:
            raise _map(exc, operation, self.bucket, key) from exc

    def _path(self, key: str) -> str:
        if self.url_scheme == "file":
            return "/" + key.lstrip("/")
        return f"{self.bucket}/{key}" if self.bucket else key

    def _key(self, path: str) -> str:
        root = "" if self.url_scheme == "file" or not self.bucket else self.bucket + "/"
        return path.lstrip("/").removeprefix(root)  # (a local path, or memory://'s root marker)

    def _makedirs(self, key: str) -> None:
        if self.url_scheme == "file":
            parent = self._path(key).rsplit("/", 1)[0]
            self.fs.makedirs(parent, exist_ok=True)

    def put(
        self,
        key: str,
        data: Buffer,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
        crc32c: int | None = None,
    ) -> str:
        """See :meth:`ObjectStore.put`. Conditional puts return (and ``if_match`` compares)
        the backend's ETag (Azure's; the generation on GCS; else the quoted MD5 of the
        content), atomically where :attr:`enforces` says so."""
        with self._mapped("put", key):
            self._makedirs(key)
            etag = self.committer.write(
                self._path(key), bytes(data), if_none_match=if_none_match, if_match=if_match
            )
        return etag if if_none_match or if_match is not None else ""

    def create_multipart(self, key: str) -> str:
        """See :meth:`ObjectStore.create_multipart`."""
        with self._mapped("create_multipart", key):
            self._makedirs(key)
            upload_id = uuid.uuid4().hex
            tmp = f"{self._path(key)}.{upload_id}.s3ckpt-partial"
            handle = self.fs.open(tmp, "wb")
        with self._lock:
            self._uploads[upload_id] = _Upload(handle, key, tmp)
        return upload_id

    def _upload(self, upload_id: str, key: str) -> _Upload:
        with self._lock:
            up = self._uploads.get(upload_id)
        if up is None:
            raise ObjectNotFoundError("no such upload", bucket=self.bucket, key=key)
        return up

    def upload_part(
        self, key: str, upload_id: str, part_number: int, data: Buffer, *, crc32c: int | None = None
    ) -> CompletedPart:
        """See :meth:`ObjectStore.upload_part`."""
        up = self._upload(upload_id, key)
        with up.lock, self._mapped("upload_part", key):
            up.pending[part_number] = bytes(data)
            while up.next_part in up.pending:
                up.handle.write(up.pending.pop(up.next_part))
                up.next_part += 1
        return CompletedPart(part_number, f"part-{part_number}", None, len(data))

    def complete_multipart(
        self,
        key: str,
        upload_id: str,
        parts: Sequence[CompletedPart],
        *,
        if_none_match: bool = False,
    ) -> str:
        """See :meth:`ObjectStore.complete_multipart`."""
        up = self._upload(upload_id, key)
        try:
            with up.lock:
                if up.pending:
                    raise StoreError(
                        f"parts {sorted(up.pending)} arrived without their predecessors",
                        bucket=self.bucket,
                        key=key,
                    )
                up.handle.close()
            self.committer.commit_file(up.tmp, self._path(key), if_none_match=if_none_match)
        except Exception as exc:
            self.abort_multipart(key, upload_id)
            raise _map(exc, "complete_multipart", self.bucket, key) from exc
        with self._lock:
            self._uploads.pop(upload_id, None)
        return ""

    def abort_multipart(self, key: str, upload_id: str) -> None:
        """See :meth:`ObjectStore.abort_multipart`."""
        with self._lock:
            up = self._uploads.pop(upload_id, None)
        if up is None:
            return
        with contextlib.suppress(Exception):  # the file is being discarded anyway
            up.handle.close()
        with self._mapped("abort_multipart", key), contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(up.tmp)

    def open_range(self, key: str, start: int = 0, length: int | None = None) -> _FsspecRange:
        """See :meth:`ObjectStore.open_range`."""
        with self._mapped("get", key):
            handle = self.fs.open(self._path(key), "rb")
            handle.seek(start)
        return _FsspecRange(handle, length)

    def get(self, key: str) -> bytes:
        """See :meth:`ObjectStore.get`."""
        with self._mapped("get", key):
            return bytes(self.fs.cat_file(self._path(key)))

    def head(self, key: str) -> ObjectInfo | None:
        """See :meth:`ObjectStore.head`."""
        try:
            with self._mapped("head", key):
                info = self.fs.info(self._path(key))
                if info.get("type") == "directory":
                    return None
                size = int(info.get("size") or 0)
                etag = self.committer.etag(info)
                if etag is None and size <= _HEAD_MD5_LIMIT:
                    # No ETag of its own (a local file): the quoted MD5 that a conditional
                    # put returns and compares, so a head-then-conditional-put (a lease
                    # takeover) and the conditional puts after it agree.
                    etag = md5_etag(self.fs.cat_file(self._path(key)))
        except ObjectNotFoundError:  # (FileNotFoundError, mapped)
            return None
        return ObjectInfo(key, size, etag, _mtime(info))

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """See :meth:`ObjectStore.list`."""
        base = self._path(prefix)
        root = base if base.endswith("/") else base.rsplit("/", 1)[0]
        with self._mapped("list", prefix):
            found = self.fs.find(root, detail=True) if self.fs.exists(root) else {}
        for path, info in sorted(found.items()):
            key = self._key(path)
            if key.startswith(prefix) and not key.endswith(".s3ckpt-partial"):
                etag = self.committer.etag(info)
                yield ObjectInfo(key, int(info.get("size") or 0), etag, _mtime(info))

    def list_prefixes(
        self, prefix: str, delimiter: str = "/", *, start_after: str | None = None
    ) -> Iterator[str]:
        """See :meth:`ObjectStore.list_prefixes` (filtered here: fsspec lists everything)."""
        yield from common_prefixes(self.list(prefix), prefix, delimiter, start_after)

    def delete(self, keys: Sequence[str]) -> DeleteFailures:
        """See :meth:`ObjectStore.delete`."""
        failures: DeleteFailures = []
        for key in keys:
            try:
                with contextlib.suppress(FileNotFoundError):  # gone already: deleted
                    self.committer.delete(self._path(key))
            except Exception as exc:
                failures.append(DeleteFailure(key, type(exc).__name__, str(exc)))
        return failures

    def delete_if_match(self, key: str, etag: str) -> None:
        """See :meth:`ObjectStore.delete_if_match`. Compares the ETag :meth:`put` returns,
        atomically where :attr:`enforces` says so."""
        with self._mapped("delete", key):
            self.committer.delete_if_match(self._path(key), etag)

    def list_multipart_uploads(self, prefix: str) -> Iterator[UploadInfo]:
        """Uploads open in this process (fsspec has no server-side multipart state)."""
        with self._lock:
            ups = [UploadInfo(up.key, uid, None) for uid, up in self._uploads.items()]
        yield from (u for u in ups if u.key.startswith(prefix))


#: Objects up to this size without an ETag of their own get the MD5 one from :meth:`head` (control
#: objects: leases, markers, pins); a larger one has none, so a HEAD never costs the read of a data
#: object.
_HEAD_MD5_LIMIT = 1 << 20


def _mtime(info: dict[str, Any]) -> float | None:
    value: Any = info.get("mtime") or info.get("LastModified") or info.get("created")
    if hasattr(value, "timestamp"):
        return float(value.timestamp())
    with contextlib.suppress(TypeError, ValueError):  # none, or not a time
        return float(value)
    return None


class _FsspecRange:
    def __init__(self, handle: Any, length: int | None) -> None:
        self._handle = handle
        self._left = sys.maxsize if length is None else length

    def readinto(self, buffer: memoryview) -> int:
        data = self._handle.read(min(len(buffer), self._left))  # b"" at the end
        buffer[: len(data)] = data
        self._left -= len(data)
        return len(data)

    def close(self) -> None:
        self._handle.close()
