"""Issue 27 item 1: a writer (or a pruner holding a lease) is "provably gone" only on the same
boot of the same host -- boot id, hostname and PID namespace all ours -- and only when its pid
is absent or now belongs to another process (another start time). The same hostname and the
initial PID namespace id repeat across machines, so they alone prove nothing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from s3ckpt._commit import (
    boot_id,
    heartbeat_body,
    pid_namespace,
    process_gone,
    process_start,
    writer_gone,
)
from s3ckpt.errors import LeaseHeldError
from s3ckpt.format._names import LEASE_NAME, data_name, heartbeat_name
from s3ckpt.retention import gc
from s3ckpt.retention._lease import Lease, LeaseRecord
from s3ckpt.store import Location, MemoryStore
from s3ckpt.uri import StoreURL, parse_url

if not (boot_id() and pid_namespace() and process_start(os.getpid())):
    pytest.skip("needs Linux /proc (boot id, PID namespace, stat)", allow_module_level=True)

OTHER_BOOT = "00000000-1111-2222-3333-444444444444"


@pytest.fixture(scope="module")
def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture
def live_pid() -> Iterator[int]:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield child.pid
    finally:
        child.kill()
        child.wait()


def body(pid: int, *, boot: str | None, start: int | None = None) -> bytes:
    doc: dict[str, object] = {
        "tag": "abcd0123",
        "rank": 0,
        "host": socket.gethostname(),
        "pidns": pid_namespace(),
        "pid": pid,
    }
    if boot is not None:
        doc["boot"] = boot
    if start is not None:
        doc["start"] = start
    return json.dumps(doc).encode()


def test_a_heartbeat_records_the_boot_and_the_start_time() -> None:
    doc = json.loads(heartbeat_body("abcd0123", 3, 7))
    assert doc["boot"] == boot_id() and doc["start"] == process_start(os.getpid())
    assert doc["pid"] == os.getpid() and doc["host"] == socket.gethostname()
    assert not writer_gone(heartbeat_body("abcd0123", 3, 7))  # this very process


def test_same_hostname_and_pidns_on_another_boot_proves_nothing(dead_pid: int) -> None:
    assert not writer_gone(body(dead_pid, boot=OTHER_BOOT))
    assert not process_gone(socket.gethostname(), pid_namespace(), dead_pid, OTHER_BOOT)


def test_an_old_body_without_a_boot_id_proves_nothing(dead_pid: int) -> None:
    assert not writer_gone(body(dead_pid, boot=None))
    assert not writer_gone(body(dead_pid, boot=""))


def test_same_boot_and_a_dead_pid_is_gone(dead_pid: int) -> None:
    assert writer_gone(body(dead_pid, boot=boot_id()))
    assert writer_gone(body(dead_pid, boot=boot_id(), start=12345))


def test_a_reused_pid_is_not_the_writer(live_pid: int) -> None:
    start = process_start(live_pid)
    assert start is not None
    assert writer_gone(body(live_pid, boot=boot_id(), start=start + 1))  # another process
    assert not writer_gone(body(live_pid, boot=boot_id(), start=start))  # the writer itself
    assert not writer_gone(body(live_pid, boot=boot_id()))  # no start time: not provable


def test_another_hostname_on_the_same_boot_proves_nothing(dead_pid: int) -> None:
    # A container whose hostname differs from the host's: not ours to judge.
    doc = json.loads(body(dead_pid, boot=boot_id()))
    doc["host"] = "somewhere-else"
    assert not writer_gone(json.dumps(doc).encode())


def test_process_start_reads_a_command_name_with_spaces_and_parens() -> None:
    # Field 2 of /proc/<pid>/stat is "(comm)" and may hold ") (": parsed after the last ")".
    script = "import time; time.sleep(30)"
    child = subprocess.Popen(
        ["bash", "-c", f'exec -a "a) (b" {sys.executable} -c "{script}"'],
    )
    try:
        for _ in range(100):
            with open(f"/proc/{child.pid}/stat", "rb") as f:
                if b"(a) (b)" in f.read():
                    break
            time.sleep(0.02)
        assert process_start(child.pid) is not None
        assert process_start(child.pid) == process_start(child.pid)
    finally:
        child.kill()
        child.wait()


# -- the lease ---------------------------------------------------------------------------------
RUN = StoreURL("memory", "b", "runs/a/")


def _lease_record(pid: int, boot: str, start: int | None = None) -> LeaseRecord:
    return LeaseRecord(
        owner="holder",
        host=socket.gethostname(),
        pid=pid,
        pidns=pid_namespace(),
        acquired=0.0,
        expires=1e12,
        boot=boot,
        start=start,
        ttl=300.0,
    )


def test_a_lease_of_a_same_hostname_host_is_not_stale(dead_pid: int) -> None:
    store = MemoryStore("b")
    store.put(RUN.key(LEASE_NAME), _lease_record(dead_pid, OTHER_BOOT).to_json())
    with pytest.raises(LeaseHeldError):
        Lease(store, RUN).acquire()


def test_a_lease_of_a_dead_pid_on_this_boot_is_stale(dead_pid: int) -> None:
    store = MemoryStore("b")
    store.put(RUN.key(LEASE_NAME), _lease_record(dead_pid, boot_id()).to_json())
    assert Lease(store, RUN).acquire().held


def test_a_lease_whose_pid_was_reused_is_stale(live_pid: int) -> None:
    start = process_start(live_pid)
    assert start is not None
    store = MemoryStore("b")
    store.put(RUN.key(LEASE_NAME), _lease_record(live_pid, boot_id(), start).to_json())
    with pytest.raises(LeaseHeldError):
        Lease(store, RUN).acquire()  # the holder is alive
    store.put(RUN.key(LEASE_NAME), _lease_record(live_pid, boot_id(), start + 7).to_json())
    assert Lease(store, RUN).acquire().held  # pid reused: the holder is gone


def test_a_lease_record_round_trips_and_reads_old_bodies() -> None:
    rec = _lease_record(123, boot_id(), 456)
    again = LeaseRecord.from_json(rec.to_json())
    assert again == rec
    old = json.dumps(
        {"format": "s3ckpt.lease", "owner": "o", "host": "h", "pid": 1, "expires": 5.0}
    ).encode()
    parsed = LeaseRecord.from_json(old)
    assert parsed is not None and parsed.boot == "" and parsed.start is None
    assert parsed.ttl is None


# -- gc ----------------------------------------------------------------------------------------
def test_gc_keeps_a_save_whose_heartbeat_came_from_a_same_hostname_host(dead_pid: int) -> None:
    store = MemoryStore("bkt")
    for name, boot in (("step_1", OTHER_BOOT), ("step_2", boot_id())):
        store.put(f"run/{name}/{data_name(0, 0, 'abcd0123')}", b"x" * 10)
        store.put(f"run/{name}/{heartbeat_name('abcd0123', 0)}", body(dead_pid, boot=boot))
    result = gc(Location.of(parse_url("s3://bkt/run/"), store=store), apply=True)
    assert result.ok
    left = {k.split("/")[1] for k in store.objects if "/step_" in k}
    assert left == {"step_1"}  # another host's live save stays; ours, killed, goes


def test_only_the_coordinators_heartbeat_proves_a_save_dead(dead_pid: int) -> None:
    """A rank that died after the gather of the write results does not stop a (paused)
    coordinator from committing: only rank 0's heartbeat may prove the save gone."""
    from s3ckpt.retention._liveness import dead_saves

    store = MemoryStore("bkt")
    url = parse_url("s3://bkt/run/step_1/")
    me = process_start(os.getpid())
    gone = body(dead_pid, boot=boot_id(), start=12345)
    alive = body(os.getpid(), boot=boot_id(), start=me)
    store.put(url.key(heartbeat_name("abcd0123", 0)), alive)
    store.put(url.key(heartbeat_name("abcd0123", 1)), gone)
    keys = {"abcd0123": [url.key(heartbeat_name("abcd0123", r)) for r in (0, 1)]}
    assert dead_saves(store, keys) == set()  # rank 1 gone, the coordinator lives on
    store.put(url.key(heartbeat_name("abcd0123", 0)), gone)
    assert dead_saves(store, keys) == {"abcd0123"}
