"""A lease on a local folder (FsspecStore, file://) can be taken over and renewed: head
reports the same MD5 ETag a conditional put returns and compares."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from s3ckpt.retention._lease import Lease
from s3ckpt.store import open_store


def test_takeover_then_renew_on_a_local_folder(tmp_path: Path) -> None:
    store, run = open_store(f"file://{tmp_path}/runs/a/")
    now = [1000.0]
    first = Lease(store, run, ttl=timedelta(seconds=60), clock=lambda: now[0]).acquire()
    first.release()  # released: the next pruner takes it over with a conditional put
    second = Lease(store, run, ttl=timedelta(seconds=60), clock=lambda: now[0]).acquire()
    now[0] += 45  # past half the TTL: renewing is a conditional put on the takeover's ETag
    second.renew_if_due()
    second.record_intent(["step_000000001"])
    second.release()  # conditional too: raises LeaseLostError if the ETags disagree


def test_head_gives_small_local_files_the_put_etag(tmp_path: Path) -> None:
    store, run = open_store(f"file://{tmp_path}/x/")
    etag = store.put(run.key("small"), b"abc", if_none_match=True)
    info = store.head(run.key("small"))
    assert info is not None and info.etag == etag
    store.put(run.key("big"), bytes(2 << 20))
    big = store.head(run.key("big"))
    assert big is not None and big.etag is None  # no whole-file read for a data object
