"""Property tests: the planner's invariants hold for any catalog and any policy."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from s3ckpt.retention import (
    CheckpointInfo,
    KeepBest,
    KeepCalendar,
    KeepEvery,
    KeepLast,
    KeepPinned,
    KeepWithin,
    Policy,
    RetentionOptions,
    plan,
)
from s3ckpt.retention._catalog import CheckpointState
from s3ckpt.uri import StoreURL

RUN = StoreURL("s3", "bucket", "runs/p/")
T0 = datetime(2024, 12, 20, tzinfo=UTC)
NOW = T0 + timedelta(days=800)

PROPS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

metric_values = st.one_of(
    st.none(),
    st.just(math.nan),
    st.floats(min_value=-10, max_value=10, allow_nan=False),
    st.sampled_from([0.0, 1.0, 2.0]),  # plenty of ties
)


STATES = [CheckpointState.COMMITTED] * 4 + [
    CheckpointState.IN_PROGRESS,
    CheckpointState.ABANDONED,
    CheckpointState.FOREIGN,
]

rows = st.tuples(
    st.sampled_from(STATES),
    st.one_of(st.none(), st.integers(0, 3000)),  # step
    st.one_of(st.none(), st.integers(0, 700 * 24 * 60)),  # commit minute
    metric_values,
    st.booleans(),  # pinned
    st.integers(0, 1000),  # size
    st.integers(0, 9),  # 0: a live save (an overwrite, if committed) writes into it
)


def _build(table: list[tuple]) -> list[CheckpointInfo]:  # type: ignore[type-arg]
    return [
        CheckpointInfo(
            url=RUN.child(f"c{i}"),
            name=f"c{i}",
            step=step,
            state=state,
            committed_at=None if minutes is None else T0 + timedelta(minutes=minutes),
            size=size,
            num_objects=3,
            metrics={} if value is None else {"loss": value},
            pinned="keep me" if pinned else None,
            tag="00000000" if state is CheckpointState.COMMITTED else None,
            live_tags=("ffffffff",) if live == 0 else (),
        )
        for i, (state, step, minutes, value, pinned, size, live) in enumerate(table)
    ]


catalogs = st.lists(rows, max_size=25).map(_build)

leaves = st.one_of(
    st.builds(KeepLast, st.integers(1, 6)),
    st.builds(KeepEvery, st.integers(1, 1500)),
    st.builds(
        KeepBest,
        st.integers(1, 4),
        st.sampled_from(["loss", "other"]),
        st.sampled_from(["min", "max"]),
        st.sampled_from(["worst", "skip"]),
        st.sampled_from(["skip", "worst"]),
    ),
    st.builds(KeepWithin, st.integers(1, 90 * 24).map(lambda h: timedelta(hours=h))),
    st.tuples(*[st.integers(-1, 4)] * 5).map(
        lambda t: KeepCalendar(*t) if any(t) else KeepCalendar(daily=1)
    ),
    st.just(KeepPinned()),
)


def _fold(parts: tuple[list[Policy], list[bool]]) -> Policy:
    rules, ors = parts
    policy = rules[0]
    for rule, use_or in zip(rules[1:], ors, strict=False):
        policy = policy | rule if use_or else policy & rule
    return policy


def _valid(p: Policy) -> bool:
    return any(not isinstance(r, KeepPinned) for r in p.rules())


# Nested combinations of up to 4 rules with | and &. A policy of nothing but KeepPinned is
# refused as empty (tested in test_retention_policy), so it is filtered out here.
safe_policies = (
    st.tuples(
        st.lists(leaves, min_size=1, max_size=4), st.lists(st.booleans(), min_size=3, max_size=3)
    )
    .map(_fold)
    .filter(_valid)
)


def _eligible(c: CheckpointInfo, foreign: bool) -> bool:
    return c.state is CheckpointState.COMMITTED or (foreign and c.state is CheckpointState.FOREIGN)


@PROPS
@given(
    catalogs,
    safe_policies,
    st.one_of(st.none(), st.integers(0, 10)),
    st.booleans(),
)
def test_invariants_hold_for_any_catalog_and_policy(
    cat: list[CheckpointInfo], policy: Policy, max_delete: int | None, foreign: bool
) -> None:
    p = plan(
        cat, policy, NOW, options=RetentionOptions(max_delete=max_delete, include_foreign=foreign)
    )
    deleted = {c.name for c in p.delete}
    # every checkpoint gets exactly one decision
    assert sorted(d.checkpoint.name for d in p.decisions) == sorted(c.name for c in cat)
    # only eligible, unpinned checkpoints are deleted
    for c in p.delete:
        assert _eligible(c, foreign) and not c.pinned
    # the newest committed checkpoint (by step, then commit time) survives any policy
    committed = sorted(
        (c for c in cat if c.state is CheckpointState.COMMITTED), key=CheckpointInfo.sort_key
    )
    if committed:
        assert committed[-1].name not in deleted
        timed = [c for c in committed if c.committed_at is not None]
        if timed:
            newest_commit = max(timed, key=lambda c: (c.committed_at, c.sort_key()))
            assert newest_commit.name not in deleted
    # in-progress checkpoints are never deleted, whatever the flags, nor one being overwritten
    assert not any(c.state is CheckpointState.IN_PROGRESS for c in p.delete)
    assert not any(c.overwrite_in_progress for c in p.delete)
    # every keep has a reason; --max-delete caps the run
    assert all(reasons for reasons in p.keep.values())
    if max_delete is not None:
        assert len(deleted) <= max_delete
    # the plan does not depend on the catalog's input order
    again = plan(
        list(reversed(cat)),
        policy,
        NOW,
        options=RetentionOptions(max_delete=max_delete, include_foreign=foreign),
    )
    assert again.decisions == p.decisions


@PROPS
@given(catalogs, safe_policies, st.booleans())
def test_planning_is_idempotent(cat: list[CheckpointInfo], policy: Policy, foreign: bool) -> None:
    first = plan(cat, policy, NOW, options=RetentionOptions(include_foreign=foreign))
    gone = {c.name for c in first.delete}
    rest = [c for c in cat if c.name not in gone]
    second = plan(rest, policy, NOW, options=RetentionOptions(include_foreign=foreign))
    assert second.delete == ()
    # What the first run kept stays kept. The second may keep *more*: a checkpoint the first
    # run skipped (e.g. no step) can fall inside a rank-based rule (KeepLast) once the
    # deleted ones are gone, and be kept by the rest of an AllOf; it was never deleted.
    assert set(second.keep) >= set(first.keep)


@PROPS
@given(catalogs, safe_policies, safe_policies, st.booleans())
def test_adding_a_keep_rule_never_deletes_more(
    cat: list[CheckpointInfo], policy: Policy, extra: Policy, foreign: bool
) -> None:
    base = {
        c.name
        for c in plan(cat, policy, NOW, options=RetentionOptions(include_foreign=foreign)).delete
    }
    more = {
        c.name
        for c in plan(
            cat, policy | extra, NOW, options=RetentionOptions(include_foreign=foreign)
        ).delete
    }
    assert more <= base
    assert {
        c.name
        for c in plan(
            cat, extra | policy, NOW, options=RetentionOptions(include_foreign=foreign)
        ).delete
    } == more


@PROPS
@given(catalogs, safe_policies, st.integers(0, 5))
def test_max_delete_takes_the_oldest_of_the_full_plan(
    cat: list[CheckpointInfo], policy: Policy, cap: int
) -> None:
    full = plan(cat, policy, NOW).delete
    capped = plan(cat, policy, NOW, options=RetentionOptions(max_delete=cap))
    assert capped.delete == full[:cap]
    assert capped.deferred == max(0, len(full) - cap)


def _calendar_by_walking(rule: KeepCalendar, cps: list[CheckpointInfo]) -> dict[str, list[str]]:
    """restic's ``forget`` done literally: for each bucket kind, walk every checkpoint
    newest first and keep the first one seen of each new period, ``n`` periods."""
    keys = {
        "hourly": lambda t: t.strftime("%Y-%m-%dT%H"),
        "daily": lambda t: t.strftime("%Y-%m-%d"),
        "weekly": lambda t: "{:04d}-W{:02d}".format(*t.isocalendar()[:2]),
        "monthly": lambda t: t.strftime("%Y-%m"),
        "yearly": lambda t: t.strftime("%Y"),
    }
    walk = sorted(
        ((c.committed_at, i, c) for i, c in enumerate(cps) if c.committed_at),
        key=lambda x: (x[0], x[1]),
        reverse=True,
    )
    out: dict[str, list[str]] = {}
    for kind, key in keys.items():
        left, last = getattr(rule, kind), None
        for t, _, c in walk:
            if left == 0:
                break
            if key(t) != last:
                last = key(t)
                out.setdefault(c.name, []).append(f"{kind} ({last})")
                left -= 1
    return out


# Commit times a few minutes to a few months apart, across year and ISO-week boundaries.
calendar_catalogs = st.lists(
    st.tuples(st.integers(0, 3 * 365 * 24 * 60), st.integers(0, 3)), max_size=40
).map(
    lambda rows: [
        CheckpointInfo(
            url=RUN.child(f"c{i}"),
            name=f"c{i}",
            step=i,
            state=CheckpointState.COMMITTED,
            # Coarse minutes make commit-time ties (the newer index must win them).
            committed_at=T0 + timedelta(minutes=m - m % (60 * coarse if coarse else 1)),
            size=1,
            num_objects=1,
        )
        for i, (m, coarse) in enumerate(rows)
    ]
)


@PROPS
@given(
    calendar_catalogs,
    st.tuples(*[st.integers(-1, 6)] * 5).filter(any),
)
def test_calendar_matches_a_literal_newest_first_walk(
    cps: list[CheckpointInfo], counts: tuple[int, int, int, int, int]
) -> None:
    rule = KeepCalendar(*counts)
    got = {k: list(v) for k, v in rule.select(cps, NOW).items()}
    assert got == _calendar_by_walking(rule, cps)


# Metrics as s3ckpt.json now stores them: any float, NaN and +-inf included, or missing.
any_metric = st.one_of(
    st.none(),
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0]),  # ties and specials
    st.floats(allow_nan=True, allow_infinity=True),
)


def _best_by_sorting(
    values: list[float | None], n: int, mode: str, nan: str, missing: str
) -> set[str]:
    """KeepBest spelled out: numbers by value (+-inf included), the newer first on ties;
    then, worst of all in either direction, NaN (``nan="worst"``) and missing metrics
    (``missing="worst"``), the newer first; the first ``n`` are kept."""
    numbers, worst = [], []
    for i, v in enumerate(values):
        if v is None:
            if missing == "worst":
                worst.append(i)
        elif math.isnan(v):
            if nan == "worst":
                worst.append(i)
        else:
            numbers.append((v if mode == "min" else -v, -i))
    order = [-i for _, i in sorted(numbers)] + sorted(worst, reverse=True)
    return {f"c{i}" for i in order[:n]}


@PROPS
@given(
    st.lists(any_metric, max_size=30),
    st.integers(1, 8),
    st.sampled_from(["min", "max"]),
    st.sampled_from(["worst", "skip"]),
    st.sampled_from(["skip", "worst"]),
)
def test_keep_best_ranks_nan_worst_both_ways_and_infinities_by_value(
    values: list[float | None], n: int, mode: str, nan: str, missing: str
) -> None:
    cps = [
        CheckpointInfo(
            url=RUN.child(f"c{i}"),
            name=f"c{i}",
            step=i,
            state=CheckpointState.COMMITTED,
            committed_at=T0 + timedelta(minutes=i),
            size=1,
            num_objects=1,
            metrics={} if v is None else {"loss": v},
        )
        for i, v in enumerate(values)
    ]
    rule = KeepBest(n, "loss", mode, nan, missing)  # type: ignore[arg-type]
    kept = set(rule.select(cps, NOW))
    assert kept == _best_by_sorting(values, n, mode, nan, missing)
    numbers = [i for i, v in enumerate(values) if v is not None and not math.isnan(v)]
    nans = [i for i, v in enumerate(values) if v is not None and math.isnan(v)]
    # a NaN is kept only when every number is kept already, whichever the direction
    if any(f"c{i}" in kept for i in nans):
        assert all(f"c{i}" in kept for i in numbers)
    # the best infinity wins over every finite number; the worst loses to all of them
    best_inf, worst_inf = (-math.inf, math.inf) if mode == "min" else (math.inf, -math.inf)
    if any(values[i] == best_inf for i in numbers):
        assert any(values[int(k[1:])] == best_inf for k in kept)
    if any(f"c{i}" in kept for i in numbers if values[i] == worst_inf):
        assert all(f"c{i}" in kept for i in numbers if values[i] != worst_inf)
