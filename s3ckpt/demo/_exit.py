"""How the demo ends: its exit codes, one error line on stderr, and the dependency checks
that end it before anything starts.

The codes are the ``s3ckpt`` command's (:mod:`s3ckpt._cli`), which sits above the demo, so
they are restated here rather than imported.
"""

from __future__ import annotations

import sys
from typing import NoReturn

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_STORE",
    "EXIT_USAGE",
    "INSTALL",
    "fail",
    "fail_interrupted",
    "require_torch",
]

EXIT_FAILED = 1
"""The resumed run did not reproduce the interrupted one, or a training process failed."""
EXIT_USAGE = 2
"""Bad usage, a configuration error or a missing dependency."""
EXIT_STORE = 3
"""The store refused or could not be reached."""
EXIT_INTERRUPTED = 130
"""Ctrl-C."""

INSTALL = 'pip install "s3ckpt[demo]"'
"""The install line that brings torch and the embedded server."""


def fail(message: str, code: int) -> NoReturn:
    """``s3ckpt demo: error: MESSAGE`` on stderr (one line, like argparse's), exit ``code``."""
    print(f"s3ckpt demo: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def fail_interrupted() -> NoReturn:
    """``s3ckpt demo: interrupted`` on stderr, exit 130."""
    print("s3ckpt demo: interrupted", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_INTERRUPTED) from None


def require_torch() -> None:
    """Exit 2 with the install line when torch is missing (checked without importing it)."""
    import importlib.util

    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        fail(f"the demo trains a model with torch, which is not installed: {INSTALL}", EXIT_USAGE)
