"""Messages that say what happened, against real HTTP (issue 37, items 5 and 8): the loser
of two writers is told who won and what to do; a bucket in another region is named from
``x-amz-bucket-region``; a script that ends without ``close()`` commits its async save or
exits non-zero naming the step; ``verify`` / ``check`` exit 3 for a read failure and 1 for
bad data."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from s3ckpt import S3Config, S3StorageWriter
from s3ckpt.errors import CheckpointExistsError, StoreError, unwrap_checkpoint_exception
from s3ckpt.store import Location
from tests._http import serve


# -- two writers ------------------------------------------------------------------------------
def _save(writer: S3StorageWriter, job: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("S3CKPT_JOB_ID", job)  # read when the marker is written
    dcp.save({"w": torch.ones(4)}, storage_writer=writer)


@pytest.mark.parametrize("late", [False, True], ids=["race", "after"])
@pytest.mark.parametrize("loser_job", ["job-b", "job-a"])
def test_the_loser_of_two_writers_is_told_who_won_and_what_to_do(
    bucket: str, monkeypatch: pytest.MonkeyPatch, loser_job: str, late: bool
) -> None:
    """Lost at the commit (both writers saw no marker), or refused when planning (the
    second job started after the first committed): the same message either way."""
    url = f"s3://{bucket}/run/step_000000005"
    first = S3StorageWriter(url, step=5)
    second = None if late else S3StorageWriter(url, step=5)  # both see none
    _save(first, "job-a", monkeypatch)
    with pytest.raises(BaseException) as info:  # DCP wraps it: unwrapped below
        monkeypatch.setenv("S3CKPT_JOB_ID", loser_job)
        _save(second or S3StorageWriter(url, step=5), loser_job, monkeypatch)
    err = unwrap_checkpoint_exception(info.value)
    assert isinstance(err, CheckpointExistsError), repr(err)
    text = str(err)
    if loser_job == "job-a":  # this job's own earlier save: overwrite=True is the fix
        assert "this job already committed" in text and "overwrite=True" in text
    else:
        assert "another writer committed" in text and "'job-a'" in text, text
        assert "host" in text and "stop the other job" in text
        assert "overwrite=True" not in text


# -- wrong region -----------------------------------------------------------------------------
class _Redirect(BaseHTTPRequestHandler):
    """A bucket of eu-west-1 asked at another region's endpoint: S3's 301."""

    def _answer(self, body: bool) -> None:
        xml = (
            b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>PermanentRedirect</Code>'
            b"<Message>The bucket you are attempting to access must be addressed using the "
            b"specified endpoint.</Message><Endpoint>bkt.s3.eu-west-1.amazonaws.com</Endpoint>"
            b"<Bucket>bkt</Bucket></Error>"
        )
        self.send_response(301)
        self.send_header("x-amz-bucket-region", "eu-west-1")
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(xml)))
        self.end_headers()
        if body:
            self.wfile.write(xml)

    def do_GET(self) -> None:
        self._answer(True)

    def do_HEAD(self) -> None:
        self._answer(False)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("operation", ["head", "list"])
def test_a_bucket_in_another_region_is_named_with_the_fix(operation: str) -> None:
    with serve(_Redirect) as endpoint:
        store = Location.of(
            "s3://bkt/run", s3_config=S3Config(endpoint_url=endpoint, region="us-east-1")
        ).store
        with pytest.raises(StoreError) as info:
            if operation == "head":
                store.head("run/s3ckpt.json")
            else:
                list(store.list("run/"))
    text = str(info.value)
    assert "eu-west-1" in text and "--region eu-west-1" in text, text
    assert "S3Config(region='eu-west-1')" in text
    assert "unexpected error" not in text


# -- exit without close() ---------------------------------------------------------------------
_SCRIPT = """
import os, signal, sys, time
import torch
from s3ckpt import Checkpointer
from s3ckpt.store import MemoryStore

url, how = sys.argv[1], sys.argv[2]
store = None
if how == "fails":  # a save that cannot commit: its marker PUT is refused, after the exit

    def refused(key):
        time.sleep(3)
        return OSError(f"refused: {key}")

    store = MemoryStore("unit-bkt")
    store.inject("put", refused, key_glob="*s3ckpt.json", times=100)
ckpt = Checkpointer(url, store=store)
handle = ckpt.async_save(7, torch.nn.Linear(512, 512))
handle.staged.result()
print("training ended", flush=True)
if how == "ctrl-c":
    os.kill(os.getpid(), signal.SIGINT)  # as a Ctrl-C in the loop: KeyboardInterrupt here
    signal.pause()
"""


def _run(tmp_path: Path, url: str, how: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    return subprocess.run(
        [sys.executable, str(script), url, how],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


@pytest.mark.parametrize("how", ["end", "ctrl-c"])
def test_a_script_ending_without_close_commits_its_async_save(
    tmp_path: Path, bucket: str, s3_client: object, how: str
) -> None:
    proc = _run(tmp_path, f"s3://{bucket}/run", how)
    assert "training ended" in proc.stdout, proc.stderr
    assert "waiting up to" in proc.stderr and "step 7" in proc.stderr, proc.stderr
    keys = [o["Key"] for o in s3_client.list_objects_v2(Bucket=bucket).get("Contents", [])]  # type: ignore[attr-defined]
    assert "run/step_000000007/s3ckpt.json" in keys, (keys, proc.stderr)
    if how == "end":
        assert proc.returncode == 0, proc.stderr
    else:  # the KeyboardInterrupt propagated: the process ends as Ctrl-C ends it
        assert proc.returncode == -signal.SIGINT, proc.returncode
        assert "KeyboardInterrupt" in proc.stderr


def test_a_save_lost_at_exit_makes_the_exit_status_non_zero_naming_the_step(
    tmp_path: Path,
) -> None:
    proc = _run(tmp_path, "s3://unit-bkt/run", "fails")
    assert "training ended" in proc.stdout, proc.stderr
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert "exiting with status 1" in proc.stderr and "step 7" in proc.stderr, proc.stderr


# -- verify and check: a read failure (3) is not bad data (1) -----------------------------------
@pytest.mark.parametrize("command", ["verify", "check"])
def test_verify_and_check_tell_a_read_failure_from_bad_data(
    bucket: str,
    moto_endpoint: str,
    s3_client: object,
    capsys: pytest.CaptureFixture[str],
    command: str,
) -> None:
    from s3ckpt.cli import main
    from tests.faultproxy import FaultProxy

    url = f"s3://{bucket}/run/step_000000001"
    g = torch.Generator().manual_seed(1)
    dcp.save(
        {"w": torch.randn(64, 64, generator=g)},
        storage_writer=S3StorageWriter(url, step=1),
        no_dist=True,
    )
    target = url if command == "verify" else f"s3://{bucket}/run/"
    argv = [command, target, "--read-data", "all"] if command == "check" else [command, target]
    with FaultProxy(moto_endpoint, fault_rate=0.0) as proxy:
        proxy.arm("GetObject", "internal", times=1000, key_glob="*.distcp")  # 500s: unreadable
        code = main([*argv, "--endpoint-url", proxy.endpoint_url, "--max-attempts", "1"])
    err = capsys.readouterr().err
    assert code == 3 and "could not read" in err, (code, err)

    s3 = s3_client
    data = next(
        o["Key"]
        for o in s3.list_objects_v2(Bucket=bucket)["Contents"]  # type: ignore[attr-defined]
        if o["Key"].endswith(".distcp")
    )
    raw = bytearray(s3.get_object(Bucket=bucket, Key=data)["Body"].read())  # type: ignore[attr-defined]
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte: bad data
    s3.put_object(Bucket=bucket, Key=data, Body=bytes(raw))  # type: ignore[attr-defined]
    code = main([*argv, "--no-record"] if command == "check" else argv)
    err = capsys.readouterr().err
    assert code == 1 and "could not read" not in err, (code, err)
