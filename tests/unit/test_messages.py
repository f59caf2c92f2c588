"""Messages that say what happened (issue 37, items 4 and 8), on MemoryStore: in-job
retention logs each deletion and its reason; deletes the store refuses are one WARNING
naming the cron route and training goes on; errors of a save reach the caller as s3ckpt
errors (``Exception``), never as torch's ``CheckpointException``."""

from __future__ import annotations

import logging
import traceback
from datetime import timedelta

import pytest
import torch
import torch.distributed.checkpoint
from torch.distributed.checkpoint.api import CheckpointException

from s3ckpt import Checkpointer
from s3ckpt.errors import (
    AccessDeniedError,
    CheckpointError,
    S3CkptError,
    StoreError,
    unwrap_checkpoint_exception,
)
from s3ckpt.retention import KeepLast
from s3ckpt.store import MemoryStore

URL = "s3://unit-bkt/run"


def _ckpt(store: MemoryStore) -> Checkpointer:
    return Checkpointer(URL, store=store, policy=KeepLast(1), retention_grace=timedelta(seconds=0))


def test_in_job_retention_logs_each_deletion_and_its_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, model = MemoryStore("unit-bkt"), torch.nn.Linear(4, 4)
    caplog.set_level(logging.INFO, logger="s3ckpt")
    with _ckpt(store) as ckpt:
        for step in (1, 2, 3):
            ckpt.save(step, model)
            ckpt.wait()
    deleted = [r.getMessage() for r in caplog.records if "retention deleted" in r.getMessage()]
    assert len(deleted) == 2, deleted
    assert f"{URL}/step_000000001" in deleted[0] and "no rule keeps it" in deleted[0]
    assert all(
        r.levelno == logging.INFO for r in caplog.records if "retention deleted" in r.getMessage()
    )


def _denied(key: str) -> BaseException:
    return AccessDeniedError("Access Denied", bucket="unit-bkt", key=key, code="AccessDenied")


@pytest.mark.parametrize("what", ["lease", "deletes"])
def test_denied_retention_warns_once_names_the_cron_and_training_goes_on(
    caplog: pytest.LogCaptureFixture, what: str
) -> None:
    store, model = MemoryStore("unit-bkt"), torch.nn.Linear(4, 4)
    if what == "lease":  # terraform's trainer role: the pruner's lease is explicitly denied
        store.inject("put", _denied, key_glob="*s3ckpt.lease", times=100)
    else:  # or the lease is allowed and only the deletes are refused, key by key
        store.inject("delete_key", _denied, key_glob="*step_*", times=10_000)
    caplog.set_level(logging.INFO, logger="s3ckpt")
    with _ckpt(store) as ckpt:
        for step in (1, 2, 3, 4):
            ckpt.save(step, model)
            ckpt.wait()
        history = ckpt.retention_history
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    denied = [m for m in warnings if "may not delete" in m]
    assert len(denied) == 1, warnings
    assert "s3ckpt prune" in denied[0] and "trainer_may_prune" in denied[0]
    assert len(history) == (1 if what == "lease" else 2)  # no pass after the denial
    assert [c.step for c in ckpt.list() if c.is_committed][-1] == 4


def _wrapped(rank: int, exc: BaseException) -> CheckpointException:
    return CheckpointException("write", {rank: (exc, traceback.StackSummary())})


def test_unwrap_gives_the_s3ckpt_error_or_wraps_a_foreign_one_with_its_rank() -> None:
    inner = StoreError("boom", bucket="unit-bkt", key="run/step_000000003/s3ckpt.json")
    found = unwrap_checkpoint_exception(_wrapped(0, inner), "the save of step 3")
    assert found is inner and isinstance(found.__cause__, CheckpointException)
    foreign = ValueError("rank 1 broke")
    err = unwrap_checkpoint_exception(_wrapped(1, foreign), "the save of step 3")
    assert isinstance(err, CheckpointError) and isinstance(err, Exception)
    assert err.rank == 1 and err.__cause__ is foreign
    assert str(err).startswith("the save of step 3 failed: ValueError: rank 1 broke")
    ki = KeyboardInterrupt()
    assert unwrap_checkpoint_exception(_wrapped(0, ki)) is ki


def _faulty_store() -> MemoryStore:
    store = MemoryStore("unit-bkt")

    def foreign(key: str) -> BaseException:
        return OSError(f"disk on fire writing {key}")  # not s3ckpt's: DCP wraps it

    store.inject("put", foreign, key_glob="*.metadata*", times=100)
    return store


@pytest.mark.parametrize("edge", ["checkpointer", "lightning", "accelerate"])
def test_failures_of_saves_and_plug_ins_are_s3ckpt_errors(edge: str) -> None:
    store, model = _faulty_store(), torch.nn.Linear(4, 4)
    if edge == "checkpointer":
        with Checkpointer(URL, store=store) as ckpt:
            with pytest.raises(S3CkptError, match="step 1"):
                ckpt.save(1, model)
            with pytest.raises(S3CkptError):
                ckpt.async_save(2, model).wait(60)
            with pytest.raises(S3CkptError):
                ckpt.wait()
        return
    from s3ckpt import S3StorageWriter
    from s3ckpt.store import Location
    from s3ckpt.uri import parse_url

    url = f"{URL}/step_000000001"
    writer = S3StorageWriter(Location.of(url, store=store), step=1)
    from s3ckpt._plugin_common import dcp_errors  # what both plug-ins wrap DCP calls in

    if edge == "lightning":
        context = dcp_errors("a checkpoint save or load")
    else:
        context = dcp_errors("save", parse_url(url), 0)
    with pytest.raises(Exception) as info, context:  # Exception: the point
        torch.distributed.checkpoint.save({"w": torch.ones(2)}, storage_writer=writer)
    assert isinstance(info.value, S3CkptError) and "disk on fire" in str(info.value)
    assert isinstance(info.value.__cause__, OSError)
