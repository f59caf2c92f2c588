"""The demo's bucket: on an embedded S3 server (moto), or on the endpoint the environment
names, checked (and created where it is the demo's own) before any training starts.

:func:`demo_server` is what the examples under ``examples/`` start with. It differs from
:func:`s3ckpt.testing.local_s3`, the testing kit's server (a fresh random bucket, a
:class:`~s3ckpt.testing.LocalS3` to inspect): it yields a URL, and uses a configured endpoint
when there is one. Every request goes through the store (:class:`~s3ckpt.store.Location`);
boto3 is used only inside :mod:`s3ckpt.store`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from s3ckpt.demo._exit import EXIT_STORE, EXIT_USAGE, INSTALL, fail

__all__ = ["DEMO_BUCKET", "demo_server", "embedded_s3", "prepare", "wait_for_ctrl_c"]

DEMO_BUCKET = "s3ckpt-demo"
"""The bucket of the embedded server, and of an endpoint given by ``AWS_ENDPOINT_URL`` alone."""


@contextmanager
def embedded_s3(bucket: str = DEMO_BUCKET) -> Iterator[str]:
    """s3ckpt.testing's embedded server (moto) with ``bucket`` on it, and the environment
    pointed at it meanwhile; yields its endpoint."""
    try:
        import moto.server  # noqa: F401  (the server's dependency, checked for our message)
    except ImportError:
        fail(
            f"the embedded S3 server needs moto, which is not installed: {INSTALL} "
            "(or set S3CKPT_DEMO_URL=s3://bucket/prefix to use a real bucket)",
            EXIT_USAGE,
        )
    from s3ckpt.testing import local_s3

    with local_s3(bucket) as s3:
        yield s3.endpoint_url


@contextmanager
def demo_server(bucket: str = DEMO_BUCKET) -> Iterator[str]:
    """``s3://{bucket}`` on the endpoint ``AWS_ENDPOINT_URL`` names, or, without one, on an
    embedded S3 server (moto) on 127.0.0.1 with dummy credentials, stopped on exit. The
    bucket is created when missing. ``AWS_ENDPOINT_URL`` and the credentials are set in
    ``os.environ`` meanwhile, so child processes reach the same server.

    The examples under ``examples/`` start this way; it is for examples and tests, not for
    production (use a real bucket and boto3's credential chain there).
    """
    if os.environ.get("AWS_ENDPOINT_URL"):
        prepare(f"s3://{bucket}/", create_bucket=True)
        yield f"s3://{bucket}"
        return
    with embedded_s3(bucket):
        yield f"s3://{bucket}"


def prepare(url: str, create_bucket: bool) -> bool:
    """Fail early, in one line, when the run's bucket cannot be used; with
    ``create_bucket``, create a missing bucket (the demo's own, on the embedded server or
    an endpoint that ``AWS_ENDPOINT_URL`` names). Returns whether it created the bucket."""
    from s3ckpt.errors import ConfigError, NoSuchBucketError, S3CkptError
    from s3ckpt.retention import list_checkpoints
    from s3ckpt.store import Location
    from s3ckpt.store import create_bucket as create

    try:
        run = Location.of(url)
        if run.url.scheme != "s3":
            raise ConfigError(f"S3CKPT_DEMO_URL must be an s3:// URL, got {url!r}")
        try:
            list_checkpoints(run)
        except NoSuchBucketError:
            if not create_bucket:
                raise
            try:
                create(run.store)
            except S3CkptError as exc:
                fail(f"cannot create the demo's bucket {run.bucket!r}: {exc}", EXIT_STORE)
            list_checkpoints(run)
            return True
    except S3CkptError as exc:
        fail(str(exc), EXIT_USAGE if isinstance(exc, ConfigError) else EXIT_STORE)
    return False


def wait_for_ctrl_c(endpoint: str) -> None:
    """Keep the embedded server (and this process) up until Ctrl-C."""
    print(
        f"\nthe embedded S3 server keeps running at {endpoint} for the commands above; "
        "Ctrl-C stops it",
        flush=True,
    )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("stopped the embedded S3 server", flush=True)
