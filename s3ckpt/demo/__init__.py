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

# The package: this face (the command line: ``main``, its arguments and its flow), _exit
# (exit codes, one error line), _server (the bucket: embedded or configured), _train (the
# training job and what its output tells the parent), _run (the kill-and-resume) and
# _summary (what is printed at the end). ``python -m s3ckpt.demo`` runs __main__.

from __future__ import annotations

import argparse
import os
import sys
import uuid

from s3ckpt.demo._exit import fail_interrupted, require_torch
from s3ckpt.demo._run import run
from s3ckpt.demo._server import DEMO_BUCKET, demo_server, embedded_s3, prepare, wait_for_ctrl_c
from s3ckpt.demo._train import DEMO_POLICY, child

__all__ = ["DEMO_BUCKET", "DEMO_POLICY", "demo_server", "main"]


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
        fail_interrupted()


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
    return parser


def _main(argv: list[str] | None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)  # progress shows up when piped, too
    if args.child:
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
    require_torch()
    run_name = f"runs/demo-{uuid.uuid4().hex[:6]}"
    shape = (args.steps, args.every, args.kill_at, args.width, args.depth)
    url = os.environ.get("S3CKPT_DEMO_URL")
    if configured:
        url = (url or f"s3://{DEMO_BUCKET}").rstrip("/") + "/" + run_name
        print(f"using configured endpoint {os.environ.get('AWS_ENDPOINT_URL', 'AWS S3')}")
        if prepare(url, create_bucket=not os.environ.get("S3CKPT_DEMO_URL")):
            print(f"created the bucket {DEMO_BUCKET} there")
        code = run(url, *shape)
        if code:
            raise SystemExit(code)
        return
    with embedded_s3() as endpoint:
        print(f"no S3 endpoint configured: started an embedded S3 server (moto) at {endpoint}")
        prepare(f"s3://{DEMO_BUCKET}/", create_bucket=True)
        # moto takes any credentials: dummy ones, never the user's, go into the hint.
        hint = (
            f"export AWS_ENDPOINT_URL={endpoint} AWS_ACCESS_KEY_ID=demo AWS_SECRET_ACCESS_KEY=demo"
        )
        code = run(f"s3://{DEMO_BUCKET}/{run_name}", *shape, env_hint=hint)
        if args.keep_server:
            wait_for_ctrl_c(endpoint)
        else:
            print(
                "  (the embedded server stops now; `s3ckpt demo --keep-server` keeps it "
                "running for these commands)"
            )
    if code:
        raise SystemExit(code)
