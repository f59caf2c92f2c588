"""A save whose commit marker PUT keeps failing is listed as failed at once and gc takes it
without waiting out the grace period; a marker PUT whose reply was lost ends committed, not
failed; ``s3ckpt`` exits 130 on SIGINT with one line and no traceback (issue 28, items 13
and 15). Over HTTP, through a fault proxy in front of the moto server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import torch

from s3ckpt import Checkpointer, S3Config
from s3ckpt.cli import main
from s3ckpt.errors import TransientStoreError
from s3ckpt.format._names import FAILED_PREFIX, LATEST_NAME, MANIFEST_NAME
from s3ckpt.retention import RetentionOptions, gc
from s3ckpt.retention._abandoned import FAILURE_SETTLE
from s3ckpt.store import Location, open_store
from s3ckpt.uri import parse_url
from tests._helpers import list_keys, open_uploads
from tests.faultproxy import FaultProxy
from tests.integration._faulted_saves import TC

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MARKER = f"*/{MANIFEST_NAME}"


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_endpoint, fault_rate=0.0) as p:
        yield p


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Linear(1024, 1536)  # 6 MiB of weight: a two-part upload


def _ls(run: str, capsys: pytest.CaptureFixture[str]) -> dict[int, dict[str, object]]:
    """``s3ckpt ls RUN --json`` (straight to moto) by step."""
    capsys.readouterr()
    assert main(["ls", run, "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)["runs"]
    return {c["step"]: c for c in listed["checkpoints"]}


def test_a_marker_put_that_keeps_failing_is_failed_at_once_and_gc_removes_it(
    proxy: FaultProxy,
    bucket: str,
    s3_client,  # type: ignore[no-untyped-def]
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = f"s3://{bucket}/run"
    cfg = S3Config(endpoint_url=proxy.endpoint_url)
    with Checkpointer(run, s3_config=cfg, transfer_config=TC) as ckpt:
        ckpt.save(1, _model(1))
        latest = s3_client.get_object(Bucket=bucket, Key=f"run/{LATEST_NAME}")["Body"].read()
        armed = proxy.arm("PutObject", "internal", key_glob=MARKER, times=1000)
        with pytest.raises(TransientStoreError):
            ckpt.save(2, _model(2))
        assert armed.hits >= 2  # retried, and failed every time
    keys = list_keys(s3_client, bucket)
    assert [k for k in keys if k.startswith(f"run/step_000000002/{FAILED_PREFIX}")]
    step2 = _ls(run + "/", capsys)[2]
    assert step2["state"] == "abandoned" and step2["failed"] is True  # not "in_progress"
    assert step2["failed_at"] and "InternalError" in str(step2["failure"])
    # gc leaves it for FAILURE_SETTLE (the failed marker PUT could still land), then takes it.
    assert main(["gc", run + "/", "--apply"]) == 0
    assert [k for k in list_keys(s3_client, bucket) if k.startswith("run/step_000000002/")]
    store, _ = open_store(run + "/")
    settled = datetime.now(UTC) + FAILURE_SETTLE + timedelta(seconds=5)
    gc(
        Location.of(parse_url(run + "/"), store=store),
        apply=True,
        options=RetentionOptions(now=settled),
    )
    assert not [k for k in list_keys(s3_client, bucket) if k.startswith("run/step_000000002/")]
    assert open_uploads(s3_client, bucket) == []
    assert set(_ls(run + "/", capsys)) == {1}
    now = s3_client.get_object(Bucket=bucket, Key=f"run/{LATEST_NAME}")["Body"].read()
    assert now == latest
    with Checkpointer(run) as ckpt:  # straight to moto: the previous checkpoint loads
        fresh = _model(9)
        assert ckpt.load(fresh) == 1
        assert torch.equal(fresh.weight, _model(1).weight)


@pytest.mark.parametrize("times", [1, 1000])
def test_a_marker_put_whose_reply_was_lost_ends_committed_not_failed(
    proxy: FaultProxy,
    bucket: str,
    s3_client,  # type: ignore[no-untyped-def]
    capsys: pytest.CaptureFixture[str],
    times: int,
) -> None:
    run = f"s3://{bucket}/run"
    cfg = S3Config(endpoint_url=proxy.endpoint_url)
    # The first PUT is applied and its reply lost; with 1000, so is every retry's (a 412):
    # the writer never sees an answer, and reads the marker back to decide.
    armed = proxy.arm("PutObject", "lost_reply", key_glob=MARKER, times=times)
    with Checkpointer(run, s3_config=cfg, transfer_config=TC) as ckpt:
        ckpt.save(1, _model(1))
    assert armed.hits >= 1
    assert not [k for k in list_keys(s3_client, bucket) if FAILED_PREFIX in k]
    step1 = _ls(run + "/", capsys)[1]
    assert step1["state"] == "committed" and step1["failed"] is False
    assert step1["failed_at"] is None


# (command, what it says): the CLI, the demo through it, and the demo's own entry point; each
# is interrupted while it waits for an answer to its first LIST, which never comes.
SIGINT_CASES = [
    (["-m", "s3ckpt.cli", "ls", "{run}"], "s3ckpt: error: interrupted"),
    (["-m", "s3ckpt.cli", "demo"], "s3ckpt demo: interrupted"),
    (["-m", "s3ckpt.demo"], "s3ckpt demo: interrupted"),
]


@pytest.mark.parametrize(("argv", "line"), SIGINT_CASES)
def test_ctrl_c_ends_the_command_with_130_one_line_and_no_traceback(
    moto_endpoint: str, bucket: str, argv: list[str], line: str
) -> None:
    arrived = threading.Event()

    def hook(op: str, key: str, phase: str) -> None:
        if op == "ListObjectsV2":
            arrived.set()

    run = f"s3://{bucket}/run/"
    with FaultProxy(moto_endpoint, fault_rate=0.0, hook=hook) as proxy:
        proxy.arm("ListObjectsV2", "stall", times=1000)  # an answer that never comes
        env = {**os.environ, "AWS_ENDPOINT_URL": proxy.endpoint_url, "S3CKPT_DEMO_URL": run}
        cli = subprocess.Popen(
            [sys.executable, *(a.format(run=run) for a in argv)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        try:
            assert arrived.wait(120), "the command never reached the store"
            cli.send_signal(signal.SIGINT)  # while it waits for the stalled LIST
            _, err = cli.communicate(timeout=60)
        finally:
            if cli.poll() is None:
                cli.kill()
                cli.wait()
    assert cli.returncode == 130, err
    assert "Traceback" not in err and err.strip() == line, err
