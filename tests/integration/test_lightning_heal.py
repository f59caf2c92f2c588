"""Issue 37 item 3 for Lightning: ``fit(ckpt_path="last")`` on S3 heals, against moto.

One epoch saves ``epoch=0-step=8.ckpt`` and ``last.ckpt`` (both step 8); then:

* a byte of ``last.ckpt`` flipped, found only while loading: the resume falls back to the
  folder's newest good checkpoint with a WARNING naming it, and ends exactly where an
  uninterrupted run ends;
* the damage found by ``s3ckpt check`` first: ``last.ckpt`` is skipped before any read
  (WARNING); ``S3CheckpointIO(fallback=False)`` raises s3ckpt's error instead.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

pytest.importorskip("lightning")

from lightning.pytorch.callbacks import ModelCheckpoint

from s3ckpt.cli import main
from s3ckpt.errors import CorruptCheckpointError
from s3ckpt.lightning import S3CheckpointIO
from tests.integration.test_heal_plugins import flip
from tests.integration.test_lightning_seams import _equal, _final, _regressor_fit

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


@pytest.fixture(scope="module")
def uninterrupted() -> dict[str, Any]:
    """Two epochs without checkpoints: where a resumed run must end."""
    return _final(_regressor_fit(2, [], []))


@pytest.fixture
def half(bucket: str, s3_client: Any) -> str:
    """One epoch saved, ``last.ckpt``'s data flipped; the run's folder."""
    run = f"s3://{bucket}/runs/exp1"
    mc = ModelCheckpoint(dirpath=run, save_top_k=-1, save_last=True)
    assert _regressor_fit(1, [mc], [S3CheckpointIO()]).global_step == 8
    flip(s3_client, bucket, "runs/exp1/last.ckpt")
    return run


def _resume(run: str, io: S3CheckpointIO) -> Any:
    mc = ModelCheckpoint(dirpath=run, save_top_k=-1, save_last=True)
    return _regressor_fit(2, [mc], [io], ckpt_path="last")


def test_ckpt_path_last_falls_back_past_damage_found_while_loading(
    half: str, uninterrupted: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="s3ckpt"):
        resumed = _resume(half, S3CheckpointIO())
    assert _equal(_final(resumed), uninterrupted)
    warned = [r.getMessage() for r in caplog.records if "skipping step 8" in r.getMessage()]
    assert warned and "last.ckpt" in warned[0] and "verification" in warned[0], warned


def test_ckpt_path_last_skips_known_damage_and_fallback_false_raises(
    half: str,
    uninterrupted: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["check", half, "--read-data", "all"]) == 1
    capsys.readouterr()
    with pytest.raises(CorruptCheckpointError, match=r"last\.ckpt"):
        _resume(half, S3CheckpointIO(fallback=False))
    with caplog.at_level(logging.WARNING, logger="s3ckpt"):
        resumed = _resume(half, S3CheckpointIO())
    assert resumed.ckpt_path == f"{half}/epoch=0-step=8.ckpt"
    assert _equal(_final(resumed), uninterrupted)
    warned = [r.getMessage() for r in caplog.records if "skipping step 8" in r.getMessage()]
    assert warned and "damaged" in warned[0] and "last.ckpt" in warned[0], warned
