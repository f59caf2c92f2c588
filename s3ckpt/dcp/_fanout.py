"""Fan-out load: each byte range that several ranks load is read from the store once per
process group and shared over it (``S3StorageReader(..., fan_out=True)``).

Who reads what is decided once, on the coordinator, from every rank's plan
(:func:`~s3ckpt.dcp._fanout_plan.plan_fan_out`, called by ``prepare_global_plan``): the
stored items two or more ranks read (*shared spans*) form one byte *stream*, cut into
*pieces*; piece ``i`` is read from the store by rank ``i % world`` (its *owner*) and
broadcast to the group (:mod:`s3ckpt.dcp._fanout_plan`). The table
(:class:`~s3ckpt.dcp._fanout_plan.FanOutPlan`) goes into every rank's
``LoadPlan.storage_data``, so all ranks follow the same one.

:class:`FanOutRead` (``read_data``) then, on every rank: starts the rank's direct reads in
a thread (the reader's ordinary :class:`~s3ckpt.transfer.RangeWalk` path, handed in as
``read_direct``); prefetches the pieces it owns, one ahead, in another thread; and walks the
shared spans in stream order, pulling the stream piece by piece
(:class:`~s3ckpt.dcp._fanout_stream.Exchange`). Every piece is one broadcast from its
owner, and pieces go in rounds of ``world`` pieces (one per owner, read in parallel), each
round opened by an all-reduce of an error flag per rank. A span the rank loads is decoded
from the stream by the :class:`~s3ckpt.dcp._decode.SpanDecoder` a direct read uses: the
same CRC32C check against ``s3ckpt.json``, the same framing check, the same
``resolve_tensor`` / ``commit_tensor`` / ``load_bytes``. So every rank that loads an item
checks its checksum itself (owners of a piece hold only bytes, not items); a corrupted
broadcast fails like a corrupted object. A span the rank does not load is skipped (the rank
still takes part in every broadcast).

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

The reader module is not imported here: what fan-out needs of the reader (its decoder, its
direct reads, its store and names) is handed to :class:`FanOutRead`.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner

from s3ckpt.config import TransferConfig
from s3ckpt.dcp._decode import ItemSpan, SpanDecoder, SpansByObject
from s3ckpt.dcp._fanout_plan import FanOutPlan, SpanKey
from s3ckpt.dcp._fanout_stream import Aborted, Broken, Exchange, Stop, StreamSpan
from s3ckpt.errors import CheckpointError, ConfigError, S3CkptError
from s3ckpt.metrics.instrument import in_context
from s3ckpt.store import ObjectStore
from s3ckpt.transfer import RangeWalk, SpanReader
from s3ckpt.transfer import Span as WalkSpan

__all__ = ["FanOutRead"]

_PIECE_THREADS = 4
"""Threads of an owner's piece read. Its direct reads run at the same time on
``max_concurrency`` threads; the store's connection pool has ``max_concurrency + 4``."""


class FanOutRead:
    """``read_data`` of one rank in a fan-out load (see the module docs).

    Args:
        table: The coordinator's table from this rank's plan.
        planner: DCP's load planner.
        lock: Guards ``planner`` (shared with the direct reads).
        decoder: The rank's span decoder (its spans, checks and decoding).
        read_direct: Reads spans from the store into the planner (the reader's direct read);
            runs in a thread beside the exchange.
        store: The store the pieces this rank owns are read from.
        object_key: An object's key by its ``.metadata`` name.
        transfer_config: The reader's; a piece is read on at most 4 of its threads.
        rank: This rank of the load.
        group: The process group of the collectives (``None``: the default group).

    After :meth:`run` (raised or not): ``bytes_read``, the bytes this rank requested for
    the pieces it owns; ``bytes_received``, the bytes it received from other ranks.
    """

    def __init__(
        self,
        table: FanOutPlan,
        planner: LoadPlanner,
        lock: threading.Lock,
        *,
        decoder: SpanDecoder,
        read_direct: Callable[[SpansByObject], None],
        store: ObjectStore,
        object_key: Callable[[str], str],
        transfer_config: TransferConfig,
        rank: int,
        group: dist.ProcessGroup | None,
    ) -> None:
        self.table = table
        self.planner = planner
        self.lock = lock
        self.decoder = decoder
        self.group = group
        self.rank = rank
        self._read_direct = read_direct
        self._errors_lock = threading.Lock()
        self.error: BaseException | None = None
        self.bytes_received = 0
        self.bytes_read = 0
        self._store, self._key_of = store, object_key
        self._piece_config = dataclasses.replace(
            transfer_config, max_concurrency=min(_PIECE_THREADS, transfer_config.max_concurrency)
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

    # -- every rank -------------------------------------------------------------------------
    def run(self, plan: LoadPlan) -> None:
        """Load ``plan``: direct reads, the exchange, the checks; raises on every rank
        when any rank failed."""
        table = self.table
        rank = dist.get_rank(self.group)
        if table.world != dist.get_world_size(self.group):
            raise ConfigError(
                f"fan_out: the load has {table.world} ranks but the reader's process group "
                f"{dist.get_world_size(self.group)}; pass the group dcp.load runs on as "
                "process_group=",
                rank=self.rank,
            )
        if rank != self.rank:
            self._fail(
                ConfigError(
                    f"fan_out: this is rank {self.rank} of the load but rank {rank} of the "
                    "reader's process group; pass the group dcp.load runs on as process_group=",
                    rank=self.rank,
                )
            )
        stream = Exchange(table, rank, self.group, self._read_piece, self._failed)
        direct: threading.Thread | None = None
        aborted = False
        try:
            shared: dict[SpanKey, ItemSpan] = {}
            try:
                per_object = self.decoder.group(plan)
                keys = set(table.spans)
                rest: SpansByObject = {}
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
            except Aborted:
                aborted = True
            except Broken as exc:
                raise exc.error from None
        finally:
            if direct is not None:
                direct.join()
            stream.close()
            self.bytes_received = stream.bytes_received
        if not aborted:
            aborted = stream.final_check()
        if aborted:
            self._raise(stream.failed_ranks, rank)

    def _direct(self, spans: SpansByObject) -> None:
        try:
            self._read_direct(spans)
        except Exception as exc:
            self._fail(exc)

    def _decode(self, stream: Exchange, i: int, span: ItemSpan) -> None:
        """Decode span ``i`` from the stream into the planner, as a direct read would; a
        failure is recorded and the rest of the span skipped."""
        name = self.table.spans[i][0]
        source = StreamSpan(stream, self.table.spans[i][2])
        try:
            self.decoder.decode(source, self._key_of(name), span, self.planner, self.lock)
        except Stop:
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
