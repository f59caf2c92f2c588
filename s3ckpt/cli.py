"""The ``s3ckpt`` command."""

from __future__ import annotations

import argparse
import sys

from s3ckpt import __version__

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the ``s3ckpt`` command; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="s3ckpt", description="PyTorch checkpoints on S3: save, load, inspect, prune."
    )
    parser.add_argument("--version", action="version", version=f"s3ckpt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser(
        "demo", help="save and load a small model on an embedded S3 server", add_help=False
    )
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        from s3ckpt import demo

        demo.main(rest)
        return 0
    parser.print_help()
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
