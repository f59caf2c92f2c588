"""``make demo`` / ``s3ckpt demo``: train, checkpoint, get killed, resume.

A small language model trains in a child process with an async checkpoint every few steps
and retention by ``policies/keep-last-3.toml``; the demo SIGKILLs that process mid-run,
starts a new one that resumes from the latest committed checkpoint, and prints the
checkpoints kept (and why) and how long training was blocked per async save against a
synchronous save of the same state.

With no endpoint configured (neither ``S3CKPT_DEMO_URL`` nor ``AWS_ENDPOINT_URL``), the
demo starts an embedded S3 server (moto's ThreadedMotoServer) on 127.0.0.1 with dummy
credentials, so it runs on a fresh machine with no AWS account. Point it at a real bucket
with ``S3CKPT_DEMO_URL=s3://bucket/prefix`` (credentials from boto3's default chain).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
import uuid
import warnings
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from s3ckpt.checkpointer import SaveHandle

__all__ = ["main"]


@contextmanager
def _embedded_s3() -> Iterator[str]:
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as exc:  # pragma: no cover - only without the test extra
        raise SystemExit(
            "the demo's embedded S3 server needs moto: pip install 's3ckpt[test]' "
            "(or set S3CKPT_DEMO_URL=s3://bucket/prefix to use a real bucket)"
        ) from exc
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    saved = {
        k: os.environ.get(k)
        for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    }
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "demo")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "demo")
    try:
        yield endpoint
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


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


VOCAB = 2048


class TrainState:
    """What besides model and optimizer a resumed run needs: the step and the data RNG."""

    def __init__(self) -> None:
        import torch

        self.step = 0
        self.generator = torch.Generator().manual_seed(1234)

    def state_dict(self) -> dict[str, object]:
        return {"step": self.step, "rng": self.generator.get_state()}

    def load_state_dict(self, sd: dict[str, object]) -> None:
        self.step = int(sd["step"])  # type: ignore[call-overload,unused-ignore]
        self.generator.set_state(sd["rng"])


def _policy_file() -> str | None:
    """``policies/keep-last-3.toml`` of the source tree, when the demo runs from one."""
    here = os.path.dirname(os.path.abspath(__file__))
    candidate = os.path.join(os.path.dirname(here), "policies", "keep-last-3.toml")
    return candidate if os.path.exists(candidate) else None


def train(url: str, steps: int, every: int, width: int, depth: int) -> None:
    """The training job: resume from latest, train, async-save every ``every`` steps.

    Prints one line per step and per checkpoint event; the parent reads them.
    """
    import torch

    from s3ckpt.checkpointer import Checkpointer
    from s3ckpt.retention import KeepLast

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    model = _model(width, depth)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    state = TrainState()
    policy_path = _policy_file()
    policy = policy_path or KeepLast(3)
    with Checkpointer(url, policy=policy) as ckpt:
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
            if step % every == 0:
                h = ckpt.async_save(step, model, opt, state, metrics={"loss": loss.item()})
                h.committed.add_done_callback(functools.partial(_report_commit, h))
                handle = h
                print(f"save: step {step} started (async)", flush=True)
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


def run(url: str, steps: int, every: int, kill_at: int, width: int, depth: int) -> None:
    """Train in a child process, SIGKILL it at step ``kill_at`` (mid async save), resume
    in a new process, and print what was kept and how long training was blocked."""
    import re
    import subprocess

    from s3ckpt._units import format_bytes
    from s3ckpt.retention import list_checkpoints, load_policy, plan
    from s3ckpt.store import open_store

    print(f"run prefix: {url}")
    policy_path = _policy_file()
    print(f"retention policy: {policy_path or 'KeepLast(3) (policies/ not found)'}\n")
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
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, bufsize=1)
    assert child.stdout is not None
    for line in child.stdout:
        _echo(line, blocked)
        if line.startswith(f"save: step {kill_at} started"):
            child.kill()
            break
    child.wait()
    print(f"   [killed: exit status {child.returncode}]\n")

    # 2. A new process resumes from latest and finishes the run.
    print("== training process 2 (resumes from latest) ==")
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True).stdout
    sync_s = None
    for line in out.splitlines(keepends=True):
        _echo(line, blocked)
        m = re.match(r"sync: .* blocked ([0-9.]+) s", line)
        if m:
            sync_s = float(m.group(1))

    # 3. What is on the bucket, what retention kept, and why.
    store, parsed = open_store(url)
    catalog = list_checkpoints(store, parsed)
    policy = load_policy(policy_path) if policy_path else None
    print("\n== checkpoints under the run ==")
    reasons: dict[str, tuple[str, ...]] = {}
    if policy is not None:
        reasons = dict(plan(catalog, policy, datetime.now(timezone.utc)).keep)
    leftovers = False
    for c in catalog:
        why = "; ".join(reasons.get(c.name, ())) or "-"
        if c.state.value != "committed":
            leftovers = True
            why = "not a checkpoint (no commit marker): never loaded, never pruned"
        print(f"  {c.name}  {c.state.value:<11} {format_bytes(c.size):>10}  kept: {why}")
    if leftovers:
        print(
            "  (objects without a commit marker: a save or a prune that the kill interrupted.\n"
            "   Recent objects look in progress, so nothing touches them yet; once the grace\n"
            "   period has passed, the next prune finishes an interrupted deletion (it is in\n"
            "   the lease's intent log) and `s3ckpt gc` removes an abandoned save.)"
        )
    if blocked and sync_s:
        import statistics

        mean = sum(blocked) / len(blocked)
        median = statistics.median(blocked)
        print(
            f"\ntraining blocked per async save: median {1000 * median:.1f} ms, mean "
            f"{1000 * mean:.1f} ms over {len(blocked)} saves (the first save of each process "
            f"allocates the staging cache), vs {sync_s:.2f} s for a synchronous save of the same "
            f"state: {100 * median / sync_s:.1f} % (median), {100 * mean / sync_s:.1f} % (mean)"
        )


def _echo(line: str, blocked: list[float]) -> None:
    import re

    m = re.match(r"step +(\d+) ", line)
    if m is None or int(m.group(1)) % 5 == 0:  # keep the log short: every fifth step
        print("   " + line, end="", flush=True)
    m = re.search(r"training blocked ([0-9.]+) ms", line)
    if m:
        blocked.append(float(m.group(1)) / 1000)


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m s3ckpt.demo`` and ``s3ckpt demo``."""
    parser = argparse.ArgumentParser(
        prog="s3ckpt demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--steps", type=int, default=40, help="training steps (default 40)")
    parser.add_argument("--every", type=int, default=5, help="async save every N steps")
    parser.add_argument(
        "--kill-at",
        type=int,
        default=25,
        help="SIGKILL the first process right after it starts the async save of this step",
    )
    parser.add_argument("--width", type=int, default=128, help="model width (default 128)")
    parser.add_argument("--depth", type=int, default=3, help="number of blocks (default 3)")
    parser.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.kill_at % args.every or not 0 < args.kill_at < args.steps:
        parser.error("--kill-at must be a multiple of --every below --steps")
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)  # progress shows up when piped, too
    if args.child:
        train(args.child, args.steps, args.every, args.width, args.depth)
        return
    run_name = f"runs/demo-{uuid.uuid4().hex[:6]}"
    url = os.environ.get("S3CKPT_DEMO_URL")
    if url or os.environ.get("AWS_ENDPOINT_URL"):
        url = (url or "s3://s3ckpt-demo").rstrip("/") + "/" + run_name
        print(f"using configured endpoint {os.environ.get('AWS_ENDPOINT_URL', 'AWS S3')}")
        run(url, args.steps, args.every, args.kill_at, args.width, args.depth)
        return
    with _embedded_s3() as endpoint:
        import boto3

        print(f"no S3 endpoint configured: started an embedded S3 server (moto) at {endpoint}")
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
            Bucket="s3ckpt-demo"
        )
        run(
            f"s3://s3ckpt-demo/{run_name}",
            args.steps,
            args.every,
            args.kill_at,
            args.width,
            args.depth,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
