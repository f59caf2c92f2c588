"""The embedded S3 server: moto's ``ThreadedMotoServer`` on 127.0.0.1, a fresh bucket on it,
and the ``AWS_*`` environment that points boto3, s3ckpt and child processes at it.

moto is imported only when a server starts (``pip install "s3ckpt[testing]"``).
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

_DUMMY_KEY = "testing"

# Removed while the server is in use: each could send a request elsewhere (another
# endpoint, a profile's endpoint or role) or attach a real session token to the dummy keys.
_CLEARED = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ENDPOINT_URL_S3",
    "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS",
)


@contextmanager
def patched_env(values: Mapping[str, str | None]) -> Iterator[None]:
    """Set (a string) or remove (``None``) each variable of ``values`` in ``os.environ``,
    and on exit put back exactly what each one was before (set, or absent). Other
    variables are left as the block left them."""
    saved = {k: os.environ.get(k) for k in values}
    try:
        _set_env(values)
        yield
    finally:
        _set_env(saved)


def _set_env(values: Mapping[str, str | None]) -> None:
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def server_env(endpoint_url: str, region: str) -> dict[str, str | None]:
    """What :func:`local_s3` sets (a string) and removes (``None``) in ``os.environ``."""
    return {
        "AWS_ENDPOINT_URL": endpoint_url,
        "AWS_ACCESS_KEY_ID": _DUMMY_KEY,
        "AWS_SECRET_ACCESS_KEY": _DUMMY_KEY,
        "AWS_REGION": region,
        "AWS_DEFAULT_REGION": region,
        # Never read the developer's ~/.aws files: no profile, no stored credentials.
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        **dict.fromkeys(_CLEARED),
    }


@dataclass(eq=False)
class LocalS3:
    """A bucket on an embedded S3 server (moto) on 127.0.0.1: what :func:`local_s3` yields
    and the fixtures ``s3ckpt_server`` and ``s3ckpt_s3`` give.

    Any S3 client reaches it through the environment (``AWS_ENDPOINT_URL`` and dummy
    credentials, see :attr:`env`) while the context or fixture is active: a
    :class:`~s3ckpt.Checkpointer`, ``s3ckpt`` commands, ``boto3.client("s3")`` and child
    processes started meanwhile.

    Attributes:
        endpoint_url: The server's ``http://127.0.0.1:PORT``.
        bucket: The bucket's name.
        region: The region of the bucket and of :attr:`env`.
    """

    endpoint_url: str
    bucket: str
    region: str = field(repr=False)

    @property
    def url(self) -> str:
        """``s3://{bucket}``."""
        return f"s3://{self.bucket}"

    def url_for(self, *parts: str) -> str:
        """``s3://{bucket}/{part}/{part}...``: a run or checkpoint prefix in the bucket.

        ``url_for("runs", "llama")`` is ``"s3://BUCKET/runs/llama"``; with no parts, :attr:`url`.
        """
        path = "/".join(p.strip("/") for p in parts if p.strip("/"))
        return f"{self.url}/{path}" if path else self.url

    @property
    def env(self) -> dict[str, str]:
        """The variables set in ``os.environ`` while this server is in use: the endpoint,
        dummy credentials, the region, and ``AWS_CONFIG_FILE`` / ``AWS_SHARED_CREDENTIALS_FILE``
        pointed at ``os.devnull``. (``AWS_PROFILE``, ``AWS_DEFAULT_PROFILE``,
        ``AWS_SESSION_TOKEN``, ``AWS_SECURITY_TOKEN``, ``AWS_ENDPOINT_URL_S3`` and
        ``AWS_IGNORE_CONFIGURED_ENDPOINT_URLS`` are removed meanwhile.) Add it to the
        environment of a process you start with an environment of your own."""
        return {
            k: v for k, v in server_env(self.endpoint_url, self.region).items() if v is not None
        }

    def client(self) -> Any:
        """A new boto3 S3 client on the server itself (never through a proxy the
        environment may point at), for arranging and inspecting a test's objects."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=_DUMMY_KEY,
            aws_secret_access_key=_DUMMY_KEY,
        )

    def new_bucket(self, name: str | None = None) -> LocalS3:
        """Create another bucket on the same server (a random name when ``name`` is None)
        and return it. It lives as long as the server."""
        s3 = LocalS3(self.endpoint_url, name or f"s3ckpt-test-{uuid.uuid4().hex[:12]}", self.region)
        kwargs: dict[str, Any] = {"Bucket": s3.bucket}
        if s3.region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": s3.region}
        s3.client().create_bucket(**kwargs)
        return s3


@contextmanager
def local_s3(bucket: str | None = None, *, region: str = "us-east-1") -> Iterator[LocalS3]:
    """Start an embedded S3 server (moto) on 127.0.0.1 with a fresh bucket, point the
    environment at it for the block, and stop it on exit.

    Meanwhile ``os.environ`` holds ``AWS_ENDPOINT_URL``, dummy credentials and the region
    (:attr:`LocalS3.env`), and none of ``AWS_PROFILE``, ``AWS_SESSION_TOKEN`` or
    ``AWS_ENDPOINT_URL_S3``; ``AWS_CONFIG_FILE`` and ``AWS_SHARED_CREDENTIALS_FILE`` point at
    ``os.devnull``, so a developer's real credentials are never read or sent. Child processes
    started in the block (``subprocess``, ``torch.multiprocessing`` spawn) inherit it. On exit
    every variable is put back exactly as it was.

    Args:
        bucket: The bucket's name; a random ``s3ckpt-test-...`` when None.
        region: The region of the bucket and of ``AWS_REGION`` / ``AWS_DEFAULT_REGION``.

    Raises:
        ImportError: moto's server is not installed (``pip install "s3ckpt[testing]"``).
    """
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        raise ImportError(
            "s3ckpt.testing's embedded S3 server needs moto's server, which is not "
            'installed: pip install "s3ckpt[testing]"'
        ) from exc
    # One INFO line per request otherwise, in every captured log.
    werkzeug = logging.getLogger("werkzeug")
    if werkzeug.level == logging.NOTSET:
        werkzeug.setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        endpoint_url = "http://{}:{}".format(*server.get_host_and_port())
        with patched_env(server_env(endpoint_url, region)):
            yield LocalS3(endpoint_url, "", region).new_bucket(bucket)
    finally:
        server.stop()
