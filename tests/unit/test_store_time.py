"""Issue 27 items 2 and 3 on a MemoryStore whose clock is the store's: every age is measured
in the store's time, a host clock further off than the grace period is refused (gc, prune,
rm) or reported (ls, report, dry runs), lease expiry never compares two hosts' clocks, and
retention orders checkpoints by when the store took their commit, not by the writer's clock.
"""

from __future__ import annotations

import types
from datetime import UTC, datetime, timedelta

import pytest

from s3ckpt.cli import main
from s3ckpt.errors import ClockSkewError, LeaseHeldError
from s3ckpt.format._names import LEASE_NAME, MANIFEST_NAME, heartbeat_name
from s3ckpt.retention import (
    KeepCalendar,
    KeepLast,
    KeepWithin,
    RetentionOptions,
    delete_checkpoint,
    gc,
    list_checkpoints,
    plan,
    prune,
)
from s3ckpt.retention._lease import Lease, LeaseRecord
from s3ckpt.store import Location, MemoryStore
from s3ckpt.store._clock import StoreTime, check_skew, skew_note, store_time
from s3ckpt.uri import StoreURL
from tests._retention_util import (
    Clock,
    ckpt_name,
    clock_and_store_fixtures,
    keys_under,
    write_checkpoint,
)

T0 = datetime(2025, 3, 1, tzinfo=UTC)
RUN = StoreURL("memory", "b", "runs/a/")
HOUR = 3600.0
DAY = 86400.0

clock, store = clock_and_store_fixtures(T0)


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch, clock: Clock) -> list[float]:
    """This host's clock, as an offset from the store's: ``host[0] = 2 * HOUR`` is a host
    two hours fast."""
    offset = [0.0]
    fake = types.SimpleNamespace(time=lambda: clock.t + offset[0])
    monkeypatch.setattr("s3ckpt.store._clock.time", fake)
    return offset


def test_store_time_reads_the_store_clock_and_the_skew(store: MemoryStore, host: list[float]):
    host[0] = -2 * DAY
    t = store_time(store)
    assert t.store == T0 and t.skew == timedelta(days=-2) and t.measured
    check_skew(t, timedelta(days=3), action="gc")
    with pytest.raises(ClockSkewError) as info:
        check_skew(t, timedelta(hours=2), action="gc")
    msg = str(info.value)
    assert "\n" not in msg and "NTP" in msg and "2d behind" in msg and "gc" in msg
    assert "2025-02-27T00:00:00Z" in msg and "2025-03-01T00:00:00Z" in msg  # both clocks
    assert info.value.skew == -2 * DAY and info.value.limit == 2 * HOUR


def test_a_store_without_a_clock_is_this_hosts(tmp_path: object) -> None:
    from s3ckpt.store import open_store

    fs, _ = open_store(f"file://{tmp_path}/x/")
    t = store_time(fs)
    assert t.skew == timedelta(0) and not t.measured
    assert skew_note(t, timedelta(seconds=1)) is None


def test_gc_on_a_fast_host_keeps_a_live_save(store: MemoryStore, clock: Clock, host: list[float]):
    # The save's last heartbeat is 30 min old in the store's time; this host is 90 min
    # fast. Judged by the host clock it would look 2 h old, past the default grace.
    tag = "a1a1a1a1"
    live = write_checkpoint(store, RUN, 2, created=clock.t, commit=False, metadata=False, tag=tag)
    store.put(live.key(heartbeat_name(tag, 0)), b"")
    clock.t += 30 * 60
    host[0] = 90 * 60
    r = gc(Location.of(RUN, store=store), apply=True)
    assert r.ok and r.abandoned == () and len(keys_under(store, live.prefix)) == 4
    (c,) = list_checkpoints(Location.of(RUN, store=store))
    assert c.live_tags == (tag,)


@pytest.mark.parametrize("offset", [3 * 60.0, -3 * 60.0, 2 * HOUR + 60, -3 * HOUR])
def test_apply_refuses_a_host_clock_further_off_than_the_grace(
    store: MemoryStore, clock: Clock, host: list[float], offset: float
) -> None:
    grace = timedelta(minutes=1) if abs(offset) < HOUR else timedelta(hours=2)
    write_checkpoint(store, RUN, 1, created=clock.t)
    write_checkpoint(store, RUN, 2, created=clock.t, commit=False, metadata=False)
    clock.t += DAY
    before = set(store.objects)
    host[0] = offset
    with pytest.raises(ClockSkewError, match="NTP"):
        gc(Location.of(RUN, store=store), apply=True, options=RetentionOptions(grace=grace))
    with pytest.raises(ClockSkewError):
        prune(
            Location.of(RUN, store=store),
            KeepLast(1),
            apply=True,
            options=RetentionOptions(grace=grace),
        )
    with pytest.raises(ClockSkewError):
        delete_checkpoint(
            Location.of(RUN.child(ckpt_name(1)), store=store),
            allow_newest=True,
            options=RetentionOptions(grace=grace),
        )
    assert set(store.objects) == before  # nothing deleted, no lease taken
    # Dry runs plan in the store's time and say so; an explicit now is the caller's.
    assert any(
        "NTP" in n
        for n in gc(Location.of(RUN, store=store), options=RetentionOptions(grace=grace)).notes
    )
    assert any(
        "NTP" in n
        for n in prune(
            Location.of(RUN, store=store), KeepLast(1), options=RetentionOptions(grace=grace)
        ).notes
    )
    now = datetime.fromtimestamp(clock.t, UTC)
    assert gc(
        Location.of(RUN, store=store), apply=True, options=RetentionOptions(grace=grace, now=now)
    ).ok


def test_the_cli_exits_5_on_skew_and_ls_only_warns(
    store: MemoryStore,
    clock: Clock,
    host: list[float],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import s3ckpt._cli as cli_mod

    monkeypatch.setattr(
        cli_mod, "open_location", lambda args, target, **kw: Location.of(target, store=store)
    )
    write_checkpoint(store, RUN, 1, created=clock.t)
    host[0] = 3 * HOUR
    assert main(["gc", str(RUN), "--apply"]) == 5
    assert main(["prune", str(RUN), "--policy", "keep-last-3", "--apply"]) == 5
    assert main(["rm", str(RUN.child(ckpt_name(1))), "--allow-newest"]) == 5
    err = capsys.readouterr().err
    assert err.count("NTP") == 3 and "3h ahead of" in err
    assert main(["ls", str(RUN)]) == 0
    out = capsys.readouterr()
    assert ckpt_name(1) in out.out and "warning" in out.err and "NTP" in out.err
    assert main(["prune", str(RUN), "--policy", "keep-last-3"]) == 0  # a dry run warns
    assert "NTP" in capsys.readouterr().err
    assert store.head(RUN.child(ckpt_name(1)).key(MANIFEST_NAME)) is not None


def test_ls_and_prune_default_to_the_store_time(
    store: MemoryStore, clock: Clock, host: list[float]
) -> None:
    write_checkpoint(store, RUN, 1, created=clock.t)
    r = prune(Location.of(RUN, store=store), KeepLast(1))
    assert r.plan.now == T0 and r.notes == ()
    assert StoreTime(T0, T0).skew == timedelta(0)


# -- the lease: expiry in the store's time -----------------------------------------------------
def _holder(expires: float) -> bytes:
    return LeaseRecord(
        "other", "elsewhere", 1, "x", 0.0, expires, boot="b", start=1, ttl=300.0
    ).to_json()


def test_a_lease_from_a_slow_host_is_held_while_fresh_in_store_time(
    store: MemoryStore, clock: Clock
) -> None:
    # The holder's clock is two hours slow: its own ``expires`` is long past on every
    # other clock, but it wrote the lease a minute ago (store time): it holds.
    store.put(RUN.key(LEASE_NAME), _holder(clock.t - 2 * HOUR + 300))
    clock.t += 60
    with pytest.raises(LeaseHeldError) as info:
        Lease(store, RUN).acquire()
    assert info.value.expires == clock.t - 60 + 300  # LastModified + its TTL
    clock.t += 250  # 310 s after its last write: expired
    assert Lease(store, RUN).acquire().held


def test_a_lease_from_a_fast_host_expires_in_store_time(store: MemoryStore, clock: Clock) -> None:
    # The holder's clock is two days fast: ``expires`` says it holds for two more days.
    store.put(RUN.key(LEASE_NAME), _holder(clock.t + 2 * DAY + 300))
    clock.t += 301
    assert Lease(store, RUN).acquire().held


def test_renewal_is_timed_by_the_holders_own_clock(store: MemoryStore, clock: Clock) -> None:
    mono = [0.0]
    lease = Lease(store, RUN, ttl=timedelta(seconds=60), clock=lambda: mono[0]).acquire()
    first = store.head(lease.key)
    mono[0] = 29.0
    lease.renew_if_due()
    assert store.head(lease.key) == first  # not yet
    mono[0] = 30.0
    clock.t += 30
    lease.renew_if_due()
    again = store.head(lease.key)
    assert again is not None and first is not None and again.etag != first.etag


# -- retention orders by the store's time (item 3) ---------------------------------------------
def _skewed_run(store: MemoryStore, clock: Clock) -> None:
    """Steps 1-3 from a node two days fast, then 4-6 after a restart on a good one; one
    commit an hour in the store's time."""
    for step in range(1, 7):
        clock.t = T0.timestamp() + step * HOUR
        fast = 2 * DAY if step <= 3 else 0.0
        write_checkpoint(store, RUN, step, created=clock.t + fast, per_save_metadata=True)
    clock.t += 60


def test_committed_at_is_the_stores_and_created_the_writers(store: MemoryStore, clock: Clock):
    _skewed_run(store, clock)
    c1 = list_checkpoints(Location.of(RUN, store=store))[0]
    assert c1.committed_at == T0 + timedelta(hours=1)
    assert c1.created == T0 + timedelta(days=2, hours=1)
    d = c1.to_dict()
    assert d["committed_at"] == "2025-03-01T01:00:00Z" and d["created"] == "2025-03-03T01:00:00Z"


@pytest.mark.parametrize(
    ("policy", "kept"),
    [
        (KeepWithin(timedelta(hours=3)), {3, 4, 5, 6}),
        (KeepCalendar(hourly=2), {5, 6}),
        (KeepLast(1), {6}),  # "most recently committed" is step 6, not the fast node's 3
    ],
)
def test_a_fast_writer_does_not_make_retention_keep_older_steps(
    store: MemoryStore, clock: Clock, host: list[float], policy: object, kept: set[int]
) -> None:
    _skewed_run(store, clock)
    ckpts = list_checkpoints(Location.of(RUN, store=store))
    p = plan(ckpts, policy, datetime.fromtimestamp(clock.t, UTC))  # type: ignore[arg-type]
    assert {int(n[-3:]) for n in p.keep} == kept
    r = prune(Location.of(RUN, store=store), policy, apply=True)  # type: ignore[arg-type]
    assert {c.step for c in list_checkpoints(Location.of(RUN, store=store))} == kept
    assert r.ok


def test_rewriting_the_marker_does_not_move_the_commit_time(
    store: MemoryStore, clock: Clock
) -> None:
    # attach_metrics rewrites the marker in place; the per-save metadata stays the time.
    new = write_checkpoint(store, RUN, 1, created=clock.t, per_save_metadata=True)
    old = write_checkpoint(store, RUN, 2, created=clock.t, name="format1")  # plain .metadata
    clock.t += 5 * HOUR
    for ckpt in (new, old):
        store.put(ckpt.key(MANIFEST_NAME), store.get(ckpt.key(MANIFEST_NAME)))
    by_name = {c.name: c for c in list_checkpoints(Location.of(RUN, store=store))}
    assert by_name[ckpt_name(1)].committed_at == T0
    assert by_name["format1"].committed_at == T0 + timedelta(hours=5)  # the marker's


def test_skew_note_wording() -> None:
    t = StoreTime(T0, T0 - timedelta(minutes=3), where="s3://bkt")
    note = skew_note(t, timedelta(minutes=1))
    assert note is not None and "3m behind" in note and "s3://bkt" in note
    assert skew_note(t, timedelta(minutes=3)) is None
