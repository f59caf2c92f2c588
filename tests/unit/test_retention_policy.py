"""Unit tests of every retention rule, the planner's invariants and policy files."""

from __future__ import annotations

import math
import pickle
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from s3ckpt.errors import ConfigError, LeaseHeldError, LeaseLostError, PolicyError
from s3ckpt.retention import (
    AllOf,
    AnyOf,
    CheckpointInfo,
    KeepBest,
    KeepCalendar,
    KeepEvery,
    KeepLast,
    KeepPinned,
    KeepWithin,
    RetentionOptions,
    load_policy,
    parse_policy,
    plan,
)
from s3ckpt.retention._catalog import CheckpointState
from s3ckpt.retention._duration import format_duration, parse_duration
from s3ckpt.uri import StoreURL

RUN = StoreURL("s3", "bucket", "runs/a/")
T0 = datetime(2025, 3, 1, tzinfo=UTC)
NOW = T0 + timedelta(days=400)
POLICIES = Path(__file__).resolve().parents[2] / "policies"


def mk(
    step: int | None,
    at: datetime | None = None,
    *,
    metrics: dict[str, float] | None = None,
    state: CheckpointState = CheckpointState.COMMITTED,
    pinned: str | None = None,
    name: str | None = None,
) -> CheckpointInfo:
    name = name or (f"step_{step:09d}" if step is not None else "ckpt")
    return CheckpointInfo(
        url=RUN.child(name),
        name=name,
        step=step,
        state=state,
        committed_at=at if state is not CheckpointState.IN_PROGRESS else None,
        size=100,
        num_objects=3,
        metrics=metrics or {},
        pinned=pinned,
    )


def series(n: int, every: int = 100, hours: float = 1.0) -> list[CheckpointInfo]:
    return [mk((i + 1) * every, T0 + timedelta(hours=hours * i)) for i in range(n)]


def kept(policy, ckpts) -> list[int | None]:  # type: ignore[no-untyped-def]
    sel = policy.select(ckpts, NOW)
    return [c.step for c in ckpts if c.name in sel]


# -- rules -------------------------------------------------------------------------------------
def test_keep_last_keeps_the_newest_n_by_step() -> None:
    ck = series(6)
    assert kept(KeepLast(3), ck) == [400, 500, 600]
    assert KeepLast(3).select(ck, NOW)[ck[-1].name] == ("last 3",)
    assert kept(KeepLast(10), ck) == [c.step for c in ck]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3"])
def test_rules_refuse_bad_counts(bad: object) -> None:
    with pytest.raises(PolicyError):
        KeepLast(bad)  # type: ignore[arg-type]
    with pytest.raises(PolicyError):
        KeepEvery(bad)  # type: ignore[arg-type]
    with pytest.raises(PolicyError):
        KeepBest(bad, "loss")  # type: ignore[arg-type]


def test_keep_every_keeps_the_closest_to_each_multiple() -> None:
    ck = [mk(s, T0 + timedelta(minutes=s)) for s in (0, 300, 900, 1150, 1700, 2100, 2500)]
    sel = KeepEvery(1000).select(ck, NOW)
    # 1000 -> 900 (100 away, vs 1150 150 away); 2000 -> 2100; 3000 -> 2500; 0 and 300 are
    # nearer to step 0, which is not a multiple this rule keeps
    assert [c.step for c in ck if c.name in sel] == [900, 2100, 2500]
    assert sel["step_000000900"] == ("every 1000 steps (step 1000)",)


def test_keep_every_ties_go_to_the_newer_and_stepless_are_ignored() -> None:
    ck = [mk(900, T0), mk(1100, T0 + timedelta(hours=1)), mk(None, T0, name="x")]
    assert kept(KeepEvery(1000), ck) == [1100]


def test_keep_best_min_max_nan_missing_and_ties() -> None:
    vals = [3.0, 1.0, math.nan, 1.0, None, 2.0]
    ck = [
        mk((i + 1) * 10, T0 + timedelta(hours=i), metrics={} if v is None else {"loss": v})
        for i, v in enumerate(vals)
    ]
    # ties (1.0 at steps 20 and 40): the newer (40) wins
    assert kept(KeepBest(1, "loss"), ck) == [40]
    assert kept(KeepBest(2, "loss"), ck) == [20, 40]
    assert kept(KeepBest(1, "loss", mode="max"), ck) == [10]
    assert KeepBest(2, "loss").select(ck, NOW)["step_000000040"] == ("best 2 by loss",)
    # NaN ranks worst, but is still a candidate when there are not enough numbers
    assert kept(KeepBest(5, "loss"), ck) == [10, 20, 30, 40, 60]
    assert kept(KeepBest(5, "loss", nan="skip"), ck) == [10, 20, 40, 60]
    assert kept(KeepBest(6, "loss", missing="worst"), ck) == [10, 20, 30, 40, 50, 60]
    # NaN ranks worst even when maximising
    assert 30 not in kept(KeepBest(4, "loss", mode="max"), ck)


def test_keep_within_is_measured_from_the_newest_not_from_now() -> None:
    ck = series(10, hours=24)  # daily, ending 9 days after T0; NOW is a year later
    assert kept(KeepWithin(timedelta(days=2)), ck) == [800, 900, 1000]
    with pytest.raises(PolicyError):
        KeepWithin(timedelta(0))


def test_keep_calendar_restic_semantics() -> None:
    # two checkpoints a day for 10 days, at 01:00 and 13:00
    ck = []
    for d in range(10):
        for h in (1, 13):
            ck.append(mk(len(ck) + 1, T0 + timedelta(days=d, hours=h)))
    sel = KeepCalendar(daily=3).select(ck, NOW)
    # the newest of each of the last 3 days that have checkpoints
    assert [c.step for c in ck if c.name in sel] == [16, 18, 20]
    assert sel[ck[-1].name] == ("daily (2025-03-10)",)
    # days without checkpoints do not count: drop days 7 and 8
    gap = [c for c in ck if c.committed_at.day not in (8, 9)]  # type: ignore[union-attr]
    assert [c.step for c in gap if c.name in KeepCalendar(daily=3).select(gap, NOW)] == [
        12,
        14,
        20,
    ]
    both = KeepCalendar(hourly=2, daily=2).select(ck, NOW)
    assert both[ck[-1].name] == ("hourly (2025-03-10T13)", "daily (2025-03-10)")
    assert [c.step for c in ck if c.name in both] == [18, 19, 20]


def test_keep_calendar_weekly_monthly_yearly_and_unlimited() -> None:
    ck = [mk(i + 1, T0 + timedelta(days=10 * i)) for i in range(80)]  # ~2.2 years
    months = KeepCalendar(monthly=-1).select(ck, NOW)
    assert len(months) == len({c.committed_at.strftime("%Y-%m") for c in ck})  # type: ignore[union-attr]
    years = KeepCalendar(yearly=5).select(ck, NOW)
    assert [c.committed_at.year for c in ck if c.name in years] == [2025, 2026, 2027]  # type: ignore[union-attr]
    weeks = KeepCalendar(weekly=2).select(ck, NOW)
    assert [c.step for c in ck if c.name in weeks] == [79, 80]
    with pytest.raises(PolicyError):
        KeepCalendar()
    with pytest.raises(PolicyError):
        KeepCalendar(daily=-2)


def test_calendar_uses_commit_time_not_step_order() -> None:
    # a rollback: step 500 was committed before step 300
    ck = [mk(300, T0 + timedelta(days=5)), mk(500, T0 + timedelta(days=1))]
    assert kept(KeepCalendar(daily=1), ck) == [300]


def test_pinned_and_combinators() -> None:
    ck = series(6)
    ck[0] = mk(100, T0, pinned="release v1")
    assert KeepPinned().select(ck, NOW) == {"step_000000100": ("pinned: release v1",)}
    both = KeepLast(2) | KeepEvery(300)
    assert isinstance(both, AnyOf) and len(both.policies) == 2
    assert kept(both, ck) == [300, 500, 600]
    assert both.select(ck, NOW)["step_000000600"] == ("last 2", "every 300 steps (step 600)")
    assert (KeepLast(1) | KeepLast(2) | KeepLast(3)).policies == (
        KeepLast(1),
        KeepLast(2),
        KeepLast(3),
    )
    inter = KeepLast(4) & KeepEvery(200)
    assert isinstance(inter, AllOf)
    assert kept(inter, ck) == [400, 600]
    assert inter.select(ck, NOW)["step_000000400"] == ("last 4 and every 200 steps (step 400)",)
    assert str(KeepLast(3) | (KeepBest(2, "l") & KeepWithin(timedelta(days=1)))) == (
        "last 3 | (best 2 by l & within 1d of newest)"
    )


def test_policies_are_frozen_and_hashable() -> None:
    p = KeepBest(2, "val_loss")
    with pytest.raises(AttributeError):
        p.n = 3  # type: ignore[misc]
    assert hash(KeepLast(3) | KeepEvery(10)) == hash(KeepLast(3) | KeepEvery(10))


# -- plan and its invariants -------------------------------------------------------------------
def test_plan_keeps_newest_pinned_and_never_touches_uncommitted() -> None:
    ck = [
        *series(5),
        mk(50, T0, pinned="paper"),
        mk(900, None, state=CheckpointState.IN_PROGRESS),
        mk(950, T0, state=CheckpointState.ABANDONED),
        mk(990, T0, state=CheckpointState.FOREIGN),
    ]
    p = plan(ck, KeepBest(1, "missing-metric"), NOW, run=RUN)
    assert {c.step for c in p.delete} == {100, 200, 300, 400}
    assert p.keep["step_000000500"] == ("newest committed",)
    assert p.keep["step_000000050"] == ("pinned: paper",)
    assert set(p.skipped) == {"step_000000900", "step_000000950", "step_000000990"}
    assert "in progress" in p.skipped["step_000000900"][0]
    assert p.bytes_freed == 400 and p.objects_deleted == 12
    # decisions are in catalog order (step, commit time) whatever the input order
    assert [d.checkpoint.step for d in p.decisions] == sorted(c.step for c in ck)  # type: ignore[type-var]
    # foreign ones join in when asked (and the newest committed is still the s3ckpt one)
    p2 = plan(ck, KeepLast(1), NOW, options=RetentionOptions(include_foreign=True))
    assert "step_000000990" in p2.keep and "step_000000500" in p2.keep


def test_plan_protects_the_most_recently_committed_after_a_rollback() -> None:
    ck = [mk(100, T0), mk(500, T0 + timedelta(hours=1)), mk(300, T0 + timedelta(hours=2))]
    p = plan(ck, KeepLast(1), NOW)
    assert p.keep == {
        "step_000000300": ("most recently committed",),
        "step_000000500": ("newest committed", "last 1"),
    }


def test_plan_max_delete_defers_the_newest_deletions() -> None:
    ck = series(10)
    p = plan(ck, KeepLast(2), NOW, options=RetentionOptions(max_delete=3))
    assert [c.step for c in p.delete] == [100, 200, 300]
    assert p.deferred == 5
    assert all("max_delete" in r[0] for r in p.skipped.values())
    assert plan(ck, KeepLast(2), NOW, options=RetentionOptions(max_delete=0)).delete == ()
    with pytest.raises(PolicyError):
        plan(ck, KeepLast(2), NOW, options=RetentionOptions(max_delete=-1))


def test_empty_policies_are_refused() -> None:
    for empty in (AnyOf(()), AllOf(()), KeepPinned(), AnyOf((KeepPinned(),))):
        with pytest.raises(PolicyError, match="no keep rule"):
            plan(series(3), empty, NOW)


def test_plan_to_dict_is_json_ready() -> None:
    import json

    p = plan([mk(1, T0, metrics={"l": math.nan})], KeepLast(1), NOW, run=RUN)
    doc = json.loads(json.dumps(p.to_dict(), allow_nan=False))
    assert doc["decisions"][0]["metrics"] == {"l": "nan"}
    assert doc["decisions"][0]["reasons"] == ["newest committed", "last 1"]


# -- policy files ------------------------------------------------------------------------------
def test_every_file_in_policies_loads() -> None:
    files = sorted(POLICIES.glob("*.toml"))
    names = {f.name for f in files}
    assert {"keep-last-3.toml", "pretraining.toml", "finetuning.toml", "archive.toml"} <= names
    for f in files:
        assert f.read_text().startswith("#"), f"{f.name} must start with a documenting comment"
        policy = load_policy(f)
        plan(series(50, hours=7), policy, NOW)  # and plans


def test_ready_made_policies_mean_what_they_say() -> None:
    assert load_policy(POLICIES / "keep-last-3.toml") == KeepLast(3)
    assert load_policy(POLICIES / "finetuning.toml") == AnyOf(
        (KeepLast(2), KeepWithin(timedelta(hours=6)), KeepBest(2, "eval_loss"))
    )
    assert load_policy(POLICIES / "archive.toml") == AnyOf(
        (KeepCalendar(monthly=12, yearly=-1), KeepPinned())
    )


def test_parse_policy_full_format() -> None:
    text = """
    description = "x"
    [keep]
    last = 3
    every = 1000
    within = "1d12h"
    pinned = true
    [[keep.best]]
    metric = "val_loss"
    n = 2
    [[keep.best]]
    metric = "acc"
    mode = "max"
    nan = "skip"
    missing = "worst"
    [keep.calendar]
    daily = 7
    yearly = -1
    """
    p = parse_policy(text)
    assert isinstance(p, AnyOf)
    assert p.policies == (
        KeepLast(3),
        KeepEvery(1000),
        KeepWithin(timedelta(hours=36)),
        KeepBest(2, "val_loss"),
        KeepBest(1, "acc", mode="max", nan="skip", missing="worst"),
        KeepCalendar(daily=7, yearly=-1),
        KeepPinned(),
    )


@pytest.mark.parametrize(
    ("text", "key", "hint"),
    [
        ("[keep]\nlats = 3\n", "keep.lats", "allowed here: last, every"),
        ("[keep]\nlast = '3'\n", "keep.last", "positive integer"),
        ("[keep]\nlast = 0\n", "keep.last", "positive integer"),
        ("[keep]\nlast = true\n", "keep.last", "positive integer"),
        ("[keep]\nwithin = '7 days'\n", "keep.within", "unit s, m, h, d or w"),
        ("[keep]\nwithin = 7\n", "keep.within", "duration string"),
        ("[keep.best]\nn = 2\n", "keep.best.metric", "required"),
        ("[keep.best]\nmetric = 'l'\nmode = 'low'\n", "keep.best.mode", "'min' or 'max'"),
        (
            "[[keep.best]]\nmetric = 'l'\n[[keep.best]]\nmetric = 'm'\nnn = 1\n",
            "keep.best[1].nn",
            "allowed",
        ),
        ("[keep.calendar]\ndaly = 7\n", "keep.calendar.daly", "allowed here: hourly"),
        ("[keep.calendar]\ndaily = 0\n", "keep.calendar", "non-zero"),
        ("[keep]\n", "keep", "no rule"),
        ("[keep]\npinned = true\n", "keep", "no rule"),
        ("description = 'x'\n", "keep", "missing"),
        ("[keeep]\nlast = 1\n", "keeep", "allowed here: description, keep"),
        ("keep = 3\n", "keep", "table"),
    ],
)
def test_parse_policy_errors_name_file_key_and_what_is_allowed(
    text: str, key: str, hint: str
) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, source="pol.toml")
    msg = str(info.value)
    assert msg.startswith(f"pol.toml: {key}:"), msg
    assert hint in msg
    assert info.value.field == key and info.value.source == "pol.toml"
    assert isinstance(info.value, ConfigError)


def test_parse_policy_bad_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match=r"^p\.toml: not valid TOML"):
        parse_policy("[keep\nlast=1", source="p.toml")
    with pytest.raises(PolicyError, match="cannot read the policy file"):
        load_policy(tmp_path / "nope.toml")


def test_durations() -> None:
    assert parse_duration("90s") == timedelta(seconds=90)
    assert parse_duration("1d12h") == timedelta(hours=36)
    assert parse_duration("2w") == timedelta(days=14)
    assert parse_duration("1.5h") == timedelta(minutes=90)
    for bad in ("", "7", "7 days", "-1d", "1y", "d"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    assert format_duration(timedelta(hours=36)) == "1d12h"
    assert format_duration(timedelta(0)) == "0s"


def test_errors_pickle_with_their_attributes() -> None:
    for err in (
        PolicyError("bad", source="f.toml", field="keep.last"),
        LeaseHeldError("held", bucket="b", key="r/s3ckpt.lease", holder="h:1:x", expires=5.0),
        LeaseLostError("lost", key="k"),
    ):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err)
        assert back.__dict__ == err.__dict__


@pytest.mark.parametrize("mode", ["min", "max"])
def test_keep_best_nan_is_worst_both_ways_and_infinities_rank_by_value(mode: str) -> None:
    vals = [math.nan, math.inf, -math.inf, 1.0, math.nan]
    ck = [
        mk((i + 1) * 10, T0 + timedelta(hours=i), metrics={"loss": v}) for i, v in enumerate(vals)
    ]
    order = [30, 40, 20] if mode == "min" else [20, 40, 30]  # -inf is the best loss
    for n in (1, 2, 3):
        assert kept(KeepBest(n, "loss", mode=mode), ck) == sorted(order[:n])  # type: ignore[arg-type]
    # NaN comes last in both directions; between NaNs the newer wins
    assert kept(KeepBest(4, "loss", mode=mode), ck) == sorted([*order, 50])  # type: ignore[arg-type]
    assert kept(KeepBest(5, "loss", mode=mode, nan="skip"), ck) == [20, 30, 40]  # type: ignore[arg-type]
