"""``python -m s3ckpt`` is the ``s3ckpt`` command (for a venv whose scripts are not on PATH)."""

from __future__ import annotations

import subprocess
import sys

from s3ckpt import __version__


def test_python_m_s3ckpt_runs_the_command() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "s3ckpt", "--version"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"s3ckpt {__version__}"


def test_python_m_s3ckpt_exits_2_on_a_bad_command() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "s3ckpt", "no-such-command"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "no-such-command" in proc.stderr
