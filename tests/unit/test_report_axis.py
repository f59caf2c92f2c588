"""The report chart's x axes for one checkpoint (issue 28): step 0 runs from 0 to 1, never
from -1; a single step sits in the middle; ticks are whole steps."""

from __future__ import annotations

from s3ckpt.tools._report._svg import _step_axis, _time_range


def test_one_checkpoint_at_step_0_has_no_negative_step() -> None:
    lo, hi, ticks = _step_axis([0.0])
    assert (lo, hi) == (0.0, 1.0)
    assert ticks == [0.0, 1.0]


def test_one_step_is_centred_with_whole_ticks() -> None:
    lo, hi, ticks = _step_axis([5.0, 5.0])  # the same step saved twice
    assert (lo, hi) == (4.0, 6.0) and lo < 5.0 < hi
    assert ticks == [4.0, 5.0, 6.0]
    lo, hi, ticks = _step_axis([1000.0])
    assert (lo + hi) / 2 == 1000.0 and 1000.0 in ticks
    assert all(t >= 0 and t == int(t) for t in ticks)


def test_many_steps_keep_their_range_and_only_whole_ticks() -> None:
    lo, hi, ticks = _step_axis([1.0, 2.0])
    assert (lo, hi) == (1.0, 2.0)
    assert ticks == [1.0, 2.0]  # not 1.125, 1.25, ...
    lo, hi, ticks = _step_axis([0.0, 100.0, 400.0])
    assert (lo, hi) == (0.0, 400.0) and ticks[0] == 0.0 and ticks[-1] == 400.0
    assert _step_axis([]) == (0.0, 1.0, [])


def test_one_commit_time_is_centred_in_an_hour() -> None:
    t = 1.7e9
    assert _time_range([t]) == (t - 1800.0, t + 1800.0)
    assert _time_range([t, t + 60]) == (t, t + 60)
