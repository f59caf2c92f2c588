"""Fan-out load: each byte range that several ranks load is read from the store once per
process group and shared over it (``S3StorageReader(..., fan_out=True)``).

Who reads what is decided once, on the coordinator, from every rank's plan
(:func:`~s3ckpt.dcp._fanout_plan.plan_fan_out`, called by ``prepare_global_plan``): the
stored items two or more ranks read (*shared spans*) form one byte *stream*, cut into
*pieces*; piece ``i`` is read from the store by rank ``i % world`` (its *owner*) and
broadcast to the group. The table (:class:`~s3ckpt.dcp._fanout_plan.FanOutPlan`) goes into
every rank's ``LoadPlan.storage_data``, so all ranks follow the same one.

:class:`FanOutRead` (``read_data``) then, on every rank: starts the rank's direct reads in
a thread (the reader's ordinary :class:`~s3ckpt._transfer.RangeWalk` path); prefetches the
pieces it owns, one ahead, in another thread; and walks the shared spans in stream order,
pulling the stream piece by piece. Every piece is one broadcast from its owner, and pieces
go in rounds of ``world`` pieces (one per owner, read in parallel), each round opened by an
all-reduce of an error flag per rank. A span the rank loads is decoded from the stream by
the :class:`~s3ckpt.dcp._decode.SpanDecoder` a direct read uses (the stream is its
:class:`~s3ckpt.dcp._decode.ByteSource`): the same CRC32C check against ``s3ckpt.json``,
the same framing check, the same ``resolve_tensor`` / ``commit_tensor`` / ``load_bytes``.
So every rank that loads an item checks its checksum itself (owners of a piece hold only
bytes, not items); a corrupted broadcast fails like a corrupted object. A span the rank
does not load is skipped (the rank still takes part in every broadcast).

Failures never leave a rank waiting in a collective: a rank that fails (its plan, a direct
read, a piece it owns, decoding) keeps joining the broadcasts of the round it is in and
raises its flag at the next round; every rank sees the flags and stops at the same round.
After the last round one more all-reduce of the flags covers late failures. When a flag was
raised, the ranks all-gather their errors and each raises: its own error, or the first
failing rank's error (its object, its rank, its message). DCP then gathers them as usual.

Memory per rank, above what decoding already buffers (see ``TransferConfig``): three
pieces, at most ``3 * piece_size`` (the owned piece being broadcast, the next owned piece
being prefetched, and the receive buffer). With NCCL (a group whose backend is NCCL only:
``cpu:gloo,cuda:nccl`` broadcasts through CPU memory) one more piece on the GPU
(``torch.cuda.current_device()``) for the broadcast, and the receive buffer is pinned.

Collectives, in this order on every rank (the group must be the one ``dcp.load`` runs on:
plans are indexed by its ranks): per round, one all-reduce of ``world`` int32 flags and
one broadcast per piece; then one all-reduce of the flags; and, only after a failure, one
``all_gather_object`` of the errors.

The reader module is not imported here: the reader is handed to :class:`FanOutRead`.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import pickle
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.planner import LoadPlan

from s3ckpt import _crc
from s3ckpt._transfer import RangeWalk, Span, SpanReader
from s3ckpt.dcp._decode import ItemSpan, SpanDecoder, SpansByObject
from s3ckpt.dcp._fanout_plan import FanOutPlan, SpanKey
from s3ckpt.dcp._split import decode_span
from s3ckpt.errors import CheckpointError, ConfigError, S3CkptError
from s3ckpt.metrics.instrument import in_context

__all__ = ["FanOutRead"]

_PIECE_THREADS = 4
# Threads of an owner's piece read. Its direct reads run at the same time on
# ``max_concurrency`` threads; the store's connection pool has ``max_concurrency + 4``.


class _Stop(BaseException):
    """The exchange cannot go on: a rank raised its flag (``error`` None: every rank stops
    at this round), or a collective failed (``error``: a rank died, a timeout). Not an
    ``Exception``: no ``except Exception`` on the way (decoding a span) records it."""

    def __init__(self, error: Exception | None = None) -> None:
        super().__init__(str(error))
        self.error = error


def _collective(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        raise _Stop(exc) from exc


class FanOutRead:
    """``read_data`` of one rank in a fan-out load (see the module docs), and the shared
    stream as the span decoder reads it (:meth:`readinto_all`).

    Args:
        reader: The :class:`~s3ckpt.dcp.S3StorageReader`: its store, ``object_key``,
            ``transfer_config`` (a piece is read on at most 4 of its threads), ``rank``,
            ``process_group`` and direct read.
        table: The coordinator's table from this rank's plan.
        decoder: The rank's span decoder (its spans, checks, planner and decoding).

    After :meth:`run` (raised or not): ``bytes_read``, the bytes this rank requested for
    the pieces it owns; ``bytes_received``, the bytes it received from other ranks.
    """

    def __init__(self, reader: Any, table: FanOutPlan, decoder: SpanDecoder) -> None:
        self.reader, self.table, self.decoder = reader, table, decoder
        self.rank, self.group = reader.rank, reader.process_group
        self.error: BaseException | None = None
        self._errors_lock = threading.Lock()
        self.bytes_received = self.bytes_read = 0
        self.failed_ranks: list[int] = []
        tc = reader.transfer_config
        self._piece_config = dataclasses.replace(
            tc, max_concurrency=min(_PIECE_THREADS, tc.max_concurrency)
        )
        self._own: dict[int, Future[torch.Tensor]] = {}
        self._piece, self._view, self._at, self._left = -1, memoryview(b""), 0, 0

    def _fail(self, exc: BaseException) -> None:
        with self._errors_lock:
            if self.error is None:
                self.error = exc

    # -- owner side -------------------------------------------------------------------------
    def _read_piece(self, piece: int) -> torch.Tensor:
        """Read ``piece`` from the store (prefetch thread); a failure is recorded and
        re-raised (the round then raises this rank's flag)."""
        table = self.table
        buf = torch.empty(table.cuts[piece + 1] - table.cuts[piece], dtype=torch.uint8)
        if self.error is not None:
            return buf  # the group stops at the next round: read nothing more
        view = memoryview(buf.numpy())
        spans: dict[str, list[tuple[int, int, tuple[int, str]]]] = {}
        at = 0
        for i, lo, hi in table.segments(piece):
            name, offset, _ = table.spans[i]
            spans.setdefault(name, []).append((offset + lo, offset + hi, (at, table.fqns[i])))
            at += hi - lo

        def on_span(span: Span[tuple[int, str]], rd: SpanReader) -> None:
            dst, fqn = span.payload
            rd.readinto_all(view[dst : dst + span.end - span.start], fqn)

        walk = RangeWalk(
            self.reader.store,
            self.reader.object_key,
            config=self._piece_config,
            on_span=on_span,
            rank=self.rank,
            thread_name_prefix="s3ckpt-fanout-get",
        )
        try:
            walk.run(walk.plan(spans))
        except Exception as exc:
            self._fail(exc)
            raise
        finally:
            with self._errors_lock:
                self.bytes_read += walk.bytes_requested
        return buf

    def _want(self, piece: int) -> None:
        """Start reading ``piece`` (owned by this rank) in the prefetch thread."""
        if piece < self.table.pieces:
            self._own[piece] = self._prefetch.submit(in_context(self._read_piece), piece)

    # -- every rank -------------------------------------------------------------------------
    def run(self, plan: LoadPlan) -> None:
        """Load ``plan``: direct reads, the exchange, the checks; raises on every rank
        when any rank failed."""
        table, group = self.table, self.group
        me = self._me = dist.get_rank(group)
        if table.world != dist.get_world_size(group):
            raise ConfigError(
                f"fan_out: the load has {table.world} ranks but the reader's process group "
                f"{dist.get_world_size(group)}; pass the group dcp.load runs on as "
                "process_group=",
                rank=self.rank,
            )
        if me != self.rank:  # no thread runs yet: the first error
            self.error = ConfigError(
                f"fan_out: this is rank {self.rank} of the load but rank {me} of the "
                "reader's process group; pass the group dcp.load runs on as process_group=",
                rank=self.rank,
            )
        backend = str(dist.get_backend(group)).lower()
        cuda = "nccl" in backend and "gloo" not in backend
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        biggest = max(b - a for a, b in itertools.pairwise(table.cuts))
        self._recv = torch.empty(biggest, dtype=torch.uint8, device=device)
        self._host = torch.empty(biggest, dtype=torch.uint8, pin_memory=True) if cuda else None
        self._flags = torch.zeros(table.world, dtype=torch.int32, device=device)
        self._prefetch = ThreadPoolExecutor(1, thread_name_prefix="s3ckpt-fanout")
        self._want(me)
        direct: threading.Thread | None = None
        aborted = False
        try:
            shared: dict[SpanKey, ItemSpan] = {}
            try:
                rest = self.decoder.group(plan)  # less the shared spans: read directly
                for key in table.spans:
                    if (span := rest.get(key[0], {}).pop(key[1:], None)) is not None:
                        shared[key] = span
                if any(rest.values()):
                    direct = threading.Thread(
                        target=in_context(self._direct), args=(rest,), name="s3ckpt-fanout-direct"
                    )
                    direct.start()
            except Exception as exc:
                self._fail(exc)
            try:
                for key in table.spans:
                    self._left = key[2]
                    try:  # as a direct read would; a failure skips the rest of the span
                        if (needed := shared.get(key)) is not None and self.error is None:
                            decode_span(self.decoder, self, self.reader.object_key(key[0]), needed)
                    except Exception as exc:
                        self._fail(exc)
                    # Pass over what decoding left (a failure), taking part in its broadcasts.
                    left, self._left = self._left, 0
                    while left > 0:
                        left -= len(self._take(left))
            except _Stop as stop:
                if stop.error is not None:
                    raise stop.error from None
                aborted = True
        finally:
            if direct is not None:
                direct.join()
            # Cancel the prefetches not started; wait for the one running.
            self._prefetch.shutdown(wait=True, cancel_futures=True)
        if aborted or self._flags_up(self.error is not None):
            self._raise(me)

    def _direct(self, spans: SpansByObject) -> None:
        try:
            self.reader._read_direct(spans, self.decoder)
        except Exception as exc:
            self._fail(exc)

    def _raise(self, rank: int) -> None:
        """Gather every rank's error and raise one here (all ranks call this)."""
        mine: Any = self.error
        if mine is not None:
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
            f"fan_out: ranks {self.failed_ranks} failed during the load and sent no error",
            rank=rank,
        )

    # -- the stream -------------------------------------------------------------------------
    def _flags_up(self, failed: bool) -> list[int]:
        """All-reduce one flag per rank (ours: ``failed``); the ranks whose flag is up."""
        self._flags.zero_()
        self._flags[self._me] = int(failed)
        dist.all_reduce(self._flags, group=self.group)
        self.failed_ranks = [r for r, f in enumerate(self._flags.tolist()) if f]
        return self.failed_ranks

    def _round(self, first: int) -> None:
        """Open the round of pieces ``first ..``: wait for this rank's piece of it, start
        reading its next one, and all-reduce the flags."""
        mine = first + self._me
        error = False
        if mine in self._own:
            error = self._own[mine].exception() is not None  # recorded by the reading thread
            self._want(mine + self.table.world)
        if _collective(self._flags_up, error or self.error is not None):
            raise _Stop

    def _next(self) -> None:
        """Receive (or send) the next piece; opens a round at each ``world``-th piece."""
        i, table = self._piece + 1, self.table
        if i % table.world == 0:
            self._round(i)
        self._piece = i
        owner, n = table.owner(i), table.cuts[i + 1] - table.cuts[i]
        src = self._own.pop(i).result()[:n] if owner == self._me else None
        # CPU: the broadcast's buffer is the bytes; NCCL: it is the GPU buffer.
        wire = src if src is not None and self._host is None else self._recv[:n]
        if src is not None and wire is not src:
            wire.copy_(src)
        _collective(dist.broadcast, wire, group=self.group, group_src=owner)
        if src is None:
            self.bytes_received += n
            src = wire if self._host is None else self._host[:n].copy_(wire)
        self._view, self._at = memoryview(src.numpy()), 0

    def _take(self, n: int) -> memoryview:
        """Up to ``n`` (> 0) next bytes of the stream, valid until the next call."""
        if self._at >= len(self._view):
            self._next()
        got = self._view[self._at : self._at + n]
        self._at += len(got)
        return got

    def readinto_all(self, view: memoryview, what: str, crc: int = 0) -> int:
        """Fill ``view`` with the current span's next bytes; their CRC32C continued from
        ``crc`` (the decoder's :class:`~s3ckpt.dcp._decode.ByteSource`; its views are bytes)."""
        if len(view) > self._left:
            raise ValueError(f"reading {len(view)} bytes of a span with {self._left} left")
        off = 0
        while off < len(view):
            got = self._take(len(view) - off)
            view[off : off + len(got)] = got
            crc = _crc.crc32c(got, crc)
            off += len(got)
            self._left -= len(got)
        return crc


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
