"""The demo's training job: a small language model trained in a child process, resumed from
the run's latest checkpoint, saved asynchronously every few steps under the built-in
retention policy :data:`DEMO_POLICY`, and once synchronously at the end for comparison.

It reports to the parent on stdout: one line per step and per checkpoint event, and
``#loss STEP HEX`` with each step's exact loss (:data:`LOSS_LINE`); :class:`TrainLog` is
the parent's side of those lines. torch is imported only when the job runs.

Then what the demo prints once both training processes are done: the checkpoints kept (and
why: a plan of the built-in policy, no torch needed), how long training was blocked per
async save against a synchronous save, the exact-resume proof, and the ``s3ckpt`` commands
to try next on the run.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import signal
import statistics
import subprocess
import time
import warnings
from concurrent.futures import Future
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from s3ckpt._units import format_bytes, plural
from s3ckpt.demo import DEMO_POLICY, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_STORE, EXIT_USAGE, fail
from s3ckpt.errors import ConfigError, S3CkptError

if TYPE_CHECKING:
    from s3ckpt.checkpointer import SaveHandle
    from s3ckpt.retention import CheckpointInfo
    from s3ckpt.store import Location

LOSS_LINE = re.compile(r"#loss (\d+) (\S+)")
"""What a child prints after each step: the loss exactly (float.hex), for the exact-resume
check. The parent reads these lines and does not echo them."""

VOCAB = 2048
"""The model's vocabulary (random tokens)."""


def _model(width: int, depth: int):  # type: ignore[no-untyped-def]
    import torch

    torch.manual_seed(0)
    layers: list[torch.nn.Module] = [torch.nn.Embedding(VOCAB, width)]
    for _ in range(depth):
        layers += [
            torch.nn.LayerNorm(width),
            torch.nn.Linear(width, 4 * width),
            torch.nn.GELU(),
            torch.nn.Linear(4 * width, width),
        ]
    layers.append(torch.nn.Linear(width, VOCAB))
    return torch.nn.Sequential(*layers)


class TrainState:
    """What besides model and optimizer a resumed run needs: the step and the data RNG."""

    def __init__(self) -> None:
        import torch

        self.step = 0
        self.generator = torch.Generator().manual_seed(1234)

    def state_dict(self) -> dict[str, object]:
        """The step and the data generator's state."""
        return {"step": self.step, "rng": self.generator.get_state()}

    def load_state_dict(self, sd: dict[str, object]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.step = int(sd["step"])  # type: ignore[call-overload,unused-ignore]
        self.generator.set_state(sd["rng"])


def train(args: argparse.Namespace) -> None:
    """The training job of ``--child URL``: resume from latest, train ``--steps``,
    async-save every ``--every`` steps.

    Prints one line per step and per checkpoint event, and ``#loss STEP HEX`` with each
    step's exact loss; the parent reads them. Right after starting the async save of step
    ``--stop-at``, it stops the process (SIGSTOP) where it stands, so that the parent's
    SIGKILL lands while that save uploads however fast the store is and however late the
    parent reads the line. Each line reaches the parent as printed: ``_main`` made stdout
    line-buffered.
    """
    import torch

    from s3ckpt.checkpointer import Checkpointer

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    model = _model(args.width, args.depth)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    state = TrainState()
    cross_entropy = torch.nn.functional.cross_entropy
    with Checkpointer(args.child, policy=DEMO_POLICY) as ckpt:
        t0 = time.perf_counter()
        if (resumed := ckpt.load(model, opt, state)) is None:
            print("start: no checkpoint under the run, training from step 0")
        else:
            print(
                f"resume: loaded step {resumed} (model, optimizer, data RNG) in "
                f"{time.perf_counter() - t0:.2f} s"
            )
        handle = None
        for step in range(state.step + 1, args.steps + 1):
            if handle is not None:
                handle.staged.result()  # parameters may change only once staged
            tokens = torch.randint(0, VOCAB, (16, 64), generator=state.generator)
            logits = model(tokens[:, :-1])
            loss = cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad()
            state.step = step
            print(f"step {step:3d}  loss {loss.item():.4f}")
            print(f"#loss {step} {loss.item().hex()}")
            if step % args.every == 0:
                handle = ckpt.async_save(step, model, opt, state, metrics={"loss": loss.item()})
                handle.committed.add_done_callback(functools.partial(_report_commit, handle))
                print(f"save: step {step} started (async)")
                if step == args.stop_at and hasattr(signal, "SIGSTOP"):
                    os.kill(os.getpid(), signal.SIGSTOP)
        ckpt.wait()
        # A synchronous save of the same state, for comparison with the async ones.
        sync = ckpt.save(args.steps + 1, model, opt, state)
        print(f"sync: a synchronous save of the same state blocked {sync.blocked_seconds:.2f} s")


def _report_commit(h: SaveHandle, fut: Future[None]) -> None:
    if (exc := fut.exception()) is not None:
        print(f"commit: step {h.step} FAILED: {exc}")
    else:
        print(
            f"commit: step {h.step} durable in {h.commit_seconds or 0:.2f} s, "
            f"training blocked {1000 * (h.blocked_seconds or 0):.1f} ms"
        )


class TrainLog:
    """What the parent reads from a training process's output."""

    def __init__(self) -> None:
        self.losses: dict[int, str] = {}  # step -> exact loss (float.hex)
        self.resumed: int | None = None
        self.sync_s: float | None = None
        self.blocked: list[float] = []  # training blocked per async save, in seconds

    def read(self, line: str) -> None:
        """Take one line: a loss is kept, anything else echoed (every fifth step) and the
        resume, the synchronous save's time and each async save's blocked time noted."""
        if m := LOSS_LINE.match(line):
            self.losses[int(m.group(1))] = m.group(2)
            return
        # Keep the log short: every fifth step.
        if (m := re.match(r"step +(\d+) ", line)) is None or int(m.group(1)) % 5 == 0:
            print("   " + line, end="", flush=True)
        if m := re.search(r"training blocked ([0-9.]+) ms", line):
            self.blocked.append(float(m.group(1)) / 1000)
        if m := re.match(r"resume: loaded step (\d+)", line):
            self.resumed = int(m.group(1))
        if m := re.match(r"sync: .* blocked ([0-9.]+) s", line):
            self.sync_s = float(m.group(1))


def watch(n: int, cmd: list[str], log: TrainLog, until: str | None = None) -> int:
    """Run training process ``n``, its output read into ``log``; SIGKILL it
    at the line that starts with ``until``. Returns its exit status; fails (exit 1, or the
    child's 2 or 3) when it failed or ended before ``until``."""
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, bufsize=1)
    assert child.stdout is not None
    try:
        with child.stdout:
            for line in child.stdout:
                log.read(line)
                if until is not None and line.startswith(until):
                    break
            else:  # it ended by itself: a failure, unless it is the resumed run ending
                if (rc := child.wait()) != 0 or until is not None:
                    # The child printed its own error (one line for an s3ckpt error) on stderr.
                    why = f"training process {n} failed (exit status {rc}); its error is above"
                    fail(why, rc if rc in (EXIT_USAGE, EXIT_STORE) else EXIT_FAILED)
    finally:
        child.kill()  # at ``until``, or the parent was interrupted: so is the run
        child.wait()
    return child.returncode


def child(args: argparse.Namespace) -> None:
    """``--child URL``: one training process; an s3ckpt error is one line and exit 3 (2 for
    a configuration error)."""
    try:
        train(args)
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: the parent says it
        raise SystemExit(EXIT_INTERRUPTED) from None
    except S3CkptError as exc:
        fail(str(exc), EXIT_USAGE if isinstance(exc, ConfigError) else EXIT_STORE)


def print_checkpoints(run: Location) -> list[CheckpointInfo]:
    """Print the run's checkpoints with the reasons :data:`DEMO_POLICY` keeps each one (a
    plan of the built-in policy: no torch, no source tree needed); return the catalog."""
    from s3ckpt.retention import list_checkpoints, load_policy, plan

    catalog = list_checkpoints(run)
    reasons = dict(plan(catalog, load_policy(DEMO_POLICY), datetime.now(UTC)).keep)
    for c in catalog:
        why = "; ".join(reasons.get(c.name, ())) or "-"
        if c.state.value != "committed":
            why = "not a checkpoint (no commit marker): never loaded, never pruned"
        print(f"  {c.name}  {c.state.value:<11} {format_bytes(c.size):>10}  kept: {why}")
    if any(c.state.value != "committed" for c in catalog):
        print(
            "  (objects without a commit marker: a save or a prune that the kill interrupted.\n"
            "   Recent objects look in progress, so nothing touches them yet; once the grace\n"
            "   period has passed, the next prune finishes an interrupted deletion (it is in\n"
            "   the lease's intent log) and `s3ckpt gc` removes an abandoned save.)"
        )
    return catalog


def print_blocked(blocked: list[float], sync_s: float | None, steps: int) -> None:
    """Training blocked per async save (median, mean) against the synchronous save of the
    same state; nothing when either is unknown."""
    if not blocked or not sync_s:
        return
    mean, median = statistics.fmean(blocked), statistics.median(blocked)
    print(
        f"\ntraining blocked per async save: median {1000 * median:.1f} ms, mean "
        f"{1000 * mean:.1f} ms over {plural(len(blocked), 'save')} (the first save of each process "
        f"allocates the staging cache), vs {sync_s:.2f} s for a synchronous save of the same "
        f"state: {100 * median / sync_s:.1f} % (median), {100 * mean / sync_s:.1f} % (mean)"
    )
    print(
        f"(step {steps + 1} is that synchronous save: process 2 saved the state of step "
        f"{steps} once more with Checkpointer.save, which returns only once the checkpoint "
        "is durable, to measure how much of a save the async ones take off the training loop.)"
    )


def resume_proof(first: TrainLog, second: TrainLog) -> tuple[bool, str]:
    """Compare the losses of the steps both processes trained: process 1 trained them
    uninterrupted, process 2 after loading the checkpoint. Each such step depends on the
    model, the optimizer state and the data RNG restored, so equal losses, bit for bit,
    show that all three came back exactly."""
    if second.resumed is None:
        return False, "process 2 found no committed checkpoint to resume from."
    if not (both := sorted(set(first.losses) & set(second.losses))):
        return True, (
            f"process 2 resumed from step {second.resumed}, the last step process 1 trained "
            "(its save committed before the kill): no step was trained by both processes, so "
            "there are no losses to compare."
        )
    differ = [s for s in both if first.losses[s] != second.losses[s]]
    span = f"step {both[0]}" if len(both) == 1 else f"steps {both[0]}-{both[-1]}"
    if differ:
        shown = ", ".join(
            f"step {s}: {float.fromhex(first.losses[s])!r} then {float.fromhex(second.losses[s])!r}"
            for s in differ[:3]
        )
        return False, (
            f"MISMATCH: process 2 resumed from step {second.resumed} and trained {span} again, "
            f"but {len(differ)} of those {plural(len(both), 'loss', 'losses')} differ from "
            f"process 1's ({shown}): the checkpoint did not restore the model, the optimizer "
            "state or the data RNG exactly."
        )
    last = both[-1]
    same = {1: "its loss is", 2: "both losses are"}.get(len(both), f"all {len(both)} losses are")
    return True, (
        f"process 2 resumed from step {second.resumed} and trained {span} again, which process 1 "
        f"had trained before it was killed: {same} bit-for-bit the same (step {last}: "
        f"{float.fromhex(second.losses[last])!r} in both). Each of those steps depends on the "
        "model, the optimizer state and the data RNG restored from the checkpoint, so all three "
        "came back exactly."
    )


def print_next(url: str, catalog: list[CheckpointInfo], env_hint: str) -> None:
    """The ``s3ckpt`` commands to try on the run (after ``env_hint``, a shell line that
    points them at the embedded server, when there is one)."""
    committed = [c.name for c in catalog if c.state.value == "committed"]
    run_url = url.rstrip("/") + "/"
    print("\n== next: try the s3ckpt command on this run ==")
    if env_hint:
        print(f"  {env_hint}")
    print(f"  s3ckpt ls {run_url}")
    if committed:
        ckpt_url = f"{run_url}{committed[-1]}/"
        print(f"  s3ckpt inspect {ckpt_url} --summary")
        print(f"  s3ckpt verify {ckpt_url}")
    # A built-in policy name: the same file, from any directory.
    print(f"  s3ckpt prune {run_url} --policy {DEMO_POLICY}    # a dry run; --apply deletes")
