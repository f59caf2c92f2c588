"""The storage seam: :class:`ObjectStore` and its implementations.

* :class:`S3Store` — S3 and S3-compatible stores through boto3 (the only boto3 user).
* :class:`FsspecStore` — any other fsspec URL (``gs://``, ``az://``, ``file://``, ``memory://``).
* :class:`MemoryStore` — in-process, with fault injection, for tests.

Every store is an :class:`ObjectStore` (what saves, loads, commits and retention need);
storage classes, tags and restores are the separate :class:`~s3ckpt.store.base.ArchiveStore`
(S3 and memory). Retries follow one policy (:class:`~s3ckpt.store.retry.RetryPolicy`, a
fresh tenacity ``Retrying`` per call). What a store enforces is probed once
(:func:`probe_capabilities`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.store._bucket import create_bucket
from s3ckpt.store._capabilities import probe_capabilities
from s3ckpt.store._counting import CountingStore
from s3ckpt.store._known import Capabilities
from s3ckpt.store._location import Location
from s3ckpt.store.base import ArchiveStore, ObjectInfo, ObjectStore
from s3ckpt.store.memory import MemoryStore
from s3ckpt.uri import StoreURL

if TYPE_CHECKING:
    from s3ckpt.store.fsspec_store import FsspecStore
    from s3ckpt.store.s3 import S3Store

__all__ = [
    "ObjectStore",
    "ArchiveStore",
    "S3Store",
    "FsspecStore",
    "MemoryStore",
    "CountingStore",
    "Location",
    "ObjectInfo",
    "Capabilities",
    "open_store",
    "create_bucket",
    "probe_capabilities",
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
        url, s3_config=s3_config, transfer_config=transfer_config, storage_options=storage_options
    )
    return loc.store, loc.url


# boto3 and fsspec are imported only when their store is used.
_LAZY = {"S3Store": "s3ckpt.store.s3", "FsspecStore": "s3ckpt.store.fsspec_store"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(name)
    return getattr(importlib.import_module(_LAZY[name]), name)
