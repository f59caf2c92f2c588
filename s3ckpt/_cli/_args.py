"""Argument types and options the retention and report commands share, and opening a
command's PATH with its progress line.

Each type refuses a bad value with :class:`argparse.ArgumentTypeError` (argparse's exit 2,
before any request): durations (``--grace``, ``--older-than``, ``--lease-ttl``), ISO times
(``--now``), counts (``--max-delete``), step patterns (``--step-pattern``, compiled here
only to check them: the run's :class:`~s3ckpt.retention.RetentionOptions` compiles the one
it uses) and the ``--metrics-file`` path.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from s3ckpt._step_names import compile_step_pattern
from s3ckpt._time import parse_iso
from s3ckpt.errors import ConfigError
from s3ckpt.retention import RetentionOptions
from s3ckpt.retention._duration import format_duration, parse_duration
from s3ckpt.retention._lease import DEFAULT_LEASE_TTL
from s3ckpt.retention._liveness import DEFAULT_GRACE, MIN_GRACE

__all__ = [
    "STEP_PATTERN_HELP",
    "add_options",
    "commands",
    "days",
    "duration",
    "nonneg_int",
    "positive_int",
    "refusing",
    "retention_options",
    "seconds",
]

STEP_PATTERN_HELP = (
    "a regular expression with one capture group around the step's digits, matched against "
    "the whole checkpoint name, for names s3ckpt does not read by itself (it reads step_100, "
    "step-100, epoch=1-step=100.ckpt, global_step100, checkpoint-100); a step recorded in "
    "s3ckpt.json wins"
)


def _number(convert: Callable[[str], Any], what: str, ok: Callable[[Any], bool]) -> Any:
    """An argument type: ``convert(text)`` where ``ok`` holds it, else "expected {what}"."""

    def parse(text: str) -> Any:
        with suppress(ValueError):
            if ok(value := convert(text)):
                return value
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")

    return parse


positive_int = _number(int, "an integer >= 1", lambda v: v >= 1)  # --max-attempts
nonneg_int = _number(int, "an integer >= 0", lambda v: v >= 0)  # --max-delete, --seed
days = _number(int, "a number of days >= 1", lambda v: v >= 1)  # restore --days
seconds = _number(float, "a number of seconds > 0", lambda v: 0 < v < math.inf)


def refusing(parse: Callable[[str], Any], *errors: type[Exception]) -> Callable[[str], Any]:
    """An argument type: ``parse(text)``, an error of ``errors`` refused with its message."""

    def argument(text: str) -> Any:
        try:
            return parse(text)
        except errors as exc:
            raise argparse.ArgumentTypeError(getattr(exc, "message", str(exc))) from None

    return argument


#: ``--grace``, ``--older-than``, ``--lease-ttl``: ``90s``, ``36h``, ``7d``, ``1d12h``.
duration = refusing(parse_duration, ValueError)
#: ``--step-pattern``: a regular expression with one capture group (checked here).
step_pattern = refusing(lambda text: compile_step_pattern(text) and text, ConfigError)


#: ``--now``: an ISO time (UTC when it names no offset) from 1970 to 2999, so that
#: ``now - grace`` stays inside datetime's range.
iso_time = _number(
    parse_iso,
    "an ISO time from 1970 to 2999, such as 2025-03-01T12:00:00Z",
    lambda v: 1970 <= v.year < 3000,
)


def metrics_path(text: str) -> str:
    """``--metrics-file``: refused before any request when its directory cannot take it
    (the file is written as a temporary file there, then renamed over PATH)."""
    folder = os.path.dirname(os.path.abspath(text))
    if not text or text.endswith(os.sep) or os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a directory: name the file to write")
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"directory {folder} does not exist (create it first)")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"directory {folder} is not writable by this user")
    return text


_GRACE_HELP = (
    "a save is in progress (never deleted, its uploads never aborted) while any of its "
    "objects, heartbeats or open uploads is younger than this; prune and gc raise "
    f"it to at least {format_duration(MIN_GRACE)} (default {format_duration(DEFAULT_GRACE)})"
)

#: The options several commands share: ``add_options(p, "--grace", ...)`` adds them, a
#: keyword there replacing one of the row's (``help=``, ``default=``).
_OPTIONS: dict[str, dict[str, Any]] = {
    "--grace": {"type": duration, "default": DEFAULT_GRACE, "help": _GRACE_HELP},
    "--lease-ttl": {
        "type": duration,
        "default": DEFAULT_LEASE_TTL,
        "metavar": "DURATION",
        "help": f"lease lifetime without renewal (default {format_duration(DEFAULT_LEASE_TTL)})",
    },
    "--step-pattern": {"type": step_pattern, "metavar": "REGEX", "help": STEP_PATTERN_HELP},
    "--now": {"type": iso_time, "metavar": "TIME"},
    "--max-delete": {"type": nonneg_int, "metavar": "N"},
    "--include-foreign": {"action": "store_true"},
    "--scan": {
        "choices": ("shallow", "deep"),
        "help": "shallow: list folders and read each commit marker, not every key (pins, live "
        "saves and storage classes unknown; prune lists what it deletes first); deep: list "
        "every key (default {default})",
    },
    "--metrics-file": {
        "type": metrics_path,
        "metavar": "PATH",
        "help": "write this {command}'s metrics in the Prometheus text format to PATH, "
        "atomically (for node_exporter's textfile collector, e.g. "
        "/var/lib/node_exporter/textfile/s3ckpt-{command}.prom), also when it fails",
    },
}


def retention_options(args: argparse.Namespace) -> RetentionOptions:
    """The :class:`~s3ckpt.retention.RetentionOptions` of the shared options the command has
    (``--grace``, ``--now``, ``--step-pattern`` ...)."""
    names = ("grace", "now", "step_pattern", "include_foreign", "max_delete", "lease_ttl", "scan")
    return RetentionOptions(**{n: getattr(args, n) for n in names if hasattr(args, n)})


#: What runs a command: the parsed arguments in, the exit code out.
Handler = Callable[[argparse.Namespace], int]


def commands(
    sub: argparse._SubParsersAction, common: argparse.ArgumentParser
) -> Callable[..., argparse.ArgumentParser]:
    """``add(name, handler, help, description, **kwargs)``: a sub-command with the store
    options ``common``, run by the handler."""

    def add(
        name: str, func: Handler, help: str, description: str | None = None, **kwargs: Any
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help, description=description, **kwargs)
        p.set_defaults(func=func)
        return p

    return add


def add_options(p: argparse.ArgumentParser, *names: str, **override: Any) -> None:
    """Add the shared options ``names`` (:data:`_OPTIONS`); ``{default}`` and ``{command}``
    in a help text are the option's default and the command's name."""
    command_name = p.prog.split()[-1]
    for name in names:
        kw = {**_OPTIONS[name], **override}
        if "help" in kw:
            kw["help"] = kw["help"].format(default=kw.get("default"), command=command_name)
        p.add_argument(name, **kw)
