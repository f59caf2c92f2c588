"""The shaping model: latency, per-connection bandwidth, per-partition request rates, splits.

Everything here is pure: no sockets, no event loop, and every method that depends on time
takes ``now`` (seconds, any monotonic origin) so that tests drive it with a fake clock.
The server (:mod:`benchmarks.s3sim._server`) owns one :class:`PartitionMap` and one pair
of :class:`Pacer` per connection.

How S3 is modelled (figures from AWS's published guidance; see README.md):

* **Time to first byte** (``ttfb_s``): added before a response starts; for an upload, after
  its body has been received.
* **Per-connection bandwidth** (``conn_mb_per_s``): request bodies are read and response
  bodies written at most this fast on one connection (a token bucket per direction).
* **Request rates per partition** (``read_rate`` / ``write_rate`` requests per second,
  times ``rate_scale``): a token bucket per partition and kind, holding ``burst_s`` seconds
  of rate. An empty bucket answers ``503 SlowDown``.
* **Partitions**: one per bucket at first (partition prefix ``"<bucket>/"``); a request
  belongs to the partition with the longest prefix of ``"<bucket>/<key>"``. A partition
  that has been *hot* (it throttled a request, or ran at ``split_load`` or more of a rate)
  in every 1 s window for ``split_after_s`` seconds splits: see :meth:`PartitionMap.split`.
* **Throttles**: explicit partitions with fixed rates (not scaled, never split) that model a
  prefix S3 throttles.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "READ",
    "WRITE",
    "Pacer",
    "Partition",
    "PartitionMap",
    "Shaping",
    "Throttle",
    "TokenBucket",
]

READ = "read"
WRITE = "write"

#: Keys remembered per partition to choose where it splits (the most recent ones).
RECENT_KEYS = 256
#: Children one split may create (the rest of the key space stays with the parent).
MAX_CHILDREN = 64


def _rate(value: float | None, name: str) -> float | None:
    if value is None:
        return None
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive number of requests per second or None")
    return float(value)


@dataclass(frozen=True)
class Throttle:
    """A partition with fixed request rates: S3 throttling one prefix.

    ``prefix`` is ``"<bucket>/<key prefix>"``; a rate of ``None`` leaves that kind of request
    unlimited. The rates are absolute: ``rate_scale`` does not apply to them, and the
    partition never splits.
    """

    prefix: str
    read_rate: float | None = None
    write_rate: float | None = None

    def __post_init__(self) -> None:
        if "/" not in self.prefix or self.prefix.startswith("/"):
            raise ValueError(f"throttle prefix must be '<bucket>/<key prefix>': {self.prefix!r}")
        object.__setattr__(self, "read_rate", _rate(self.read_rate, "read_rate"))
        object.__setattr__(self, "write_rate", _rate(self.write_rate, "write_rate"))

    @classmethod
    def parse(cls, spec: str) -> Throttle:
        """``"bucket/prefix=READS/WRITES"``; ``-`` for a kind that is not limited.

        >>> Throttle.parse("ckpt/hot/=100/-")
        Throttle(prefix='ckpt/hot/', read_rate=100.0, write_rate=None)
        """
        prefix, sep, rates = spec.rpartition("=")
        reads, sep2, writes = rates.partition("/")
        if not sep or not sep2:
            raise ValueError(f"throttle must be PREFIX=READS/WRITES: {spec!r}")

        def one(text: str) -> float | None:
            text = text.strip()
            return None if text in ("-", "", "none", "inf") else float(text)

        return cls(prefix, one(reads), one(writes))

    def to_json(self) -> dict[str, Any]:
        """The JSON form the control API accepts back (see :meth:`from_json`)."""
        return {"prefix": self.prefix, "read_rate": self.read_rate, "write_rate": self.write_rate}

    @classmethod
    def from_json(cls, value: Any) -> Throttle:
        """A throttle from :meth:`to_json`'s dict or from :meth:`parse`'s string."""
        if isinstance(value, str):
            return cls.parse(value)
        return cls(value["prefix"], value.get("read_rate"), value.get("write_rate"))


@dataclass(frozen=True)
class Shaping:
    """How much like S3 the server behaves; all off by default (:meth:`none`).

    :meth:`s3` gives the documented S3 figures; every field can also be set alone.
    """

    ttfb_s: float = 0.0
    """Time to first byte added to every response (seconds). S3 preset: 0.030."""
    conn_mb_per_s: float | None = None
    """Bandwidth of one connection, each direction (MB/s, 10**6 bytes). S3 preset: 85."""
    read_rate: float | None = None
    """GET/HEAD/LIST requests per second per partition, before ``rate_scale``. S3: 5500."""
    write_rate: float | None = None
    """PUT/POST/DELETE/COPY requests per second per partition, before ``rate_scale``. S3: 3500."""
    burst_s: float = 1.0
    """Capacity of a partition's token buckets, in seconds of its rate."""
    rate_scale: float = 1.0
    """Factor on ``read_rate`` and ``write_rate`` (not on throttles), e.g. 0.01 on a laptop."""
    split_after_s: float | None = None
    """Seconds a partition must stay hot before it splits; None: never. S3 preset: 60."""
    split_load: float = 0.5
    """A 1 s window is hot at this fraction of a rate (or when it throttled anything)."""
    throttles: tuple[Throttle, ...] = field(default_factory=tuple)
    """Fixed-rate partitions (see :class:`Throttle`)."""

    def __post_init__(self) -> None:
        if not (self.ttfb_s >= 0 and math.isfinite(self.ttfb_s)):
            raise ValueError("ttfb_s must be >= 0")
        if self.conn_mb_per_s is not None and not (self.conn_mb_per_s > 0):
            raise ValueError("conn_mb_per_s must be > 0 or None")
        _rate(self.read_rate, "read_rate")
        _rate(self.write_rate, "write_rate")
        if not (self.burst_s > 0):
            raise ValueError("burst_s must be > 0")
        if not (self.rate_scale > 0 and math.isfinite(self.rate_scale)):
            raise ValueError("rate_scale must be > 0")
        if self.split_after_s is not None and not (self.split_after_s >= 0):
            raise ValueError("split_after_s must be >= 0 or None")
        if not (0 < self.split_load <= 1):
            raise ValueError("split_load must be in (0, 1]")
        object.__setattr__(self, "throttles", tuple(self.throttles))

    @classmethod
    def none(cls, **overrides: Any) -> Shaping:
        """No shaping at all (the default): as fast as the server can go."""
        return cls(**overrides)

    @classmethod
    def s3(cls, **overrides: Any) -> Shaping:
        """S3's published figures: 30 ms to first byte, 85 MB/s per connection, 5,500 reads
        and 3,500 writes per second per partition with 1 s of burst, splits after 60 s hot.
        """
        base: dict[str, Any] = {
            "ttfb_s": 0.030,
            "conn_mb_per_s": 85.0,
            "read_rate": 5500.0,
            "write_rate": 3500.0,
            "burst_s": 1.0,
            "split_after_s": 60.0,
            "split_load": 0.5,
        }
        base.update(overrides)
        return cls(**base)

    @classmethod
    def profile(cls, name: str, **overrides: Any) -> Shaping:
        """:meth:`none` or :meth:`s3` by name (``"none"`` / ``"s3"``)."""
        if name == "none":
            return cls.none(**overrides)
        if name == "s3":
            return cls.s3(**overrides)
        raise ValueError(f"unknown profile {name!r} (none, s3)")

    def replace(self, **changes: Any) -> Shaping:
        """A copy with ``changes`` applied (validated)."""
        return dataclasses.replace(self, **changes)

    @property
    def scaled_read_rate(self) -> float | None:
        """``read_rate * rate_scale`` (None: unlimited)."""
        return None if self.read_rate is None else self.read_rate * self.rate_scale

    @property
    def scaled_write_rate(self) -> float | None:
        """``write_rate * rate_scale`` (None: unlimited)."""
        return None if self.write_rate is None else self.write_rate * self.rate_scale

    @property
    def conn_bytes_per_s(self) -> float | None:
        """``conn_mb_per_s`` in bytes per second."""
        return None if self.conn_mb_per_s is None else self.conn_mb_per_s * 1e6

    def to_json(self) -> dict[str, Any]:
        """Field name to value; throttles as dicts (see :meth:`from_json`)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["throttles"] = [t.to_json() for t in self.throttles]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any], base: Shaping | None = None) -> Shaping:
        """``base`` (default: :meth:`none`) updated by ``data``.

        ``data`` may name a ``"profile"`` (``"none"``/``"s3"``) to start from instead of
        ``base``; other keys are field names. Unknown keys raise ValueError.
        """
        data = dict(data)
        profile = data.pop("profile", None)
        start = cls.profile(profile) if profile is not None else (base or cls.none())
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown shaping knobs: {sorted(unknown)}")
        if "throttles" in data:
            data["throttles"] = tuple(Throttle.from_json(t) for t in data["throttles"] or ())
        return dataclasses.replace(start, **data)


class TokenBucket:
    """``rate`` tokens per second, at most ``capacity``; starts full."""

    __slots__ = ("capacity", "last", "rate", "tokens")

    def __init__(self, rate: float, capacity: float, now: float) -> None:
        self.rate = rate
        self.capacity = max(1.0, capacity)
        self.tokens = self.capacity
        self.last = now

    def take(self, now: float, n: float = 1.0) -> bool:
        """Take ``n`` tokens if there are that many (after refilling up to ``now``)."""
        if now > self.last:
            self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate)
            self.last = now
        if self.tokens >= n:
            self.tokens -= n
            return True
        return False


class Pacer:
    """Bandwidth of one direction of one connection, as a delay to wait per transfer.

    :meth:`delay` books ``n`` bytes and answers how long the caller must wait before going on
    (never negative). ``allowance`` bytes may go ahead of the rate (the burst a real NIC
    queue absorbs), so small transfers are not delayed at all.
    """

    __slots__ = ("allowance_s", "free_at", "rate")

    def __init__(self, bytes_per_s: float, allowance: int = 256 * 1024) -> None:
        self.rate = bytes_per_s
        self.allowance_s = allowance / bytes_per_s
        self.free_at = -math.inf

    def delay(self, now: float, n: int) -> float:
        """Book ``n`` bytes at ``now``; seconds to wait before the next transfer."""
        self.free_at = max(self.free_at, now) + n / self.rate
        return max(0.0, self.free_at - now - self.allowance_s)


class Partition:
    """One key range's request-rate state and counters."""

    __slots__ = (
        "created",
        "hot_since",
        "peak_reads",
        "peak_writes",
        "pinned",
        "prefix",
        "read_bucket",
        "read_rate",
        "reads",
        "recent",
        "throttled_reads",
        "throttled_writes",
        "win_reads",
        "win_sec",
        "win_throttled",
        "win_writes",
        "write_bucket",
        "write_rate",
        "writes",
    )

    def __init__(
        self,
        prefix: str,
        read_rate: float | None,
        write_rate: float | None,
        burst_s: float,
        now: float,
        *,
        pinned: bool = False,
    ) -> None:
        self.prefix = prefix
        self.pinned = pinned
        self.created = now
        self.read_rate = read_rate
        self.write_rate = write_rate
        self.read_bucket = (
            None if read_rate is None else TokenBucket(read_rate, read_rate * burst_s, now)
        )
        self.write_bucket = (
            None if write_rate is None else TokenBucket(write_rate, write_rate * burst_s, now)
        )
        self.reads = self.writes = self.throttled_reads = self.throttled_writes = 0
        self.peak_reads = self.peak_writes = 0
        self.win_sec = math.floor(now)
        self.win_reads = self.win_writes = self.win_throttled = 0
        self.hot_since: float | None = None
        self.recent: deque[str] = deque(maxlen=RECENT_KEYS)

    def reset_counts(self) -> None:
        """Zero the counters and peaks (the rate state and the hot streak stay)."""
        self.reads = self.writes = self.throttled_reads = self.throttled_writes = 0
        self.peak_reads = self.peak_writes = 0
        self.win_reads = self.win_writes = self.win_throttled = 0

    def snapshot(self, now: float) -> dict[str, Any]:
        """The stats entry for this partition."""
        current = math.floor(now) == self.win_sec
        return {
            "prefix": self.prefix,
            "pinned": self.pinned,
            "read_rate": self.read_rate,
            "write_rate": self.write_rate,
            "reads": self.reads,
            "writes": self.writes,
            "throttled_reads": self.throttled_reads,
            "throttled_writes": self.throttled_writes,
            "peak_reads_per_s": max(self.peak_reads, self.win_reads if current else 0),
            "peak_writes_per_s": max(self.peak_writes, self.win_writes if current else 0),
            "hot_for_s": 0.0 if self.hot_since is None else round(now - self.hot_since, 3),
            "age_s": round(now - self.created, 3),
        }


class PartitionMap:
    """The partitions of every bucket, the request admission and the split rule.

    Lookup is the longest partition prefix of ``"<bucket>/<key>"``: one dict probe per
    distinct prefix length, so it stays cheap with hundreds of partitions.
    """

    def __init__(self, shaping: Shaping, now: float) -> None:
        self.shaping = shaping
        self.parts: dict[str, Partition] = {}
        self._lengths: list[int] = []
        self.splits: list[dict[str, Any]] = []
        self.started = now
        for t in shaping.throttles:
            self._add(
                Partition(t.prefix, t.read_rate, t.write_rate, shaping.burst_s, now, pinned=True)
            )

    @property
    def limits(self) -> bool:
        """Whether any request can be throttled (otherwise admission only counts)."""
        s = self.shaping
        return s.read_rate is not None or s.write_rate is not None or bool(s.throttles)

    def _add(self, part: Partition) -> Partition:
        self.parts[part.prefix] = part
        n = len(part.prefix)
        if n not in self._lengths:
            self._lengths.append(n)
            self._lengths.sort(reverse=True)
        return part

    def lookup(self, path: str, now: float) -> Partition:
        """The partition of ``path`` (``"<bucket>/<key>"``), creating the bucket's first."""
        parts = self.parts
        for n in self._lengths:
            if n <= len(path):
                part = parts.get(path[:n])
                if part is not None:
                    return part
        bucket = path.split("/", 1)[0] + "/"
        s = self.shaping
        return self._add(Partition(bucket, s.scaled_read_rate, s.scaled_write_rate, s.burst_s, now))

    def admit(self, path: str, kind: str, now: float) -> bool:
        """Count one request of ``kind`` (:data:`READ`/:data:`WRITE`) on ``path``'s
        partition; False if its token bucket is empty (the caller answers SlowDown)."""
        part = self.lookup(path, now)
        sec = math.floor(now)
        if sec != part.win_sec:
            self._close_window(part, sec, now)
            part = self.lookup(path, now)  # a split may have created a better match
            if sec != part.win_sec:
                self._close_window(part, sec, now)
        if self.shaping.split_after_s is not None and not part.pinned:
            part.recent.append(path)
        if kind == READ:
            part.reads += 1
            part.win_reads += 1
            bucket = part.read_bucket
        else:
            part.writes += 1
            part.win_writes += 1
            bucket = part.write_bucket
        if bucket is None or bucket.take(now):
            return True
        part.win_throttled += 1
        if kind == READ:
            part.throttled_reads += 1
        else:
            part.throttled_writes += 1
        return False

    def _close_window(self, part: Partition, sec: int, now: float) -> None:
        """End ``part``'s 1 s window (it is older than ``sec``): peaks, hot streak, split."""
        part.peak_reads = max(part.peak_reads, part.win_reads)
        part.peak_writes = max(part.peak_writes, part.win_writes)
        hot = part.win_throttled > 0 or self._busy(part)
        if not hot or sec - part.win_sec > 1:  # a cold window, or idle seconds in between
            part.hot_since = None
        elif part.hot_since is None:
            part.hot_since = max(float(part.win_sec), part.created)
        part.win_sec = sec
        part.win_reads = part.win_writes = part.win_throttled = 0
        after = self.shaping.split_after_s
        hot_for = None if part.hot_since is None else sec - part.hot_since
        if after is not None and hot_for is not None and hot_for >= after and not part.pinned:
            self.split(part, now)

    def _busy(self, part: Partition) -> bool:
        load = self.shaping.split_load
        r, w = part.read_rate, part.write_rate
        return (r is not None and part.win_reads >= load * r) or (
            w is not None and part.win_writes >= load * w
        )

    def split(self, part: Partition, now: float) -> list[str]:
        """Split ``part`` at the first character that tells its recent keys apart.

        With ``L`` the longest common prefix of the partition's last :data:`RECENT_KEYS`
        paths, one child ``L + c`` is created for each character ``c`` that follows ``L`` in
        them (at most :data:`MAX_CHILDREN`, the most frequent first, ties by character). The
        parent keeps the rest of its range. Children start with full token buckets at the
        partition rates, so the split adds capacity where the load is. A partition whose
        recent keys are all one key cannot split (S3 cannot split a single key either).
        Returns the new prefixes (empty when nothing could split).
        """
        recent = list(part.recent)
        part.recent.clear()
        part.hot_since = None
        if not recent:
            return []
        lcp = _common_prefix(recent)
        counts: dict[str, int] = {}
        for path in recent:
            if len(path) > len(lcp):
                c = path[len(lcp)]
                counts[c] = counts.get(c, 0) + 1
        chosen = sorted(counts, key=lambda c: (-counts[c], c))[:MAX_CHILDREN]
        children = [lcp + c for c in sorted(chosen) if lcp + c not in self.parts]
        if not children:
            return []
        s = self.shaping
        for prefix in children:
            self._add(Partition(prefix, part.read_rate, part.write_rate, s.burst_s, now))
        self.splits.append(
            {"at_s": round(now - self.started, 3), "parent": part.prefix, "children": children}
        )
        return children

    def reset_counts(self) -> None:
        """Zero every partition's counters and forget past splits (the layout stays)."""
        for part in self.parts.values():
            part.reset_counts()
        self.splits.clear()

    def snapshot(self, now: float) -> list[dict[str, Any]]:
        """Stats entries, sorted by prefix."""
        return [self.parts[p].snapshot(now) for p in sorted(self.parts)]


def _common_prefix(paths: list[str]) -> str:
    lo, hi = min(paths), max(paths)
    n = 0
    for a, b in zip(lo, hi, strict=False):
        if a != b:
            break
        n += 1
    return lo[:n]
