"""The fan-out table (s3ckpt.dcp._fanout_plan): which stored items are shared, how their stream
is cut into pieces, and when no table is made (every rank then reads directly)."""

from __future__ import annotations

import itertools
import logging

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem

from s3ckpt.dcp._fanout_plan import FanOutPlan, build_table, cut_stream, plan_fan_out

span_lists = st.lists(
    st.tuples(st.sampled_from("abcd"), st.integers(0, 10_000), st.integers(1, 5_000)),
    min_size=1,
    max_size=30,
    unique=True,
).map(sorted)


@given(span_lists, st.integers(1, 9), st.integers(1024, 20_000))
def test_pieces_cover_the_stream_within_the_piece_size(
    spans: list[tuple[str, int, int]], world: int, piece_size: int
) -> None:
    cuts = cut_stream(spans, world, piece_size)
    total = sum(n for _, _, n in spans)
    assert cuts[0] == 0 and cuts[-1] == total
    sizes = [b - a for a, b in itertools.pairwise(cuts)]
    assert all(0 < n <= piece_size for n in sizes), sizes
    table = FanOutPlan(world, tuple(spans), ("x",) * len(spans), tuple(cuts))
    # Every byte of every span is in exactly one piece, in stream order.
    got = [(i, lo, hi) for p in range(table.pieces) for i, lo, hi in table.segments(p)]
    pos: dict[int, int] = {}
    for i, lo, hi in got:
        assert lo == pos.get(i, 0) and lo < hi <= spans[i][2]
        pos[i] = hi
    assert pos == {i: n for i, (_, _, n) in enumerate(spans)}


def test_cuts_move_to_object_boundaries_and_spread_over_the_ranks() -> None:
    mib = 1 << 20
    # Four objects of 24 MiB (two items each): world 4 -> one object per rank, one GET each.
    spans = [(name, off, 12 * mib) for name in "abcd" for off in (0, 12 * mib)]
    objects = [0, 24 * mib, 48 * mib, 72 * mib, 96 * mib]
    assert cut_stream(spans, 4, 64 * mib) == objects
    # The piece size bounds the pieces when the ranks are few; cuts still find the objects.
    assert cut_stream(spans, 1, 32 * mib) == objects
    # No cut within a quarter piece of an object boundary: cut where the piece ends.
    assert cut_stream(spans, 1, 20 * mib) == [0, 20 * mib, 40 * mib, 60 * mib, 80 * mib, 96 * mib]
    # A small stream is not spread thinner than 8 MiB pieces.
    assert cut_stream([("a", 0, 4 * mib), ("b", 0, 4 * mib)], 8, 64 * mib) == [0, 8 * mib]


def _item(fqn: str) -> ReadItem:
    index = MetadataIndex(fqn)
    return ReadItem(
        LoadItemType.BYTE_IO, index, torch.Size([]), index, torch.Size([]), torch.Size([])
    )


def _storage(*fqns: str) -> dict[MetadataIndex, _StorageInfo]:
    return {MetadataIndex(f): _StorageInfo("obj", 100 * i, 100) for i, f in enumerate(fqns)}


def test_only_items_two_ranks_read_are_shared() -> None:
    storage = _storage("a", "b", "c")
    plans = [LoadPlan([_item("a"), _item("b")]), LoadPlan([_item("a"), _item("c")])]
    table = build_table(plans, storage, piece_size=1 << 20)
    assert table is not None
    assert table.spans == (("obj", 0, 100),) and table.fqns == ("a",)
    assert table.cuts == (0, 100) and table.owner(0) == 0
    assert build_table([plans[0], LoadPlan([_item("c")])], storage, piece_size=1 << 20) is None


def test_without_a_process_group_the_plans_stay_direct(caplog: pytest.LogCaptureFixture) -> None:
    plans = [LoadPlan([_item("a")]), LoadPlan([_item("a")])]
    with caplog.at_level(logging.DEBUG, logger="s3ckpt.dcp._fanout"):
        out = plan_fan_out(plans, _storage("a"), piece_size=1 << 20, group=None)
    assert out is plans
    assert "no process group is initialised; every rank reads directly" in caplog.text
