"""The part pool: a fixed number of part-sized buffers, handed out under back-pressure."""

from __future__ import annotations

import threading

__all__ = ["PartPool"]


class PartPool:
    """``n_buffers`` part-sized buffers; :meth:`take` blocks while every one is in flight.

    Back-pressure by a semaphore, as s3transfer's ``BoundedExecutor`` does: a slot is
    acquired before a buffer is taken and released when the buffer comes back (its part
    was sent). Buffers are allocated on first use and reused, so memory is at most
    ``n_buffers * part_size``. :meth:`close_for_failure` wakes every waiter at once.
    """

    def __init__(self, part_size: int, n_buffers: int) -> None:
        self.part_size = part_size
        self.n_buffers = n_buffers
        self._slots = threading.Semaphore(n_buffers)
        self._lock = threading.Lock()
        self._free: list[bytearray] = []
        self._failed = False

    def take(self) -> bytearray | None:
        """A free buffer; blocks while all are in flight. None once the pool has failed."""
        self._slots.acquire()
        if self._failed:
            self._slots.release()  # pass the wake-up on to the next waiter
            return None
        with self._lock:
            return self._free.pop() if self._free else bytearray(self.part_size)

    def give(self, buf: bytearray) -> None:
        """Return a buffer taken with :meth:`take` (its part was sent, or not needed)."""
        with self._lock:
            self._free.append(buf)
        self._slots.release()

    def close_for_failure(self) -> None:
        """Make every current and future :meth:`take` return None without waiting."""
        with self._lock:
            if self._failed:
                return
            self._failed = True
        self._slots.release()  # each woken waiter releases again: all of them wake

    def clear(self) -> None:
        """Drop the free buffers."""
        with self._lock:
            self._free.clear()
