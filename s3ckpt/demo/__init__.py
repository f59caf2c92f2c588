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

# The package: this face (the command line, the bucket: embedded or configured, the
# kill-and-resume) and _train (the training job, what its output tells the parent, and what
# is printed at the end). ``python -m s3ckpt.demo`` runs __main__.

from __future__ import annotations

import argparse
import os
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import NoReturn

__all__ = ["demo_server", "main"]

DEMO_BUCKET = "s3ckpt-demo"
"""The bucket of the embedded server, and of an endpoint given by ``AWS_ENDPOINT_URL`` alone."""
DEMO_POLICY = "keep-last-3"
"""The demo's retention policy: a built-in policy name (read from the package with
importlib.resources), never a path into a source tree a pip install does not have."""

# Exit codes: the ``s3ckpt`` command's (:mod:`s3ckpt._cli`, which sits above the demo, so
# they are restated here): 1 the resumed run did not reproduce the interrupted one or a
# training process failed, 2 bad usage or a missing dependency, 3 the store, 130 Ctrl-C.
EXIT_FAILED, EXIT_USAGE, EXIT_STORE, EXIT_INTERRUPTED = 1, 2, 3, 130
INSTALL = 'pip install "s3ckpt[demo]"'


def fail(message: str, code: int) -> NoReturn:
    """``s3ckpt demo: error: MESSAGE`` on stderr (one line, like argparse's), exit ``code``."""
    print(f"s3ckpt demo: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


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
        print("s3ckpt demo: interrupted", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_INTERRUPTED) from None


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="s3ckpt demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--steps", type=_positive, default=40, help="training steps (default 40)")
    add("--every", type=_positive, default=5, help="async save every N steps (default 5)")
    add(
        "--kill-at",
        type=_positive,
        default=25,
        help="SIGKILL the first process right after it starts the async save of this step "
        "(default 25)",
    )
    add("--width", type=_positive, default=128, help="model width (default 128)")
    add("--depth", type=_positive, default=3, help="number of blocks (default 3)")
    add(
        "--keep-server",
        action="store_true",
        help="keep the embedded S3 server running after the demo, until Ctrl-C, to try the "
        "commands it prints",
    )
    add("--child", metavar="URL", help=argparse.SUPPRESS)
    add("--stop-at", type=int, help=argparse.SUPPRESS)
    return parser


def _main(argv: list[str] | None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)  # progress shows up when piped, too
    if args.child:
        from s3ckpt.demo._train import child

        child(args)
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
    import importlib.util

    if importlib.util.find_spec("torch") is None:  # checked without importing torch
        fail(f"the demo trains a model with torch, which is not installed: {INSTALL}", EXIT_USAGE)
    run_name = f"runs/demo-{uuid.uuid4().hex[:6]}"
    if configured:
        url = (os.environ.get("S3CKPT_DEMO_URL") or f"s3://{DEMO_BUCKET}").rstrip("/")
        url += "/" + run_name
        print(f"using configured endpoint {os.environ.get('AWS_ENDPOINT_URL', 'AWS S3')}")
        if prepare(url, create_bucket=not os.environ.get("S3CKPT_DEMO_URL")):
            print(f"created the bucket {DEMO_BUCKET} there")
        code = run(url, args)
    else:
        with demo_server():  # no AWS_ENDPOINT_URL: the embedded server, which sets it
            endpoint = os.environ["AWS_ENDPOINT_URL"]
            print(f"no S3 endpoint configured: started an embedded S3 server (moto) at {endpoint}")
            # moto takes any credentials: dummy ones, never the user's, go into the hint.
            hint = f"export AWS_ENDPOINT_URL={endpoint} AWS_ACCESS_KEY_ID=demo "
            hint += "AWS_SECRET_ACCESS_KEY=demo"
            code = run(f"s3://{DEMO_BUCKET}/{run_name}", args, env_hint=hint)
            if not args.keep_server:
                print(
                    "  (the embedded server stops now; `s3ckpt demo --keep-server` keeps it "
                    "running for these commands)"
                )
            else:
                print(
                    f"\nthe embedded S3 server keeps running at {endpoint} for the commands "
                    "above; Ctrl-C stops it"
                )
                with suppress(KeyboardInterrupt):
                    while True:
                        time.sleep(3600)
                print("stopped the embedded S3 server")
    if code:
        raise SystemExit(code)


# -- the bucket ---------------------------------------------------------------------------
@contextmanager
def demo_server(bucket: str = DEMO_BUCKET) -> Iterator[str]:
    """``s3://{bucket}`` on the endpoint ``AWS_ENDPOINT_URL`` names, or, without one, on an
    embedded S3 server (moto) on 127.0.0.1 with dummy credentials, stopped on exit. The
    bucket is created when missing. ``AWS_ENDPOINT_URL`` and the credentials are set in
    ``os.environ`` meanwhile, so child processes reach the same server.

    The examples under ``examples/`` start this way; it is for examples and tests, not for
    production (use a real bucket and boto3's credential chain there). Unlike
    :func:`s3ckpt.testing.local_s3` (a fresh random bucket, a :class:`~s3ckpt.testing.LocalS3`
    to inspect), it yields a URL and uses a configured endpoint when there is one.
    """
    if os.environ.get("AWS_ENDPOINT_URL"):
        prepare(f"s3://{bucket}/", create_bucket=True)
        yield f"s3://{bucket}"
        return
    try:
        import moto.server  # noqa: F401  (the server's dependency, checked for our message)
    except ImportError:
        fail(
            f"the embedded S3 server needs moto, which is not installed: {INSTALL} "
            "(or set S3CKPT_DEMO_URL=s3://bucket/prefix to use a real bucket)",
            EXIT_USAGE,
        )
    from s3ckpt.testing import local_s3

    with local_s3(bucket):
        yield f"s3://{bucket}"


def prepare(url: str, create_bucket: bool) -> bool:
    """Fail early, in one line, when the run's bucket cannot be used; with
    ``create_bucket``, create a missing bucket (the demo's own, on the embedded server or
    an endpoint that ``AWS_ENDPOINT_URL`` names). Returns whether it created the bucket."""
    from s3ckpt import store
    from s3ckpt.errors import ConfigError, NoSuchBucketError, S3CkptError
    from s3ckpt.retention import list_checkpoints

    try:
        run = store.Location.of(url)
        if run.url.scheme != "s3":
            raise ConfigError(f"S3CKPT_DEMO_URL must be an s3:// URL, got {url!r}")
        try:
            list_checkpoints(run)
        except NoSuchBucketError:
            if not create_bucket:
                raise
            try:
                store.create_bucket(run.store)
            except S3CkptError as exc:
                fail(f"cannot create the demo's bucket {run.bucket!r}: {exc}", EXIT_STORE)
            list_checkpoints(run)
            return True
    except S3CkptError as exc:
        fail(str(exc), EXIT_USAGE if isinstance(exc, ConfigError) else EXIT_STORE)
    return False


# -- the kill-and-resume ------------------------------------------------------------------
def run(url: str, args: argparse.Namespace, *, env_hint: str = "") -> int:
    """Train in a child process, SIGKILL it at step ``args.kill_at`` (mid async save),
    resume in a new process, and print what was kept, whether the resumed run reproduced
    the interrupted one, how long training was blocked, and the commands to try next
    (after ``env_hint``, a shell line that points them at the embedded server). Returns
    the exit code: 0, or 1 when a step trained by both processes had different losses."""
    from s3ckpt.demo import _train as t
    from s3ckpt.store import Location

    print(f"run prefix: {url}")
    print(f"retention policy: {DEMO_POLICY} (built-in: policies/{DEMO_POLICY}.toml)\n")
    shape = f"--steps {args.steps} --every {args.every} --width {args.width} --depth {args.depth}"
    cmd = [sys.executable, "-m", "s3ckpt.demo", "--child", url, *shape.split()]
    kill_at = args.kill_at
    print(f"== training process 1 (SIGKILLed while its async save of step {kill_at} uploads) ==")
    first, second = t.TrainLog(), t.TrainLog()
    status = t.watch(1, [*cmd, "--stop-at", str(kill_at)], first, f"save: step {kill_at} started")
    print(f"   [killed: exit status {status}]\n")
    print("== training process 2 (resumes from latest) ==")
    t.watch(2, cmd, second)
    print("\n== checkpoints under the run ==")
    catalog = t.print_checkpoints(Location.of(url))
    t.print_blocked(first.blocked + second.blocked, second.sync_s, args.steps)
    exact, verdict = t.resume_proof(first, second)  # the exact-resume proof
    print("\n== exact resume ==")
    print(textwrap.fill(verdict, width=92, initial_indent="  ", subsequent_indent="  "))
    t.print_next(url, catalog, env_hint)
    return 0 if exact else EXIT_FAILED
