"""The demo end to end with a tiny model: against the moto server named by
``AWS_ENDPOINT_URL`` alone, and on its own embedded server kept running by
``--keep-server``. Each prints the exact-resume proof and commands that work on the run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from s3ckpt.cli import build_parser, main
from s3ckpt.demo import DEMO_BUCKET
from tests._helpers import list_keys

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
# Two saves before the kill (steps 2 and 4), one resumed step, a few seconds per process.
TINY = ["--steps", "6", "--every", "2", "--kill-at", "4", "--width", "16", "--depth", "1"]


def next_commands(out: str) -> list[list[str]]:
    """The ``s3ckpt ...`` lines the demo prints at the end, as argument lists."""
    section = out.split("== next: try the s3ckpt command on this run ==", 1)[1]
    return [
        line.split("#")[0].split()[1:]
        for line in section.splitlines()
        if line.strip().startswith("s3ckpt ")
    ]


def check_the_end(out: str) -> str:
    """The proof and the commands are there; returns the run's URL."""
    assert "bit-for-bit the same" in out and "MISMATCH" not in out, out
    assert "resumed from step 2 and trained steps 3-4 again" in out, out
    assert "is that synchronous save" in out, out
    commands = next_commands(out)
    assert [c[0] for c in commands] == ["ls", "inspect", "verify", "prune"], out
    return commands[0][1]


def test_demo_on_the_endpoint_of_aws_endpoint_url(
    moto_endpoint: str,
    s3_client: object,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("S3CKPT_DEMO_URL", raising=False)
    assert main(["demo", *TINY]) == 0
    out = capsys.readouterr().out
    assert f"using configured endpoint {moto_endpoint}" in out
    assert f"created the bucket {DEMO_BUCKET} there" in out  # no bucket of that name before
    run_url = check_the_end(out)
    assert run_url.startswith(f"s3://{DEMO_BUCKET}/runs/demo-")
    # The commands printed are valid as they are (the environment already names the
    # endpoint); ls and prune, which need no torch, run.
    for argv in next_commands(out):
        build_parser().parse_args(argv)
        if argv[0] in ("ls", "prune"):
            assert main(argv) == 0, argv
    run = run_url.removeprefix(f"s3://{DEMO_BUCKET}/")
    keys = list_keys(s3_client, DEMO_BUCKET, run)
    assert {k.split("/")[2] for k in keys if k.endswith("/s3ckpt.json")} >= {
        "step_000000006",
        "step_000000007",
    }


def test_demo_url_with_a_missing_bucket_is_one_line_exit_3(
    moto_endpoint: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("S3CKPT_DEMO_URL", f"s3://no-such-{uuid.uuid4().hex[:12]}/demo")
    assert main(["demo", *TINY]) == 3
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "bucket does not exist" in lines[0], captured.err
    assert "training process" not in captured.out  # failed before any training started


def test_keep_server_keeps_the_embedded_server_until_ctrl_c(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("AWS_ENDPOINT_URL", "S3CKPT_DEMO_URL")}
    log = tmp_path / "demo.out"
    with log.open("w") as out_file:
        demo = subprocess.Popen(
            [sys.executable, "-m", "s3ckpt.cli", "demo", *TINY, "--keep-server"],
            cwd=REPO,
            env=env,
            stdout=out_file,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 240
        while "Ctrl-C stops it" not in log.read_text():
            assert demo.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        out = log.read_text()
        assert "started an embedded S3 server (moto)" in out
        run_url = check_the_end(out)
        exports = re.search(r"export (AWS_ENDPOINT_URL=\S+) (AWS_ACCESS_KEY_ID=\S+) (\S+)", out)
        assert exports is not None, out
        cmd_env = dict(env, **dict(kv.split("=", 1) for kv in exports.groups()))
        # The server outlives the demo's own work: ls, as printed, lists the run.
        ls = subprocess.run(
            [sys.executable, "-m", "s3ckpt.cli", "ls", run_url],
            env=cmd_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert ls.returncode == 0, ls.stderr
        assert "step_000000007" in ls.stdout and "committed" in ls.stdout
        demo.send_signal(signal.SIGINT)
        assert demo.wait(timeout=60) == 0, log.read_text()
        assert log.read_text().rstrip().endswith("stopped the embedded S3 server")
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
