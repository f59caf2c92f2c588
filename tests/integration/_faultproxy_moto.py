"""What the fault proxy's tests against moto share: a moto S3 server of their own, boto3
clients that do not retry, fresh buckets, and the errors a client may meet when the proxy
cuts a connection or a body."""

from __future__ import annotations

import http.client
import select
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3
import botocore.exceptions as bexc
import pytest
import urllib3.exceptions
from botocore.config import Config
from moto.server import ThreadedMotoServer

from tests.faultproxy._connection import IO_TIMEOUT

__all__ = [
    "BODY_ERRORS",
    "CONNECTION_ERRORS",
    "PROMPT",
    "make_client",
    "moto_server",
    "new_bucket",
    "readable",
]

CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    bexc.ConnectionError,  # EndpointConnectionError & co.
    bexc.HTTPClientError,  # ConnectionClosedError, ReadTimeoutError, ...
    urllib3.exceptions.ProtocolError,
    ConnectionError,  # builtin ConnectionResetError & co.
)
"""What a client may see when the proxy aborts a connection."""

BODY_ERRORS: tuple[type[BaseException], ...] = (
    bexc.IncompleteReadError,
    bexc.ResponseStreamingError,
    urllib3.exceptions.ProtocolError,
    bexc.HTTPClientError,
    ConnectionError,
    http.client.IncompleteRead,
)
"""What reading a truncated streaming body may raise."""

# stop() normally takes milliseconds, but a loaded CI machine can deschedule this process for
# seconds, so the bound is not a timing claim: it separates "woke the blocked threads" from
# "waited for them", which takes the proxy's socket timeout (IO_TIMEOUT, 120 s).
PROMPT = IO_TIMEOUT / 4
"""The most seconds a prompt ``stop()`` may take."""


@contextmanager
def moto_server() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 with S3 loaded; yields its ``http://127.0.0.1:PORT``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        mp.delenv("AWS_PROFILE", raising=False)
        mp.delenv("AWS_SESSION_TOKEN", raising=False)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        make_client(url, read_timeout=300).list_buckets()  # moto loads S3 lazily
        try:
            yield url
        finally:
            server.stop()


def make_client(endpoint_url: str, read_timeout: float = 60, **retries: Any) -> Any:
    """A path-style boto3 S3 client; no retries unless ``retries`` (botocore's) are given."""
    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(
            retries=retries or {"total_max_attempts": 1},  # no retries
            s3={"addressing_style": "path"},
            connect_timeout=5,
            read_timeout=read_timeout,
        ),
    )


def new_bucket(moto_url: str) -> str:
    """A new bucket on the server itself (not through a proxy)."""
    name = f"fp-{uuid.uuid4().hex[:12]}"
    make_client(moto_url).create_bucket(Bucket=name)
    return name


def readable(sock: socket.socket) -> bool:
    """Whether ``sock`` has data or EOF pending right now."""
    return bool(select.select([sock], [], [], 0)[0])
