"""The ``s3ckpt`` command's conventions against the moto S3 server over HTTP: a closed pipe
ends a command quietly, and ``pin`` refuses a run prefix and an empty prefix with exit 2
(tests/unit/test_cli_conventions.py has the rest, on local folders and loopback servers)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from s3ckpt import S3StorageWriter
from s3ckpt.cli import main
from s3ckpt.store.s3 import S3Store
from s3ckpt.uri import StoreURL
from tests._helpers import SMALL
from tests._retention_util import write_checkpoint

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CLI = "import sys\nfrom s3ckpt.cli import main\nsys.exit(main(sys.argv[1:]))"


def into_closed_pipe(*argv: str) -> tuple[int, str]:
    """``s3ckpt ARGV`` whose stdout reader is gone before the first byte (``| head -0``)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CLI, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    return proc.wait(timeout=300), err


def test_inspect_into_a_closed_pipe_ends_quietly(bucket: str) -> None:
    url = f"s3://{bucket}/run/step_000000001"
    state = {"model": {f"layer{i}.w": torch.randn(8, 8) for i in range(200)}}
    dcp.save(state, storage_writer=S3StorageWriter(url, transfer_config=SMALL), no_dist=True)
    code, err = into_closed_pipe("inspect", url)  # `s3ckpt ls` is tested on a local folder
    assert (code, err) == (141, ""), err


def test_pin_refuses_a_run_a_folder_of_runs_and_an_empty_prefix_with_exit_2(
    bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    store = S3Store(bucket)
    run = StoreURL("s3", bucket, "runs/a/")
    for step in (1, 2):
        write_checkpoint(store, run, step, created=time.time() - 86400 + step)
    code = main(["pin", str(run), "--reason", "release"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert f"{run} is a run holding checkpoints (step_000000001, step_000000002)" in err
    code = main(["pin", f"s3://{bucket}/runs/a/step_000000009", "--reason", "release"])
    err = capsys.readouterr().err
    assert code == 2 and "no checkpoint at" in err and err.count("\n") == 1, err
    # A folder of runs (checkpoints two levels down) is no checkpoint either, and nothing
    # is written there.
    code = main(["pin", f"s3://{bucket}/runs/", "--reason", "release"])
    err = capsys.readouterr().err
    assert code == 2 and "are not a checkpoint's" in err and err.count("\n") == 1, err
    assert store.head("runs/s3ckpt.pin.json") is None
    code = main(["pin", str(run.child("step_000000002")), "--reason", "release", "--json"])
    assert code == 0 and '"pinned": true' in capsys.readouterr().out
