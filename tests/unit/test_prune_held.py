"""Issue 37 item 2: a prune whose run's ``s3ckpt.check.json`` cannot be read holds back that
run's deletions (what ``s3ckpt check`` found there is unknown, so the newest checkpoint the
plan keeps may be the damaged one): every planned deletion becomes a skip that says why, the
result is not ``ok`` (the CLI's exit 1, done in part), and nothing is deleted. A run whose
record is merely absent prunes as before."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from s3ckpt.format._names import CHECK_NAME, LEASE_NAME
from s3ckpt.retention import KeepLast, RetentionOptions, prune
from s3ckpt.store import Location, MemoryStore
from s3ckpt.uri import StoreURL
from tests._retention_util import Clock, clock_and_store_fixtures, write_checkpoint

T0 = datetime(2025, 1, 1, tzinfo=UTC)
RUN = StoreURL("memory", "b", "runs/a/")

clock, store = clock_and_store_fixtures(T0)


def fill(store: MemoryStore, clock: Clock) -> datetime:
    for s in (1, 2, 3):
        clock.t = T0.timestamp() + s * 60
        write_checkpoint(store, RUN, s, created=clock.t)
    return datetime.fromtimestamp(clock.t, UTC) + timedelta(hours=3)


def test_an_unreadable_check_record_holds_back_the_runs_deletions(
    store: MemoryStore, clock: Clock
) -> None:
    now = fill(store, clock)
    store.put(RUN.key(CHECK_NAME), b"{}")  # exists; its GET fails
    store.inject("get", key_glob=f"*{CHECK_NAME}", times=10)
    before = set(store.objects)
    r = prune(
        Location.of(RUN, store=store), KeepLast(1), apply=True, options=RetentionOptions(now=now)
    )
    assert r.plan.delete == () and not r.deleted and not r.ok
    assert set(store.objects) - {RUN.key(LEASE_NAME)} == before  # nothing deleted
    assert r.held is not None and CHECK_NAME in r.held and "held back" in r.held
    assert r.held in r.notes and r.to_dict()["held"] == r.held
    held = [n for n, why in r.plan.skipped.items() if "check record" in why[0]]
    assert sorted(held) == ["step_000000001", "step_000000002"], r.plan.skipped
    dry = prune(Location.of(RUN, store=store), KeepLast(1), options=RetentionOptions(now=now))
    assert dry.plan.delete == () and dry.held is not None and not dry.ok


def test_a_run_without_a_check_record_prunes_as_before(store: MemoryStore, clock: Clock) -> None:
    now = fill(store, clock)
    r = prune(
        Location.of(RUN, store=store), KeepLast(1), apply=True, options=RetentionOptions(now=now)
    )
    assert r.ok and r.held is None and len(r.deleted) == 2
