"""Pieces of the ``s3ckpt`` command shared by its sub-command modules.

Each sub-command module exposes ``register(subparsers, common)``: it adds its parsers with
``parser.set_defaults(func=handler)``; a handler takes the parsed ``argparse.Namespace`` and
returns an exit code. ``common`` is a parent parser holding the store options every command
takes (``--endpoint-url``, ``--region``, ``--profile``, ``--addressing-style``,
``--no-verify-tls``, ``--max-attempts``, ``--read-timeout``).

Exit codes (stable; cron jobs and scripts act on them):

====  ==========================================================================
0     done (a dry run that planned, a verify that found nothing wrong, a ``doctor`` whose
      checks all passed, warnings allowed, ...)
1     done in part: some deletes failed, a verify found bad data, a check found a damaged
      checkpoint, a diff found differences
      when ``--exit-code`` was asked for, a checkpoint is unreadable (``ls``, ``prune``,
      ``gc`` and ``report`` list a damaged one as its own row, warn on stderr and process
      the rest); the message names each failure; ``doctor``: a check failed, the store
      will not keep checkpoints safe as configured (the ✘ rows say why)
2     bad input: a malformed or unsupported URL, policy file or argument, no checkpoint
      at the location, an unknown AWS profile, a command that needs PyTorch where it is
      not installed, ``rm`` of a checkpoint it refuses to delete (pinned, the newest, in
      progress, foreign); nothing was changed
3     the store refused or could not be reached (credentials, bucket, endpoint;
      ``doctor`` before its first row); ``verify`` or ``check`` could not read what it
      checks ("could not read ...": no bad data found, run it again)
4     busy: another pruner holds the lease on a run; try again later
5     clock skew: this host's clock and the store's differ by more than the grace period,
      so ``gc``, ``prune --apply`` and ``rm`` refused to delete anything; fix the host's
      clock (NTP) and run again (``ls``, ``report`` and dry runs only warn)
130   interrupted (Ctrl-C), after the command's cleanup; one line on stderr, no traceback
      (``s3ckpt demo`` too)
141   stdout was closed early (``s3ckpt ls ... | head``): the command stops quietly, as
      a program killed by SIGPIPE does
====  ==========================================================================

Errors are one line on stderr, ``s3ckpt: error: ...``, never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from s3ckpt._cli._args import positive_int, seconds
from s3ckpt._cli._output import ProgressCounter, progress_enabled, warn_damaged
from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.errors import (
    CheckpointNotFoundError,
    ClockSkewError,
    ConfigError,
    DeleteRefusedError,
    S3CkptError,
    StoreError,
)
from s3ckpt.metrics import CheckMetricsFile, MetricsFile
from s3ckpt.metrics._prometheus import CheckValues
from s3ckpt.retention import CheckpointInfo
from s3ckpt.store import CountingStore, Location
from s3ckpt.uri import parse_location

EXIT_OK = 0
EXIT_PARTIAL = 1
EXIT_USAGE = 2
EXIT_STORE = 3
EXIT_BUSY = 4
EXIT_CLOCK = 5
EXIT_INTERRUPTED = 130
EXIT_PIPE = 141

__all__ = [
    "EXIT_BUSY",
    "EXIT_CLOCK",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_PARTIAL",
    "EXIT_PIPE",
    "EXIT_STORE",
    "EXIT_USAGE",
    "Command",
    "CommandError",
    "common_parser",
    "error",
    "exit_code_for",
    "open_location",
    "s3_config_from_args",
    "transfer_config_from_args",
]

#: ``TransferConfig.request_deadline`` per second of ``--read-timeout`` (the defaults' ratio,
#: 50 s / 20 s): a slower read timeout keeps room for more than one attempt.
_DEADLINE_PER_READ_TIMEOUT = 2.5


class CommandError(Exception):
    """A command cannot go on (bad input): :func:`s3ckpt.cli.main` prints the message as one
    error line and exits 2."""


def common_parser() -> argparse.ArgumentParser:
    """The options every store-touching command takes."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("store")
    h = "S3-compatible endpoint (default: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, else AWS)"
    g.add_argument("--endpoint-url", help=h)
    h = "AWS region (default: AWS_REGION, AWS_DEFAULT_REGION, the profile's, us-east-1)"
    g.add_argument("--region", help=h)
    h = "AWS profile from ~/.aws/config or ~/.aws/credentials (default: AWS_PROFILE)"
    g.add_argument("--profile", help=h)
    h = (
        "bucket addressing; most self-hosted stores need path (default: the profile's "
        "s3.addressing_style, else auto)"
    )
    g.add_argument("--addressing-style", choices=("auto", "virtual", "path"), help=h)
    h = "do not verify the endpoint's TLS certificate"
    g.add_argument("--no-verify-tls", action="store_true", help=h)
    h = (
        "go on (with a warning) on a store that ignores conditional writes "
        "(If-None-Match / If-Match); you guarantee one writer or pruner at a time"
    )
    g.add_argument("--single-writer", action="store_true", help=h)
    h = (
        "attempts per request, the first included, on throttling, 5xx, timeouts and "
        "resets (default: AWS_MAX_ATTEMPTS, the profile's max_attempts, else 8)"
    )
    g.add_argument("--max-attempts", type=positive_int, metavar="N", help=h)
    h = (
        "seconds without a byte from the store before an attempt is retried; one "
        f"request may take {_DEADLINE_PER_READ_TIMEOUT:g} times this across its attempts "
        f"(default {TransferConfig.read_timeout:g})"
    )
    g.add_argument("--read-timeout", type=seconds, metavar="SECONDS", help=h)
    return p


def s3_config_from_args(args: argparse.Namespace) -> S3Config:
    """An :class:`S3Config` from the common options (unset ones keep S3Config's defaults)."""
    names = ("endpoint_url", "region", "profile", "addressing_style", "single_writer")
    kwargs: dict[str, Any] = {n: getattr(args, n) for n in names if getattr(args, n, None)}
    if args.no_verify_tls:
        kwargs["verify_tls"] = False
    return S3Config(**kwargs)


def transfer_config_from_args(args: argparse.Namespace) -> TransferConfig | None:
    """A :class:`TransferConfig` from ``--max-attempts`` / ``--read-timeout``; ``None``
    when neither is given (the library's defaults, ``AWS_MAX_ATTEMPTS`` and the profile's
    ``max_attempts`` apply)."""
    kwargs: dict[str, Any] = {}
    if args.max_attempts is not None:
        kwargs["max_attempts"] = args.max_attempts
    if (read := args.read_timeout) is not None:
        deadline = max(TransferConfig.request_deadline, _DEADLINE_PER_READ_TIMEOUT * read)
        kwargs.update(read_timeout=read, request_deadline=deadline)
    return TransferConfig(**kwargs) if kwargs else None


def open_location(args: argparse.Namespace, target: str, *, folder: bool = False) -> Location:
    """A command's URL or local path, opened once with the command's
    :class:`~s3ckpt.config.S3Config` and :class:`~s3ckpt.config.TransferConfig` (the
    process's shared store for them); the commands pass the Location down.

    Args:
        folder: A local path must be an existing folder (a typo is an error here, where a
            prefix on a bucket would only be empty).
    """
    url = parse_location(target)
    if folder and url.scheme == "file" and not os.path.isdir("/" + url.prefix):
        raise CommandError(f"{target}: no such folder (PATH is a URL or a local folder)")
    return Location.of(
        url, s3_config=s3_config_from_args(args), transfer_config=transfer_config_from_args(args)
    )


class Command:
    """What every command over a PATH repeats, in one place: PATH opened once (a local path
    must be a folder); on a terminal, without ``--json`` / ``--no-progress``, what it lists,
    reads and deletes counted on a progress line (``counted``: the store wrapped in a
    :class:`~s3ckpt.store.CountingStore`); ``--metrics-file`` (``prune``, ``gc``, ``check``)
    made before the first request and written once, also when the command fails; and the
    exit code (:meth:`finish`).

    ::

        cmd = Command(args, args.path)
        with cmd.working():  # the progress line; a failure writes the metrics file
            result = gc(cmd.location, ...)
        code = cmd.finish(code, damaged=result.damaged)

    Attributes:
        location: The opened PATH (its store counted).
        counter: The progress line (drawn only where enabled).
        metrics: The metrics file asked for, or None.
    """

    def __init__(self, args: argparse.Namespace, target: str, *, counted: bool = True) -> None:
        self.command: str = args.command
        self.metrics: MetricsFile | CheckMetricsFile | None = None
        if (path := getattr(args, "metrics_file", None)) and self.command == "check":
            self.metrics = CheckMetricsFile(path)
        elif path:
            self.metrics = MetricsFile(path, self.command, dry_run=not args.apply)
        self.location = open_location(args, target, folder=True)
        self.counter = ProgressCounter(self.command, enabled=counted and progress_enabled(args))
        if self.counter.enabled:
            store = CountingStore(self.location.store, self.counter.add)
            self.location = dataclasses.replace(self.location, store=store)

    @contextmanager
    def working(self) -> Iterator[None]:
        """The command's requests: its progress line is erased after them (the output
        follows); if they fail, the metrics file is written with success 0."""
        try:
            yield
        except BaseException:
            self._write_metrics(False, CheckValues())
            raise
        finally:
            self.counter.clear()  # the command's own output follows

    def finish(
        self, code: int, values: CheckValues | None = None, damaged: Iterable[CheckpointInfo] = ()
    ) -> int:
        """The exit code: ``code``, 1 (done in part) when a checkpoint of ``damaged`` is
        damaged (each named on stderr: :func:`~s3ckpt._cli._output.warn_damaged`), 2 when
        the metrics file was asked for and could not be written (what the command did
        stands: its output tells it)."""
        if warn_damaged(self.command, damaged):
            code = EXIT_PARTIAL
        if not self._write_metrics(code == EXIT_OK, values) and code == EXIT_OK:
            code = EXIT_USAGE
        return code

    def _write_metrics(self, success: bool, values: CheckValues | None) -> bool:
        """Write the metrics file; on failure say why on stderr and return False."""
        if self.metrics is None:
            return True
        try:
            if isinstance(self.metrics, CheckMetricsFile):
                self.metrics.write(values or CheckValues(), success=success)
            else:
                self.metrics.write(success=success)
        except OSError as exc:
            print(
                f"s3ckpt {self.command}: cannot write the metrics file {self.metrics.path}: "
                f"{exc.strerror or exc}",
                file=sys.stderr,
            )
            return False
        return True


def exit_code_for(exc: BaseException) -> int:
    """The exit code for an error that ended a command (or one target of ``rm``)."""
    if isinstance(exc, ClockSkewError):
        return EXIT_CLOCK
    if isinstance(exc, (CommandError, ConfigError, CheckpointNotFoundError, DeleteRefusedError)):
        return EXIT_USAGE
    partial = isinstance(exc, S3CkptError) and not isinstance(exc, StoreError)
    return EXIT_PARTIAL if partial else EXIT_STORE


def error(message: str) -> None:
    """Print ``message`` to stderr as ``s3ckpt: error: ...``."""
    print(f"s3ckpt: error: {message}", file=sys.stderr)
