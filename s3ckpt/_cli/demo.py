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
    from s3ckpt.demo import main

    main(list(args.rest))
    return 0
