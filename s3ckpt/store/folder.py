"""Folder-at-a-time reads for a retention scan: one delimited listing of a prefix, and one
GET that returns an object's bytes with its LastModified.

A shallow retention scan (:mod:`s3ckpt.retention._shallow`) walks a bucket one "folder" at a
time instead of listing every key, and reads each commit marker with the store's time it was
written. :class:`~s3ckpt.store.ObjectStore` has neither request: on an
:class:`~s3ckpt.store.s3.S3Store` (or a store wrapping one, such as the CLI's counting
store) these functions send ``ListObjectsV2`` with ``Delimiter="/"`` and one ``GetObject``
through the store's own retry policy and request accounting (``_call``); on any other
store they fall back to the protocol's requests (a full listing of the prefix, filtered;
GET then HEAD), which give the same answers at the old cost. Decisions: kept out of
``store/s3.py`` (its size), and duck-typed rather than added to the protocol, so the
stores and test doubles that implement :class:`~s3ckpt.store.ObjectStore` need nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from s3ckpt.errors import ObjectNotFoundError
from s3ckpt.store import _reply
from s3ckpt.store.base import ObjectInfo, ObjectStore, common_prefixes

__all__ = ["get_info", "list_folder"]


def _s3(store: ObjectStore) -> Any:
    """The :class:`~s3ckpt.store.s3.S3Store` ``store`` is or wraps (duck-typed: that module
    imports the capability probe, which lists through this one), else None."""
    inner: Any = store
    for _ in range(4):  # a wrapper (CountingStore) keeps its store as ``wrapped``
        if getattr(inner, "url_scheme", None) == "s3" and hasattr(inner, "_paginate"):
            return inner
        inner = getattr(inner, "wrapped", None)  # None once there is no wrapper: no match
    return None


def list_folder(store: ObjectStore, prefix: str) -> Iterator[ObjectInfo | str]:
    """The objects directly under ``prefix`` (:class:`ObjectInfo`) and its immediate
    sub-folders (``str``, ending in ``/``). On S3: ``ceil((objects + folders) / 1000)``
    LIST requests with ``Delimiter="/"``; elsewhere one full listing of the prefix."""
    s3 = _s3(store)
    if s3 is None:
        listed = list(store.list(prefix))
        yield from (o for o in listed if "/" not in o.key[len(prefix) :])
        yield from common_prefixes(listed, prefix)
        return
    for page in s3._paginate("list_objects_v2", prefix, Delimiter="/"):
        yield from map(_reply.listed_object, page.get("Contents") or [])
        yield from (str(cp["Prefix"]) for cp in page.get("CommonPrefixes") or [])


def get_info(store: ObjectStore, key: str, max_bytes: int) -> tuple[bytes | None, ObjectInfo]:
    """``key``'s bytes (None when it is larger than ``max_bytes``: not read) and its size,
    ETag and LastModified. On S3 one GET; elsewhere a HEAD, then a GET.

    Raises:
        ObjectNotFoundError: No such object.
    """
    s3 = _s3(store)
    if s3 is None:
        info = store.head(key)
        if info is None:
            raise ObjectNotFoundError("object not found", bucket=store.bucket, key=key)
        return (None if info.size > max_bytes else store.get(key)), info

    def read(resp: Any) -> tuple[bytes | None, ObjectInfo]:
        size = int(resp.get("ContentLength", 0))
        body = None if size > max_bytes else bytes(resp["Body"].read())
        if body is None:
            resp["Body"].close()
        lm = resp.get("LastModified")
        return body, ObjectInfo(key, size, resp.get("ETag"), lm.timestamp() if lm else None)

    return s3._get(key, read)
