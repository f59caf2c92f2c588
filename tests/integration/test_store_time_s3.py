"""Issue 27 items 1-3 over HTTP against moto: the store's time from a response's ``Date``,
gc and a same-hostname host, and retention under a writer whose clock is two days fast."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from datetime import timedelta

import pytest

from s3ckpt._commit import boot_id, pid_namespace
from s3ckpt.config import S3Config
from s3ckpt.format._names import data_name, heartbeat_name
from s3ckpt.retention import KeepWithin, RetentionOptions, gc, list_checkpoints, prune
from s3ckpt.store import Location
from s3ckpt.store._clock import store_time
from s3ckpt.store.s3 import S3Store
from s3ckpt.uri import StoreURL
from tests._retention_util import write_checkpoint

pytestmark = pytest.mark.integration

HOUR = 3600.0
DAY = 86400.0


def _store(moto_endpoint: str, bucket: str) -> S3Store:
    return S3Store(bucket, S3Config(endpoint_url=moto_endpoint))


def _backdate(bucket: str, prefix: str, seconds: float) -> None:
    """Make every object under ``prefix`` older on moto (its in-process backend)."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    b = s3_backends[DEFAULT_ACCOUNT_ID]["aws"].buckets[bucket]
    for key in b.keys.values():
        if key.name.startswith(prefix):
            key.last_modified = key.last_modified - timedelta(seconds=seconds)


def test_store_time_comes_from_the_date_header(moto_endpoint: str, bucket: str) -> None:
    before = time.time()
    t = store_time(_store(moto_endpoint, bucket), "runs/")
    after = time.time()
    assert t.measured and t.source == "the store's Date header"
    # moto shares this host's clock: the Date (whole seconds, +0.5 s) is within a second.
    assert before - 1.5 <= t.store.timestamp() <= after + 1.5
    assert abs(t.skew.total_seconds()) <= 1.5


def test_gc_keeps_a_live_save_of_a_same_hostname_host(moto_endpoint: str, bucket: str) -> None:
    if not (boot_id() and pid_namespace()):
        pytest.skip("needs Linux /proc (boot id, PID namespace)")
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    store = _store(moto_endpoint, bucket)
    # Both heartbeats name this hostname, the initial PID namespace and a pid that does not
    # exist here; only step_2's names this boot. step_1 is another machine's live save.
    for name, boot in (("step_1", "00000000-0000-0000-0000-000000000001"), ("step_2", boot_id())):
        tag = "abcd0123"
        body = {
            "tag": tag,
            "rank": 0,
            "host": socket.gethostname(),
            "pidns": pid_namespace(),
            "pid": child.pid,
            "boot": boot,
            "start": 1,
        }
        store.put(f"run/{name}/{data_name(0, 0, tag)}", b"x" * 10)
        store.put(f"run/{name}/{heartbeat_name(tag, 0)}", json.dumps(body).encode())
    result = gc(
        Location.of(StoreURL("s3", bucket, "run/"), store=store),
        apply=True,
        options=RetentionOptions(grace=timedelta(hours=2)),
    )
    assert result.ok
    left = {o.key.split("/")[1] for o in store.list("run/step_")}
    assert left == {"step_1"}


def test_a_fast_writer_does_not_make_within_delete_newer_steps(
    moto_endpoint: str, bucket: str
) -> None:
    store = _store(moto_endpoint, bucket)
    run = StoreURL("s3", bucket, "runs/skew/")
    now = time.time()
    # Steps 1-2 came from a node two days fast, 3-4 from a good one; committed an hour apart.
    for step in (1, 2, 3, 4):
        fast = 2 * DAY if step <= 2 else 0.0
        ckpt = write_checkpoint(store, run, step, created=now + fast, per_save_metadata=True)
        _backdate(bucket, ckpt.prefix, (4 - step) * HOUR)
    ckpts = list_checkpoints(Location.of(run, store=store))
    assert [c.step for c in ckpts] == [1, 2, 3, 4]
    assert ckpts[0].created is not None and ckpts[0].committed_at is not None
    assert ckpts[0].created - ckpts[0].committed_at > timedelta(days=2)
    r = prune(Location.of(run, store=store), KeepWithin(timedelta(minutes=90)), apply=True)
    assert r.ok and set(r.deleted) == {"step_000000001", "step_000000002"}
    assert [c.step for c in list_checkpoints(Location.of(run, store=store))] == [3, 4]
