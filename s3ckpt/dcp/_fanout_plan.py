"""The fan-out table: which stored items several ranks load, cut into pieces, and which rank
reads each piece for the group (:func:`plan_fan_out`, on the coordinator, in
``prepare_global_plan``; the load itself is :mod:`s3ckpt.dcp._fanout`).

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

Logs on ``s3ckpt.dcp._fanout`` (the fan-out logger docs/dcp.md names), at DEBUG, why a
load reads directly when ``fan_out`` is on.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import math
from bisect import bisect_left, bisect_right
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch.distributed as dist
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import LoadPlan

from s3ckpt.config import MiB

if TYPE_CHECKING:
    from s3ckpt.dcp._torch import StorageInfo

__all__ = [
    "DEFAULT_PIECE_SIZE",
    "MIN_PIECE_SIZE",
    "FanOutPlan",
    "SpanKey",
    "build_table",
    "cut_stream",
    "plan_fan_out",
]

log = logging.getLogger("s3ckpt.dcp._fanout")

DEFAULT_PIECE_SIZE = 64 * MiB
# Largest piece one broadcast carries (and one owner reads in one go).

MIN_PIECE_SIZE = 1024
# Smallest ``fan_out_piece_size`` accepted (small pieces are for tests).


_SPREAD_FLOOR = 8 * MiB
# Pieces are about ``total / world`` when that is smaller than the piece size, but not
# smaller than this (S3's advice for ranged GETs is 8-16 MB): a small shared stream is read
# by fewer ranks in fewer, larger GETs.

SpanKey = tuple[str, int, int]
# A shared span: ``(object name, offset, length)``.


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
    spans: tuple[SpanKey, ...]
    fqns: tuple[str, ...]
    cuts: tuple[int, ...]

    @property
    def pieces(self) -> int:
        """How many pieces the stream is cut into."""
        return len(self.cuts) - 1

    def owner(self, piece: int) -> int:
        """The rank that reads ``piece`` from the store for the group."""
        return piece % self.world

    @functools.cached_property
    def _starts(self) -> list[int]:
        return list(itertools.accumulate((length for _, _, length in self.spans), initial=0))

    def segments(self, piece: int) -> list[tuple[int, int, int]]:
        """``(span index, start in span, end in span)`` of each span part in ``piece``."""
        lo, hi = self.cuts[piece], self.cuts[piece + 1]
        starts = self._starts
        found = range(bisect_right(starts, lo) - 1, min(bisect_left(starts, hi), len(self.spans)))
        return [(i, max(lo - starts[i], 0), min(hi, starts[i + 1]) - starts[i]) for i in found]


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
    why = ""
    if not dist.is_available():
        why = "torch.distributed is not available"
    elif not dist.is_initialized():
        why = "no process group is initialised"
    elif dist.get_world_size(group) < 2:
        why = "the process group has one rank"
    elif len(plans) < 2:
        why = "the load has one rank (dcp.load(..., no_dist=True)?)"
    elif len(plans) != dist.get_world_size(group):
        why = (
            f"the load has {len(plans)} ranks but the process group {dist.get_world_size(group)}"
            " (pass the group dcp.load runs on as process_group=)"
        )
    elif any(p.storage_data is not None for p in plans):
        why = "the plans already carry storage_data"
    if why:
        log.debug("s3ckpt: fan_out=True but %s; every rank reads directly", why)
        return plans
    if (table := build_table(plans, storage_data, piece_size=piece_size)) is None:
        log.debug("s3ckpt: fan_out=True but no stored item is read by two ranks")
        return plans
    log.debug(
        "s3ckpt: fan_out: %d shared items, %d bytes in %d pieces over %d ranks",
        len(table.spans),
        table.cuts[-1],
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
    readers: dict[SpanKey, set[int]] = {}
    names: dict[SpanKey, str] = {}
    for rank, plan in enumerate(plans):
        for item in plan.items:
            if (info := storage_data.get(item.storage_index)) is not None:
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


def cut_stream(spans: list[SpanKey], world: int, piece_size: int) -> list[int]:
    """Piece boundaries of the stream of ``spans`` (see the module docs): ``[0, ..., total]``,
    every piece at most ``piece_size`` bytes and none empty."""
    starts = list(itertools.accumulate((length for _, _, length in spans), initial=0))
    total = starts[-1]
    spread = max(math.ceil(total / world), min(_SPREAD_FLOOR, piece_size))
    target = max(1, min(piece_size, spread))
    # Stream offsets where a new object starts.
    boundaries = [starts[i] for i in range(1, len(spans)) if spans[i][0] != spans[i - 1][0]]
    cuts = [0]
    while total - cuts[-1] > target:
        at = cuts[-1] + target
        # The nearest object boundary within a quarter piece: back, or on while the piece
        # stays within piece_size.
        j = bisect_right(boundaries, at)
        near = [b for b in boundaries[max(j - 1, 0) : j + 1] if abs(b - at) <= target // 4]
        near = [b for b in near if cuts[-1] < b < total and b - cuts[-1] <= piece_size]
        cuts.append(min(near, key=lambda b: abs(b - at), default=at))
    cuts.append(total)
    return cuts
