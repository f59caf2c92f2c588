"""Retention under the per-save commit protocol: per-tag liveness, the grace floor, only
deleting what s3ckpt wrote, leftovers, rolling .metadata forward, intent logs taken over by
gc, and truthful reports. MemoryStore, in process."""

from __future__ import annotations

import json
import math
import sys
import time
import types
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from s3ckpt._tombstone import Tombstone
from s3ckpt.cli import main
from s3ckpt.format._manifest import Manifest
from s3ckpt.format._names import (
    LEASE_NAME,
    MANIFEST_NAME,
    METADATA_NAME,
    MIN_GRACE_SECONDS,
    data_name,
    heartbeat_name,
    items_name,
    metadata_name,
)
from s3ckpt.retention import KeepBest, KeepLast, RetentionOptions, gc, list_checkpoints, prune
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

# The CLI judges against the wall clock: the store's clock starts 30 days before it, so
# "3 hours later" is still in the past and ``at(clock)`` is close to what the CLI uses.
T0 = datetime.fromtimestamp(time.time() - 30 * 86400, UTC)
RUN = StoreURL("memory", "b", "runs/a/")
HOUR = 3600.0


clock, store = clock_and_store_fixtures(T0)


def at(clock: Clock, ahead: float = 0.0) -> datetime:
    return datetime.fromtimestamp(clock.t + ahead, UTC)


def names(store: MemoryStore, ckpt: StoreURL) -> set[str]:
    return {k[len(ckpt.prefix) :] for k in keys_under(store, ckpt.prefix)}


def fenced(store: MemoryStore, ckpt: StoreURL) -> set[str]:
    """``names`` without the finished tombstone a deleter left as the fence of a reaped save
    (which it must be: gone, not listed)."""
    tomb = Tombstone.parse(store.get(ckpt.key(MANIFEST_NAME)))
    assert tomb is not None and tomb.done and tomb.keep and tomb.reaped
    return names(store, ckpt) - {MANIFEST_NAME}


def run_cli(store: MemoryStore, monkeypatch: pytest.MonkeyPatch, *argv: str) -> tuple[int, str]:
    import s3ckpt._cli as cli_mod

    # PATH is a memory:// URL: the command parses it, and runs on this test's store, on a
    # host whose clock agrees with the store's (the CLI judges by the store's time).
    monkeypatch.setattr(
        cli_mod, "open_location", lambda args, target, **kw: Location.of(target, store=store)
    )
    monkeypatch.setattr("s3ckpt.store._clock.time", types.SimpleNamespace(time=store.now))
    out: list[str] = []
    monkeypatch.setattr(sys, "stdout", types.SimpleNamespace(write=out.append, flush=lambda: 0))
    code = main(list(argv))
    monkeypatch.undo()
    return code, "".join(out)


# -- 1. liveness per tag, the grace floor ------------------------------------------------------
def test_a_save_uploading_one_big_object_past_grace_is_live_through_its_heartbeats(
    store: MemoryStore, clock: Clock
) -> None:
    tag = "a1a1a1a1"
    ckpt = write_checkpoint(
        store, RUN, 9, created=clock.t, commit=False, metadata=False, tag=tag, heartbeats=2
    )
    up = store.create_multipart(ckpt.key(data_name(2, 0, tag)))
    clock.t += 3 * HOUR  # the big upload has run 3 h: older than --grace and --older-than
    store.put(ckpt.key(heartbeat_name(tag, 2)), b"")  # rank 2 still beats
    now = at(clock, 5)
    (c,) = list_checkpoints(
        Location.of(RUN, store=store), options=RetentionOptions(now=now, grace=timedelta(hours=2))
    )
    assert c.state is CheckpointState.IN_PROGRESS and c.live_tags == (tag,)
    r = gc(
        Location.of(RUN, store=store),
        older_than=timedelta(seconds=1),
        apply=True,
        options=RetentionOptions(now=now, grace=timedelta(hours=2)),
    )
    assert r.ok and r.uploads == () and r.abandoned == () and r.leftovers == ()
    assert up in store.uploads and len(names(store, ckpt)) == 6


def test_an_overwrite_in_a_committed_prefix_keeps_its_old_upload(
    store: MemoryStore, clock: Clock
) -> None:
    # An upload older than --older-than in a committed prefix belongs to a save still
    # writing there (its heartbeat is fresh): gc leaves it open.
    ckpt = write_checkpoint(store, RUN, 1, created=clock.t, tag="c0c0c0c0")
    new = "b2b2b2b2"
    store.put(ckpt.key(heartbeat_name(new, 0)), b"")
    up = store.create_multipart(ckpt.key(data_name(0, 0, new)))
    clock.t += 2 * 86400
    store.put(ckpt.key(heartbeat_name(new, 0)), b"")  # still writing, 2 days in
    now = at(clock, 10)
    r = gc(
        Location.of(RUN, store=store),
        older_than=timedelta(days=1),
        apply=True,
        options=RetentionOptions(now=now),
    )
    assert r.ok and r.aborted == 0 and up in store.uploads
    assert heartbeat_name(new, 0) in names(store, ckpt)
    (c,) = list_checkpoints(Location.of(RUN, store=store), options=RetentionOptions(now=now))
    assert c.overwrite_in_progress and c.live_saves == 1 and c.tag == "c0c0c0c0"


@pytest.mark.parametrize("grace", [timedelta(0), timedelta(seconds=10)])
def test_grace_below_the_floor_is_raised_and_said(
    store: MemoryStore, clock: Clock, grace: timedelta, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock.t = time.time() - 35  # the CLI below judges by the wall clock
    write_checkpoint(store, RUN, 1, created=clock.t)
    tag = "d4d4d4d4"
    live = write_checkpoint(store, RUN, 2, created=clock.t, commit=False, metadata=False, tag=tag)
    clock.t += 30  # 30 s since the save's last heartbeat: live under the 60 s floor
    now = at(clock)
    r = gc(
        Location.of(RUN, store=store),
        older_than=timedelta(0),
        apply=True,
        options=RetentionOptions(now=now, grace=grace),
    )
    assert r.ok and r.removed == () and len(names(store, live)) == 3
    assert r.notes and "1m" in r.notes[0]
    p = prune(
        Location.of(RUN, store=store),
        KeepLast(1),
        apply=True,
        options=RetentionOptions(now=now, grace=grace),
    )
    assert p.notes == r.notes
    assert p.plan.skipped[ckpt_name(2)] == ("in progress (no commit marker, recent activity)",)
    assert MIN_GRACE_SECONDS == 60
    code, out = run_cli(store, monkeypatch, "gc", str(RUN), "--grace", "0s", "--apply")
    assert code == 0 and "note: grace 0s is below the floor of 1m" in out
    assert len(names(store, live)) == 3


# -- 2. only what s3ckpt wrote -------------------------------------------------------------------
def test_gc_never_deletes_foreign_files_stock_dcp_or_plain_metadata(
    store: MemoryStore, clock: Clock
) -> None:
    dead = write_checkpoint(store, RUN, 5, created=clock.t, commit=False, metadata=False)
    store.put(dead.key(metadata_name("e5e5e5e5")), b"m")
    store.put(dead.key(heartbeat_name("e5e5e5e5", 0)), b"")
    foreign = {"events.out.tfevents.1", "model.safetensors", "__0_0.distcp", "notes/readme.md"}
    for n in foreign:
        store.put(dead.key(n), b"x")
    only_foreign = RUN.child(ckpt_name(6))  # named step_N, holds nothing of s3ckpt's or DCP's
    store.put(only_foreign.key("events.out.tfevents.2"), b"x")
    store.put(only_foreign.key("model.safetensors"), b"x")
    stock = RUN.child(ckpt_name(7))  # a stock DCP checkpoint
    store.put(stock.key("__0_0.distcp"), b"x")
    store.put(stock.key(METADATA_NAME), b"x")
    clock.t += 3 * HOUR
    now = at(clock)
    cat = {
        c.name: c
        for c in list_checkpoints(Location.of(RUN, store=store), options=RetentionOptions(now=now))
    }
    assert set(cat) == {ckpt_name(5), ckpt_name(7)}
    assert cat[ckpt_name(5)].state is CheckpointState.ABANDONED
    assert cat[ckpt_name(7)].state is CheckpointState.FOREIGN
    r = gc(Location.of(RUN, store=store), apply=True, options=RetentionOptions(now=now))
    assert r.ok and r.removed == (str(dead),)
    assert fenced(store, dead) == foreign
    assert names(store, only_foreign) == {"events.out.tfevents.2", "model.safetensors"}
    assert names(store, stock) == {"__0_0.distcp", METADATA_NAME}


def test_prune_deletes_a_committed_checkpoint_but_not_the_files_beside_it(
    store: MemoryStore, clock: Clock
) -> None:
    old = write_checkpoint(store, RUN, 1, created=clock.t, per_save_metadata=True, heartbeats=1)
    store.put(old.key(data_name(0, 0, "f0f0f0f0")), b"x")  # a dead overwrite's object
    store.put(old.key("events.out.tfevents.1"), b"tb")
    up = store.create_multipart(old.key(data_name(1, 0, "f0f0f0f0")))
    stock_up = store.create_multipart(old.key("upload.bin"))
    clock.t += HOUR
    write_checkpoint(store, RUN, 2, created=clock.t)
    clock.t += 3 * HOUR
    r = prune(
        Location.of(RUN, store=store),
        KeepLast(1),
        apply=True,
        options=RetentionOptions(now=at(clock)),
    )
    assert r.ok and r.deleted == (ckpt_name(1),) and r.aborted == 1
    assert fenced(store, old) == {"events.out.tfevents.1"}
    assert up not in store.uploads and stock_up in store.uploads
    assert [
        c.name
        for c in list_checkpoints(
            Location.of(RUN, store=store), options=RetentionOptions(now=at(clock))
        )
    ] == [ckpt_name(2)]


def test_prune_of_a_foreign_checkpoint_deletes_only_dcp_names(
    store: MemoryStore, clock: Clock
) -> None:
    stock = RUN.child(ckpt_name(1))
    for n in ("__0_0.distcp", "__1_0.distcp", METADATA_NAME, "config.json"):
        store.put(stock.key(n), b"x")
    clock.t += HOUR
    write_checkpoint(store, RUN, 2, created=clock.t)
    clock.t += 3 * HOUR
    r = prune(
        Location.of(RUN, store=store),
        KeepLast(1),
        apply=True,
        options=RetentionOptions(now=at(clock), include_foreign=True),
    )
    assert r.ok and r.deleted == (ckpt_name(1),)
    assert names(store, stock) == {"config.json"}


def test_prune_defers_a_checkpoint_being_overwritten(store: MemoryStore, clock: Clock) -> None:
    # The overwrite commits with If-Match on the marker it replaces: deleting that marker
    # now would make the save fail. The plan defers it; the next prune deletes it.
    old = write_checkpoint(store, RUN, 1, created=clock.t, tag="0a0a0a0a")
    write_checkpoint(store, RUN, 2, created=clock.t + 60)
    clock.t += 3 * HOUR
    new = "0b0b0b0b"  # a re-save of step 1 is writing into the prefix right now
    store.put(old.key(heartbeat_name(new, 0)), b"")
    store.put(old.key(data_name(0, 0, new)), b"x")
    up = store.create_multipart(old.key(data_name(1, 0, new)))
    before = names(store, old)
    r = prune(
        Location.of(RUN, store=store),
        KeepLast(1),
        apply=True,
        options=RetentionOptions(now=at(clock, 1)),
    )
    assert r.deleted == () and r.plan.delete == () and r.plan.deferred == 0
    assert r.plan.skipped[ckpt_name(1)] == (
        "deferred: an overwrite is in progress (a live save is re-writing it)",
    )
    assert names(store, old) == before and up in store.uploads
    # the overwrite died: its leftovers go with the checkpoint once it is dead
    clock.t += 3 * HOUR
    r = prune(
        Location.of(RUN, store=store),
        KeepLast(1),
        apply=True,
        options=RetentionOptions(now=at(clock)),
    )
    assert r.deleted == (ckpt_name(1),) and r.aborted == 1
    assert fenced(store, old) == set() and up not in store.uploads


# -- 3. leftovers, uploads nobody knows, rolling .metadata forward -------------------------------
def test_gc_reclaims_orphans_in_committed_and_uncommitted_prefixes(
    store: MemoryStore, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock.t = time.time() - (3 * HOUR + 86400 + 65)  # ends near the wall clock (the CLI's)
    committed = write_checkpoint(
        store, RUN, 1, created=clock.t, per_save_metadata=True, tag="11111111", heartbeats=2
    )
    killed = "22222222"  # an overwrite killed before its marker
    for n in (data_name(0, 0, killed), metadata_name(killed), heartbeat_name(killed, 0)):
        store.put(committed.key(n), b"x")
    lost = store.create_multipart(committed.key(data_name(1, 0, killed)))  # reply lost
    resave = write_checkpoint(
        store, RUN, 2, created=clock.t, commit=False, metadata=False, tag="33333333"
    )
    clock.t += 3 * HOUR
    live = "44444444"  # re-save of step 2 after the kill: live, same prefix
    store.put(resave.key(heartbeat_name(live, 0)), b"")
    live_up = store.create_multipart(resave.key(data_name(0, 0, live)))
    clock.t += 86400 + 60
    store.put(resave.key(heartbeat_name(live, 0)), b"")
    now = at(clock, 1)

    dry = gc(Location.of(RUN, store=store), options=RetentionOptions(now=now))
    want_committed = {
        committed.key(n)
        for n in (
            data_name(0, 0, killed),
            metadata_name(killed),
            heartbeat_name(killed, 0),
            heartbeat_name("11111111", 0),
            heartbeat_name("11111111", 1),
        )
    }
    # A dead save's names beside a live one wait: its prefix cannot be fenced without ending
    # the live save's claim (they go once that save commits or dies).
    want_resave: set[str] = set()
    assert set(dry.leftovers) == want_committed | want_resave
    assert [u.upload_id for u in dry.uploads] == [lost] and dry.abandoned == ()
    assert run_cli(store, monkeypatch, "gc", str(RUN), "--json")[0] == 0
    _, out = run_cli(store, monkeypatch, "gc", str(RUN), "--json")
    doc = json.loads(out)
    assert set(doc["leftovers"]) == set(dry.leftovers) and doc["applied"] is False

    r = gc(Location.of(RUN, store=store), apply=True, options=RetentionOptions(now=now))
    assert r.ok and r.leftovers_deleted == len(want_committed | want_resave) and r.aborted == 1
    assert lost not in store.uploads and live_up in store.uploads
    assert names(store, committed) == {
        MANIFEST_NAME,
        METADATA_NAME,
        metadata_name("11111111"),
        items_name("11111111"),
        *(data_name(i, 0, "11111111") for i in range(3)),
    }
    assert names(store, resave) == {
        heartbeat_name(live, 0),
        *(data_name(i, 0, "33333333") for i in range(3)),
    }
    (c1, c2) = list_checkpoints(Location.of(RUN, store=store), options=RetentionOptions(now=now))
    assert c1.is_committed and c2.state is CheckpointState.IN_PROGRESS and c2.live_saves == 1


def test_gc_rolls_forward_a_missing_or_stale_plain_metadata(
    store: MemoryStore, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, str]] = []

    def restore(st: Any, ckpt: StoreURL, manifest: Manifest) -> None:
        calls.append((ckpt.prefix, manifest.tag))
        st.put(ckpt.key(METADATA_NAME), st.get(ckpt.key(manifest.metadata_key)))

    monkeypatch.setattr("s3ckpt.retention._abandoned.restore_stock_metadata", restore)

    missing = write_checkpoint(
        store, RUN, 1, created=clock.t, per_save_metadata=True, tag="1a1a1a1a"
    )
    store.delete([missing.key(METADATA_NAME)])
    wrong = write_checkpoint(store, RUN, 2, created=clock.t, per_save_metadata=True, tag="2a2a2a2a")
    store.put(wrong.key(METADATA_NAME), b"a longer, older copy")
    older = write_checkpoint(store, RUN, 3, created=clock.t, per_save_metadata=True, tag="3a3a3a3a")
    clock.t += 10  # an overwrite of step 3 commits; its plain copy was never written
    store.delete([older.key(MANIFEST_NAME)])
    write_checkpoint(
        store, RUN, 3, created=clock.t, per_save_metadata=True, tag="3b3b3b3b", metadata=False
    )
    store.put(older.key(metadata_name("3b3b3b3b")), b"meta")
    fine = write_checkpoint(store, RUN, 4, created=clock.t, per_save_metadata=True)
    legacy = write_checkpoint(store, RUN, 5, created=clock.t)  # commits the plain .metadata
    busy = write_checkpoint(store, RUN, 6, created=clock.t, per_save_metadata=True, tag="6a6a6a6a")
    store.delete([busy.key(METADATA_NAME)])
    clock.t += 3 * HOUR
    store.put(busy.key(heartbeat_name("6b6b6b6b", 0)), b"")  # an overwrite is live: wait
    now = at(clock, 1)

    dry = gc(Location.of(RUN, store=store), options=RetentionOptions(now=now))
    stale = {str(missing), str(wrong), str(older)}
    assert set(dry.stale_metadata) == stale and calls == []
    r = gc(Location.of(RUN, store=store), apply=True, options=RetentionOptions(now=now))
    assert r.ok and set(r.restored) == stale
    assert sorted(calls) == [
        (missing.prefix, "1a1a1a1a"),
        (wrong.prefix, "2a2a2a2a"),
        (older.prefix, "3b3b3b3b"),
    ]
    assert fine.prefix not in {c[0] for c in calls} and legacy.prefix not in {c[0] for c in calls}
    assert gc(Location.of(RUN, store=store), options=RetentionOptions(now=now)).stale_metadata == ()


def test_gc_rolls_forward_with_the_real_helper(store: MemoryStore, clock: Clock) -> None:
    pytest.importorskip("s3ckpt._commit")
    ckpt = write_checkpoint(store, RUN, 1, created=clock.t, per_save_metadata=True)
    store.delete([ckpt.key(METADATA_NAME)])
    clock.t += 3 * HOUR
    r = gc(Location.of(RUN, store=store), apply=True, options=RetentionOptions(now=at(clock)))
    assert r.ok and r.restored == (str(ckpt),)
    assert store.get(ckpt.key(METADATA_NAME)) == b"meta"


# -- 4. ls shows saves in progress ---------------------------------------------------------------
def test_ls_shows_upload_only_saves_and_overwrites(
    store: MemoryStore, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock.t = time.time() - 3 * HOUR - 5  # ends near the wall clock (the CLI's)
    committed = write_checkpoint(store, RUN, 1, created=clock.t, tag="77777777")
    clock.t += 3 * HOUR
    store.create_multipart(RUN.child(ckpt_name(2)).key(data_name(0, 0, "88888888")))
    store.put(committed.key(heartbeat_name("99999999", 0)), b"")
    now = at(clock, 1)
    cat = {
        c.name: c
        for c in list_checkpoints(Location.of(RUN, store=store), options=RetentionOptions(now=now))
    }
    c2 = cat[ckpt_name(2)]
    assert c2.state is CheckpointState.IN_PROGRESS and c2.num_objects == 0
    assert c2.live_saves == 1 and len(c2.uploads) == 1
    assert cat[ckpt_name(1)].overwrite_in_progress
    # ls: the text and the JSON
    code, out = run_cli(store, monkeypatch, "ls", str(RUN))
    assert code == 0 and ckpt_name(2) in out
    assert f"{ckpt_name(2)}: 1 save in progress, 1 open upload, no objects yet" in out
    assert f"{ckpt_name(1)}: overwrite in progress (1 save in progress)" in out
    code, out = run_cli(store, monkeypatch, "ls", str(RUN), "--json")
    (run,) = json.loads(out)["runs"]
    by = {c["name"]: c for c in run["checkpoints"]}
    assert by[ckpt_name(2)]["state"] == "in_progress" and by[ckpt_name(2)]["open_uploads"] == 1
    assert by[ckpt_name(1)]["overwrite_in_progress"] is True and by[ckpt_name(1)]["live_saves"] == 1
    assert by[ckpt_name(1)]["tag"] == "77777777"


# -- 5. an intent log taken over by gc -----------------------------------------------------------
def _crashed_prune(store: MemoryStore, clock: Clock) -> None:
    """Steps 1-5; a pruner deleting 1 and 2 died after their markers and part of 1."""
    for s in range(1, 6):
        write_checkpoint(store, RUN, s, created=clock.t + s, per_save_metadata=True)
    for s in (1, 2):
        store.delete([RUN.child(ckpt_name(s)).key(MANIFEST_NAME)])
    store.delete([RUN.child(ckpt_name(1)).key(METADATA_NAME)])
    dead = LeaseRecord("dead", "other-host", 1, "x", 0, 0.0, deleting=(ckpt_name(1), ckpt_name(2)))
    store.put(RUN.key(LEASE_NAME), dead.to_json())
    clock.t += 3 * HOUR


def test_gc_taking_over_a_dead_pruners_lease_finishes_its_deletions(
    store: MemoryStore, clock: Clock
) -> None:
    _crashed_prune(store, clock)
    now = at(clock)
    dry = gc(Location.of(RUN, store=store), options=RetentionOptions(now=now))
    assert set(dry.resumed) == {str(RUN.child(ckpt_name(s))) for s in (1, 2)}
    r = gc(Location.of(RUN, store=store), apply=True, options=RetentionOptions(now=now))
    assert r.ok and set(r.resumed) == set(dry.resumed)
    for s in (1, 2):  # an older version's deletion: fenced now, and its saves reaped
        assert fenced(store, RUN.child(ckpt_name(s))) == set()
    assert [
        c.name
        for c in list_checkpoints(Location.of(RUN, store=store), options=RetentionOptions(now=now))
    ] == [ckpt_name(s) for s in (3, 4, 5)]
    rec = LeaseRecord.from_json(store.get(RUN.key(LEASE_NAME)))
    assert rec is not None and rec.released and rec.deleting == ()


def test_gc_carries_an_intent_it_cannot_finish_yet(store: MemoryStore, clock: Clock) -> None:
    _crashed_prune(store, clock)
    # step 2 is being saved again right now: not finished, but not forgotten either
    store.put(RUN.child(ckpt_name(2)).key(heartbeat_name("abababab", 0)), b"")
    r = gc(Location.of(RUN, store=store), apply=True, options=RetentionOptions(now=at(clock, 1)))
    assert r.resumed == (str(RUN.child(ckpt_name(1))),)
    rec = LeaseRecord.from_json(store.get(RUN.key(LEASE_NAME)))
    assert rec is not None and rec.deleting == (ckpt_name(2),)


def test_a_gc_that_dies_keeps_the_intent_log(store: MemoryStore, clock: Clock) -> None:
    _crashed_prune(store, clock)
    store.inject("list", key_glob=RUN.prefix, times=2)  # the re-listing under the lease fails
    with pytest.raises(Exception, match="injected"):
        gc(Location.of(RUN, store=store), apply=True, options=RetentionOptions(now=at(clock)))
    rec = LeaseRecord.from_json(store.get(RUN.key(LEASE_NAME)))
    assert rec is not None and set(rec.deleting) == {ckpt_name(1), ckpt_name(2)}


# -- 7. truthful reports ------------------------------------------------------------------------
def test_gc_reports_a_busy_run_as_skipped_not_removed(
    store: MemoryStore, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = write_checkpoint(store, RUN, 1, created=clock.t, commit=False, metadata=False)
    clock.t += 3 * HOUR
    holder = Lease(store, RUN, ttl=timedelta(hours=1), owner="cron").acquire()
    r = gc(Location.of(RUN, store=store), apply=True, options=RetentionOptions(now=at(clock)))
    assert r.removed == () and r.skipped == (str(dead),) and r.busy_runs == (str(RUN),)
    assert len(names(store, dead)) == 3
    code, out = run_cli(store, monkeypatch, "gc", str(RUN), "--apply")
    assert code == 4
    assert "abandoned saves: 1 (removed 0, skipped 1: lease held by another pruner)" in out
    holder.release()
    code, out = run_cli(store, monkeypatch, "gc", str(RUN), "--apply")
    assert code == 0 and "abandoned saves: 1 (removed 1)" in out


def test_prune_counts_resumed_deletions_in_its_totals(
    store: MemoryStore, clock: Clock, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    _crashed_prune(store, clock)
    policy = tmp_path / "p.toml"
    policy.write_text("[keep]\nlast = 5\n")
    code, out = run_cli(store, monkeypatch, "prune", str(RUN), "--policy", str(policy), "--apply")
    assert code == 0
    assert "deleted 2 of 2 (" in out and "2 of them finished for an interrupted prune" in out
    assert "of 0" not in out


def test_scan_lists_uploads_once_and_gc_reads_leases_only_where_they_are(
    store: MemoryStore, clock: Clock
) -> None:
    write_checkpoint(store, RUN, 1, created=clock.t)
    scan(Location.of(RUN, store=store), options=RetentionOptions(now=at(clock)))
    assert store.calls["list_multipart_uploads"] == 1 and store.calls["list"] == 1
    gets = store.calls["get"]
    gc(Location.of(RUN, store=store), options=RetentionOptions(now=at(clock)))
    # the marker and the run's s3ckpt.check.json (the catalog's); there is no lease to read
    assert store.calls["get"] == gets + 2


# -- 6. NaN / inf metrics from the markers --------------------------------------------------
def test_nan_and_inf_metrics_from_markers_rank_in_keep_best(
    store: MemoryStore, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    losses = [math.nan, math.inf, 0.5, -math.inf, math.nan]
    for i, loss in enumerate(losses):
        write_checkpoint(store, RUN, i + 1, created=clock.t + i, metrics={"loss": loss})
    clock.t += 3 * HOUR
    cat = list_checkpoints(Location.of(RUN, store=store), options=RetentionOptions(now=at(clock)))
    assert [c.metrics["loss"] for c in cat][1:4] == [math.inf, 0.5, -math.inf]
    assert math.isnan(cat[0].metrics["loss"])
    p = prune(
        Location.of(RUN, store=store), KeepBest(2, "loss"), options=RetentionOptions(now=at(clock))
    )
    assert set(p.plan.keep) == {ckpt_name(4), ckpt_name(3), ckpt_name(5)}  # 5: newest
    p = prune(
        Location.of(RUN, store=store),
        KeepBest(2, "loss", mode="max"),
        options=RetentionOptions(now=at(clock)),
    )
    assert set(p.plan.keep) == {ckpt_name(2), ckpt_name(3), ckpt_name(5)}
    _, out = run_cli(store, monkeypatch, "ls", str(RUN), "--json")
    (run,) = json.loads(out)["runs"]
    assert [c["metrics"]["loss"] for c in run["checkpoints"]] == ["nan", "inf", 0.5, "-inf", "nan"]
