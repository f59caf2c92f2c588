"""Checkpointer on MemoryStore, one process: resume, latest, async failures, retention order."""

from __future__ import annotations

import json
import signal
import threading
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

from s3ckpt import Checkpointer, CheckpointNotFoundError
from s3ckpt.errors import CheckpointExistsError, SaveInProgressError, StoreError
from s3ckpt.retention import KeepLast
from s3ckpt.retention._catalog import CheckpointState
from s3ckpt.store import MemoryStore

URL = "s3://unit-bkt/run"


class State:
    def __init__(self, step: int = 0) -> None:
        self.step = step
        self.note = "x"

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "note": self.note}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.step, self.note = sd["step"], sd["note"]


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    g = torch.Generator().manual_seed(step)
    model(torch.randn(4, 6, generator=g)).square().mean().backward()
    opt.step()
    opt.zero_grad()


def _fresh() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    return model, torch.optim.AdamW(model.parameters(), lr=0.05)


def _hold_completions(store: MemoryStore) -> threading.Event:
    """Make ``store`` hold every CompleteMultipartUpload until the returned event is set
    (or 30 s pass): a save stays uploading for as long as a test needs."""
    gate = threading.Event()
    original = store.complete_multipart

    def held_complete(*args: Any, **kwargs: Any) -> Any:
        gate.wait(30)
        return original(*args, **kwargs)

    store.complete_multipart = held_complete  # type: ignore[method-assign]
    return gate


def test_save_then_resume_latest_restores_model_optimizer_and_train_state() -> None:
    store = MemoryStore("unit-bkt")
    model, opt = _fresh()
    with Checkpointer(URL, store=store) as ckpt:
        assert ckpt.load(*_fresh(), State()) is None  # nothing yet: untouched, None
        for step in (1, 2, 3):
            _train(model, opt, step)
            ckpt.async_save(step, model, opt, State(step)).staged.result()
    m2, o2 = _fresh()
    ts = State()
    with Checkpointer(URL, store=store) as ckpt:
        assert ckpt.latest() == 3
        assert ckpt.load(m2, o2, ts) == 3
    assert ts.step == 3
    for a, b in zip(model.state_dict().values(), m2.state_dict().values(), strict=False):
        assert torch.equal(a, b)
    s1, s2 = opt.state_dict()["state"], o2.state_dict()["state"]
    for k in s1:
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(s1[k][name], s2[k][name])


def test_load_a_given_step_and_a_missing_step() -> None:
    store = MemoryStore("unit-bkt")
    model, opt = _fresh()
    with Checkpointer(URL, store=store) as ckpt:
        _train(model, opt, 1)
        ckpt.save(1, model, opt)
        first = model[0].weight.detach().clone()
        _train(model, opt, 2)
        ckpt.save(2, model, opt)
        m2, o2 = _fresh()
        assert ckpt.load(m2, o2, step=1) == 1
        assert torch.equal(m2[0].weight, first)
        with pytest.raises(CheckpointNotFoundError, match="step 5"):
            ckpt.load(m2, o2, step=5)
        with pytest.raises(CheckpointExistsError):
            ckpt.save(2, model, opt)


def test_latest_ignores_a_pointer_to_an_uncommitted_checkpoint() -> None:
    store = MemoryStore("unit-bkt")
    model, opt = _fresh()
    with Checkpointer(URL, store=store) as ckpt:
        ckpt.save(10, model, opt)
        ckpt.save(20, model, opt)
        # The pointer names step 20; its commit marker disappears (e.g. a pruner got it).
        store.delete(["run/step_000000020/s3ckpt.json"])
        assert ckpt.latest() == 10
        store.put("run/s3ckpt.latest.json", b"{not json")
        assert ckpt.latest() == 10
        store.put("run/s3ckpt.latest.json", json.dumps({"step": 99}).encode())
        assert ckpt.latest() == 10


def test_failed_async_save_surfaces_on_the_handle_and_on_the_next_call() -> None:
    store = MemoryStore("unit-bkt")
    model, opt = _fresh()
    ckpt = Checkpointer(URL, store=store)
    ckpt.save(1, model, opt)
    store.inject("put", key_glob="*step_000000002/s3ckpt.json", times=1)
    handle = ckpt.async_save(2, model, opt)
    # DCP's CheckpointException (a BaseException) is unwrapped to the store's error.
    with pytest.raises(StoreError, match="injected fault") as on_handle:
        handle.committed.result(timeout=60)
    assert on_handle.value.key == "run/step_000000002/s3ckpt.json"
    with pytest.raises(StoreError, match="injected fault"):
        ckpt.save(3, model, opt)
    # Raised once; the Checkpointer goes on, and the failed step left no commit.
    ckpt.save(3, model, opt)
    assert ckpt.latest() == 3
    states = {c.step: c.state for c in ckpt.list()}
    assert states.get(2) != CheckpointState.COMMITTED
    assert not [o.key for o in store.list("run/step_000000002/")]  # cleaned up
    ckpt.close()


def test_on_busy_raise_refuses_a_second_save_while_uploading() -> None:
    store = MemoryStore("unit-bkt")
    gate = _hold_completions(store)
    big = torch.nn.Linear(2048, 2048)  # 16 MiB: a multipart upload
    ckpt = Checkpointer(URL, store=store, on_busy="raise")
    handle = ckpt.async_save(1, big)
    handle.staged.result(timeout=60)
    with pytest.raises(SaveInProgressError, match="step 1"):
        ckpt.async_save(2, big)
    gate.set()
    handle.wait(timeout=60)
    ckpt.async_save(2, big).wait(timeout=60)
    ckpt.close()


class RecordingStore(MemoryStore):
    """Records puts of commit markers and deletes, in order."""

    def __init__(self) -> None:
        super().__init__("unit-bkt")
        self.events: list[tuple[str, str]] = []
        self._ev_lock = threading.Lock()

    def put(self, key: str, data: Any, **kwargs: Any) -> str:
        etag = super().put(key, data, **kwargs)
        if key.endswith("/s3ckpt.json"):
            with self._ev_lock:
                self.events.append(("commit", key))
        return etag

    def delete(self, keys: Any) -> Any:
        with self._ev_lock:  # (not the lease's capability probe, beside the run's lease)
            self.events.extend(("delete", k) for k in keys if ".probe-" not in k)
        return super().delete(keys)


def test_retention_runs_only_after_commit_and_keeps_the_newest() -> None:
    store = RecordingStore()
    model, opt = _fresh()
    with Checkpointer(URL, store=store, policy=KeepLast(1)) as ckpt:
        for step in range(1, 6):
            _train(model, opt, step)
            ckpt.async_save(step, model, opt)
    committed: set[int] = set()
    for kind, key in store.events:
        step = int(key.split("/step_")[1][:9])
        if kind == "commit":
            committed.add(step)
        elif "/s3ckpt.alive." in key and step in committed:
            continue  # the writer removing its own heartbeats after its commit
        else:
            # Every delete is of a checkpoint older than one already committed.
            assert committed and step < max(committed), (kind, key, committed)
    assert any(kind == "delete" for kind, _ in store.events)
    remaining = [c for c in Checkpointer(URL, store=store).list()]
    assert [c.step for c in remaining if c.state == CheckpointState.COMMITTED] == [5]


def test_attach_metrics_reaches_the_commit_marker() -> None:
    store = MemoryStore("unit-bkt")
    model, opt = _fresh()
    with Checkpointer(URL, store=store) as ckpt:
        ckpt.async_save(4, model, opt, metrics={"loss": 2.5})
        ckpt.attach_metrics(4, {"val_loss": 1.25})
        info = {c.step: c for c in ckpt.list()}[4]
        assert info.metrics == {"loss": 2.5, "val_loss": 1.25}
        with pytest.raises(CheckpointNotFoundError):
            ckpt.attach_metrics(5, {"val_loss": 1.0})


def test_store_error_at_construction_of_a_save_raises_synchronously() -> None:
    store = MemoryStore("unit-bkt")
    model, _ = _fresh()
    with Checkpointer(URL, store=store) as ckpt:
        ckpt.save(1, model)
        with pytest.raises(CheckpointExistsError):
            ckpt.async_save(1, model)
        store.inject("*", key_glob="*step_000000002/*", times=1)
        with pytest.raises(StoreError):
            ckpt.async_save(2, model)


def test_ctrl_c_while_waiting_for_an_upload_reaches_the_caller() -> None:
    store = MemoryStore("unit-bkt")
    gate = _hold_completions(store)
    big = torch.nn.Linear(2048, 2048)  # 16 MiB: a multipart upload, held at its completion
    ckpt = Checkpointer(URL, store=store)
    handle = ckpt.async_save(1, big)
    handle.staged.result(timeout=60)
    main = threading.main_thread().ident
    assert main is not None and threading.get_ident() == main
    # SIGINT to the main thread while wait() blocks on the upload: Ctrl-C, for real.
    timer = threading.Timer(0.5, signal.pthread_kill, (main, signal.SIGINT))
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            ckpt.wait()
        assert not handle.done()  # interrupted while the upload was still held
    finally:
        timer.cancel()
        gate.set()
    handle.wait(timeout=60)
    ckpt.close()
    assert ckpt.list()[-1].step == 1


def test_save_error_unwraps_dcp_checkpoint_exception_by_type() -> None:
    from torch.distributed.checkpoint.api import CheckpointException

    from s3ckpt.errors import CheckpointError, unwrap_checkpoint_exception

    def failed(rank: int, exc: BaseException) -> CheckpointException:
        return CheckpointException("save", {rank: (exc, traceback.StackSummary())})

    url = "s3://unit-bkt/run/step_000000003/"
    what = f"the save of step 3 to {url}"
    inner = StoreError("boom", bucket="unit-bkt", key="run/step_000000003/s3ckpt.json")
    assert unwrap_checkpoint_exception(failed(0, inner), what) is inner
    wrapped = unwrap_checkpoint_exception(failed(1, ValueError("rank 1 broke")), what)
    assert isinstance(wrapped, CheckpointError)
    assert str(wrapped).startswith(f"the save of step 3 to {url} failed:")
    # Every failure is an s3ckpt error now, a bare foreign one too (issue 37 item 4).
    plain = ValueError("mine")
    assert unwrap_checkpoint_exception(plain, what).__cause__ is plain
    interrupt = KeyboardInterrupt()
    assert unwrap_checkpoint_exception(interrupt, what) is interrupt


def test_a_given_store_and_a_parsed_url_open_no_other_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from s3ckpt.store import S3Store
    from s3ckpt.uri import parse_url

    built: list[str] = []
    original = S3Store.__init__

    def counting_init(self: S3Store, *args: Any, **kwargs: Any) -> None:
        built.append(args[0] if args else kwargs["bucket"])
        original(self, *args, **kwargs)

    monkeypatch.setattr(S3Store, "__init__", counting_init)
    store = MemoryStore("unit-bkt")
    url = parse_url(URL)
    model, opt = _fresh()
    with Checkpointer(url, store=store) as ckpt:
        assert ckpt.url is url and ckpt.store is store
        ckpt.save(1, model, opt)
        ckpt.async_save(2, model, opt).wait(timeout=60)
        assert ckpt.load(*_fresh(), step=1) == 1
        assert ckpt.load(*_fresh(), verify_complete=True) == 2
    assert built == []  # the writers and readers used the Checkpointer's store
    opened = Checkpointer(URL)  # the S3 client itself is created lazily: no request here
    opened.close()
    assert isinstance(opened.store, S3Store) and built == ["unit-bkt"]


def test_retention_history_keeps_every_pass_with_its_step_and_failure() -> None:
    from s3ckpt.checkpointer import RetentionRecord
    from s3ckpt.checkpointer._retention import RETENTION_HISTORY
    from s3ckpt.retention import PruneResult

    store = MemoryStore("unit-bkt")
    model, opt = _fresh()
    with Checkpointer(URL, store=store, policy=KeepLast(1)) as ckpt:
        assert ckpt.retention_history == () and ckpt.last_retention is None
        ckpt.save(1, model, opt)
        ckpt.async_save(2, model, opt).wait(timeout=60)
        ckpt.wait()
        # The third pass fails: its listings of the run raise (the save's own do not).
        store.inject("*", key_glob="run/", times=100)
        ckpt.save(3, model, opt)
        ckpt.wait()
        history = ckpt.retention_history
    assert [r.step for r in history] == [1, 2, 3]
    assert all(isinstance(r, RetentionRecord) for r in history)
    assert [r.ok for r in history] == [True, True, False]
    assert isinstance(history[1].result, PruneResult)
    assert history[1].result.deleted == ("step_000000001",)
    assert isinstance(history[2].error, StoreError) and history[2].result is None
    assert ckpt.last_retention is history[2].error  # last_retention is the newest outcome
    assert history[0].started <= history[1].started <= history[2].started
    assert all(r.seconds >= 0 for r in history)
    assert RETENTION_HISTORY == 100


def test_retention_history_is_bounded() -> None:
    from s3ckpt.checkpointer._retention import RETENTION_HISTORY, RetentionRunner
    from s3ckpt.uri import parse_url

    store = MemoryStore("unit-bkt")
    runner = RetentionRunner(store, parse_url(URL))
    for step in range(RETENTION_HISTORY + 5):
        runner.schedule(KeepLast(1), timedelta(hours=1), step)
    runner.close()
    steps = [r.step for r in runner.history]
    assert steps == list(range(5, RETENTION_HISTORY + 5))  # the oldest dropped first


class Tagged:
    """A train-state value of the user's own class (not in SAFE_GLOBALS)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag


class TaggedState(State):
    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "note": Tagged(self.note), "root": Path("/runs") / self.note}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.step, self.note = sd["step"], sd["note"].tag
        assert sd["root"] == Path("/runs") / self.note


def test_load_passes_safe_globals_to_the_reader() -> None:
    from torch.distributed.checkpoint.api import CheckpointException

    from s3ckpt.errors import UnsafeCheckpointError

    store = MemoryStore("unit-bkt")
    model, opt = _fresh()
    saved = TaggedState(5)
    saved.note = "abc"
    with Checkpointer(URL, store=store) as ckpt:
        ckpt.save(5, model, opt, saved)
        with pytest.raises(UnsafeCheckpointError, match="Tagged") as info:
            ckpt.load(*_fresh(), TaggedState())  # an s3ckpt error, not DCP's wrapper
        assert not isinstance(info.value, CheckpointException)
        restored = TaggedState()
        assert ckpt.load(*_fresh(), restored, safe_globals=[Tagged]) == 5
        assert (restored.step, restored.note) == (5, "abc")
        trusting = TaggedState()
        assert ckpt.load(*_fresh(), trusting, allow_unsafe_pickle=True) == 5
        assert trusting.note == "abc"


def test_metrics_take_tensors_and_numpy_scalars_without_a_warning() -> None:
    """``metrics={"loss": loss}`` as a training loop has it: a 0-d tensor that requires grad
    (no requires_grad warning), a numpy scalar; typed so that mypy accepts the call."""
    import warnings

    import numpy as np

    store = MemoryStore("unit-bkt")
    model, opt = _fresh()
    loss = model(torch.ones(1, 6)).square().mean()
    assert loss.requires_grad
    with Checkpointer(URL, store=store) as ckpt, warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ckpt.save(1, model, opt, metrics={"loss": loss})
        ckpt.attach_metrics(1, {"val_loss": np.float32(0.5), "acc": torch.tensor(0.75)})
        info = {c.step: c for c in ckpt.list()}[1]
    assert not [w for w in seen if "requires_grad" in str(w.message)]
    assert info.metrics == {"loss": pytest.approx(loss.item()), "val_loss": 0.5, "acc": 0.75}
