"""The ``s3ckpt`` command.

Sub-commands live in the modules named in :data:`COMMAND_MODULES` (each has a
``register(subparsers, common)``); exit codes are documented in :mod:`s3ckpt._cli`.
Commands that need no torch (ls, prune, pin, gc, ...) never import it.

Every error a user can meet ends the command with one line on stderr
(``s3ckpt: error: ...``) and its exit code, never a traceback; a reader that closes the
pipe early (``s3ckpt ls ... | head -1``) ends it quietly with exit 141, and Ctrl-C with
``s3ckpt: error: interrupted`` and exit 130 (``s3ckpt demo`` included).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys

from s3ckpt._cli import (
    EXIT_INTERRUPTED,
    EXIT_PIPE,
    EXIT_USAGE,
    CommandError,
    common_parser,
    error,
    exit_code_for,
)
from s3ckpt._version import __version__
from s3ckpt.errors import S3CkptError, find_interrupt

__all__ = ["COMMAND_MODULES", "build_parser", "main"]

#: Modules that add sub-commands, in the order they appear in ``--help``.
COMMAND_MODULES: tuple[str, ...] = (
    "s3ckpt._cli.retention",
    "s3ckpt._cli.check",
    "s3ckpt._cli.tools",
    "s3ckpt._cli.report",
    "s3ckpt._cli.doctor",
)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser."""
    parser = argparse.ArgumentParser(
        prog="s3ckpt",
        description="PyTorch checkpoints on S3: save, load, list, inspect, verify, prune.",
    )
    parser.add_argument("--version", action="version", version=f"s3ckpt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    common = common_parser()
    # Listed for --help only: _main runs `s3ckpt demo ARGS...` itself (argparse's REMAINDER
    # does not take arguments that start with "-" right after a sub-command).
    demo_help = "train, checkpoint and resume a small model on an embedded S3 server"
    sub.add_parser("demo", help=demo_help, add_help=False).add_argument("rest", nargs="...")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``s3ckpt`` command; returns the exit code.

    Ctrl-C anywhere (parsing, importing torch, a request, a ``dcp.load`` that wrapped it in
    its ``CheckpointException``) ends it with one line on stderr and exit 130, no traceback.
    """
    try:
        return _main(argv)
    except BaseException as exc:
        if not isinstance(find_interrupt(exc), KeyboardInterrupt):
            raise
        error("interrupted")
        return EXIT_INTERRUPTED


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["demo"]:  # s3ckpt.demo.main with the rest as given
            from s3ckpt.demo import main as demo

            demo(argv[1:])
            return 0
        parser = build_parser()
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0), bad usage (2), a failure the demo reported (1-3)
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    if (func := getattr(args, "func", None)) is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        code = int(func(args))
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except BrokenPipeError:
        # The reader of stdout went away: send what is still buffered, and whatever is
        # printed until exit, to the null device, so the interpreter's last flush raises no
        # second BrokenPipeError ("Exception ignored ..."). Python's documented recipe
        # (``signal`` module, "Note on SIGPIPE").
        with contextlib.suppress(OSError, ValueError):  # no file descriptor (tests)
            stdout, devnull = sys.stdout.fileno(), os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stdout)
            os.close(devnull)
        return EXIT_PIPE
    except (CommandError, S3CkptError) as exc:
        error(str(exc))
        return exit_code_for(exc)


if __name__ == "__main__":
    raise SystemExit(main())
