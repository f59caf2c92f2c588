"""The storage seam: :class:`ObjectStore` and its implementations.

* :class:`S3Store` — S3 and S3-compatible stores through boto3 (the only boto3 user).
* :class:`FsspecStore` — any other fsspec URL (``gs://``, ``az://``, ``file://``, ``memory://``).
* :class:`MemoryStore` — in-process, with fault injection, for tests.

:func:`retrying` builds the one retry policy (tenacity) from a :class:`TransferConfig`;
:data:`TRANSIENT_CODES` are the S3 error codes it is worth retrying on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.store._bucket import create_bucket
from s3ckpt.store._capabilities import (
    Capabilities,
    cached_capabilities,
    is_unsupported,
    list_open_uploads,
    lists_uploads,
    probe_capabilities,
    require_conditional_writes,
)
from s3ckpt.store._clock import StoreTime, check_skew, skew_note, store_time
from s3ckpt.store._counting import CountingStore
from s3ckpt.store._location import AtLocation, Location, LocationLike
from s3ckpt.store._versions import (
    Noncurrent,
    VersionedStore,
    Versions,
    bucket_versioning,
    noncurrent_versions,
)
from s3ckpt.store.base import (
    CompletedPart,
    DeleteFailure,
    ObjectInfo,
    ObjectStore,
    RangeReader,
    UploadInfo,
)
from s3ckpt.store.memory import MemoryStore
from s3ckpt.store.retry import TRANSIENT_CODES, retrying
from s3ckpt.uri import StoreURL

if TYPE_CHECKING:
    from s3ckpt.store.fsspec_store import FsspecStore
    from s3ckpt.store.s3 import S3Store

__all__ = [
    "AtLocation",
    "Capabilities",
    "CompletedPart",
    "CountingStore",
    "DeleteFailure",
    "FsspecStore",
    "Location",
    "LocationLike",
    "MemoryStore",
    "Noncurrent",
    "ObjectInfo",
    "ObjectStore",
    "RangeReader",
    "S3Store",
    "TRANSIENT_CODES",
    "UploadInfo",
    "VersionedStore",
    "Versions",
    "bucket_versioning",
    "cached_capabilities",
    "create_bucket",
    "is_unsupported",
    "list_open_uploads",
    "lists_uploads",
    "noncurrent_versions",
    "require_conditional_writes",
    "StoreTime",
    "check_skew",
    "open_store",
    "probe_capabilities",
    "retrying",
    "skew_note",
    "store_time",
]


def open_store(
    url: str | StoreURL,
    *,
    s3_config: S3Config | None = None,
    transfer_config: TransferConfig | None = None,
    storage_options: dict[str, Any] | None = None,
) -> tuple[ObjectStore, StoreURL]:
    """The store for ``url`` (the process's shared one for these settings) and the parsed
    URL: :meth:`Location.of` as a pair."""
    loc = Location.of(
        url,
        s3_config=s3_config,
        transfer_config=transfer_config,
        storage_options=storage_options,
    )
    return loc.store, loc.url


def __getattr__(name: str) -> Any:
    # boto3 and fsspec are imported only when their store is used.
    if name == "S3Store":
        from s3ckpt.store.s3 import S3Store

        return S3Store
    if name == "FsspecStore":
        from s3ckpt.store.fsspec_store import FsspecStore

        return FsspecStore
    raise AttributeError(name)
