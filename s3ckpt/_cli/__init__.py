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
import os
import sys
from typing import Any

from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.errors import (
    AccessDeniedError,
    CheckpointNotFoundError,
    ClockSkewError,
    ConfigError,
    DeleteRefusedError,
    EndpointError,
    NoSuchBucketError,
    S3CkptError,
    StoreError,
)
from s3ckpt.store import Location
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
    """A command cannot go on: :func:`s3ckpt.cli.main` prints ``message`` as one error line
    and exits with ``code``."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def common_parser() -> argparse.ArgumentParser:
    """The options every store-touching command takes."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("store")
    g.add_argument(
        "--endpoint-url",
        default=None,
        help="S3-compatible endpoint (default: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, else AWS)",
    )
    g.add_argument(
        "--region",
        default=None,
        help="AWS region (default: AWS_REGION, AWS_DEFAULT_REGION, the profile's, us-east-1)",
    )
    g.add_argument(
        "--profile",
        default=None,
        help="AWS profile from ~/.aws/config or ~/.aws/credentials (default: AWS_PROFILE)",
    )
    g.add_argument(
        "--addressing-style",
        choices=("auto", "virtual", "path"),
        default=None,
        help="bucket addressing; most self-hosted stores need path (default: the profile's "
        "s3.addressing_style, else auto)",
    )
    g.add_argument(
        "--no-verify-tls", action="store_true", help="do not verify the endpoint's TLS certificate"
    )
    g.add_argument(
        "--single-writer",
        action="store_true",
        help="go on (with a warning) on a store that ignores conditional writes "
        "(If-None-Match / If-Match); you guarantee one writer or pruner at a time",
    )
    g.add_argument(
        "--max-attempts",
        type=_positive_int,
        default=None,
        metavar="N",
        help="attempts per request, the first included, on throttling, 5xx, timeouts and "
        "resets (default: AWS_MAX_ATTEMPTS, the profile's max_attempts, else 8)",
    )
    g.add_argument(
        "--read-timeout",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="seconds without a byte from the store before an attempt is retried; one "
        f"request may take {_DEADLINE_PER_READ_TIMEOUT:g} times this across its attempts "
        f"(default {TransferConfig.read_timeout:g})",
    )
    return p


def s3_config_from_args(args: argparse.Namespace) -> S3Config:
    """An :class:`S3Config` from the common options (unset ones keep S3Config's defaults)."""
    kwargs: dict[str, Any] = {}
    if getattr(args, "endpoint_url", None):
        kwargs["endpoint_url"] = args.endpoint_url
    if getattr(args, "region", None):
        kwargs["region"] = args.region
    if getattr(args, "profile", None):
        kwargs["profile"] = args.profile
    if getattr(args, "addressing_style", None):
        kwargs["addressing_style"] = args.addressing_style
    if getattr(args, "no_verify_tls", False):
        kwargs["verify_tls"] = False
    if getattr(args, "single_writer", False):
        kwargs["single_writer"] = True
    return S3Config(**kwargs)


def transfer_config_from_args(args: argparse.Namespace) -> TransferConfig | None:
    """A :class:`TransferConfig` from ``--max-attempts`` / ``--read-timeout``; ``None``
    when neither is given (the library's defaults, ``AWS_MAX_ATTEMPTS`` and the profile's
    ``max_attempts`` apply)."""
    kwargs: dict[str, Any] = {}
    if getattr(args, "max_attempts", None) is not None:
        kwargs["max_attempts"] = args.max_attempts
    if getattr(args, "read_timeout", None) is not None:
        kwargs["read_timeout"] = args.read_timeout
        kwargs["request_deadline"] = max(
            TransferConfig.request_deadline, _DEADLINE_PER_READ_TIMEOUT * args.read_timeout
        )
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
        url,
        s3_config=s3_config_from_args(args),
        transfer_config=transfer_config_from_args(args),
    )


def exit_code_for(exc: BaseException) -> int:
    """The exit code for an error that ended a command."""
    if isinstance(exc, ClockSkewError):
        return EXIT_CLOCK
    if isinstance(exc, (ConfigError, CheckpointNotFoundError, DeleteRefusedError)):
        return EXIT_USAGE
    if isinstance(exc, (AccessDeniedError, NoSuchBucketError, EndpointError, StoreError)):
        return EXIT_STORE
    if isinstance(exc, S3CkptError):
        return EXIT_PARTIAL
    return EXIT_STORE


def error(message: str) -> None:
    """Print ``message`` to stderr as ``s3ckpt: error: ...``."""
    print(f"s3ckpt: error: {message}", file=sys.stderr)
