"""The storage seam: every byte s3ckpt moves passes through an :class:`ObjectStore`.

Why this shape: it is the smallest set of object-store verbs that lets a checkpoint be
streamed (multipart with parallel parts), committed atomically (conditional put), read
back in parallel (ranged GETs into a caller's buffer), listed cheaply (paged, with a
delimiter) and pruned safely (batched deletes reporting per-key errors). S3, GCS, Azure
and a dict in memory can all provide it, so the layers above never see boto3.

Call sequence of a multipart upload::

    upload_id = store.create_multipart(key)
    parts = [store.upload_part(key, upload_id, n, data) for n, data in ...]  # any order, parallel
    store.complete_multipart(key, upload_id, parts)      # or abort_multipart on any failure

Storage classes are a separate protocol, :class:`ArchiveStore` (S3 and the memory store;
:func:`archive_store` refuses others with a ``ConfigError``): an object moves to another
class in place (:meth:`ArchiveStore.set_storage_class`), is tagged for a lifecycle rule
(:meth:`ArchiveStore.put_object_tags`), and one in an archive class
(:data:`ARCHIVE_CLASSES`) is read only after :meth:`ArchiveStore.restore_object` made a
temporary copy (:func:`restore_state` reads a HEAD's answer).

Implementations must be picklable and safe to use from many threads.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.errors import ConfigError, ObjectNotFoundError
from s3ckpt.metrics.instrument import expecting
from s3ckpt.store.retry import RetryPolicy

__all__ = [
    "ARCHIVE_CLASSES",
    "ArchiveStore",
    "Buffer",
    "CompletedPart",
    "DeleteFailure",
    "DeleteFailures",
    "ObjectInfo",
    "ObjectStore",
    "RangeReader",
    "RestoreState",
    "S3Requests",
    "UploadInfo",
    "MAX_DELETE_BATCH",
    "RESTORE_TIERS",
    "archive_store",
    "check_restore_args",
    "common_prefixes",
    "restore_state",
]

Buffer = bytes | bytearray | memoryview
T = TypeVar("T")

#: S3's DeleteObjects accepts at most 1000 keys per request.
MAX_DELETE_BATCH = 1000


@dataclass(frozen=True)
class ObjectInfo:
    """One listed or HEADed object."""

    key: str
    size: int
    etag: str | None = None
    #: Seconds since the epoch (UTC).
    last_modified: float | None = None
    #: The S3 storage class a listing reports (``STANDARD``, ``STANDARD_IA``, ``GLACIER``, ...), or
    #: None where the store does not say (S3 leaves it out for some objects; other stores have
    #: none). None bills as ``STANDARD``. A HEAD fills it from ``x-amz-storage-class``, which S3
    #: leaves out for ``STANDARD``.
    storage_class: str | None = None
    #: A HEAD's raw ``x-amz-restore`` header (``ongoing-request="false", expiry-date="..."``) for an
    #: archived object a restore was asked for; None otherwise (and in listings).
    #: :func:`restore_state` reads it.
    restore: str | None = None


#: The storage classes whose objects S3 keeps offline: a GET fails (403 ``InvalidObjectState``)
#: until a restore made a temporary copy. ``GLACIER_IR`` is not one (it reads at once, at a
#: retrieval fee).
ARCHIVE_CLASSES = frozenset({"GLACIER", "DEEP_ARCHIVE"})


class RestoreState(str, enum.Enum):
    """Where an object stands with its restore: what
    :meth:`ArchiveStore.restore_object` answers, and :func:`restore_state` reads from a HEAD.
    """

    #: A restore was asked for now (S3 answered 202).
    STARTED = "started"
    #: A restore asked for earlier is still running (409 ``RestoreAlreadyInProgress``, or a HEAD's
    #: ``ongoing-request="true"``).
    IN_PROGRESS = "in_progress"
    #: A temporary copy is readable (200, or ``ongoing-request="false"``).
    RESTORED = "restored"
    #: The object is in no archive class: nothing to restore, it reads at once.
    NOT_ARCHIVED = "not_archived"
    #: Archived and no restore asked for (a HEAD only; ``restore_object`` never answers this).
    ARCHIVED = "archived"


def restore_state(info: ObjectInfo) -> RestoreState:
    """``info``'s state from its storage class and ``x-amz-restore`` header (a HEAD's)."""
    if (info.storage_class or "STANDARD") not in ARCHIVE_CLASSES:
        return RestoreState.NOT_ARCHIVED
    if info.restore is None:
        return RestoreState.ARCHIVED
    if 'ongoing-request="true"' in info.restore:
        return RestoreState.IN_PROGRESS
    return RestoreState.RESTORED


#: The retrieval tiers RestoreObject takes (fastest and dearest last).
RESTORE_TIERS = ("Standard", "Bulk", "Expedited")


def check_restore_args(days: int, tier: str) -> None:
    """Refuse a restore's ``days`` below 1 or a ``tier`` S3 does not name
    (:class:`~s3ckpt.errors.ConfigError`), before any request."""
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise ConfigError(f"restore days must be an integer >= 1, got {days!r}")
    if tier not in RESTORE_TIERS:
        raise ConfigError(f"restore tier must be one of {', '.join(RESTORE_TIERS)}, got {tier!r}")


def common_prefixes(
    listed: Iterable[ObjectInfo], prefix: str, delimiter: str = "/", start_after: str | None = None
) -> list[str]:
    """The sorted "sub-folders" of ``prefix`` among the ``listed`` objects (all under it),
    as S3's ``CommonPrefixes``: for stores whose listings hold every key."""
    rests = (o.key[len(prefix) :] for o in listed)
    seen = {prefix + r.split(delimiter, 1)[0] + delimiter for r in rests if delimiter in r}
    return sorted(p for p in seen if start_after is None or p > start_after)


def if_found(request: Callable[[], T]) -> T | None:
    """``request()``, or None where it answered 404 (counted as that expected answer)."""
    with expecting("not_found"), contextlib.suppress(ObjectNotFoundError):
        return request()
    return None


@dataclass(frozen=True)
class CompletedPart:
    """One uploaded part, as :meth:`ObjectStore.complete_multipart` needs it."""

    part_number: int
    etag: str
    #: Base64 CRC32C the store acknowledged, when checksums are on.
    checksum_crc32c: str | None = None
    size: int = 0


@dataclass(frozen=True)
class UploadInfo:
    """An open (incomplete) multipart upload."""

    key: str
    upload_id: str
    initiated: float | None = None


@dataclass(frozen=True)
class DeleteFailure:
    """A key a batched delete could not remove, with the store's code and message."""

    key: str
    code: str
    message: str


#: What :meth:`ObjectStore.delete` returns (an alias: ``list`` is shadowed in store classes).
DeleteFailures = list[DeleteFailure]


@runtime_checkable
class RangeReader(Protocol):
    """A byte range of an object being streamed; ``readinto`` returns 0 at the end."""

    def readinto(self, buffer: memoryview) -> int: ...

    def close(self) -> None: ...


@runtime_checkable
class ObjectStore(Protocol):
    """What s3ckpt needs from an object store. Keys are full keys within ``bucket``."""

    @property
    def bucket(self) -> str: ...

    @property
    def url_scheme(self) -> str:
        """``s3`` for S3 stores, the fsspec protocol otherwise (used in messages)."""
        ...

    def put(
        self,
        key: str,
        data: Buffer,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
        crc32c: int | None = None,
    ) -> str:
        """Upload ``data`` in one request and return its ETag.

        Args:
            if_none_match: Fail with :class:`~s3ckpt.errors.PreconditionFailedError`
                if the key already exists (S3 ``If-None-Match: *``).
            if_match: Replace the object only if its current ETag is this one (S3
                ``If-Match``): a compare-and-swap, as the retention lease needs. Fails with
                :class:`~s3ckpt.errors.PreconditionFailedError` if the ETag differs and
                :class:`~s3ckpt.errors.ObjectNotFoundError` if the key is gone.
            crc32c: CRC32C of ``data`` if the caller has it (else computed when needed).
        """
        ...

    def create_multipart(self, key: str) -> str:
        """Start a multipart upload and return its upload id."""
        ...

    def upload_part(
        self, key: str, upload_id: str, part_number: int, data: Buffer, *, crc32c: int | None = None
    ) -> CompletedPart:
        """Upload part ``part_number`` (1-based) of ``upload_id``."""
        ...

    def complete_multipart(
        self,
        key: str,
        upload_id: str,
        parts: Sequence[CompletedPart],
        *,
        if_none_match: bool = False,
    ) -> str:
        """Assemble the parts (sorted by number) into the object; return its ETag."""
        ...

    def abort_multipart(self, key: str, upload_id: str) -> None:
        """Abort an upload, discarding its parts. Aborting an unknown upload is not an error."""
        ...

    def open_range(self, key: str, start: int = 0, length: int | None = None) -> RangeReader:
        """Stream ``length`` bytes (``None``: to the end) of ``key`` from ``start``.

        Transient failures mid-body are retried by resuming at the current offset, so the
        caller sees each byte exactly once. Fewer bytes than asked means the object is
        shorter than expected; the caller decides whether that is corruption.
        """
        ...

    def get(self, key: str) -> bytes:
        """Whole object as bytes (for small objects: manifests, metadata)."""
        ...

    def head(self, key: str) -> ObjectInfo | None:
        """Size and ETag of ``key``, or ``None`` if it does not exist."""
        ...

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every object under ``prefix``, paged (one request per 1000 keys on S3)."""
        ...

    def list_prefixes(
        self, prefix: str, delimiter: str = "/", *, start_after: str | None = None
    ) -> Iterator[str]:
        """The immediate "sub-folders" under ``prefix`` (S3 common prefixes), sorted.

        Args:
            start_after: Yield only prefixes that sort strictly after this string (a full
                key or prefix, e.g. ``run/step-00000100/``). On S3 the keys up to it are
                skipped server-side (``StartAfter``), so checking for anything newer than a
                known name costs one request however much sorts before it.
        """
        ...

    def delete(self, keys: Sequence[str]) -> DeleteFailures:
        """Delete ``keys`` in batches of at most 1000; return the keys that failed.

        A key that does not exist counts as deleted (S3 semantics).
        """
        ...

    def delete_if_match(self, key: str, etag: str) -> None:
        """Delete ``key`` only if its current ETag is ``etag`` (S3 ``DeleteObject`` with
        ``If-Match``): how rm and prune remove a commit marker an overwrite may be replacing.

        Raises:
            PreconditionFailedError: The object has another ETag (it changed).
            ObjectNotFoundError: The object does not exist (deleted already).
            UnsupportedOperationError: The store has no conditional deletes (the caller
                falls back; see :mod:`s3ckpt.store._capabilities`).
        """
        ...

    def list_multipart_uploads(self, prefix: str) -> Iterator[UploadInfo]:
        """Open multipart uploads under ``prefix``."""
        ...


@runtime_checkable
class ArchiveStore(ObjectStore, Protocol):
    """A store with storage classes (S3): the archive operations the tiers and ``s3ckpt
    restore`` use, apart from the core :class:`ObjectStore` every store has. A store
    without them is refused by :func:`archive_store`."""

    def set_storage_class(
        self, key: str, storage_class: str, *, etag: str | None = None, size: int | None = None
    ) -> ObjectInfo:
        """Move ``key`` to ``storage_class`` in place and return its HEAD afterwards.

        On S3 a CopyObject onto itself (metadata, tags and the object's CRC32C kept), or,
        above :data:`s3ckpt.store._archive.COPY_PART_LIMIT` (5 GiB), a multipart copy
        (CreateMultipartUpload with the class, UploadPartCopy ranges, Complete). An object
        already in the class is left alone (one HEAD). A lost reply is decided by reading
        back: a HEAD that finds the object in the class with the same size is success.

        Args:
            etag: Move only if the object is still this version (``CopySourceIfMatch``).
            size: The object's size, when the caller has it (else one HEAD first).

        Raises:
            PreconditionFailedError: ``etag`` is given and the object changed.
            ObjectNotFoundError: The object does not exist.
        """
        ...

    def put_object_tags(self, key: str, tags: Mapping[str, str]) -> None:
        """Replace ``key``'s tag set with ``tags`` (S3 ``PutObjectTagging``): how a
        lifecycle rule on a tag is told to move an object.
        """
        ...

    def restore_object(self, key: str, *, days: int, tier: str = "Standard") -> RestoreState:
        """Ask for a temporary copy of an archived object for ``days`` days (S3
        ``RestoreObject``; ``tier``: ``Standard``, ``Bulk`` or ``Expedited``).

        Returns ``STARTED``, ``IN_PROGRESS``, ``RESTORED`` (a copy is readable; asking
        again extended it) or ``NOT_ARCHIVED`` (nothing to restore).
        """
        ...


def archive_store(store: ObjectStore, key: str, operation: str) -> ArchiveStore:
    """``store`` as an :class:`ArchiveStore`, else the :class:`~s3ckpt.errors.ConfigError`
    of a store without storage classes (fsspec URLs), naming the URL."""
    if isinstance(store, ArchiveStore):
        return store
    raise ConfigError(
        f"{operation} {store.url_scheme}://{store.bucket}/{key}: storage classes are an S3 "
        "feature; this store has none"
    )


class S3Requests(Protocol):
    """What the S3 store's helpers (:mod:`~s3ckpt.store._archive`,
    :mod:`~s3ckpt.store._versions`, :mod:`~s3ckpt.store._body`) need of
    :class:`~s3ckpt.store.s3.S3Store` (named here: s3.py imports them)."""

    s3_config: S3Config
    transfer_config: TransferConfig
    retry_policy: RetryPolicy
    bucket: str

    @property
    def client(self) -> Any: ...

    @property
    def endpoint_url(self) -> str | None: ...

    def _call(self, operation: str, key: str | None, fn: Callable[[], T]) -> T: ...

    def _call_counted(
        self, operation: str, key: str | None, fn: Callable[[], T]
    ) -> tuple[T, int]: ...

    def _get_object(self, key: str, first: int, last: int | None) -> Any: ...

    def _paginate(self, operation: str, prefix: str, **kwargs: Any) -> Iterator[dict[str, Any]]: ...

    def head(self, key: str) -> ObjectInfo | None: ...

    def abort_multipart(self, key: str, upload_id: str) -> None: ...
