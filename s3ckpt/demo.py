"""``make demo`` / ``s3ckpt demo``: train, checkpoint, get killed, resume.

A small language model trains in a child process with an async checkpoint every few steps
and retention by the built-in policy ``keep-last-3`` (``policies/keep-last-3.toml``, shipped
in the package: the same from a pip install as from the source tree); the demo SIGKILLs
that process mid-run, starts a new one that resumes from the latest committed checkpoint,
and prints the checkpoints kept (and why), whether the resumed run reproduced the
interrupted one exactly, how long training was blocked per async save against a
synchronous save of the same state, and the ``s3ckpt`` commands to try next on the run.

With no endpoint configured (neither ``S3CKPT_DEMO_URL`` nor ``AWS_ENDPOINT_URL``), the
demo starts an embedded S3 server (moto's ThreadedMotoServer) on 127.0.0.1 with dummy
credentials, so it runs on a fresh machine with no AWS account. Point it at a real bucket
with ``S3CKPT_DEMO_URL=s3://bucket/prefix`` (credentials from boto3's default chain), or at
another S3-compatible server with ``AWS_ENDPOINT_URL`` alone (the demo creates its bucket,
``s3ckpt-demo``, there if it is missing). ``--keep-server`` keeps the embedded server running
after the demo, until Ctrl-C, so that the printed commands can be tried on it.

Needs torch and, for the embedded server, moto: ``pip install "s3ckpt[demo]"``. Exit codes:
0 done, 1 the resumed run did not reproduce the interrupted one (or a training process
failed), 2 bad usage or a missing dependency, 3 the store refused or could not be reached,
130 interrupted (Ctrl-C: one line on stderr, the training processes stopped too).
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
import warnings
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from s3ckpt.checkpointer import SaveHandle
    from s3ckpt.retention import CheckpointInfo
    from s3ckpt.store import ObjectStore
    from s3ckpt.uri import StoreURL

__all__ = ["local_s3", "main"]

#: The bucket of the embedded server, and of an endpoint given by ``AWS_ENDPOINT_URL`` alone.
DEMO_BUCKET = "s3ckpt-demo"

#: The demo's retention policy: a built-in policy name (read from the package with
#: importlib.resources), never a path into a source tree a pip install does not have.
DEMO_POLICY = "keep-last-3"

# The exit codes of the s3ckpt command (s3ckpt._cli), which this module sits below.
_EXIT_FAILED = 1
_EXIT_USAGE = 2
_EXIT_STORE = 3
_EXIT_INTERRUPTED = 130

_INSTALL = 'pip install "s3ckpt[demo]"'

# A child prints "#loss STEP HEX" after each step: the loss exactly (float.hex), for the
# exact-resume check. The parent reads these lines and does not echo them.
_LOSS_LINE = re.compile(r"#loss (\d+) (\S+)")


def _fail(message: str, code: int) -> NoReturn:
    """``s3ckpt demo: error: MESSAGE`` on stderr (one line, like argparse's), exit ``code``."""
    print(f"s3ckpt demo: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def _require_torch() -> None:
    """Exit 2 with the install line when torch is missing (checked without importing it)."""
    import importlib.util

    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        _fail(
            f"the demo trains a model with torch, which is not installed: {_INSTALL}", _EXIT_USAGE
        )


@contextmanager
def _embedded_s3(bucket: str = DEMO_BUCKET) -> Iterator[str]:
    """s3ckpt.testing's embedded server (moto) with ``bucket`` on it, and the environment
    pointed at it meanwhile; yields its endpoint."""
    try:
        import moto.server  # noqa: F401  (the server's dependency, checked for our message)
    except ImportError:
        _fail(
            f"the embedded S3 server needs moto, which is not installed: {_INSTALL} "
            "(or set S3CKPT_DEMO_URL=s3://bucket/prefix to use a real bucket)",
            _EXIT_USAGE,
        )
    from s3ckpt.testing import local_s3 as embedded

    with embedded(bucket) as s3:
        yield s3.endpoint_url


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


class _Log:
    """What the parent reads from a training process's output."""

    def __init__(self) -> None:
        self.losses: dict[int, str] = {}  # step -> exact loss (float.hex)
        self.resumed: int | None = None
        self.sync_s: float | None = None

    def read(self, line: str, blocked: list[float]) -> None:
        m = _LOSS_LINE.match(line)
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


def _child_failed(n: int, returncode: int) -> NoReturn:
    # The child printed its own error (one line for an s3ckpt error) on stderr.
    code = returncode if returncode in (_EXIT_USAGE, _EXIT_STORE) else _EXIT_FAILED
    _fail(f"training process {n} failed (exit status {returncode}); its error is above", code)


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
    from s3ckpt._units import plural
    from s3ckpt.store import open_store

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
    first = _Log()
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
    second = _Log()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, bufsize=1)
    try:
        _read_all(child.stdout, second, blocked)
    except BaseException:
        child.kill()  # the parent was interrupted: so is the run
        child.wait()
        raise
    if child.wait() != 0:
        _child_failed(2, child.returncode)

    # 3. What is on the bucket, what retention kept, and why.
    store, parsed = open_store(url)
    print("\n== checkpoints under the run ==")
    catalog = _print_checkpoints(store, parsed)
    sync_s = second.sync_s
    if blocked and sync_s:
        import statistics

        mean = sum(blocked) / len(blocked)
        median = statistics.median(blocked)
        print(
            f"\ntraining blocked per async save: median {1000 * median:.1f} ms, mean "
            f"{1000 * mean:.1f} ms over {plural(len(blocked), 'save')} (the first save of each "
            "process "
            f"allocates the staging cache), vs {sync_s:.2f} s for a synchronous save of the same "
            f"state: {100 * median / sync_s:.1f} % (median), {100 * mean / sync_s:.1f} % (mean)"
        )
        print(
            f"(step {steps + 1} is that synchronous save: process 2 saved the state of step "
            f"{steps} once more with Checkpointer.save, which returns only once the checkpoint "
            "is durable, to measure how much of a save the async ones take off the training loop.)"
        )

    # 4. The exact-resume proof.
    exact, verdict = _resume_proof(first, second)
    print("\n== exact resume ==")
    print(textwrap.fill(verdict, width=92, initial_indent="  ", subsequent_indent="  "))

    # 5. What to try next.
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
    return 0 if exact else _EXIT_FAILED


def _print_checkpoints(store: ObjectStore, run: StoreURL) -> list[CheckpointInfo]:
    """Print the run's checkpoints with the reasons :data:`DEMO_POLICY` keeps each one (a
    plan of the built-in policy: no torch, no source tree needed); return the catalog."""
    from s3ckpt._units import format_bytes
    from s3ckpt.retention import list_checkpoints, load_policy, plan

    catalog = list_checkpoints(store, run)
    reasons = dict(plan(catalog, load_policy(DEMO_POLICY), datetime.now(UTC)).keep)
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
    return catalog


def _read_all(stream: IO[str] | None, log: _Log, blocked: list[float]) -> None:
    assert stream is not None
    with stream:
        for line in stream:
            log.read(line, blocked)


def _resume_proof(first: _Log, second: _Log) -> tuple[bool, str]:
    """Compare the losses of the steps both processes trained: process 1 trained them
    uninterrupted, process 2 after loading the checkpoint. Each such step depends on the
    model, the optimizer state and the data RNG restored, so equal losses, bit for bit,
    show that all three came back exactly."""
    from s3ckpt._units import plural

    if second.resumed is None:
        return False, "process 2 found no committed checkpoint to resume from."
    both = sorted(set(first.losses) & set(second.losses))
    if not both:
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
            f"process 1's ({shown}): "
            "the checkpoint did not restore the model, the optimizer state or the data RNG "
            "exactly."
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


def _echo(line: str, blocked: list[float]) -> None:
    m = re.match(r"step +(\d+) ", line)
    if m is None or int(m.group(1)) % 5 == 0:  # keep the log short: every fifth step
        print("   " + line, end="", flush=True)
    m = re.search(r"training blocked ([0-9.]+) ms", line)
    if m:
        blocked.append(float(m.group(1)) / 1000)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def _child(args: argparse.Namespace) -> None:
    """``--child URL``: one training process; an s3ckpt error is one line and exit 3 (2 for
    a configuration error)."""
    from s3ckpt.errors import ConfigError, S3CkptError

    try:
        train(args.child, args.steps, args.every, args.width, args.depth, stop_at=args.stop_at)
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: the parent says it
        raise SystemExit(_EXIT_INTERRUPTED) from None
    except S3CkptError as exc:
        _fail(str(exc), _EXIT_USAGE if isinstance(exc, ConfigError) else _EXIT_STORE)


@contextmanager
def local_s3(bucket: str = DEMO_BUCKET) -> Iterator[str]:
    """``s3://{bucket}`` on the endpoint ``AWS_ENDPOINT_URL`` names, or, without one, on an
    embedded S3 server (moto) on 127.0.0.1 with dummy credentials, stopped on exit. The
    bucket is created when missing. ``AWS_ENDPOINT_URL`` and the credentials are set in
    ``os.environ`` meanwhile, so child processes reach the same server.

    The examples under ``examples/`` start this way; it is for examples and tests, not for
    production (use a real bucket and boto3's credential chain there).
    """
    if os.environ.get("AWS_ENDPOINT_URL"):
        _prepare(f"s3://{bucket}/", create_bucket=True)
        yield f"s3://{bucket}"
        return
    with _embedded_s3(bucket):
        yield f"s3://{bucket}"


def _prepare(url: str, create_bucket: bool) -> bool:
    """Fail early, in one line, when the run's bucket cannot be used; with
    ``create_bucket``, create a missing bucket (the demo's own, on the embedded server or
    an endpoint that ``AWS_ENDPOINT_URL`` names). Returns whether it created the bucket."""
    from s3ckpt.errors import ConfigError, NoSuchBucketError, S3CkptError
    from s3ckpt.retention import list_checkpoints
    from s3ckpt.store import open_store

    try:
        store, parsed = open_store(url)
        if parsed.scheme != "s3":
            raise ConfigError(f"S3CKPT_DEMO_URL must be an s3:// URL, got {url!r}")
        try:
            list_checkpoints(store, parsed)
        except NoSuchBucketError:
            if not create_bucket:
                raise
            _create_bucket(parsed.bucket)
            list_checkpoints(store, parsed)
            return True
    except S3CkptError as exc:
        _fail(str(exc), _EXIT_USAGE if isinstance(exc, ConfigError) else _EXIT_STORE)
    return False


def _create_bucket(bucket: str) -> None:
    """Create ``bucket`` at ``AWS_ENDPOINT_URL`` (in the configured region, else us-east-1)."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    kwargs: dict[str, object] = {"Bucket": bucket}
    if region != "us-east-1":
        kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
    client = boto3.client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL"), region_name=region)
    try:
        client.create_bucket(**kwargs)
    except (BotoCoreError, ClientError) as exc:
        _fail(f"cannot create the demo's bucket {bucket!r}: {exc}", _EXIT_STORE)


def _wait_for_ctrl_c(endpoint: str) -> None:
    print(
        f"\nthe embedded S3 server keeps running at {endpoint} for the commands above; "
        "Ctrl-C stops it",
        flush=True,
    )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("stopped the embedded S3 server", flush=True)


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m s3ckpt.demo`` and ``s3ckpt demo``.

    Raises:
        SystemExit: with a code other than 0 when the demo failed (see the module's
            docstring); the reason is printed on stderr in one line. Ctrl-C: 130, with
            ``s3ckpt demo: interrupted`` (its training processes stop too, silently).
    """
    try:
        _main(argv)
    except KeyboardInterrupt:
        _fail_interrupted()


def _fail_interrupted() -> NoReturn:
    print("s3ckpt demo: interrupted", file=sys.stderr, flush=True)
    raise SystemExit(_EXIT_INTERRUPTED) from None


def _main(argv: list[str] | None) -> None:
    parser = argparse.ArgumentParser(
        prog="s3ckpt demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--steps", type=_positive, default=40, help="training steps (default 40)")
    parser.add_argument(
        "--every", type=_positive, default=5, help="async save every N steps (default 5)"
    )
    parser.add_argument(
        "--kill-at",
        type=_positive,
        default=25,
        help="SIGKILL the first process right after it starts the async save of this step "
        "(default 25)",
    )
    parser.add_argument("--width", type=_positive, default=128, help="model width (default 128)")
    parser.add_argument("--depth", type=_positive, default=3, help="number of blocks (default 3)")
    parser.add_argument(
        "--keep-server",
        action="store_true",
        help="keep the embedded S3 server running after the demo, until Ctrl-C, to try the "
        "commands it prints",
    )
    parser.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--stop-at", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)  # progress shows up when piped, too
    if args.child:
        _child(args)
        return
    if args.kill_at % args.every or not args.every < args.kill_at < args.steps:
        parser.error(
            "--kill-at must be a multiple of --every, after the first save and below --steps"
        )
    configured = os.environ.get("S3CKPT_DEMO_URL") or os.environ.get("AWS_ENDPOINT_URL")
    if args.keep_server and configured:
        parser.error(
            "--keep-server keeps the embedded S3 server, which the demo does not start when "
            "S3CKPT_DEMO_URL or AWS_ENDPOINT_URL is set"
        )
    _require_torch()
    run_name = f"runs/demo-{uuid.uuid4().hex[:6]}"
    shape = (args.steps, args.every, args.kill_at, args.width, args.depth)
    url = os.environ.get("S3CKPT_DEMO_URL")
    if configured:
        url = (url or f"s3://{DEMO_BUCKET}").rstrip("/") + "/" + run_name
        print(f"using configured endpoint {os.environ.get('AWS_ENDPOINT_URL', 'AWS S3')}")
        if _prepare(url, create_bucket=not os.environ.get("S3CKPT_DEMO_URL")):
            print(f"created the bucket {DEMO_BUCKET} there")
        code = run(url, *shape)
        if code:
            raise SystemExit(code)
        return
    with _embedded_s3() as endpoint:
        print(f"no S3 endpoint configured: started an embedded S3 server (moto) at {endpoint}")
        _prepare(f"s3://{DEMO_BUCKET}/", create_bucket=True)
        # moto takes any credentials: dummy ones, never the user's, go into the hint.
        hint = (
            f"export AWS_ENDPOINT_URL={endpoint} AWS_ACCESS_KEY_ID=demo AWS_SECRET_ACCESS_KEY=demo"
        )
        code = run(f"s3://{DEMO_BUCKET}/{run_name}", *shape, env_hint=hint)
        if args.keep_server:
            _wait_for_ctrl_c(endpoint)
        else:
            print(
                "  (the embedded server stops now; `s3ckpt demo --keep-server` keeps it "
                "running for these commands)"
            )
    if code:
        raise SystemExit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
