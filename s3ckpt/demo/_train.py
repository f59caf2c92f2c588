"""The demo's training job: a small language model trained in a child process, resumed from
the run's latest checkpoint, saved asynchronously every few steps under the built-in
retention policy :data:`DEMO_POLICY`, and once synchronously at the end for comparison.

It reports to the parent on stdout: one line per step and per checkpoint event, and
``#loss STEP HEX`` with each step's exact loss (:data:`LOSS_LINE`); :class:`TrainLog` is
the parent's side of those lines. torch is imported only when the job runs.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import signal
import time
import warnings
from concurrent.futures import Future
from typing import TYPE_CHECKING

from s3ckpt.demo._exit import EXIT_INTERRUPTED, EXIT_STORE, EXIT_USAGE, fail

if TYPE_CHECKING:
    from s3ckpt.checkpointer import SaveHandle

__all__ = ["DEMO_POLICY", "LOSS_LINE", "VOCAB", "TrainLog", "TrainState", "child", "train"]

DEMO_POLICY = "keep-last-3"
"""The demo's retention policy: a built-in policy name (read from the package with
importlib.resources), never a path into a source tree a pip install does not have."""

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


def train(
    url: str, steps: int, every: int, width: int, depth: int, *, stop_at: int | None = None
) -> None:
    """The training job: resume from latest, train, async-save every ``every`` steps.

    Prints one line per step and per checkpoint event, and ``#loss STEP HEX`` with each
    step's exact loss; the parent reads them.

    Args:
        stop_at: Right after starting the async save of this step, stop the process
            (SIGSTOP) where it stands, so that the parent's SIGKILL lands while that save
            uploads however fast the store is and however late the parent reads the line.
    """
    import torch

    from s3ckpt.checkpointer import Checkpointer

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    model = _model(width, depth)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    state = TrainState()
    with Checkpointer(url, policy=DEMO_POLICY) as ckpt:
        t0 = time.perf_counter()
        resumed = ckpt.load(model, opt, state)
        if resumed is None:
            print("start: no checkpoint under the run, training from step 0", flush=True)
        else:
            print(
                f"resume: loaded step {resumed} (model, optimizer, data RNG) in "
                f"{time.perf_counter() - t0:.2f} s",
                flush=True,
            )
        handle = None
        for step in range(state.step + 1, steps + 1):
            if handle is not None:
                handle.staged.result()  # parameters may change only once staged
            tokens = torch.randint(0, VOCAB, (16, 64), generator=state.generator)
            logits = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)
            )
            loss.backward()
            opt.step()
            opt.zero_grad()
            state.step = step
            print(f"step {step:3d}  loss {loss.item():.4f}", flush=True)
            print(f"#loss {step} {loss.item().hex()}", flush=True)
            if step % every == 0:
                h = ckpt.async_save(step, model, opt, state, metrics={"loss": loss.item()})
                h.committed.add_done_callback(functools.partial(_report_commit, h))
                handle = h
                print(f"save: step {step} started (async)", flush=True)
                if step == stop_at and hasattr(signal, "SIGSTOP"):
                    os.kill(os.getpid(), signal.SIGSTOP)
        ckpt.wait()
        # A synchronous save of the same state, for comparison with the async ones.
        t0 = time.perf_counter()
        sync = ckpt.save(steps + 1, model, opt, state)
        print(
            f"sync: a synchronous save of the same state blocked {sync.blocked_seconds:.2f} s",
            flush=True,
        )


def _report_commit(h: SaveHandle, fut: Future[None]) -> None:
    exc = fut.exception()
    if exc is not None:
        print(f"commit: step {h.step} FAILED: {exc}", flush=True)
    else:
        print(
            f"commit: step {h.step} durable in {h.commit_seconds or 0:.2f} s, "
            f"training blocked {1000 * (h.blocked_seconds or 0):.1f} ms",
            flush=True,
        )


class TrainLog:
    """What the parent reads from a training process's output."""

    def __init__(self) -> None:
        self.losses: dict[int, str] = {}  # step -> exact loss (float.hex)
        self.resumed: int | None = None
        self.sync_s: float | None = None

    def read(self, line: str, blocked: list[float]) -> None:
        """Take one line: a loss is kept, anything else echoed (every fifth step) and the
        resume, the synchronous save's time and each async save's blocked time noted."""
        m = LOSS_LINE.match(line)
        if m:
            self.losses[int(m.group(1))] = m.group(2)
            return
        _echo(line, blocked)
        m = re.match(r"resume: loaded step (\d+)", line)
        if m:
            self.resumed = int(m.group(1))
        m = re.match(r"sync: .* blocked ([0-9.]+) s", line)
        if m:
            self.sync_s = float(m.group(1))


def _echo(line: str, blocked: list[float]) -> None:
    m = re.match(r"step +(\d+) ", line)
    if m is None or int(m.group(1)) % 5 == 0:  # keep the log short: every fifth step
        print("   " + line, end="", flush=True)
    m = re.search(r"training blocked ([0-9.]+) ms", line)
    if m:
        blocked.append(float(m.group(1)) / 1000)


def child(args: argparse.Namespace) -> None:
    """``--child URL``: one training process; an s3ckpt error is one line and exit 3 (2 for
    a configuration error)."""
    from s3ckpt.errors import ConfigError, S3CkptError

    try:
        train(args.child, args.steps, args.every, args.width, args.depth, stop_at=args.stop_at)
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: the parent says it
        raise SystemExit(EXIT_INTERRUPTED) from None
    except S3CkptError as exc:
        fail(str(exc), EXIT_USAGE if isinstance(exc, ConfigError) else EXIT_STORE)
