"""delete_checkpoint (``s3ckpt rm``) against MemoryStore: order, refusals, faults, crashes."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from s3ckpt._tombstone import Tombstone
from s3ckpt.errors import (
    CheckpointNotFoundError,
    ConfigError,
    DeleteRefusedError,
    LeaseHeldError,
    TransientStoreError,
)
from s3ckpt.format._names import (
    ITEMS_PREFIX,
    LATEST_NAME,
    LEASE_NAME,
    MANIFEST_NAME,
    METADATA_NAME,
)
from s3ckpt.retention import (
    KeepLast,
    RetentionOptions,
    delete_checkpoint,
    list_checkpoints,
    pin,
    prune,
)
from s3ckpt.retention._catalog import CheckpointState
from s3ckpt.retention._lease import Lease, LeaseRecord
from s3ckpt.retention._results import DeleteResult
from s3ckpt.store import Location, MemoryStore
from s3ckpt.store.base import DeleteFailures
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


def fill(store: MemoryStore, clock: Clock, steps: Sequence[int]) -> None:
    for s in steps:
        clock.t = T0.timestamp() + s * 60
        write_checkpoint(store, RUN, s, created=clock.t)


def later(clock: Clock) -> datetime:
    """A time when nothing written so far is in progress any more."""
    return datetime.fromtimestamp(clock.t, UTC) + timedelta(hours=3)


def rm(store: MemoryStore, clock: Clock, step_or_name: int | str, **kw: object) -> DeleteResult:
    name = ckpt_name(step_or_name) if isinstance(step_or_name, int) else step_or_name
    kw.setdefault("now", later(clock))
    kw.setdefault("sleep", lambda s: None)
    per_call = {k: kw.pop(k) for k in ("allow_newest", "dry_run") if k in kw}
    return delete_checkpoint(
        Location.of(RUN.child(name), store=store),
        options=RetentionOptions(**kw),  # type: ignore[arg-type]
        **per_call,  # type: ignore[arg-type]
    )


def test_deletes_the_marker_first_then_what_s3ckpt_wrote_and_keeps_the_rest(
    store: MemoryStore, clock: Clock
) -> None:
    fill(store, clock, [1, 2, 3])
    c1 = RUN.child(ckpt_name(1))
    store.put(c1.key("events.out.tfevents"), b"tb")  # not s3ckpt's: stays
    others = keys_under(store, RUN.child(ckpt_name(2)).prefix)
    requests: list[list[str]] = []
    real = store.delete

    def spy(keys: Sequence[str]) -> DeleteFailures:
        if not all(".probe-" in k for k in keys):  # (not the lease's capability probe)
            requests.append([k.rpartition("/")[2] for k in keys])
        return real(keys)

    real_if = store.delete_if_match

    def spy_if(key: str, etag: str) -> None:  # the marker: only while it is the planned one
        if key.endswith(MANIFEST_NAME):  # (not the lease's capability probe)
            requests.append([key.rpartition("/")[2]])
        real_if(key, etag)

    store.delete = spy  # type: ignore[method-assign]
    store.delete_if_match = spy_if  # type: ignore[method-assign]
    r = rm(store, clock, 1)
    assert r.applied and r.deleted and r.ok and r.state is CheckpointState.COMMITTED
    # The fence (a tombstone PUT on the marker) first, then .metadata, the data and the item
    # records, and the tombstone last (no other save's names were there: it need not stay).
    assert r.step == 1 and r.keys_deleted == 6 and r.delete_requests == 4
    assert requests == [
        [METADATA_NAME],
        sorted(requests[1]),  # the data and the item records
        [MANIFEST_NAME],
    ]
    assert sum(n.endswith(".distcp") for n in requests[1]) == 3
    assert [n[: len(ITEMS_PREFIX)] for n in requests[1] if not n.endswith(".distcp")] == [
        ITEMS_PREFIX
    ]
    assert r.kept == (c1.key("events.out.tfevents"),)
    assert keys_under(store, c1.prefix) == {c1.key("events.out.tfevents")}
    assert keys_under(store, RUN.child(ckpt_name(2)).prefix) == others
    names = [
        c.name
        for c in list_checkpoints(
            Location.of(RUN, store=store), options=RetentionOptions(now=later(clock))
        )
    ]
    assert names == [ckpt_name(2), ckpt_name(3)]
    rec = LeaseRecord.from_json(store.get(RUN.key(LEASE_NAME)))
    assert rec is not None and rec.released and rec.deleting == () and rec.operation == "rm"
    assert r.to_dict()["deleted"] is True


def test_dry_run_lists_the_keys_and_changes_nothing(store: MemoryStore, clock: Clock) -> None:
    fill(store, clock, [1, 2])
    before = dict(store.objects)
    r = rm(store, clock, 1, dry_run=True)
    assert not r.applied and not r.deleted and len(r.keys) == 6
    assert store.objects == before and store.calls.get("delete", 0) == 0


def nothing_written(store: MemoryStore, before: dict[str, object]) -> bool:
    return store.objects == before and RUN.key(LEASE_NAME) not in store.objects


def test_refusals_name_the_url_and_change_nothing(store: MemoryStore, clock: Clock) -> None:
    fill(store, clock, [1, 2, 3, 4, 5])
    pin(store, RUN.child(ckpt_name(2)), "paper figure 3")
    clock.t += 3 * 3600
    write_checkpoint(store, RUN, 6, created=clock.t, commit=False, name="foreign")
    write_checkpoint(store, RUN, 7, created=clock.t, commit=False, metadata=False, name="dead")
    now = later(clock)
    clock.t = now.timestamp() - 60
    write_checkpoint(store, RUN, 8, created=clock.t, commit=False)  # a save in progress
    before = dict(store.objects)
    cases = [
        (ckpt_name(2), "pinned", "it is pinned (paper figure 3); unpin it first"),
        (ckpt_name(5), "newest", "it is the run's newest committed checkpoint"),
        (ckpt_name(8), "in_progress", "a save is still writing it"),
        ("foreign", "foreign", "pass include_foreign=True (s3ckpt rm --include-foreign)"),
        ("dead", "abandoned", "s3ckpt gc"),
    ]
    for name, reason, text in cases:
        with pytest.raises(DeleteRefusedError) as info:
            delete_checkpoint(
                Location.of(RUN.child(name), store=store), options=RetentionOptions(now=now)
            )
        msg = str(info.value)
        assert info.value.reason == reason, msg
        assert msg.startswith(f"refusing to delete {RUN.child(name)}: ") and text in msg, msg
        assert "nothing was deleted" in msg
        assert nothing_written(store, before), name
    for url, error in [
        (RUN.child("nope"), CheckpointNotFoundError),
        (RUN, ConfigError),  # a run
        (StoreURL("memory", "b", "runs/"), CheckpointNotFoundError),  # a folder of runs
        (StoreURL("memory", "b", ""), ConfigError),  # the bucket's root
    ]:
        with pytest.raises(error) as err:
            delete_checkpoint(Location.of(url, store=store), options=RetentionOptions(now=now))
        assert str(url) in str(err.value)
        assert nothing_written(store, before), url
    # what the refusals were about can still be deleted when asked
    r = delete_checkpoint(
        Location.of(RUN.child("foreign"), store=store),
        options=RetentionOptions(now=now, include_foreign=True),
    )
    assert r.deleted and r.state is CheckpointState.FOREIGN
    r = delete_checkpoint(
        Location.of(RUN.child(ckpt_name(5)), store=store),
        allow_newest=True,
        options=RetentionOptions(now=now),
    )
    assert r.deleted and any("newest" in n for n in r.notes)
    with pytest.raises(DeleteRefusedError, match="newest committed"):
        delete_checkpoint(
            Location.of(RUN.child(ckpt_name(4)), store=store), options=RetentionOptions(now=now)
        )  # 4 is the newest now


def test_the_most_recently_committed_is_refused_after_a_rollback(
    store: MemoryStore, clock: Clock
) -> None:
    fill(store, clock, [1, 2, 3])
    clock.t += 3600  # resumed from step 1: step 2 saved again, later than step 3
    write_checkpoint(store, RUN, 2, created=clock.t, name="step_000000002-rollback")
    with pytest.raises(DeleteRefusedError, match="most recently committed") as info:
        rm(store, clock, "step_000000002-rollback")
    assert info.value.reason == "newest"
    assert rm(store, clock, 2).deleted


def test_lease_held_by_another_pruner(store: MemoryStore, clock: Clock) -> None:
    fill(store, clock, [1, 2])
    Lease(store, RUN, owner="cron").acquire()
    with pytest.raises(LeaseHeldError):
        rm(store, clock, 1)
    assert list_checkpoints(
        Location.of(RUN, store=store), options=RetentionOptions(now=later(clock))
    )[0].is_committed


def test_a_lost_reply_of_the_fence_or_of_its_delete_is_decided_by_reading_back(
    store: MemoryStore, clock: Clock
) -> None:
    """The tombstone PUT (the fence) and the tombstone's delete each reach the store, their
    replies are lost and the retry meets their effect (412, 404): both are decided by
    reading the marker back, and rm finishes in one call."""
    fill(store, clock, [1, 2])
    real_put, real_if = store.put, store.delete_if_match

    def put_twice(key: str, data: bytes, **kw: object) -> str:
        etag = real_put(key, data, **kw)  # type: ignore[arg-type]
        if key.endswith(MANIFEST_NAME) and Tombstone.parse(data) is not None:
            real_put(key, data, **kw)  # type: ignore[arg-type]  # the retry: 412
        return etag

    def delete_twice(key: str, etag: str) -> None:
        real_if(key, etag)
        if key.endswith(MANIFEST_NAME):
            real_if(key, etag)  # the retry of an applied delete: 404

    store.put = put_twice  # type: ignore[method-assign]
    store.delete_if_match = delete_twice  # type: ignore[method-assign]
    r = rm(store, clock, 1)
    assert r.deleted and r.ok
    assert keys_under(store, RUN.child(ckpt_name(1)).prefix) == set()


def test_a_throttled_request_is_retried_within_the_call(store: MemoryStore, clock: Clock) -> None:
    fill(store, clock, [1, 2])
    store.inject(
        "delete", lambda k: TransientStoreError("slow", key=k, code="SlowDown"), key_glob="*/step_*"
    )
    sleeps: list[float] = []
    r = rm(store, clock, 1, sleep=sleeps.append)
    assert r.deleted and r.ok and sleeps


def test_a_crash_mid_way_is_finished_by_the_next_pruner(store: MemoryStore, clock: Clock) -> None:
    fill(store, clock, [1, 2, 3])

    def crash(event: str, details: dict[str, object]) -> None:
        if event == "delete" and details["phase"] == "metadata":
            raise KeyboardInterrupt  # killed after the marker went, before the data

    with pytest.raises(KeyboardInterrupt):
        rm(store, clock, 1, on_progress=crash)
    c1 = RUN.child(ckpt_name(1))
    assert Tombstone.parse(store.get(c1.key(MANIFEST_NAME))) is not None
    assert len(keys_under(store, c1.prefix)) > 1
    state = {
        c.name: c.state
        for c in list_checkpoints(
            Location.of(RUN, store=store), options=RetentionOptions(now=later(clock))
        )
    }
    assert state[ckpt_name(1)] is CheckpointState.BEING_DELETED
    # The next pruner (a prune here) finishes it (it is being deleted, and in the intent log).
    r = prune(
        Location.of(RUN, store=store),
        KeepLast(5),
        apply=True,
        options=RetentionOptions(now=later(clock)),
    )
    assert r.resumed == (ckpt_name(1),) and ckpt_name(1) in r.deleted
    assert keys_under(store, c1.prefix) == set()


def test_rm_finishes_a_dead_pruners_deletions_too(store: MemoryStore, clock: Clock) -> None:
    fill(store, clock, [1, 2, 3])
    store.delete([RUN.child(ckpt_name(1)).key(MANIFEST_NAME)])  # the dead pruner got this far
    dead = LeaseRecord("dead", "other-host", 1, "x", 0, 0.0, deleting=(ckpt_name(1),))
    store.put(RUN.key(LEASE_NAME), dead.to_json())
    clock.t += 600  # its lease object is older than the TTL, in the store's time
    r = rm(store, clock, 2)
    assert r.deleted and r.resumed == (ckpt_name(1),)
    assert [
        c.name
        for c in list_checkpoints(
            Location.of(RUN, store=store), options=RetentionOptions(now=later(clock))
        )
    ] == [ckpt_name(3)]


def test_framework_names_and_a_step_pattern_tell_the_newest(
    store: MemoryStore, clock: Clock
) -> None:
    # Named by step, saved in another order: the name's step says which is the newest.
    for i, (name, step) in enumerate([("ckpt_s900", 900), ("ckpt_s100", 100), ("x_s500", 500)]):
        clock.t = T0.timestamp() + i  # committed in this order, in the store's time
        write_checkpoint(store, RUN, step, created=T0.timestamp() + i, name=name, record_step=False)
    with pytest.raises(DeleteRefusedError, match="newest committed"):
        rm(store, clock, "ckpt_s900", step_pattern=r"\w+_s(\d+)")
    with pytest.raises(DeleteRefusedError, match="most recently committed"):
        rm(store, clock, "x_s500", step_pattern=r"\w+_s(\d+)")
    assert rm(store, clock, "ckpt_s100", step_pattern=r"\w+_s(\d+)").deleted
    with pytest.raises(ConfigError):
        rm(store, clock, "ckpt_s900", step_pattern="no group")


def test_a_latest_pointer_naming_the_deleted_checkpoint_falls_back_to_a_listing(
    store: MemoryStore, clock: Clock
) -> None:
    from s3ckpt.checkpointer._latest import LatestPointer
    from s3ckpt.checkpointer._ranks import RankGroup

    fill(store, clock, [1, 2, 3])
    pointer = LatestPointer(store, RUN, RankGroup(None))
    pointer.write(3)
    assert rm(store, clock, 3, allow_newest=True).deleted
    assert store.head(RUN.key(LATEST_NAME)) is not None, "the pointer is left as it is"
    assert next(pointer.candidates(timedelta(hours=2))).step == 2
