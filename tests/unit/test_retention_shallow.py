"""The shallow scan on an in-memory store (the protocol's fallback requests): the same
catalog and plans as a deep scan, the knob's validation, and what it leaves unknown."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from s3ckpt.errors import ConfigError
from s3ckpt.format._names import PIN_NAME
from s3ckpt.retention import KeepCalendar, KeepLast, RetentionOptions, prune
from s3ckpt.retention._scan import scan
from s3ckpt.retention._shallow import find_runs, walk
from s3ckpt.store import Location
from s3ckpt.store.memory import MemoryStore
from s3ckpt.uri import StoreURL
from tests._retention_util import write_checkpoint

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def _store() -> tuple[MemoryStore, StoreURL]:
    store = MemoryStore("b")
    root = StoreURL("s3", "b", "r/")
    for run in ("r/a/", "r/g/b/"):
        for s in (1, 2, 3):
            url = StoreURL("s3", "b", run)
            write_checkpoint(
                store, url, s, created=(T0 + timedelta(days=s)).timestamp(), per_save_metadata=True
            )
    store.put("r/a/notes/readme.txt", b"x")
    return store, root


def test_scan_knob_is_validated() -> None:
    with pytest.raises(ConfigError, match="scan"):
        RetentionOptions(scan="quick")


def test_shallow_catalog_matches_deep() -> None:
    store, root = _store()
    deep = scan(Location.of(root, store=store), options=RetentionOptions(scan="deep"))
    shallow = scan(Location.of(root, store=store), options=RetentionOptions(scan="shallow"))
    view = [
        [(c.name, c.step, c.state, c.tag, c.committed_keys) for c in cat.checkpoints]
        for cat in deep
    ]
    assert [
        [(c.name, c.step, c.state, c.tag, c.committed_keys) for c in cat.checkpoints]
        for cat in shallow
    ] == view
    assert all(c.shallow and c.bytes_by_class == {} for cat in shallow for c in cat.checkpoints)
    assert not any("__" in o.key for o in walk(store, root, None)[0])
    assert find_runs(store, root, None) == ["r/a/", "r/g/b/"]


@pytest.mark.parametrize("policy", [KeepLast(1), KeepCalendar(daily=1)])
def test_shallow_prune_finds_the_pin_before_deleting(policy: object) -> None:
    store, _ = _store()
    run = StoreURL("s3", "b", "r/a/")
    store.put("r/a/step_000000001/" + PIN_NAME, b'{"reason": "keep"}')
    plans = {}
    for mode in ("deep", "shallow"):
        p = prune(Location.of(run, store=store), policy, options=RetentionOptions(scan=mode)).plan  # type: ignore[arg-type]
        plans[mode] = [(d.checkpoint.name, d.action) for d in p.decisions]
    assert plans["shallow"] == plans["deep"]
    assert ("step_000000001", "keep") in plans["deep"]
