"""Catalog, lease, prune, gc and pins against MemoryStore (fast, in process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta

import pytest

from s3ckpt._commit import boot_id
from s3ckpt.errors import (
    CheckpointNotFoundError,
    ConfigError,
    LeaseHeldError,
    LeaseLostError,
    PolicyError,
    TransientStoreError,
)
from s3ckpt.format._names import (
    LATEST_NAME,
    LEASE_NAME,
    MANIFEST_NAME,
    METADATA_NAME,
    data_name,
    items_name,
)
from s3ckpt.retention import (
    AnyOf,
    KeepBest,
    KeepLast,
    RetentionOptions,
    gc,
    list_checkpoints,
    list_runs,
    pin,
    prune,
    unpin,
)
from s3ckpt.retention._catalog import CheckpointState
from s3ckpt.retention._lease import Lease, LeaseRecord
from s3ckpt.retention._scan import scan
from s3ckpt.store import Location, MemoryStore
from s3ckpt.uri import StoreURL
from tests._retention_util import (
    Clock,
    ckpt_name,
    clock_and_store_fixtures,
    keys_under,
    write_checkpoint,
)

T0 = datetime(2025, 1, 1, tzinfo=UTC)
RUN = StoreURL("memory", "b", "runs/a/")


clock, store = clock_and_store_fixtures(T0)


def fill(store: MemoryStore, clock: Clock, steps: list[int], run: StoreURL = RUN) -> None:
    for s in steps:
        clock.t = T0.timestamp() + s * 60
        write_checkpoint(store, run, s, created=clock.t, metrics={"loss": 1000.0 / s})


def now_after(clock: Clock, hours: float = 3) -> datetime:
    return datetime.fromtimestamp(clock.t, UTC) + timedelta(hours=hours)


# -- catalog -----------------------------------------------------------------------------------
def test_catalog_states_order_and_control_objects(store: MemoryStore, clock: Clock) -> None:
    fill(store, clock, [30, 10, 20])
    store.put(RUN.key(LATEST_NAME), b"{}")
    store.put(RUN.key(LEASE_NAME), b"{}")
    store.put(RUN.key("tensorboard/events.out"), b"tb")  # not a checkpoint
    clock.t += 3600 * 5
    write_checkpoint(store, RUN, 5, created=clock.t, commit=False, metadata=False, name="old")
    write_checkpoint(store, RUN, 6, created=clock.t, commit=False, name="foreign")
    clock.t += 3600 * 3
    write_checkpoint(store, RUN, 40, created=clock.t, commit=False)  # the save in progress
    now = datetime.fromtimestamp(clock.t + 60, UTC)
    cat = list_checkpoints(
        Location.of(RUN, store=store), options=RetentionOptions(now=now, grace=timedelta(hours=2))
    )
    # without a step: by commit time (none for the abandoned one, so it sorts first)
    assert [(c.name, c.state) for c in cat] == [
        ("old", CheckpointState.ABANDONED),
        ("foreign", CheckpointState.FOREIGN),
        (ckpt_name(10), CheckpointState.COMMITTED),
        (ckpt_name(20), CheckpointState.COMMITTED),
        (ckpt_name(30), CheckpointState.COMMITTED),
        (ckpt_name(40), CheckpointState.IN_PROGRESS),
    ]
    c10 = cat[2]
    assert c10.step == 10 and c10.metrics == {"loss": 100.0}
    assert c10.committed_at == T0 + timedelta(minutes=10)
    marker, records = (store.head(c10.url.key(n)) for n in (MANIFEST_NAME, items_name(c10.tag)))
    assert marker is not None and records is not None
    assert c10.num_objects == 6 and c10.size == 3 * 64 + 4 + marker.size + records.size
    assert cat[1].committed_at is not None  # foreign: the .metadata mtime
    # one LIST, one upload LIST, one GET per marker, one of the run's s3ckpt.check.json
    assert store.calls["list"] == 1 and store.calls["get"] == 3 + 1


def test_open_multipart_upload_keeps_a_prefix_in_progress(store: MemoryStore, clock: Clock) -> None:
    write_checkpoint(store, RUN, 7, created=clock.t, commit=False, metadata=False)
    clock.t += 5 * 3600
    store.create_multipart(RUN.child(ckpt_name(7)).key(data_name(1, 0, "abcdef01")))
    now = datetime.fromtimestamp(clock.t, UTC)
    assert (
        list_checkpoints(Location.of(RUN, store=store), options=RetentionOptions(now=now))[0].state
        is CheckpointState.IN_PROGRESS
    )


def test_marker_step_wins_and_corrupt_marker_is_still_committed(store: MemoryStore) -> None:
    write_checkpoint(store, RUN, 77, created=T0.timestamp(), name="step_000000001")
    write_checkpoint(store, RUN, 2, created=T0.timestamp(), commit=False)
    store.put(RUN.child(ckpt_name(2)).key(MANIFEST_NAME), b"{not json")
    cat = list_checkpoints(Location.of(RUN, store=store), options=RetentionOptions(now=T0))
    assert [(c.name, c.step) for c in cat] == [("step_000000002", 2), ("step_000000001", 77)]
    assert cat[0].state is CheckpointState.COMMITTED and "not valid JSON" in (cat[0].error or "")


def test_list_runs_finds_every_run_under_a_prefix(store: MemoryStore, clock: Clock) -> None:
    root = StoreURL("memory", "b", "")
    for name in ("runs/a/", "runs/b/", "team/x/runs/c/"):
        fill(store, clock, [1, 2], StoreURL("memory", "b", name))
    assert [
        r.prefix
        for r in list_runs(Location.of(root, store=store), options=RetentionOptions(now=T0))
    ] == [
        "runs/a/",
        "runs/b/",
        "team/x/runs/c/",
    ]
    assert [
        r.prefix for r in list_runs(Location.of(RUN, store=store), options=RetentionOptions(now=T0))
    ] == ["runs/a/"]
    # a checkpoint URL lists as its run with one checkpoint
    cats = scan(Location.of(RUN.child(ckpt_name(1)), store=store), options=RetentionOptions(now=T0))
    assert [(c.run.prefix, len(c.checkpoints)) for c in cats] == [("runs/a/", 1)]


# -- prune -------------------------------------------------------------------------------------
def test_dry_run_changes_nothing_and_takes_no_lease(store: MemoryStore, clock: Clock) -> None:
    fill(store, clock, list(range(1, 8)))
    before = dict(store.objects)
    r = prune(
        Location.of(RUN, store=store), KeepLast(2), options=RetentionOptions(now=now_after(clock))
    )
    assert not r.applied and len(r.plan.delete) == 5
    assert store.objects.keys() == before.keys()
    assert store.calls.get("delete", 0) == 0 and store.calls.get("put", 0) == 7 * 6


def test_apply_deletes_marker_then_metadata_then_data_in_batches(
    store: MemoryStore, clock: Clock
) -> None:
    fill(store, clock, list(range(1, 11)))
    order: list[str] = []
    real = store.delete

    def spy(keys):  # type: ignore[no-untyped-def]
        if not all(".probe-" in k for k in keys):  # the lease probe removes its own key
            names = {k.rpartition("/")[2].split(".")[0] or "." for k in keys}
            order.append(",".join(sorted(names)))
        return real(keys)

    store.delete = spy  # type: ignore[method-assign]
    r = prune(
        Location.of(RUN, store=store),
        KeepLast(3),
        apply=True,
        options=RetentionOptions(now=now_after(clock), batch_size=4),
    )
    assert r.ok and r.applied and len(r.deleted) == 7
    # 7 fences (a tombstone PUT If-Match each), 7 metadata -> 2, 21 data and 7 item records
    # -> 7, then the 7 tombstones (DeleteObject If-Match: no other save's names were there)
    assert r.delete_requests == 23 and r.keys_deleted == 42
    assert store.calls["delete_if_match"] == 7 + 1  # and the lease's capability probe
    assert order[:2] == [".", "."]
    assert all(n.startswith("__") or n == "s3ckpt" for o in order[2:] for n in o.split(","))
    left = {
        c.name
        for c in list_checkpoints(
            Location.of(RUN, store=store), options=RetentionOptions(now=now_after(clock))
        )
    }
    assert left == {ckpt_name(s) for s in (8, 9, 10)}
    assert not any(k.startswith(RUN.child(ckpt_name(1)).prefix) for k in store.objects)
    rec = LeaseRecord.from_json(store.get(RUN.key(LEASE_NAME)))
    assert rec is not None and rec.released and rec.deleting == ()
    # prune again: nothing to do
    assert (
        prune(
            Location.of(RUN, store=store),
            KeepLast(3),
            apply=True,
            options=RetentionOptions(now=now_after(clock)),
        ).deleted
        == ()
    )


def test_a_failed_marker_delete_keeps_the_whole_checkpoint(
    store: MemoryStore, clock: Clock
) -> None:
    fill(store, clock, [1, 2, 3, 4])
    store.inject("put", key_glob="*step_000000002/s3ckpt.json", times=100)  # the fence
    r = prune(
        Location.of(RUN, store=store),
        KeepLast(1),
        apply=True,
        options=RetentionOptions(now=now_after(clock), sleep=lambda s: None),
    )
    assert not r.ok and [f.key.rpartition("/")[2] for f in r.failures] == [MANIFEST_NAME]
    assert set(r.deleted) == {ckpt_name(1), ckpt_name(3)}
    cat = {
        c.name: c
        for c in list_checkpoints(
            Location.of(RUN, store=store), options=RetentionOptions(now=now_after(clock))
        )
    }
    assert cat[ckpt_name(2)].state is CheckpointState.COMMITTED
    assert cat[ckpt_name(2)].num_objects == 6  # all its data is still there
    # the unfinished name stays in the released lease's intent log
    rec = LeaseRecord.from_json(store.get(RUN.key(LEASE_NAME)))
    assert rec is not None and rec.deleting == (ckpt_name(2),)


def test_throttled_keys_are_retried_and_other_failures_reported(
    store: MemoryStore, clock: Clock
) -> None:
    fill(store, clock, [1, 2, 3])
    throttle = store.inject(
        "delete_key",
        lambda k: TransientStoreError("slow down", key=k, code="SlowDown"),
        key_glob="*__1_0*",
        times=3,
    )
    sleeps: list[float] = []
    r = prune(
        Location.of(RUN, store=store),
        KeepLast(1),
        apply=True,
        options=RetentionOptions(now=now_after(clock), sleep=sleeps.append),
    )
    assert r.ok and throttle.hits == 3 and sleeps, "throttled keys must be retried with back-off"
    assert len(r.deleted) == 2
    # a whole request failing is reported per key, not raised, and the run goes on
    fill(store, clock, [4, 5])
    store.inject("put", key_glob="*/s3ckpt.json", times=2)  # both fences
    r = prune(
        Location.of(RUN, store=store),
        KeepLast(1),
        apply=True,
        options=RetentionOptions(now=now_after(clock), retries=1, sleep=sleeps.append),
    )
    assert not r.ok and r.deleted == ()
    assert all("injected" in f.message for f in r.failures) and len(r.failures) == 2
    states = {
        c.name: c.state
        for c in list_checkpoints(
            Location.of(RUN, store=store), options=RetentionOptions(now=now_after(clock))
        )
    }
    assert set(states) == {ckpt_name(3), ckpt_name(4), ckpt_name(5)}
    assert set(states.values()) == {CheckpointState.COMMITTED}


def test_max_delete_and_empty_policy(store: MemoryStore, clock: Clock) -> None:
    fill(store, clock, list(range(1, 8)))
    with pytest.raises(PolicyError):
        prune(Location.of(RUN, store=store), AnyOf(()), apply=True)
    assert store.calls.get("put", 0) == 42, "an empty policy is refused before any request"
    r = prune(
        Location.of(RUN, store=store),
        KeepLast(1),
        apply=True,
        options=RetentionOptions(max_delete=2, now=now_after(clock)),
    )
    assert r.deleted == (ckpt_name(1), ckpt_name(2)) and r.plan.deferred == 4
    with pytest.raises(ConfigError):
        prune(
            Location.of(RUN, store=store),
            KeepLast(1),
            apply=True,
            options=RetentionOptions(batch_size=1001),
        )


def test_pins_block_deletion_and_unpin_releases(store: MemoryStore, clock: Clock) -> None:
    fill(store, clock, [1, 2, 3])
    c1 = RUN.child(ckpt_name(1))
    pin(store, c1, "paper figure 3")
    assert (
        list_checkpoints(Location.of(RUN, store=store), options=RetentionOptions(now=T0))[0].pinned
        == "paper figure 3"
    )
    r = prune(
        Location.of(RUN, store=store),
        KeepLast(1),
        apply=True,
        options=RetentionOptions(now=now_after(clock)),
    )
    assert r.deleted == (ckpt_name(2),)
    assert r.plan.keep[ckpt_name(1)] == ("pinned: paper figure 3",)
    assert unpin(store, c1) and not unpin(store, c1)
    r = prune(
        Location.of(RUN, store=store),
        KeepLast(1),
        apply=True,
        options=RetentionOptions(now=now_after(clock)),
    )
    assert r.deleted == (ckpt_name(1),)
    with pytest.raises(CheckpointNotFoundError):
        pin(store, RUN.child("nope"), "x")
    with pytest.raises(ConfigError):
        pin(store, RUN.child(ckpt_name(3)), "  ")


# -- lease -------------------------------------------------------------------------------------
def test_lease_excludes_a_second_pruner_until_released_or_expired(
    store: MemoryStore, clock: Clock
) -> None:
    # Expiry is judged in the store's time (the lease object's LastModified plus the TTL);
    # the holder times its renewals by its own clock.
    t = [0.0]
    start = clock.t
    a = Lease(store, RUN, ttl=timedelta(seconds=60), clock=lambda: t[0], owner="a").acquire()
    b = Lease(store, RUN, ttl=timedelta(seconds=60), owner="b")
    with pytest.raises(LeaseHeldError) as info:
        b.acquire()
    assert info.value.holder == "a" and info.value.expires == start + 60
    clock.t, t[0] = start + 40, 40.0
    a.renew_if_due()  # 40 s since its write, past half the TTL: renewed (expires at +100)
    clock.t = start + 70
    with pytest.raises(LeaseHeldError):
        b.acquire()
    clock.t = start + 101  # a stalled past its expiry: b takes over
    b.acquire()
    with pytest.raises(LeaseLostError):
        a.record_intent(["x"])
    b.release()
    Lease(store, RUN, clock=lambda: t[0], owner="c").acquire()


def test_lease_of_a_dead_process_on_this_host_is_stale_at_once(store: MemoryStore) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead = int(proc.stdout)
    rec = LeaseRecord(
        owner="dead",
        host=__import__("socket").gethostname(),
        pid=dead,
        pidns=os.readlink("/proc/self/ns/pid") if os.path.exists("/proc/self/ns/pid") else "",
        acquired=0,
        expires=1e12,
        deleting=("step_000000001",),
        boot=boot_id(),  # this boot of this host: the pid's absence proves it gone
    )
    store.put(RUN.key(LEASE_NAME), rec.to_json())
    if not rec.pidns or not rec.boot:
        pytest.skip("no PID namespace or boot id on this platform")
    lease = Lease(store, RUN).acquire()
    assert lease.previous is not None and lease.previous.deleting == ("step_000000001",)
    # a live holder (this very process, under another owner id) is not stale
    live = LeaseRecord("live", rec.host, os.getppid(), rec.pidns, 0, 1e12, boot=rec.boot)
    store.put(RUN.key(LEASE_NAME), live.to_json())
    with pytest.raises(LeaseHeldError):
        Lease(store, RUN).acquire()


def test_a_new_pruner_finishes_a_dead_pruners_deletions(store: MemoryStore, clock: Clock) -> None:
    fill(store, clock, [1, 2, 3, 4, 5])
    # the dead pruner had removed the markers of 1 and 2 and the data of 1 only in part
    for s in (1, 2):
        store.delete([RUN.child(ckpt_name(s)).key(MANIFEST_NAME)])
    store.delete([RUN.child(ckpt_name(1)).key(METADATA_NAME)])
    dead = LeaseRecord("dead", "other-host", 1, "x", 0, 0.0, deleting=(ckpt_name(1), ckpt_name(2)))
    store.put(RUN.key(LEASE_NAME), dead.to_json())
    clock.t += 600  # its lease object is older than the TTL, in the store's time
    r = prune(
        Location.of(RUN, store=store),
        KeepLast(4),
        apply=True,
        options=RetentionOptions(now=now_after(clock)),
    )
    # 1 and 2 look uncommitted now (abandoned / foreign) but are finished from the intent log
    assert set(r.resumed) == {ckpt_name(1), ckpt_name(2)}
    assert set(r.deleted) == {ckpt_name(1), ckpt_name(2)}
    assert sorted(
        c.name
        for c in list_checkpoints(
            Location.of(RUN, store=store), options=RetentionOptions(now=now_after(clock))
        )
    ) == [ckpt_name(s) for s in (3, 4, 5)]


def test_intent_of_a_checkpoint_that_is_committed_again_is_not_blindly_finished(
    store: MemoryStore, clock: Clock
) -> None:
    fill(store, clock, [1, 2, 3])
    dead = LeaseRecord("dead", "other-host", 1, "x", 0, 0.0, deleting=(ckpt_name(1),))
    store.put(RUN.key(LEASE_NAME), dead.to_json())
    clock.t += 600  # its lease object is older than the TTL, in the store's time
    r = prune(
        Location.of(RUN, store=store),
        KeepBest(3, "loss"),
        apply=True,
        options=RetentionOptions(now=now_after(clock)),
    )
    assert r.resumed == () and r.deleted == ()  # its marker survived: the plan keeps it


# -- gc ----------------------------------------------------------------------------------------
def test_gc_aborts_old_uploads_and_removes_only_abandoned(store: MemoryStore, clock: Clock) -> None:
    fill(store, clock, [1, 2])
    dead = write_checkpoint(
        store, RUN, 3, created=clock.t, commit=False, metadata=False, tag="0d0d0d0d"
    )
    write_checkpoint(store, RUN, 4, created=clock.t, commit=False)  # foreign
    old_upload = store.create_multipart(dead.key(data_name(9, 0, "0d0d0d0d")))
    stock_upload = store.create_multipart(dead.key("__9_0.distcp"))  # not s3ckpt's: stays
    clock.t += 3 * 86400
    live = write_checkpoint(
        store, RUN, 5, created=clock.t, commit=False, metadata=False, tag="1e1e1e1e"
    )
    new_upload = store.create_multipart(live.key(data_name(9, 0, "1e1e1e1e")))
    now = datetime.fromtimestamp(clock.t + 60, UTC)
    dry = gc(Location.of(RUN, store=store), options=RetentionOptions(now=now))
    assert not dry.applied and [c.name for c in dry.abandoned] == [ckpt_name(3)]
    assert [u.upload_id for u in dry.uploads] == [old_upload]
    assert old_upload in store.uploads  # dry run
    r = gc(Location.of(RUN, store=store), apply=True, options=RetentionOptions(now=now))
    assert r.ok and r.aborted == 1 and r.removed == (str(RUN.child(ckpt_name(3))),)
    assert old_upload not in store.uploads and new_upload in store.uploads
    assert stock_upload in store.uploads
    states = {
        c.name: c.state
        for c in list_checkpoints(Location.of(RUN, store=store), options=RetentionOptions(now=now))
    }
    # step 3 is gone: its fence (a finished tombstone) stays, as its save may be paused; the
    # stock upload is not s3ckpt's
    assert states == {
        ckpt_name(1): CheckpointState.COMMITTED,
        ckpt_name(2): CheckpointState.COMMITTED,
        ckpt_name(4): CheckpointState.FOREIGN,
        ckpt_name(5): CheckpointState.IN_PROGRESS,
    }
    assert keys_under(store, dead.prefix) == {dead.key(MANIFEST_NAME)}
    assert keys_under(store, RUN.child(ckpt_name(5)).prefix)


# -- no torch ----------------------------------------------------------------------------------
def test_retention_and_its_cli_import_without_torch() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # any "import torch" now raises ImportError
        import s3ckpt.retention, s3ckpt._cli.retention
        import s3ckpt._commit  # gc rolls .metadata forward with it, in the torch-free cron
        from s3ckpt.cli import main
        for cmd in ("ls", "prune", "pin", "unpin", "gc"):
            try:
                main([cmd, "--help"])
            except SystemExit:
                pass
        assert "torch" not in {m.split(".")[0] for m in sys.modules if sys.modules[m]}
        print("ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False
    )
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr


def test_lease_record_round_trip() -> None:
    rec = LeaseRecord("o", "h", 1, "ns", 2.0, 3.0, True, ("a", "b"), "gc")
    assert LeaseRecord.from_json(rec.to_json()) == rec
    assert LeaseRecord.from_json(b"garbage") is None
    assert json.loads(rec.to_json())["format"] == "s3ckpt.lease"
