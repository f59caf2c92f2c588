"""Pieces of the ``s3ckpt`` command shared by its sub-command modules.

Each sub-command module exposes ``register(subparsers, common)``: it adds its parsers with
``parser.set_defaults(func=handler)``; a handler takes the parsed ``argparse.Namespace`` and
returns an exit code. ``common`` is a parent parser holding the store options every command
takes (``--endpoint-url``, ``--region``, ``--profile``, ``--no-verify-tls``).

Exit codes (stable; cron jobs and scripts act on them):

====  ==========================================================================
0     done (a dry run that planned, a verify that found nothing wrong, ...)
1     done in part: some deletes failed, a verify found bad data, a diff found differences
      when ``--exit-code`` was asked for; the message names each failure
2     bad input: a malformed URL, policy file or argument; nothing was changed
3     the store refused or could not be reached (credentials, bucket, endpoint)
4     busy: another pruner holds the lease on a run; try again later
====  ==========================================================================
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from s3ckpt.config import S3Config
from s3ckpt.errors import (
    AccessDeniedError,
    ConfigError,
    EndpointError,
    NoSuchBucketError,
    S3CkptError,
    StoreError,
)

EXIT_OK = 0
EXIT_PARTIAL = 1
EXIT_USAGE = 2
EXIT_STORE = 3
EXIT_BUSY = 4

__all__ = [
    "EXIT_BUSY",
    "EXIT_OK",
    "EXIT_PARTIAL",
    "EXIT_STORE",
    "EXIT_USAGE",
    "common_parser",
    "exit_code_for",
    "s3_config_from_args",
]


def common_parser() -> argparse.ArgumentParser:
    """The options every store-touching command takes."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("store")
    g.add_argument(
        "--endpoint-url",
        default=None,
        help="S3-compatible endpoint (default: AWS_ENDPOINT_URL, else AWS)",
    )
    g.add_argument("--region", default=None, help="AWS region (default: boto3's chain)")
    g.add_argument("--profile", default=None, help="AWS profile name (default: boto3's chain)")
    g.add_argument(
        "--no-verify-tls", action="store_true", help="do not verify the endpoint's TLS certificate"
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
    if getattr(args, "no_verify_tls", False):
        kwargs["verify_tls"] = False
    return S3Config(**kwargs)


def exit_code_for(exc: BaseException) -> int:
    """The exit code for an error that ended a command."""
    if isinstance(exc, ConfigError):
        return EXIT_USAGE
    if isinstance(exc, (AccessDeniedError, NoSuchBucketError, EndpointError, StoreError)):
        return EXIT_STORE
    if isinstance(exc, S3CkptError):
        return EXIT_PARTIAL
    return EXIT_STORE


def error(message: str) -> None:
    """Print ``message`` to stderr as ``s3ckpt: error: ...``."""
    print(f"s3ckpt: error: {message}", file=sys.stderr)
