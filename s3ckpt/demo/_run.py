"""The kill-and-resume: the training job (:mod:`s3ckpt.demo._train`) runs in a child
process that is SIGKILLed while an async save uploads; a second process resumes from the
latest committed checkpoint and finishes the run; then the summary is printed
(:mod:`s3ckpt.demo._summary`).
"""

from __future__ import annotations

import subprocess
import sys
from typing import IO, NoReturn

from s3ckpt.demo._exit import EXIT_FAILED, EXIT_STORE, EXIT_USAGE, fail
from s3ckpt.demo._summary import print_blocked, print_checkpoints, print_next, print_proof
from s3ckpt.demo._train import DEMO_POLICY, TrainLog

__all__ = ["run"]


def run(
    url: str,
    steps: int,
    every: int,
    kill_at: int,
    width: int,
    depth: int,
    *,
    env_hint: str = "",
) -> int:
    """Train in a child process, SIGKILL it at step ``kill_at`` (mid async save), resume
    in a new process, and print what was kept, whether the resumed run reproduced the
    interrupted one, how long training was blocked, and the commands to try next.

    Args:
        env_hint: A shell line that sets up the environment for those commands (the
            embedded server's endpoint and credentials); empty when none is needed.

    Returns:
        The exit code: 0, or 1 when a step trained by both processes had different losses.
    """
    from s3ckpt.store import Location

    print(f"run prefix: {url}")
    print(f"retention policy: {DEMO_POLICY} (built-in: policies/{DEMO_POLICY}.toml)\n")
    cmd = [
        sys.executable,
        "-m",
        "s3ckpt.demo",
        "--child",
        url,
        "--steps",
        str(steps),
        "--every",
        str(every),
        "--width",
        str(width),
        "--depth",
        str(depth),
    ]

    # 1. The first training process, killed mid-run.
    print(f"== training process 1 (SIGKILLed while its async save of step {kill_at} uploads) ==")
    blocked: list[float] = []
    first = TrainLog()
    child = subprocess.Popen(
        [*cmd, "--stop-at", str(kill_at)], stdout=subprocess.PIPE, text=True, bufsize=1
    )
    assert child.stdout is not None
    killed = False
    try:
        for line in child.stdout:
            first.read(line, blocked)
            if line.startswith(f"save: step {kill_at} started"):
                killed = True
                break
    finally:
        child.kill()  # also when the parent is interrupted: the child may be stopped
        child.stdout.close()
        child.wait()
    if not killed:
        _child_failed(1, child.returncode)
    print(f"   [killed: exit status {child.returncode}]\n")

    # 2. A new process resumes from latest and finishes the run.
    print("== training process 2 (resumes from latest) ==")
    second = TrainLog()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, bufsize=1)
    try:
        _read_all(child.stdout, second, blocked)
    except BaseException:
        child.kill()  # the parent was interrupted: so is the run
        child.wait()
        raise
    if child.wait() != 0:
        _child_failed(2, child.returncode)

    # 3. What is on the bucket, what retention kept, and why; how long training waited.
    print("\n== checkpoints under the run ==")
    catalog = print_checkpoints(Location.of(url))
    print_blocked(blocked, second.sync_s, steps)

    # 4. The exact-resume proof.
    exact = print_proof(first, second)

    # 5. What to try next.
    print_next(url, catalog, env_hint)
    return 0 if exact else EXIT_FAILED


def _child_failed(n: int, returncode: int) -> NoReturn:
    # The child printed its own error (one line for an s3ckpt error) on stderr.
    code = returncode if returncode in (EXIT_USAGE, EXIT_STORE) else EXIT_FAILED
    fail(f"training process {n} failed (exit status {returncode}); its error is above", code)


def _read_all(stream: IO[str] | None, log: TrainLog, blocked: list[float]) -> None:
    assert stream is not None
    with stream:
        for line in stream:
            log.read(line, blocked)
