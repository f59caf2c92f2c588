"""The examples in examples/ run as their README says, with s3fs blocked (tests/no_s3fs).

Each runs as a subprocess and must exit 0 with its success line: the plain loop against the
session's moto server (``--url``), the FSDP2 one under torchrun on its own embedded server
(rank 0 starts it and tells the other rank), which also covers the examples' default path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.multiprocess]

ROOT = Path(__file__).resolve().parents[2]
NO_S3FS = ROOT / "tests" / "no_s3fs"


def run_example(*argv: str, endpoint: str | None = None) -> str:
    """Run ``python ARGV...`` in the repository root with s3fs unimportable; its stdout.

    Without ``endpoint`` no S3 endpoint is configured, so the example starts its own server.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(NO_S3FS), str(ROOT), env.get("PYTHONPATH", "")])
    env.pop("AWS_ENDPOINT_URL", None)
    if endpoint:
        env["AWS_ENDPOINT_URL"] = endpoint
    proc = subprocess.run(
        [sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=280
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_plain_loop_resumes_bit_for_bit(moto_endpoint: str, bucket: str) -> None:
    out = run_example(
        "examples/plain_loop.py",
        "--url",
        f"s3://{bucket}/plain",
        "--steps",
        "5",
        "--every",
        "2",
        endpoint=moto_endpoint,
    )
    # Saves 2 (async) and stops after 3; the fresh process resumes from 2, trains 3-5.
    assert "stopped after step 3" in out, out
    assert "OK: resumed from step 2, matches the uninterrupted run bit for bit" in out, out
    assert "checkpoints kept by KeepLast(2): step_000000004, step_000000005" in out, out


def test_fsdp2_saved_on_two_ranks_loads_on_one() -> None:
    out = run_example(
        "-m", "torch.distributed.run", "--nproc_per_node", "2", "examples/fsdp2_gloo.py"
    )
    assert "S3 endpoint http://127.0.0.1:" in out, out  # rank 0's embedded server
    assert "loaded step 6 on 1 rank(s): 0 differences" in out, out
    assert "OK: saved on 2 rank(s), loaded on 1: full state identical" in out, out
