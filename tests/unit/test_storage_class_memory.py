"""Storage classes on MemoryStore and FsspecStore, and ``restore_checkpoint`` (issue 31):
which objects a restore asks for, the states it reports, the wait, per-object failures."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from s3ckpt.errors import (
    ArchivedObjectError,
    CheckpointNotFoundError,
    ConfigError,
    PreconditionFailedError,
)
from s3ckpt.format._names import MANIFEST_NAME
from s3ckpt.store import Location, MemoryStore
from s3ckpt.store.base import ArchiveStore, RestoreState, archive_store, restore_state
from s3ckpt.store.fsspec_store import FsspecStore
from s3ckpt.tools import restore_checkpoint
from s3ckpt.uri import StoreURL
from tests._retention_util import Clock, keys_under, write_checkpoint

T0 = datetime(2025, 1, 1, tzinfo=UTC)
RUN = StoreURL("memory", "b", "runs/a/")


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def store(clock: Clock) -> MemoryStore:
    return MemoryStore("b", clock=clock, restore_seconds=3600)


def _archive(store: MemoryStore, prefix: str, cls: str = "GLACIER") -> list[str]:
    keys = sorted(k for k in keys_under(store, prefix) if not k.endswith(MANIFEST_NAME))
    for key in keys:
        store.set_storage_class(key, cls)
    return keys


def test_memory_store_moves_reads_and_restores_like_s3(store: MemoryStore, clock: Clock) -> None:
    store.put("k/a", b"abc")
    etag = store.head("k/a").etag  # type: ignore[union-attr]
    with pytest.raises(PreconditionFailedError):
        store.set_storage_class("k/a", "GLACIER", etag='"other"')
    info = store.set_storage_class("k/a", "GLACIER", etag=etag)
    assert (info.storage_class, info.etag) == ("GLACIER", etag)
    assert next(iter(store.list("k/"))).storage_class == "GLACIER"
    with pytest.raises(ArchivedObjectError, match=r"`s3ckpt restore s3://b/k/`"):
        store.get("k/a")
    with pytest.raises(ArchivedObjectError):
        store.open_range("k/a", 1, 1)
    assert store.restore_object("k/a", days=1) is RestoreState.STARTED
    assert store.restore_object("k/a", days=1) is RestoreState.IN_PROGRESS
    assert restore_state(store.head("k/a")) is RestoreState.IN_PROGRESS  # type: ignore[arg-type]
    clock.t += 3600
    assert store.restore_object("k/a", days=1) is RestoreState.RESTORED
    assert store.get("k/a") == b"abc"
    store.put("k/b", b"x")
    assert store.restore_object("k/b", days=1) is RestoreState.NOT_ARCHIVED
    store.put_object_tags("k/b", {"s3ckpt-tier": "GLACIER"})
    assert store.objects["k/b"].tags == {"s3ckpt-tier": "GLACIER"}
    with pytest.raises(ConfigError, match="days"):
        store.restore_object("k/a", days=0)
    with pytest.raises(ConfigError, match="tier"):
        store.restore_object("k/a", days=1, tier="Fast")


def test_fsspec_store_refuses_storage_classes_naming_the_url(tmp_path: object) -> None:
    fs = FsspecStore("memory", "bkt")
    assert not isinstance(fs, ArchiveStore) and isinstance(MemoryStore(), ArchiveStore)
    for operation in ("set_storage_class", "put_object_tags", "restore_object"):
        with pytest.raises(ConfigError, match=r"memory://bkt/a/b: storage classes are an S3"):
            archive_store(fs, "a/b", operation)


def test_restore_of_a_checkpoint_asks_for_every_archived_object_and_waits(
    store: MemoryStore, clock: Clock
) -> None:
    ckpt = write_checkpoint(store, RUN, 5, created=clock.t, per_save_metadata=True)
    archived = _archive(store, ckpt.prefix)
    seen: list[tuple[int, int]] = []
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.t += seconds

    res = restore_checkpoint(
        Location.of(ckpt, store=store),
        days=2,
        wait=True,
        poll_seconds=1000,
        progress=lambda d, t: seen.append((d, t)),
        sleep=sleep,
    )
    assert [o.key for o in res.objects] == archived  # data, both .metadata copies
    assert res.readable and res.waited and not res.failed
    assert res.counts["restored"] == len(archived) and slept == [1000, 1000, 1000, 1000]
    assert seen[-1][0] == seen[-1][1] == sum(o.size for o in res.objects)
    assert store.calls["restore"] == len(archived)
    doc = res.to_dict()
    assert doc["counts"]["restored"] == len(archived) and doc["readable"] is True


def test_restore_of_a_run_covers_its_archived_committed_checkpoints(
    store: MemoryStore, clock: Clock
) -> None:
    c1 = write_checkpoint(store, RUN, 1, created=clock.t)
    c2 = write_checkpoint(store, RUN, 2, created=clock.t)
    write_checkpoint(store, RUN, 3, created=clock.t)  # all STANDARD: not visited
    _archive(store, c1.prefix, "DEEP_ARCHIVE")
    _archive(store, c2.prefix, "GLACIER_IR")  # reads at once: nothing to restore
    clock.t += 86400
    res = restore_checkpoint(Location.of(RUN, store=store), days=1)
    assert [c.url for c in res.checkpoints] == [str(c1)]  # c2 reads at once, c3 is STANDARD
    assert (
        res.counts["started"] == 5 and res.counts["not_archived"] == 0
    )  # 3 data, .metadata, items
    assert not res.readable
    with pytest.raises(CheckpointNotFoundError, match="nothing to restore"):
        restore_checkpoint(Location.of(RUN.child("nope"), store=store))


def test_a_refused_restore_is_recorded_and_the_rest_go_on(store: MemoryStore, clock: Clock) -> None:
    ckpt = write_checkpoint(store, RUN, 5, created=clock.t)
    archived = _archive(store, ckpt.prefix)
    store.inject("restore", key_glob="*__0_*", times=1)
    res = restore_checkpoint(Location.of(ckpt, store=store))
    assert len(res.failed) == 1 and "injected fault" in (res.failed[0].error or "")
    assert res.counts["started"] == len(archived) - 1
