"""One value per process and key, built on first use: the S3 store's shared boto3 clients
(:func:`s3ckpt.store._client.shared_client`) and adaptive limiters
(:func:`s3ckpt.store._adaptive.shared_limiter`)."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["ProcessCache"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ProcessCache(Generic[K, V]):
    """Values built once per key and shared by the threads of a process; beyond ``size``
    the least recently used is dropped (whoever holds it keeps it). A forked child starts
    empty: the parent's values (clients and their sockets) are not its own.

    Thread-safe: concurrent first :meth:`get` calls for a key build one value.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()
        self._forks_watched = False  # the fork hook is registered with the first value

    def get(self, key: K, build: Callable[[], V]) -> V:
        """The value for ``key``, built by ``build()`` if there is none (an exception from
        ``build`` caches nothing)."""
        with self._lock:
            value = self._items.get(key)
            if value is None:
                if not self._forks_watched:  # not at import: no side effect until used
                    os.register_at_fork(after_in_child=self.clear)
                    self._forks_watched = True
                value = self._items[key] = build()
                while len(self._items) > self.size:
                    self._items.popitem(last=False)
            else:
                self._items.move_to_end(key)
            return value

    def clear(self) -> None:
        """Drop every value (a forked child; tests)."""
        # A new lock: in a forked child, a parent thread may have held the old one.
        self._lock = threading.Lock()
        self._items.clear()
