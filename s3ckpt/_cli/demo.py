"""``s3ckpt demo``."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add demo; the arguments after it go to :func:`s3ckpt.demo.main` as they are."""
    p = sub.add_parser(
        "demo",
        help="train, checkpoint and resume a small model on an embedded S3 server",
        add_help=False,
    )
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    return run(list(args.rest))


def run(argv: list[str]) -> int:
    """``s3ckpt demo ARGS...``: :func:`s3ckpt.demo.main` with ``argv`` as given.

    :func:`s3ckpt.cli.main` calls this directly when ``demo`` is the first argument:
    argparse's ``REMAINDER`` does not take arguments that start with ``-`` right after a
    sub-command, so ``s3ckpt demo --steps 5`` would otherwise be refused.
    """
    from s3ckpt.demo import main

    try:
        main(argv)
    except SystemExit as exc:  # --help (0), or a failure the demo has reported (1, 2, 3)
        return int(exc.code) if isinstance(exc.code, int) else 2
    return 0
