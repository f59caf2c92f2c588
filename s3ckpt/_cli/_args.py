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
import dataclasses
import os
from datetime import datetime, timedelta

from s3ckpt._cli import open_location
from s3ckpt._cli._output import ProgressCounter, progress_enabled
from s3ckpt._step_names import compile_step_pattern
from s3ckpt._time import parse_iso
from s3ckpt.errors import ConfigError
from s3ckpt.retention import DEFAULT_LEASE_TTL, format_duration, parse_duration
from s3ckpt.store import CountingStore, Location

__all__ = [
    "STEP_PATTERN_HELP",
    "add_lease_ttl",
    "add_metrics_file",
    "add_scan",
    "add_step_pattern",
    "counted",
    "duration",
    "iso_time",
    "metrics_path",
    "nonneg_int",
    "open_counted",
    "step_pattern",
]

STEP_PATTERN_HELP = (
    "a regular expression with one capture group around the step's digits, matched against "
    "the whole checkpoint name, for names s3ckpt does not read by itself (it reads step_100, "
    "step-100, epoch=1-step=100.ckpt, global_step100, checkpoint-100); a step recorded in "
    "s3ckpt.json wins"
)


def duration(text: str) -> timedelta:
    """``--grace``, ``--older-than``, ``--lease-ttl``: ``90s``, ``36h``, ``7d``, ``1d12h``."""
    try:
        value = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def nonneg_int(text: str) -> int:
    """``--max-delete``: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def step_pattern(text: str) -> str:
    """``--step-pattern``: a regular expression with one capture group (checked here)."""
    try:
        compile_step_pattern(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    return text


def iso_time(text: str) -> datetime:
    """``--now``: an ISO time from 1970 to 2999 (UTC when it names no offset)."""
    try:
        value = parse_iso(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO time such as 2025-03-01T12:00:00Z, got {text!r}"
        ) from None
    if not 1970 <= value.year < 3000:  # ``now - grace`` must stay inside datetime's range
        raise argparse.ArgumentTypeError(f"expected a time from 1970 to 2999, got {text!r}")
    return value


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


def add_lease_ttl(p: argparse.ArgumentParser) -> None:
    """``--lease-ttl DURATION``."""
    p.add_argument(
        "--lease-ttl",
        type=duration,
        default=DEFAULT_LEASE_TTL,
        metavar="DURATION",
        help=f"lease lifetime without renewal (default {format_duration(DEFAULT_LEASE_TTL)})",
    )


def add_step_pattern(p: argparse.ArgumentParser, note: str = "") -> None:
    """``--step-pattern REGEX`` (``note`` ends its help)."""
    p.add_argument(
        "--step-pattern",
        type=step_pattern,
        default=None,
        metavar="REGEX",
        help=STEP_PATTERN_HELP + note,
    )


def add_scan(p: argparse.ArgumentParser, default: str) -> None:
    """``--scan shallow|deep`` of ``ls`` and ``prune`` (``RetentionOptions.scan``)."""
    p.add_argument(
        "--scan",
        choices=("shallow", "deep"),
        default=default,
        help="shallow: list folders and read each commit marker, not every key (pins, live "
        "saves and storage classes unknown; prune lists what it deletes first); deep: list "
        f"every key (default {default})",
    )


def add_metrics_file(p: argparse.ArgumentParser, command: str) -> None:
    """``--metrics-file PATH`` of ``prune`` and ``gc``."""
    p.add_argument(
        "--metrics-file",
        default=None,
        type=metrics_path,
        metavar="PATH",
        help=f"write this {command}'s metrics in the Prometheus text format to PATH, atomically "
        "(for node_exporter's textfile collector, e.g. "
        f"/var/lib/node_exporter/textfile/s3ckpt-{command}.prom), also when it fails",
    )


def counted(
    args: argparse.Namespace, location: Location, label: str
) -> tuple[Location, ProgressCounter]:
    """``location`` with its store counted on a progress line
    (:class:`~s3ckpt.store.CountingStore`), and that line: drawn only on a terminal without
    ``--json`` / ``--no-progress`` (otherwise the store is not wrapped at all)."""
    counter = ProgressCounter(label, enabled=progress_enabled(args))
    if counter.enabled:
        location = dataclasses.replace(location, store=CountingStore(location.store, counter.add))
    return location, counter


def open_counted(
    args: argparse.Namespace, target: str, label: str
) -> tuple[Location, ProgressCounter]:
    """The command's PATH opened once (:func:`s3ckpt._cli.open_location`: a local path must
    be a folder), :func:`counted`."""
    return counted(args, open_location(args, target, folder=True), label)
