"""The shallow scan over HTTP (moto's server): the same catalog and the same plans as a deep
scan, without listing committed checkpoints' keys; a prune re-checks what it deletes."""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime, timedelta

import pytest

from s3ckpt.cli import main
from s3ckpt.format._names import MANIFEST_NAME, PIN_NAME, heartbeat_name
from s3ckpt.retention import KeepLast, KeepWithin, RetentionOptions, prune
from s3ckpt.retention._scan import scan
from s3ckpt.retention._shallow import find_runs, walk
from s3ckpt.store import Location
from s3ckpt.store.s3 import S3Store
from s3ckpt.uri import StoreURL
from tests._retention_util import write_checkpoint

pytestmark = pytest.mark.integration

T0 = datetime(2025, 1, 1, tzinfo=UTC)
DEEP = RetentionOptions(scan="deep")
SHALLOW = RetentionOptions(scan="shallow")


def _fill(store: S3Store, run: StoreURL, steps: list[int], **kw: object) -> None:
    for s in steps:
        created = (T0 + timedelta(hours=s)).timestamp()
        write_checkpoint(
            store,
            run,
            s,
            created=created,
            metrics={"loss": 10.0 - s},
            per_save_metadata=True,
            **kw,  # type: ignore[arg-type]
        )


def _fleet(bucket: str) -> tuple[S3Store, StoreURL]:
    store = S3Store(bucket)
    root = StoreURL("s3", bucket, "fleet/")
    a, b = root.child("run-a"), root.child("team/run-b")
    _fill(store, a, [1, 2, 3, 4])
    _fill(store, b, [10, 20])
    write_checkpoint(store, a, 5, created=T0.timestamp(), commit=False)  # in progress
    store.put(a.key("s3ckpt.latest.json"), b"{}")
    store.put(a.key("tensorboard/events.out"), b"x")
    return store, root


def _view(cats: list) -> list[tuple]:  # type: ignore[type-arg]
    return [
        (str(cat.run), c.name, c.step, c.state, dict(c.metrics), c.tag, c.committed_keys)
        for cat in cats
        for c in cat.checkpoints
    ]


def test_shallow_catalog_agrees_with_deep_and_lists_no_committed_keys(bucket: str) -> None:
    store, root = _fleet(bucket)
    deep = scan(Location.of(root, store=store), options=DEEP)
    shallow = scan(Location.of(root, store=store), options=SHALLOW)
    assert _view(shallow) == _view(deep)
    by = {c.name: c for cat in shallow for c in cat.checkpoints}
    assert by["step_000000001"].shallow and not by["step_000000005"].shallow
    assert by["step_000000001"].to_dict()["bytes_by_class"] is None  # unknown, not STANDARD
    deep_size = {c.name: c.size for cat in deep for c in cat.checkpoints}["step_000000001"]
    assert 0 < by["step_000000001"].size <= deep_size  # what the marker commits
    listed = {o.key for o in walk(store, root, None)[0]}
    assert not any("step_000000001/__" in k for k in listed)  # data never listed
    assert any("step_000000005/" in k for k in listed)  # the uncommitted one is, deeply
    assert find_runs(store, root, None) == ["fleet/run-a/", "fleet/team/run-b/"]


def test_prune_shallow_rechecks_pins_and_overwrites(bucket: str) -> None:
    store, root = _fleet(bucket)
    run = root.child("run-a")
    store.put(run.child("step_000000001").key(PIN_NAME), b'{"reason": "paper"}')
    store.put(run.child("step_000000002").key(heartbeat_name("0badc0de", 0)), b"")  # overwrite
    plans = {}
    for opts in (DEEP, SHALLOW):
        p = prune(Location.of(run, store=store), KeepLast(1), options=opts).plan
        plans[opts.scan] = [(d.checkpoint.name, d.action) for d in p.decisions]
    assert plans["shallow"] == plans["deep"]
    assert ("step_000000001", "keep") in plans["deep"]
    assert ("step_000000002", "skip") in plans["deep"]
    assert ("step_000000003", "delete") in plans["deep"]


def test_prune_shallow_apply_deletes_what_deep_deletes(bucket: str) -> None:
    store = S3Store(bucket)
    left = {}
    for mode in ("deep", "shallow"):
        run = StoreURL("s3", bucket, f"{mode}/run/")
        _fill(store, run, [1, 2, 3, 4], heartbeats=2)
        store.put(run.key("step_000000002/notes.txt"), b"keep me")  # foreign: never deleted
        res = prune(
            Location.of(run, store=store),
            KeepLast(2),
            apply=True,
            options=RetentionOptions(scan=mode),
        )
        assert res.deleted == ("step_000000001", "step_000000002")
        keys = (o.key.split("/", 1)[1] for o in store.list(f"{mode}/"))
        left[mode] = sorted(re.sub(r"\.[0-9a-f]{8}\b", ".TAG", k) for k in keys)
    assert left["shallow"] == left["deep"]
    assert "run/step_000000002/notes.txt" in left["shallow"]


def test_rewritten_marker_time_does_not_move_keep_within(bucket: str) -> None:
    """attach_metrics rewrites a marker: its LastModified is later than its commit. KeepWithin
    judges from the newest commit; the shallow plan must not slide its window forward."""
    store = S3Store(bucket)
    run = StoreURL("s3", bucket, "within/")
    _fill(store, run, [1, 2])
    time.sleep(2.1)
    _fill(store, run, [3])
    time.sleep(2.1)
    key = run.child("step_000000001").key(MANIFEST_NAME)
    store.put(key, store.get(key))  # the marker rewritten in place, as attach_metrics does
    policy = KeepWithin(timedelta(seconds=3))
    plans = {
        o.scan: [
            (d.checkpoint.name, d.action)
            for d in prune(Location.of(run, store=store), policy, options=o).plan.decisions
        ]
        for o in (DEEP, SHALLOW)
    }
    assert plans["shallow"] == plans["deep"]
    assert ("step_000000002", "keep") in plans["deep"]


def test_cli_scan_flag(bucket: str, capsys: pytest.CaptureFixture[str]) -> None:
    _, root = _fleet(bucket)
    assert main(["ls", str(root), "--scan", "shallow", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    text = json.dumps(doc)
    assert '"scan": "shallow"' in text and '"scan": "deep"' in text
