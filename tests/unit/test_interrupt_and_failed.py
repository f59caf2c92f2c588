"""Ctrl-C during a save or a load stays KeyboardInterrupt (after cleanup), and a save that
s3ckpt saw fail is recorded, so the catalog lists it as failed at once (issue 28, items 13
and 15). MemoryStore only: the same over HTTP is tests/integration/test_failed_save_s3.py."""

from __future__ import annotations

import signal
import threading
import traceback
from datetime import UTC, datetime, timedelta

import pytest
import torch
from torch.distributed.checkpoint.api import CheckpointException

from s3ckpt import Checkpointer
from s3ckpt._commit import record_failure
from s3ckpt.errors import (
    CheckpointError,
    StoreError,
    TransientStoreError,
    find_interrupt,
    unwrap_checkpoint_exception,
)
from s3ckpt.format._names import (
    LATEST_NAME,
    MANIFEST_NAME,
    data_name,
    failure_name,
    heartbeat_name,
    owned_tag,
)
from s3ckpt.retention import CheckpointInfo, RetentionOptions, gc, list_checkpoints
from s3ckpt.retention._abandoned import FAILURE_SETTLE
from s3ckpt.retention._catalog import CheckpointState
from s3ckpt.store import Location, MemoryStore
from s3ckpt.uri import StoreURL, parse_url
from tests._helpers import SMALL

URL = "s3://unit-bkt/run"
RUN = parse_url(URL + "/")


def _model(seed: int) -> torch.nn.Module:
    """6 MiB of weight (a two-part multipart upload with SMALL) and a bias (one PUT)."""
    torch.manual_seed(seed)
    return torch.nn.Linear(1024, 1536)


def _by_step(store: MemoryStore) -> dict[int | None, CheckpointInfo]:
    return {c.step: c for c in list_checkpoints(Location.of(RUN, store=store))}


def _keys(store: MemoryStore, step: int) -> set[str]:
    prefix = RUN.child(f"step_{step:09d}").prefix
    return {k[len(prefix) :] for k in store.objects if k.startswith(prefix)}


def _assert_step_1_intact(ckpt: Checkpointer, store: MemoryStore, pointer: bytes) -> None:
    assert store.objects[RUN.key(LATEST_NAME)].data == pointer  # latest unchanged
    assert ckpt.latest() == 1
    fresh = _model(99)
    assert ckpt.load(fresh) == 1
    assert torch.equal(fresh.weight, _model(1).weight)


# (operation, key glob): where the Ctrl-C lands. A part upload runs on an upload thread (its
# KeyboardInterrupt reaches the saving thread through the uploader); the multipart create
# and the marker PUT run on the thread that called save.
INTERRUPTS = [
    ("upload_part", "*.distcp"),
    ("create_multipart", "*.distcp"),
    ("put", f"*/{MANIFEST_NAME}"),
]


@pytest.mark.parametrize(("op", "glob"), INTERRUPTS)
def test_ctrl_c_in_a_save_is_keyboard_interrupt_and_leaves_the_previous_checkpoint(
    op: str, glob: str
) -> None:
    store = MemoryStore("unit-bkt")
    with Checkpointer(URL, store=store, transfer_config=SMALL) as ckpt:
        ckpt.save(1, _model(1))
        pointer = store.objects[RUN.key(LATEST_NAME)].data
        fault = store.inject(op, lambda key: KeyboardInterrupt(), key_glob=glob)
        with pytest.raises(KeyboardInterrupt) as info:
            ckpt.save(2, _model(2))
        assert fault.hits == 1
        assert not isinstance(info.value, CheckpointError)
        assert store.uploads == {}  # every multipart upload was aborted
        left = _keys(store, 2)
        assert MANIFEST_NAME not in left
        if op != "put":
            # Everything the save uploaded, its heartbeat included, was removed again.
            assert left == set() and 2 not in _by_step(store)
        else:
            # The marker PUT may have been applied: its objects stay, the failure is
            # recorded, and the catalog lists it failed (the marker would have won).
            assert sum(1 for k in left if k.startswith("s3ckpt.failed.")) == 1
            assert any(k.endswith(".distcp") for k in left)
            step2 = _by_step(store)[2]
            assert step2.state is CheckpointState.ABANDONED and step2.failed
            assert step2.failure is not None
            assert "interrupted (KeyboardInterrupt)" in step2.failure
            gc(Location.of(RUN, store=store), apply=True, options=RetentionOptions(now=_settled()))
            assert _keys(store, 2) == set()
        _assert_step_1_intact(ckpt, store, pointer)
        # The same step saves again: the failure record is that one save's, not the prefix's.
        ckpt.save(2, _model(2))
        again = _by_step(store)[2]
        assert again.is_committed and not again.failed
        assert ckpt.latest() == 2


def test_ctrl_c_during_a_load_is_keyboard_interrupt() -> None:
    store = MemoryStore("unit-bkt")
    with Checkpointer(URL, store=store, transfer_config=SMALL) as ckpt:
        ckpt.save(1, _model(1))
        store.inject("get", lambda key: KeyboardInterrupt(), key_glob="*.distcp")
        with pytest.raises(KeyboardInterrupt) as info:
            ckpt.load(_model(5))
        assert not isinstance(info.value, CheckpointException)
        assert ckpt.load(_model(5)) == 1  # nothing was changed by the interrupted load


def test_ctrl_c_while_an_async_save_uploads_reaches_the_next_save() -> None:
    store = MemoryStore("unit-bkt")
    gate = threading.Event()
    complete = store.complete_multipart

    def held(*args: object, **kwargs: object) -> str:
        gate.wait(30)
        return complete(*args, **kwargs)  # type: ignore[arg-type]

    store.complete_multipart = held  # type: ignore[method-assign]
    main = threading.main_thread().ident
    assert main is not None and threading.get_ident() == main
    ckpt = Checkpointer(URL, store=store, transfer_config=SMALL)
    handle = ckpt.async_save(1, _model(1))
    handle.staged.result(timeout=60)
    # SIGINT while the next async_save waits for the one in flight (on_busy="wait").
    timer = threading.Timer(0.5, signal.pthread_kill, (main, signal.SIGINT))
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            ckpt.async_save(2, _model(2))
    finally:
        timer.cancel()
        gate.set()
    ckpt.close()
    assert [c.step for c in ckpt.list()] == [1]


def _wrapped(exc: BaseException, rank: int = 0) -> CheckpointException:
    return CheckpointException("write", {rank: (exc, traceback.StackSummary())})


def test_interrupts_are_found_inside_dcp_wrappers_and_never_become_checkpoint_errors() -> None:
    ki = KeyboardInterrupt()
    url = "s3://unit-bkt/run/step_000000002/"
    assert find_interrupt(_wrapped(ki, 1)) is ki
    assert unwrap_checkpoint_exception(_wrapped(ki), url) is ki
    bye = SystemExit(3)
    assert unwrap_checkpoint_exception(_wrapped(bye), url) is bye
    cause = RuntimeError("outer")
    cause.__cause__ = _wrapped(ki)
    assert find_interrupt(cause) is ki
    handled = RuntimeError("raised while handling a Ctrl-C that was dealt with")
    handled.__context__ = ki
    assert find_interrupt(handled) is None
    assert find_interrupt(_wrapped(StoreError("x", bucket="b", key="k"))) is None
    assert isinstance(unwrap_checkpoint_exception(_wrapped(ValueError("v")), url), CheckpointError)


# -- failure records -----------------------------------------------------------------------------
def _failing_marker(store: MemoryStore) -> None:
    def transient(key: str) -> BaseException:
        return TransientStoreError("injected: the marker PUT keeps failing", bucket="b", key=key)

    store.inject("put", transient, key_glob=f"*/{MANIFEST_NAME}", times=100)


def test_a_save_whose_marker_put_keeps_failing_is_failed_at_once_and_gc_takes_it() -> None:
    store = MemoryStore("unit-bkt")
    with Checkpointer(URL, store=store, transfer_config=SMALL) as ckpt:
        ckpt.save(1, _model(1))
        pointer = store.objects[RUN.key(LATEST_NAME)].data
        _failing_marker(store)
        with pytest.raises(TransientStoreError):
            ckpt.save(2, _model(2))
        step2 = _by_step(store)[2]  # the default grace (2 h) has not passed
        assert step2.state is CheckpointState.ABANDONED and step2.failed
        assert step2.live_tags == () and step2.failed_at is not None
        assert step2.failure is not None and "the marker PUT keeps failing" in step2.failure
        assert step2.to_dict()["failed"] is True
        assert any(k.endswith(".distcp") for k in _keys(store, 2))  # kept: the PUT may land
        # Not at once: the failed marker PUT could still land for a moment (FAILURE_SETTLE).
        early = gc(Location.of(RUN, store=store), apply=True)
        assert early.removed == () and any("a save failed there" in n for n in early.notes)
        assert any(k.endswith(".distcp") for k in _keys(store, 2))
        result = gc(
            Location.of(RUN, store=store), apply=True, options=RetentionOptions(now=_settled())
        )
        assert [str(u) for u in result.removed] == [str(step2.url)]
        assert _keys(store, 2) == set()
        store.faults.clear()
        _assert_step_1_intact(ckpt, store, pointer)


def test_without_its_failure_record_a_failed_save_waits_out_the_grace_period() -> None:
    store = MemoryStore("unit-bkt")
    with Checkpointer(URL, store=store, transfer_config=SMALL) as ckpt:
        ckpt.save(1, _model(1))
        _failing_marker(store)
        store.inject("put", key_glob="*/s3ckpt.failed.*", times=100)  # the record fails too
        with pytest.raises(TransientStoreError):
            ckpt.save(2, _model(2))
    step2 = _by_step(store)[2]
    assert step2.state is CheckpointState.IN_PROGRESS and step2.failed_at is None
    assert gc(Location.of(RUN, store=store), apply=True).removed == ()


def _settled() -> datetime:
    """A gc time at which a failure recorded just now has settled (FAILURE_SETTLE)."""
    return datetime.now(UTC) + FAILURE_SETTLE + timedelta(seconds=5)


def _fake_save(store: MemoryStore, ckpt: StoreURL, tag: str, *, failed: bool) -> None:
    store.put(ckpt.key(data_name(0, 0, tag)), b"data of " + tag.encode())
    store.put(ckpt.key(heartbeat_name(tag, 0)), b"{}")
    if failed:
        record_failure(store, ckpt, tag, 0, 2, RuntimeError("boom"))


def test_a_commit_marker_wins_over_a_failure_record_of_its_own_save() -> None:
    store = MemoryStore("unit-bkt")
    with Checkpointer(URL, store=store, transfer_config=SMALL) as ckpt:
        ckpt.save(1, _model(1))
        pointer = store.objects[RUN.key(LATEST_NAME)].data
        c1 = _by_step(store)[1]
        assert c1.tag is not None
        # The writer gave up on its marker PUT and said so, but the PUT had been applied.
        assert record_failure(store, c1.url, c1.tag, 0, 1, TimeoutError("reply lost"))
        c1 = _by_step(store)[1]
        assert c1.is_committed and not c1.failed and c1.failed_at is None
        gc(Location.of(RUN, store=store), apply=True, options=RetentionOptions(now=_settled()))
        assert failure_name(c1.tag, 0) not in _keys(store, 1)  # the stale record went
        _assert_step_1_intact(ckpt, store, pointer)


def test_a_failure_record_never_touches_another_save_of_the_prefix() -> None:
    store = MemoryStore("unit-bkt")
    with Checkpointer(URL, store=store, transfer_config=SMALL) as ckpt:
        ckpt.save(1, _model(1))
        pointer = store.objects[RUN.key(LATEST_NAME)].data
    step1 = RUN.child("step_000000001")
    step2 = RUN.child("step_000000002")
    _fake_save(store, step2, "aaaaaaaa", failed=True)  # failed
    _fake_save(store, step2, "bbbbbbbb", failed=False)  # a retry, still writing
    _fake_save(store, step1, "cccccccc", failed=True)  # a failed overwrite of step 1
    by = _by_step(store)
    assert by[2].state is CheckpointState.IN_PROGRESS and by[2].live_tags == ("bbbbbbbb",)
    assert not by[2].failed and by[2].failed_at is not None  # said, but not its state
    assert by[1].is_committed and not by[1].overwrite_in_progress and by[1].failed_at
    gc(Location.of(RUN, store=store), apply=True, options=RetentionOptions(now=_settled()))
    assert {owned_tag(k) for k in _keys(store, 2)} == {"bbbbbbbb"}
    assert "cccccccc" not in {owned_tag(k) for k in _keys(store, 1)}
    # Both writers proven gone by their records: no fence was needed, the marker is untouched.
    assert (
        _by_step(store)[1].reaped == ()
        and RUN.key("step_000000002/s3ckpt.json") not in store.objects
    )
    with Checkpointer(URL, store=store, transfer_config=SMALL) as ckpt:
        _assert_step_1_intact(ckpt, store, pointer)


def _ls(store: MemoryStore, monkeypatch: pytest.MonkeyPatch, *extra: str) -> str:
    import sys
    import types

    import s3ckpt._cli as cli_mod
    from s3ckpt.cli import main

    monkeypatch.setattr(
        cli_mod, "open_location", lambda args, target, **kw: Location.of(target, store=store)
    )
    out: list[str] = []
    monkeypatch.setattr(sys, "stdout", types.SimpleNamespace(write=out.append, flush=lambda: 0))
    assert main(["ls", URL, *extra]) == 0
    monkeypatch.undo()
    return "".join(out)


def test_ls_shows_a_failed_save_with_its_time_and_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    store = MemoryStore("unit-bkt")
    step2 = RUN.child("step_000000002")
    _fake_save(store, step2, "aaaaaaaa", failed=True)
    when = _by_step(store)[2].failed_at
    assert when is not None
    text = _ls(store, monkeypatch)
    row = next(line for line in text.splitlines() if "step_000000002" in line)
    assert row.split()[2] == "failed", text
    stamp = when.strftime("%Y-%m-%d %H:%MZ")
    assert f"step_000000002: a save failed at {stamp}: rank 0: RuntimeError: boom" in text
    (run,) = json.loads(_ls(store, monkeypatch, "--json"))["runs"]
    (c,) = run["checkpoints"]
    assert c["state"] == "abandoned" and c["failed"] is True
    assert c["failed_at"].startswith(when.strftime("%Y-%m-%dT%H:%M"))
    assert c["failure"] == "rank 0: RuntimeError: boom"


def test_the_cli_turns_a_wrapped_ctrl_c_into_exit_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import s3ckpt._cli.retention as cli_mod
    from s3ckpt.cli import main

    def interrupted(args: object) -> int:
        raise _wrapped(KeyboardInterrupt())  # what a dcp.load under a command raises

    monkeypatch.setattr(cli_mod, "_ls", interrupted)
    assert main(["ls", URL]) == 130
    err = capsys.readouterr().err
    assert err == "s3ckpt: error: interrupted\n"
