"""The fan-out stream on one rank: the shared spans' bytes, piece by piece, each piece one
broadcast from the rank that read it, in rounds opened by an all-reduce of error flags.

:class:`Exchange` is the stream (see :mod:`s3ckpt.dcp._fanout` for the whole load): piece
``i`` is broadcast by its owner, rank ``i % world``, which reads it from the store in a
prefetch thread (its next piece is read while a round is broadcast); every ``world``-th
piece opens a round with an all-reduce of one int32 flag per rank, and a raised flag stops
every rank at that round (:class:`Aborted`). :class:`StreamSpan` is one span of the stream
as the :class:`~s3ckpt.dcp._decode.ByteSource` the span decoder reads.

Memory: three pieces at most (the owned piece being broadcast, the next owned piece being
prefetched, the receive buffer); with NCCL one more piece on the GPU, and the receive
buffer is pinned.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist

from s3ckpt import _crc
from s3ckpt.dcp._fanout_plan import FanOutPlan
from s3ckpt.metrics.instrument import in_context

__all__ = ["Aborted", "Broken", "Exchange", "Stop", "StreamSpan"]


class Stop(Exception):
    """The exchange cannot go on (raised through the span decoder to the walk of the
    stream)."""


class Aborted(Stop):
    """A rank raised its flag: every rank stops the exchange at this round."""


class Broken(Stop):
    """A collective failed (a rank died, a timeout): nothing more can be sent."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _collective(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    try:
        fn(*args, **kwargs)
    except Exception as exc:
        raise Broken(exc) from exc


def _device(group: dist.ProcessGroup | None) -> torch.device:
    """CUDA (the current device) for an NCCL-only group; CPU for gloo (and for a group
    with a CPU backend beside NCCL, ``cpu:gloo,cuda:nccl``)."""
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend and "gloo" not in backend:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class Exchange:
    """The shared stream on one rank: pieces broadcast in order, read front to back.

    Args:
        table: The coordinator's table.
        rank: This rank in ``group``.
        group: The process group of the collectives (``None``: the default group).
        read_piece: Reads one piece this rank owns from the store (prefetch thread).
        failed: Whether this rank has failed (its flag at the next round).
    """

    def __init__(
        self,
        table: FanOutPlan,
        rank: int,
        group: dist.ProcessGroup | None,
        read_piece: Callable[[int], torch.Tensor],
        failed: Callable[[], bool],
    ) -> None:
        self.table = table
        self.rank = rank
        self.group = group
        self._read_piece = read_piece
        self._failed = failed
        self.device = _device(group)
        self.bytes_received = 0
        self.failed_ranks: list[int] = []
        biggest = max(b - a for a, b in itertools.pairwise(table.cuts))
        cuda = self.device.type == "cuda"
        self._recv = torch.empty(biggest, dtype=torch.uint8, device=self.device)
        self._host = (
            torch.empty(biggest, dtype=torch.uint8, pin_memory=True) if cuda else self._recv
        )
        self._flags = torch.zeros(table.world, dtype=torch.int32, device=self.device)
        self._prefetch = ThreadPoolExecutor(1, thread_name_prefix="s3ckpt-fanout")
        self._own: dict[int, Future[torch.Tensor]] = {}
        self._piece = -1
        self._view = memoryview(b"")
        self._at = 0
        self._want(rank)

    def _want(self, piece: int) -> None:
        """Start reading ``piece`` (owned by this rank) in the prefetch thread."""
        if piece < self.table.pieces:
            self._own[piece] = self._prefetch.submit(in_context(self._read_piece), piece)

    def close(self) -> None:
        """Cancel the prefetches not started and wait for the one running."""
        for fut in self._own.values():
            fut.cancel()
        self._prefetch.shutdown(wait=True)

    # -- collectives ------------------------------------------------------------------------
    def _round(self, first: int) -> None:
        """Open the round of pieces ``first ..``: wait for this rank's piece of it, start
        reading its next one, and all-reduce the flags."""
        mine = first + self.rank
        error = False
        if mine in self._own:
            try:
                self._own[mine].result()
            except Exception:
                error = True  # recorded by the reading thread
            self._want(mine + self.table.world)
        self._flags.zero_()
        self._flags[self.rank] = int(error or self._failed())
        _collective(dist.all_reduce, self._flags, group=self.group)
        flags = self._flags.tolist()
        if any(flags):
            self.failed_ranks = [r for r, f in enumerate(flags) if f]
            raise Aborted

    def final_check(self) -> bool:
        """The last all-reduce of the flags; True when some rank failed."""
        self._flags.zero_()
        self._flags[self.rank] = int(self._failed())
        dist.all_reduce(self._flags, group=self.group)
        flags = self._flags.tolist()
        self.failed_ranks = [r for r, f in enumerate(flags) if f]
        return bool(self.failed_ranks)

    def _next(self) -> None:
        """Receive (or send) the next piece; opens a round at each ``world``-th piece."""
        i = self._piece + 1
        if i >= self.table.pieces:
            raise AssertionError("read past the end of the fan-out stream")
        if i % self.table.world == 0:
            self._round(i)
        self._piece = i
        owner = self.table.owner(i)
        n = self.table.cuts[i + 1] - self.table.cuts[i]
        src = None
        if owner == self.rank:
            src = self._own.pop(i).result()[:n]
        if self.device.type == "cpu":
            buf = src if src is not None else self._recv[:n]
            _collective(dist.broadcast, buf, group=self.group, group_src=owner)
            host = buf
        else:
            gpu = self._recv[:n]
            if src is not None:
                gpu.copy_(src)
            _collective(dist.broadcast, gpu, group=self.group, group_src=owner)
            host = src if src is not None else self._host[:n]
            if src is None:
                host.copy_(gpu)
        if owner != self.rank:
            self.bytes_received += n
        self._view = memoryview(host.numpy())
        self._at = 0

    # -- reading the stream -----------------------------------------------------------------
    def take(self, n: int) -> memoryview:
        """Up to ``n`` (> 0) next bytes of the stream, valid until the next call."""
        if self._at >= len(self._view):
            self._next()
        got = self._view[self._at : self._at + n]
        self._at += len(got)
        return got

    def skip(self, n: int) -> None:
        """Pass over the next ``n`` bytes of the stream (taking part in their broadcasts)."""
        while n > 0:
            n -= len(self.take(n))


class StreamSpan:
    """One span of the stream as a :class:`~s3ckpt.dcp._decode.ByteSource` (what the span
    decoder reads)."""

    def __init__(self, stream: Exchange, length: int) -> None:
        self._stream = stream
        self._left = length

    def readinto_all(self, view: memoryview, what: str, crc: int = 0) -> int:
        """Fill ``view`` with the span's next bytes; their CRC32C continued from ``crc``."""
        view = view.cast("B") if view.format != "B" else view
        n = len(view)
        if n > self._left:
            raise ValueError(f"reading {n} bytes of a span with {self._left} left")
        off = 0
        while off < n:
            got = self._stream.take(n - off)
            view[off : off + len(got)] = got
            crc = _crc.crc32c(got, crc)
            off += len(got)
        self._left -= n
        return crc

    def drain(self) -> None:
        """Skip what is left of the span (after a failure while decoding it)."""
        left, self._left = self._left, 0
        self._stream.skip(left)
