"""A store that counts what it lists, reads and deletes: :class:`CountingStore`.

The CLI's progress line (``s3ckpt ls | prune | gc`` on a terminal) counts the objects a
command lists, reads and deletes and the uploads it lists and aborts. The decorator restates
only the seven calls it counts; every other public attribute (``put``, ``head``, ``bucket``,
``endpoint_url``, ``s3_config``, a store's clock ...) is the wrapped store's own, by
delegation, so a member added to :class:`~s3ckpt.store.ObjectStore` needs nothing here.
Private attributes are not delegated: code that reaches for one (the capability probe's
``_call``) sees a plain store, as it would any other wrapper.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from s3ckpt.store.base import DeleteFailures, ObjectInfo, ObjectStore, RangeReader, UploadInfo

__all__ = ["CountingStore"]


class CountingStore:
    """``store``, with what it lists, reads and deletes counted through ``count``.

    Args:
        store: The store to wrap.
        count: Called with ``(what, n)`` after each counted call (``ProgressCounter.add``):
            ``"objects listed"``, ``"uploads listed"``, ``"read"``, ``"deleted"`` or
            ``"uploads aborted"``, and how many.
    """

    def __init__(self, store: ObjectStore, count: Callable[[str, int], None]) -> None:
        self.wrapped = store
        self._count = count

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.wrapped, name)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """The wrapped store's listing, each object counted as it passes."""
        for info in self.wrapped.list(prefix):
            self._count("objects listed", 1)
            yield info

    def list_multipart_uploads(self, prefix: str) -> Iterator[UploadInfo]:
        """The wrapped store's open uploads, each counted as it passes."""
        for upload in self.wrapped.list_multipart_uploads(prefix):
            self._count("uploads listed", 1)
            yield upload

    def get(self, key: str) -> bytes:
        """One object, counted as read."""
        data = self.wrapped.get(key)
        self._count("read", 1)
        return data

    def open_range(self, key: str, start: int = 0, length: int | None = None) -> RangeReader:
        """A ranged read, counted as read (the scan reads commit markers this way)."""
        reader = self.wrapped.open_range(key, start, length)
        self._count("read", 1)
        return reader

    def delete(self, keys: Sequence[str]) -> DeleteFailures:
        """A batched delete; the keys that went are counted."""
        failures = self.wrapped.delete(keys)
        self._count("deleted", len(keys) - len(failures))
        return failures

    def delete_if_match(self, key: str, etag: str) -> None:
        """A conditional delete, counted when it succeeds."""
        self.wrapped.delete_if_match(key, etag)
        self._count("deleted", 1)

    def abort_multipart(self, key: str, upload_id: str) -> None:
        """An abort, counted when it succeeds."""
        self.wrapped.abort_multipart(key, upload_id)
        self._count("uploads aborted", 1)
