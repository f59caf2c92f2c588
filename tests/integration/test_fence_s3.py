"""Issue 37 item 1 on moto over HTTP: a save paused right before its marker PUT while gc
(past its grace) reaps it fails with a clear s3ckpt error; the previous checkpoint stays
the latest and loads.

The pause is made deterministic without SIGSTOP: the coordinator's commit
(``SaveCommit._commit_marker``) runs gc first, in the writer's own thread, exactly where a
paused process would be when it resumes. Every request is a real S3 request to moto.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from s3ckpt import Checkpointer, S3StorageReader, S3StorageWriter
from s3ckpt.dcp._finish import SaveCommit
from s3ckpt.errors import SaveFencedError, find_s3ckpt_error
from s3ckpt.retention import RetentionOptions, gc, list_checkpoints

pytestmark = [pytest.mark.integration]

LATER = datetime.now(UTC) + timedelta(hours=3)  # every grace period past


def _pause_commit(monkeypatch: pytest.MonkeyPatch, deleter: Callable[[], object]) -> None:
    real = SaveCommit._commit_marker
    ran: list[object] = []

    def paused(self: SaveCommit, *args: Any) -> None:
        if not ran:
            ran.append(deleter())  # the writer is paused here; gc runs
        real(self, *args)

    monkeypatch.setattr(SaveCommit, "_commit_marker", paused)


def _fenced(exc: BaseException) -> str:
    found = find_s3ckpt_error(exc)
    assert isinstance(found, SaveFencedError), exc
    text = str(found)
    assert "`s3ckpt gc`" in text and "Nothing was committed" in text, text
    return text


def test_a_checkpointer_save_paused_past_gc_is_fenced_and_latest_stays(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"s3://{bucket}/run"
    model = torch.nn.Linear(4, 4)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    ckpt = Checkpointer(url)
    try:
        ckpt.save(1, model)
        _pause_commit(
            monkeypatch, lambda: gc(url + "/", apply=True, options=RetentionOptions(now=LATER))
        )
        with torch.no_grad():
            model.weight.add_(1.0)
        with pytest.raises(BaseException) as err:
            ckpt.save(2, model)
        assert "step 2" in _fenced(err.value)
        monkeypatch.undo()
        assert ckpt.latest() == 1
        fresh = torch.nn.Linear(4, 4)
        assert ckpt.load(fresh) == 1
        assert all(torch.equal(fresh.state_dict()[k], v) for k, v in saved.items())
    finally:
        ckpt.close()
    assert [c.step for c in list_checkpoints(url + "/", options=RetentionOptions(now=LATER))] == [1]


def test_an_overwrite_paused_past_gc_is_fenced_and_the_committed_state_loads(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"s3://{bucket}/ow/ckpt"
    dcp.save({"t": torch.ones(8)}, storage_writer=S3StorageWriter(url))
    _pause_commit(
        monkeypatch,
        lambda: gc(f"s3://{bucket}/ow/", apply=True, options=RetentionOptions(now=LATER)),
    )
    with pytest.raises(BaseException) as err:
        dcp.save({"t": torch.zeros(8)}, storage_writer=S3StorageWriter(url, overwrite=True))
    _fenced(err.value)
    monkeypatch.undo()
    out = {"t": torch.full((8,), 5.0)}
    dcp.load(out, storage_reader=S3StorageReader(url))
    assert torch.equal(out["t"], torch.ones(8))
