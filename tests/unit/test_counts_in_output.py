"""Counts in what people read: "1 checkpoint", never "1 checkpoints" (issue 28)."""

from __future__ import annotations

import time
import uuid

import pytest

from s3ckpt._units import plural
from s3ckpt.cli import main
from s3ckpt.store import open_store
from tests._retention_util import write_checkpoint


def test_plural() -> None:
    assert plural(1, "checkpoint") == "1 checkpoint"
    assert plural(0, "checkpoint") == "0 checkpoints"
    assert plural(2, "DeleteObjects request") == "2 DeleteObjects requests"
    assert plural(1, "loss", "losses") == "1 loss"
    assert plural(3, "loss", "losses") == "3 losses"


def test_ls_and_prune_say_one_checkpoint_and_one_object(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"memory://counts-{uuid.uuid4().hex[:8]}/runs/a/"
    store, run = open_store(url)
    write_checkpoint(store, run, 5, created=time.time(), data_objects=1)
    assert main(["ls", url]) == 0
    out = capsys.readouterr().out
    assert "(1 checkpoint, 1 committed," in out, out
    write_checkpoint(store, run, 6, created=time.time(), data_objects=1)
    assert main(["ls", url]) == 0
    assert "(2 checkpoints, 2 committed," in capsys.readouterr().out
    assert main(["prune", url, "--policy", "keep-last-3"]) == 0
    out = capsys.readouterr().out
    assert "would delete 0 (0 B, 0 objects)" in out and "1 objects" not in out, out
