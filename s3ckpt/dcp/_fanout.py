"""Fan-out load: each byte range that several ranks load is read from the store once per
process group and shared over it (``S3StorageReader(..., fan_out=True)``).

Who reads what is decided once, on the coordinator, from every rank's plan
(:func:`plan_fan_out`, called by ``prepare_global_plan``):

* a *shared span* is one stored item (object, offset, length) that two or more ranks read
  (replicated parameters, data-parallel replicas, a checkpoint saved on fewer ranks);
  items read by one rank stay direct reads;
* the shared spans, sorted by (object, offset), form one virtual byte *stream*, cut into
  *pieces* of at most ``piece_size`` bytes (about ``total / world`` each when that is
  smaller, so every rank gets a share, but no smaller than 8 MiB; a cut moves to an object
  boundary when one is within a quarter piece, so a piece rarely needs two GETs);
* piece ``i`` is read from the store by rank ``i % world`` (its *owner*) and broadcast to
  the group. The table (:class:`FanOutPlan`) goes into every rank's ``LoadPlan.storage_data``,
  so all ranks follow the same one.

:class:`FanOutRead` (``read_data``) then, on every rank: starts the rank's direct reads in
a thread (the ordinary :class:`~s3ckpt.transfer.RangeWalk` path); prefetches the pieces it
owns, one ahead, in another thread; and walks the shared spans in stream order, pulling the
stream piece by piece. Every piece is one broadcast from its owner, and pieces go in rounds
of ``world`` pieces (one per owner, read in parallel), each round opened by an all-reduce of
an error flag per rank. A span the rank loads is decoded from the stream by the reader's own
``_read_span``, the code a direct read runs: the same CRC32C check against ``s3ckpt.json``,
the same framing check, the same ``resolve_tensor`` / ``commit_tensor`` / ``load_bytes``.
So every rank that loads an item checks its checksum itself (owners of a piece hold only
bytes, not items); a corrupted broadcast fails like a corrupted object. A span the rank does
not load is skipped (the rank still takes part in every broadcast).

Failures never leave a rank waiting in a collective: a rank that fails (its plan, a direct
read, a piece it owns, decoding) keeps joining the broadcasts of the round it is in and
raises its flag at the next round; every rank sees the flags and stops at the same round.
After the last round one more all-reduce of the flags covers late failures. When a flag was
raised, the ranks all-gather their errors and each raises: its own error, or the first
failing rank's error (its object, its rank, its message). DCP then gathers them as usual.

Memory per rank, above what decoding already buffers (see ``TransferConfig``): three
pieces, at most ``3 * piece_size`` (the owned piece being broadcast, the next owned piece
being prefetched, and the receive buffer). With NCCL, one more piece on the GPU for the
broadcast and the receive buffer is pinned.

Collectives, in this order on every rank (the group must be the one ``dcp.load`` runs on:
plans are indexed by its ranks): per round, one all-reduce of ``world`` int32 flags and
one broadcast per piece; then one all-reduce of the flags; and, only after a failure, one
``all_gather_object`` of the errors.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import logging
import math
import pickle
import threading
from bisect import bisect_right
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner

from s3ckpt import _crc
from s3ckpt.config import MiB
from s3ckpt.errors import CheckpointError, ConfigError, S3CkptError
from s3ckpt.metrics.instrument import in_context
from s3ckpt.transfer import RangeWalk, SpanReader
from s3ckpt.transfer import Span as WalkSpan

if TYPE_CHECKING:
    from s3ckpt.dcp._torch import StorageInfo
    from s3ckpt.dcp.reader import S3StorageReader, _Span

__all__ = [
    "DEFAULT_PIECE_SIZE",
    "MIN_PIECE_SIZE",
    "ByteSource",
    "FanOutPlan",
    "FanOutRead",
    "build_table",
    "cut_stream",
    "fan_out_group",
    "plan_fan_out",
]

log = logging.getLogger(__name__)

DEFAULT_PIECE_SIZE = 64 * MiB
"""Largest piece one broadcast carries (and one owner reads in one go)."""

MIN_PIECE_SIZE = 1024
"""Smallest ``fan_out_piece_size`` accepted (small pieces are for tests)."""

_SPREAD_FLOOR = 8 * MiB
"""Pieces are about ``total / world`` when that is smaller than the piece size, but not
smaller than this (S3's advice for ranged GETs is 8-16 MB): a small shared stream is read
by fewer ranks in fewer, larger GETs."""

_PIECE_THREADS = 4
"""Threads of an owner's piece read. Its direct reads run at the same time on
``max_concurrency`` threads; the store's connection pool has ``max_concurrency + 4``."""

_SpanKey = tuple[str, int, int]  # (object name, offset, length)


class ByteSource(Protocol):
    """What the reader's ``_read_span`` reads a span from: a ranged GET
    (:class:`~s3ckpt.transfer.SpanReader`) or the fan-out stream."""

    def readinto_all(self, view: memoryview, what: str, crc: int = 0) -> int:
        """Fill ``view`` with the span's next bytes; their CRC32C continued from ``crc``."""
        ...


@dataclass(frozen=True)
class FanOutPlan:
    """The coordinator's table, the same in every rank's ``LoadPlan.storage_data``.

    Attributes:
        world: Ranks of the load (plans), the size the process group must have.
        spans: The shared spans ``(object, offset, length)``, in stream order.
        fqns: A name for each span (the first item that reads it), for error messages.
        cuts: Piece boundaries in the stream: piece ``i`` is ``[cuts[i], cuts[i + 1])``,
            owned by rank ``i % world``.
    """

    world: int
    spans: tuple[_SpanKey, ...]
    fqns: tuple[str, ...]
    cuts: tuple[int, ...]

    @property
    def pieces(self) -> int:
        return len(self.cuts) - 1

    @property
    def total(self) -> int:
        return self.cuts[-1]

    def owner(self, piece: int) -> int:
        return piece % self.world

    @functools.cached_property
    def _starts(self) -> list[int]:
        return list(itertools.accumulate((length for _, _, length in self.spans), initial=0))

    def segments(self, piece: int) -> list[tuple[int, int, int]]:
        """``(span index, start in span, end in span)`` of each span part in ``piece``."""
        lo, hi = self.cuts[piece], self.cuts[piece + 1]
        starts = self._starts
        out = []
        i = bisect_right(starts, lo) - 1
        while i < len(self.spans) and starts[i] < hi:
            out.append((i, max(lo - starts[i], 0), min(hi, starts[i + 1]) - starts[i]))
            i += 1
        return out


def fan_out_group(group: dist.ProcessGroup | None) -> tuple[bool, str]:
    """Whether a fan-out load can run on ``group`` (``None``: the default group), and why
    not when it cannot."""
    if not dist.is_available():
        return False, "torch.distributed is not available"
    if not dist.is_initialized():
        return False, "no process group is initialised"
    if dist.get_world_size(group) < 2:
        return False, "the process group has one rank"
    return True, ""


def plan_fan_out(
    plans: list[LoadPlan],
    storage_data: Mapping[MetadataIndex, StorageInfo],
    *,
    piece_size: int,
    group: dist.ProcessGroup | None,
) -> list[LoadPlan]:
    """The global plans with a :class:`FanOutPlan` in each (coordinator, in
    ``prepare_global_plan``); ``plans`` unchanged when nothing is shared or a fan-out load
    cannot run (logged at DEBUG: every rank then reads directly)."""
    ok, why = fan_out_group(group)
    if ok and len(plans) < 2:
        ok, why = False, "the load has one rank (dcp.load(..., no_dist=True)?)"
    if ok and len(plans) != dist.get_world_size(group):
        ok = False
        why = (
            f"the load has {len(plans)} ranks but the process group {dist.get_world_size(group)}"
            " (pass the group dcp.load runs on as process_group=)"
        )
    if ok and any(p.storage_data is not None for p in plans):
        ok, why = False, "the plans already carry storage_data"
    if not ok:
        log.debug("s3ckpt: fan_out=True but %s; every rank reads directly", why)
        return plans
    table = build_table(plans, storage_data, piece_size=piece_size)
    if table is None:
        log.debug("s3ckpt: fan_out=True but no stored item is read by two ranks")
        return plans
    log.debug(
        "s3ckpt: fan_out: %d shared items, %d bytes in %d pieces over %d ranks",
        len(table.spans),
        table.total,
        table.pieces,
        table.world,
    )
    return [dataclasses.replace(p, storage_data=table) for p in plans]


def build_table(
    plans: list[LoadPlan],
    storage_data: Mapping[MetadataIndex, StorageInfo],
    *,
    piece_size: int,
) -> FanOutPlan | None:
    """The shared spans of ``plans`` and their pieces; ``None`` when no span is shared.

    Items missing from ``storage_data`` are left out (the rank reading one raises while
    planning its reads, and fails the group through the flags)."""
    readers: dict[_SpanKey, set[int]] = {}
    names: dict[_SpanKey, str] = {}
    for rank, plan in enumerate(plans):
        for item in plan.items:
            info = storage_data.get(item.storage_index)
            if info is None:
                continue
            key = (info.relative_path, info.offset, info.length)
            readers.setdefault(key, set()).add(rank)
            names.setdefault(key, item.storage_index.fqn)
    spans = sorted(k for k, ranks in readers.items() if len(ranks) >= 2 and k[2] > 0)
    if not spans:
        return None
    return FanOutPlan(
        world=len(plans),
        spans=tuple(spans),
        fqns=tuple(names[k] for k in spans),
        cuts=tuple(cut_stream(spans, len(plans), piece_size)),
    )


def cut_stream(spans: list[_SpanKey], world: int, piece_size: int) -> list[int]:
    """Piece boundaries of the stream of ``spans`` (see the module docs): ``[0, ..., total]``,
    every piece at most ``piece_size`` bytes and none empty."""
    total = sum(length for _, _, length in spans)
    spread = max(math.ceil(total / world), min(_SPREAD_FLOOR, piece_size))
    target = max(1, min(piece_size, spread))
    boundaries: list[int] = []  # stream offsets where a new object starts
    pos = 0
    for i, (name, _, length) in enumerate(spans):
        if i and name != spans[i - 1][0]:
            boundaries.append(pos)
        pos += length
    cuts = [0]
    while total - cuts[-1] > target:
        at = cuts[-1] + target
        # The nearest object boundary within a quarter piece: back, or on while the piece
        # stays within piece_size.
        j = bisect_right(boundaries, at)
        near = [b for b in boundaries[max(j - 1, 0) : j + 1] if abs(b - at) <= target // 4]
        near = [b for b in near if cuts[-1] < b < total and b - cuts[-1] <= piece_size]
        if near:
            at = min(near, key=lambda b: abs(b - at))
        cuts.append(at)
    cuts.append(total)
    return cuts


class _Stop(Exception):
    """The exchange cannot go on (raised through ``_read_span`` to the walk of the stream)."""


class _Aborted(_Stop):
    """A rank raised its flag: every rank stops the exchange at this round."""


class _Broken(_Stop):
    """A collective failed (a rank died, a timeout): nothing more can be sent."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _collective(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    try:
        fn(*args, **kwargs)
    except Exception as exc:
        raise _Broken(exc) from exc


def _device(group: dist.ProcessGroup | None) -> torch.device:
    """CUDA (the current device) for an NCCL-only group; CPU for gloo (and for a group
    with a CPU backend beside NCCL, ``cpu:gloo,cuda:nccl``)."""
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend and "gloo" not in backend:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class _Exchange:
    """The shared stream on one rank: pieces broadcast in order, read front to back."""

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
            raise _Aborted

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
        while n > 0:
            n -= len(self.take(n))


class _StreamSpan:
    """One span of the stream as a :class:`ByteSource` (what ``_read_span`` reads)."""

    def __init__(self, stream: _Exchange, length: int) -> None:
        self._stream = stream
        self._left = length

    def readinto_all(self, view: memoryview, what: str, crc: int = 0) -> int:
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
        left, self._left = self._left, 0
        self._stream.skip(left)


class FanOutRead:
    """``read_data`` of one rank in a fan-out load (see the module docs).

    Args:
        reader: The rank's reader (its store, key names, checks and decoding).
        table: The coordinator's table from this rank's plan.
        planner: DCP's load planner.
    """

    def __init__(self, reader: S3StorageReader, table: FanOutPlan, planner: LoadPlanner) -> None:
        self.reader = reader
        self.table = table
        self.planner = planner
        self.group = reader.process_group
        self.lock = threading.Lock()
        self._errors_lock = threading.Lock()
        self.error: BaseException | None = None
        self.bytes_received = 0
        self._bytes_read = 0
        self._store, self._key_of = reader.store, reader.object_key
        tc = reader.transfer_config
        self._piece_config = dataclasses.replace(
            tc, max_concurrency=min(_PIECE_THREADS, tc.max_concurrency)
        )

    def _fail(self, exc: BaseException) -> None:
        with self._errors_lock:
            if self.error is None:
                self.error = exc

    def _failed(self) -> bool:
        return self.error is not None

    # -- owner side -------------------------------------------------------------------------
    def _read_piece(self, piece: int) -> torch.Tensor:
        """Read ``piece`` from the store (prefetch thread); a failure is recorded and
        re-raised (the round then raises this rank's flag)."""
        table = self.table
        buf = torch.empty(table.cuts[piece + 1] - table.cuts[piece], dtype=torch.uint8)
        if self._failed():
            return buf  # the group stops at the next round: read nothing more
        view = memoryview(buf.numpy())
        spans: dict[str, list[tuple[int, int, tuple[int, str]]]] = {}
        at = 0
        for i, lo, hi in table.segments(piece):
            name, offset, _ = table.spans[i]
            spans.setdefault(name, []).append((offset + lo, offset + hi, (at, table.fqns[i])))
            at += hi - lo

        def on_span(span: WalkSpan[tuple[int, str]], rd: SpanReader) -> None:
            dst, fqn = span.payload
            rd.readinto_all(view[dst : dst + span.end - span.start], fqn)

        walk = RangeWalk(
            self._store,
            self._key_of,
            config=self._piece_config,
            on_span=on_span,
            rank=self.reader.rank,
            thread_name_prefix="s3ckpt-fanout-get",
        )
        try:
            walk.run(walk.plan(spans))
        except Exception as exc:
            self._fail(exc)
            raise
        finally:
            with self._errors_lock:
                self._bytes_read += walk.bytes_requested
        return buf

    # -- every rank -------------------------------------------------------------------------
    def run(self, plan: LoadPlan) -> None:
        """Load ``plan``: direct reads, the exchange, the checks; raises on every rank
        when any rank failed."""
        reader, table = self.reader, self.table
        rank = dist.get_rank(self.group)
        if table.world != dist.get_world_size(self.group):
            raise ConfigError(
                f"fan_out: the load has {table.world} ranks but the reader's process group "
                f"{dist.get_world_size(self.group)}; pass the group dcp.load runs on as "
                "process_group=",
                rank=reader.rank,
            )
        if rank != reader.rank:
            self._fail(
                ConfigError(
                    f"fan_out: this is rank {reader.rank} of the load but rank {rank} of the "
                    "reader's process group; pass the group dcp.load runs on as process_group=",
                    rank=reader.rank,
                )
            )
        stream = _Exchange(table, rank, self.group, self._read_piece, self._failed)
        direct: threading.Thread | None = None
        aborted = False
        try:
            shared: dict[_SpanKey, _Span] = {}
            try:
                per_object = reader._group(plan)
                keys = set(table.spans)
                rest: dict[str, dict[tuple[int, int], _Span]] = {}
                for name, spans in per_object.items():
                    for (offset, length), span in spans.items():
                        if (name, offset, length) in keys:
                            shared[(name, offset, length)] = span
                        else:
                            rest.setdefault(name, {})[(offset, length)] = span
                if rest:
                    direct = threading.Thread(
                        target=in_context(self._direct), args=(rest,), name="s3ckpt-fanout-direct"
                    )
                    direct.start()
            except Exception as exc:
                self._fail(exc)
            try:
                for i, key in enumerate(table.spans):
                    needed = shared.get(key)
                    if needed is None or self._failed():
                        stream.skip(key[2])
                        continue
                    self._decode(stream, i, needed)
            except _Aborted:
                aborted = True
            except _Broken as exc:
                raise exc.error from None
        finally:
            if direct is not None:
                direct.join()
            stream.close()
            self.bytes_received = stream.bytes_received
            reader._count(self._bytes_read)
            reader.bytes_received += stream.bytes_received
        if not aborted:
            aborted = stream.final_check()
        if aborted:
            self._raise(stream.failed_ranks, rank)

    def _direct(self, spans: dict[str, dict[tuple[int, int], _Span]]) -> None:
        try:
            self.reader._read_direct(spans, self.planner, self.lock)
        except Exception as exc:
            self._fail(exc)

    def _decode(self, stream: _Exchange, i: int, span: _Span) -> None:
        """Decode span ``i`` from the stream into the planner, as a direct read would; a
        failure is recorded and the rest of the span skipped."""
        name = self.table.spans[i][0]
        source = _StreamSpan(stream, self.table.spans[i][2])
        try:
            self.reader._read_span(source, self._key_of(name), span, self.planner, self.lock)
        except _Stop:
            raise
        except Exception as exc:
            self._fail(exc)
        source.drain()

    def _raise(self, failed: list[int], rank: int) -> None:
        """Gather every rank's error and raise one here (all ranks call this)."""
        mine: Any = None
        if self.error is not None:
            mine = self.error
            try:
                pickle.dumps(mine)
            except Exception:
                mine = CheckpointError(f"{type(mine).__name__}: {mine}", rank=rank)
        errors: list[Any] = [None] * self.table.world
        dist.all_gather_object(errors, mine, group=self.group)
        if self.error is not None:
            raise self.error
        for r, err in enumerate(errors):
            if err is not None:
                raise _relayed(err, r) from err
        raise CheckpointError(
            f"fan_out: ranks {failed} failed during the load and sent no error", rank=rank
        )


def _relayed(err: BaseException, rank: int) -> BaseException:
    """``err`` of ``rank`` as raised on another rank: same type, object and rank, with a
    message that says it came from there."""
    prefix = f"rank {rank} failed in a fan-out load (it reads for the whole group): "
    if isinstance(err, S3CkptError):
        out = copy.copy(err)
        out.args = (prefix + err.message, *err.args[1:])
        if out.rank is None:
            out.rank = rank
        return out
    return CheckpointError(prefix + f"{type(err).__name__}: {err}", rank=rank)
