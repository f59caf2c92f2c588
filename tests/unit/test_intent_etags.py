"""The intent log records the commit-marker ETags a pruner planned to delete (issue 27).

A pruner that dies after logging its intent must not have its successor delete an overwrite
that committed since: the successor finishes a marker only while it still has the ETag the
log recorded (conditionally), leaves any other marker to the plan, and re-plans every
present marker of a record without ETags (older versions). Against MemoryStore.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from s3ckpt._tombstone import Tombstone
from s3ckpt.format._manifest import Manifest
from s3ckpt.format._names import LEASE_NAME, MANIFEST_NAME
from s3ckpt.retention import (
    KeepLast,
    RetentionOptions,
    delete_checkpoint,
    gc,
    list_checkpoints,
    prune,
)
from s3ckpt.retention._catalog import CheckpointState
from s3ckpt.retention._lease import LeaseRecord
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


class Crash(Exception):
    """The pruner dies (raised from its progress hook)."""


def fill(store: MemoryStore, clock: Clock, steps: list[int]) -> None:
    for s in steps:
        clock.t = T0.timestamp() + s * 60
        write_checkpoint(store, RUN, s, created=clock.t, per_save_metadata=True)


def now(clock: Clock) -> datetime:
    return datetime.fromtimestamp(clock.t, UTC) + timedelta(hours=3)


def marker(s: int) -> str:
    return RUN.child(ckpt_name(s)).key(MANIFEST_NAME)


def lease_doc(store: MemoryStore) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(store.get(RUN.key(LEASE_NAME)))
    return doc


def die_after_intent(store: MemoryStore, clock: Clock, keep: int) -> None:
    """A prune that records its intent and dies before its first delete."""

    def hook(event: str, details: dict[str, Any]) -> None:
        if event == "intent":
            raise Crash

    with pytest.raises(Crash):
        prune(
            Location.of(RUN, store=store),
            KeepLast(keep),
            apply=True,
            options=RetentionOptions(now=now(clock), on_progress=hook),
        )


def overwrite(store: MemoryStore, clock: Clock, s: int) -> str:
    """Another save commits ``s`` again (a new tag, a new marker replacing the old one with
    ``If-Match``, as the commit does); its marker's ETag."""
    clock.t += 60
    scratch = StoreURL("memory", "b", "scratch/")
    src = write_checkpoint(store, scratch, s, created=clock.t, per_save_metadata=True)
    dst = RUN.child(ckpt_name(s))
    names = sorted(k[len(src.prefix) :] for k in keys_under(store, src.prefix))
    for n in (*(n for n in names if n != MANIFEST_NAME), MANIFEST_NAME):
        old = store.head(dst.key(n)) if n == MANIFEST_NAME else None
        etag = store.put(
            dst.key(n), store.get(src.key(n)), if_match=old.etag if old is not None else None
        )
    store.delete(sorted(keys_under(store, src.prefix)))
    return etag


def test_the_intent_records_the_planned_marker_etags(store: MemoryStore, clock: Clock) -> None:
    fill(store, clock, [1, 2, 3])
    etags = {ckpt_name(s): store.head(marker(s)).etag for s in (1, 2)}  # type: ignore[union-attr]
    die_after_intent(store, clock, keep=1)
    doc = lease_doc(store)
    assert doc["deleting"] == [ckpt_name(1), ckpt_name(2)]
    assert doc["planned"] == etags
    rec = LeaseRecord.from_json(store.get(RUN.key(LEASE_NAME)))
    assert rec is not None and dict(rec.planned) == etags
    assert LeaseRecord.from_json(rec.to_json()) == rec


def test_an_overwrite_after_a_dead_pruners_intent_survives_its_successor(
    store: MemoryStore, clock: Clock
) -> None:
    fill(store, clock, [1, 2, 3])
    die_after_intent(store, clock, keep=2)  # planned: step 1
    new = overwrite(store, clock, 1)
    # the successor keeps everything: only the dead pruner's log could delete step 1
    r = prune(
        Location.of(RUN, store=store),
        KeepLast(10),
        apply=True,
        options=RetentionOptions(now=now(clock)),
    )
    assert r.resumed == () and r.deleted == ()
    info = store.head(marker(1))
    assert info is not None and info.etag == new
    cat = {
        c.name: c
        for c in list_checkpoints(
            Location.of(RUN, store=store), options=RetentionOptions(now=now(clock))
        )
    }
    assert cat[ckpt_name(1)].state is CheckpointState.COMMITTED and not cat[ckpt_name(1)].damaged
    assert lease_doc(store)["deleting"] == []  # the log is settled: nothing carried forward


def test_a_marker_still_as_planned_is_finished(store: MemoryStore, clock: Clock) -> None:
    fill(store, clock, [1, 2, 3])
    die_after_intent(store, clock, keep=2)  # planned: step 1, nothing deleted yet
    r = prune(
        Location.of(RUN, store=store),
        KeepLast(10),
        apply=True,
        options=RetentionOptions(now=now(clock)),
    )
    assert r.resumed == (ckpt_name(1),) and r.deleted == (ckpt_name(1),)
    assert keys_under(store, RUN.child(ckpt_name(1)).prefix) == set()


@pytest.mark.parametrize("successor", ["rm", "gc"])
def test_rm_and_gc_finish_only_the_planned_marker(
    store: MemoryStore, clock: Clock, successor: str
) -> None:
    fill(store, clock, [1, 2, 3, 4])
    die_after_intent(store, clock, keep=2)  # planned: steps 1 and 2
    new = overwrite(store, clock, 1)
    if successor == "rm":
        delete_checkpoint(
            Location.of(RUN.child(ckpt_name(3)), store=store),
            options=RetentionOptions(now=now(clock)),
        )
    else:
        gc(Location.of(RUN, store=store), apply=True, options=RetentionOptions(now=now(clock)))
    if successor == "rm":
        assert store.head(marker(1)).etag == new  # type: ignore[union-attr]
    else:  # gc fenced the replaced save's leftovers: the overwrite's marker, reaped recorded
        kept = Manifest.from_json(store.get(marker(1)))
        assert kept.reaped and kept.tag not in kept.reaped
        assert store.head(marker(1)).etag != new  # type: ignore[union-attr]
    assert store.head(marker(2)) is None  # finished from the log
    assert keys_under(store, RUN.child(ckpt_name(2)).prefix) == set()


def test_an_overwrite_between_the_successors_listing_and_its_delete_survives(
    store: MemoryStore, clock: Clock
) -> None:
    fill(store, clock, [1, 2, 3])
    die_after_intent(store, clock, keep=2)  # planned: step 1
    new: list[str] = []

    def hook(event: str, details: dict[str, Any]) -> None:
        if event == "intent" and not new:  # the successor planned to finish step 1
            new.append(overwrite(store, clock, 1))

    r = prune(
        Location.of(RUN, store=store),
        KeepLast(10),
        apply=True,
        options=RetentionOptions(now=now(clock), on_progress=hook),
    )
    assert r.resumed == (ckpt_name(1),) and r.deleted == ()
    assert any("changed after it was planned" in n for n in r.notes)
    info = store.head(marker(1))
    assert info is not None and info.etag == new[0]
    cat = {
        c.name: c
        for c in list_checkpoints(
            Location.of(RUN, store=store), options=RetentionOptions(now=now(clock))
        )
    }
    assert cat[ckpt_name(1)].state is CheckpointState.COMMITTED and not cat[ckpt_name(1)].damaged


def test_a_record_without_etags_replans_present_markers(store: MemoryStore, clock: Clock) -> None:
    fill(store, clock, [1, 2, 3])
    store.delete([marker(2)])  # the dead pruner had deleted step 2's marker
    dead = LeaseRecord("dead", "other-host", 1, "x", 0, 0.0, deleting=(ckpt_name(1), ckpt_name(2)))
    store.put(RUN.key(LEASE_NAME), dead.to_json())  # an older version's log: no "planned"
    assert "planned" not in json.loads(dead.to_json()) or not dead.planned
    clock.t += 600
    r = prune(
        Location.of(RUN, store=store),
        KeepLast(10),
        apply=True,
        options=RetentionOptions(now=now(clock)),
    )
    assert r.resumed == (ckpt_name(2),)  # no marker: finished
    assert store.head(marker(1)) is not None  # present, no recorded ETag: the plan keeps it


def test_a_dead_deleters_tombstone_is_finished(clock: Clock) -> None:
    store = MemoryStore("b", clock=clock, conditional_deletes=False)
    fill(store, clock, [1, 2, 3])
    planned = store.head(marker(1)).etag  # type: ignore[union-attr]
    # the dead pruner swapped its tombstone in (PUT If-Match) and died before deleting it
    store.put(marker(1), Tombstone("dead", names=(".metadata",)).to_json(), if_match=planned)
    dead = LeaseRecord(
        "dead",
        "other-host",
        1,
        "x",
        0,
        0.0,
        deleting=(ckpt_name(1),),
        planned={ckpt_name(1): planned or ""},
    )
    store.put(RUN.key(LEASE_NAME), dead.to_json())
    clock.t += 600
    r = prune(
        Location.of(RUN, store=store),
        KeepLast(10),
        apply=True,
        options=RetentionOptions(now=now(clock)),
    )
    assert r.resumed == (ckpt_name(1),) and r.deleted == (ckpt_name(1),)
    assert keys_under(store, RUN.child(ckpt_name(1)).prefix) == set()
    assert [
        c.name
        for c in list_checkpoints(
            Location.of(RUN, store=store), options=RetentionOptions(now=now(clock))
        )
    ] == [
        ckpt_name(2),
        ckpt_name(3),
    ]
