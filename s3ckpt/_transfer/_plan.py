"""Pure planning helpers: pack items into objects, coalesce byte ranges into requests."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["MIN_READ_PIECE", "Request", "coalesce", "pack", "read_piece_size"]

T = TypeVar("T")

_MiB = 1024 * 1024

MIN_READ_PIECE = 8 * _MiB
# The smallest ranged GET a load cuts a large item into: S3's guidance (8-16 MB byte-range
# fetches); below it a request's time to first byte (~30 ms) costs more than a connection more
# earns.

READS_PER_CONNECTION = 2
# Ranged GETs per connection a load aims for: enough that a slow request leaves no
# connection idle for long, few enough that each request is long next to its first byte.


def read_piece_size(total: int, connections: int, *, ceiling: int) -> int:
    """The most bytes one ranged GET of a load reads: ``total`` (the bytes to load) spread
    over :data:`READS_PER_CONNECTION` requests per connection, rounded up to a MiB, within
    :data:`MIN_READ_PIECE` .. ``ceiling`` (``TransferConfig.read_request_size``).

    S3 gives one connection about 85 MB/s whatever the object, so the load's speed is the
    connections kept busy: 1 GiB on 14 connections reads in 37 MiB pieces (28 GETs, two
    rounds; the first byte's ~30 ms is 7 % of each), where one GET per 192 MiB tensor kept
    five busy."""
    want = -(-total // (connections * READS_PER_CONNECTION))
    want = -(-want // _MiB) * _MiB
    return max(min(MIN_READ_PIECE, ceiling), min(want, ceiling))


def pack(sizes: Sequence[int], n_bins: int) -> list[list[int]]:
    """Split item indices into ``n_bins`` bins of near-equal total size.

    Largest first into the lightest bin (LPT); within a bin, indices keep their original
    order so related items (a module's parameters) stay adjacent. Empty bins are dropped.
    """
    heap: list[tuple[int, int]] = [(0, b) for b in range(n_bins)]
    bins: list[list[int]] = [[] for _ in range(n_bins)]
    for idx in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        load, b = heapq.heappop(heap)
        bins[b].append(idx)
        heapq.heappush(heap, (load + sizes[idx], b))
    return [sorted(b) for b in bins if b]


@dataclass(slots=True)
class Request(Generic[T]):
    """One ranged GET covering ``[start, end)`` and the spans inside it, sorted."""

    start: int
    end: int
    spans: list[tuple[int, int, T]] = field(default_factory=list)

    @property
    def size(self) -> int:
        """Bytes the request transfers (gaps included)."""
        return self.end - self.start


def coalesce(spans: Sequence[tuple[int, int, T]], gap: int, max_size: int) -> list[Request[T]]:
    """Merge byte ranges ``(start, end, payload)`` of one object into requests.

    Adjacent or overlapping ranges, or ranges at most ``gap`` bytes apart, share a
    request while the request stays within ``max_size`` bytes; a single range larger
    than ``max_size`` gets a request of its own. Every input span appears in exactly one
    request, in start order.
    """
    out: list[Request[T]] = []
    for start, end, payload in sorted(spans, key=lambda s: (s[0], s[1])):
        if end < start:
            raise ValueError(f"bad range [{start}, {end})")
        cur = out[-1] if out else None
        if cur is not None and start <= cur.end + gap and max(end, cur.end) - cur.start <= max_size:
            cur.end = max(cur.end, end)
            cur.spans.append((start, end, payload))
        else:
            out.append(Request(start, end, [(start, end, payload)]))
    return out
