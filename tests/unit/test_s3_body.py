"""Request bodies reach the socket without a second copy of the part.

botocore's CRT signer (used whenever awscrt is installed, as in our test extras) wraps a
body without ``seek`` in ``io.BytesIO``, copying a bytearray: 8 parts in flight cost
8 x part_size of extra memory. ``S3Store`` hands botocore a :class:`BufferBody` stream.

The endpoint is a tiny HTTP server on 127.0.0.1 that reads and discards the body, so the
only large Python allocation that can show up in tracemalloc is a copy made on our side.
"""

from __future__ import annotations

import hashlib
import io
import tracemalloc
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import ClassVar

import pytest

from s3ckpt.config import S3Config
from s3ckpt.store import open_store
from s3ckpt.store._body import BufferBody
from tests._http import serve

MiB = 1 << 20


class _Discard(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    received: ClassVar[list[tuple[int, str]]] = []

    def do_PUT(self) -> None:
        left = int(self.headers["Content-Length"])
        digest = hashlib.sha256()
        while left:
            chunk = self.rfile.read(min(left, 64 * 1024))
            digest.update(chunk)
            left -= len(chunk)
        _Discard.received.append((int(self.headers["Content-Length"]), digest.hexdigest()))
        self.send_response(200)
        self.send_header("ETag", '"etag"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[str]:
    _Discard.received.clear()
    with serve(_Discard) as url:
        yield url


@pytest.mark.parametrize("kind", ["bytearray", "memoryview"])
def test_upload_part_does_not_copy_the_body(endpoint: str, kind: str) -> None:
    store, url = open_store(
        "s3://bucket/run", s3_config=S3Config(endpoint_url=endpoint, region="us-east-1")
    )
    part = bytearray(range(256)) * (32 * MiB // 256)
    data = part if kind == "bytearray" else memoryview(part)[: 24 * MiB]
    store.upload_part(url.key("obj"), "upload-1", 1, b"warm up the client")
    tracemalloc.start()
    try:
        store.upload_part(url.key("obj"), "upload-1", 2, data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The server got every byte, in order...
    assert _Discard.received[-1] == (len(data), hashlib.sha256(data).hexdigest())
    # ... and no copy of the 24-32 MiB body was ever alive (urllib3 sends 16 KiB blocks).
    assert peak < 4 * MiB, f"peak Python allocation {peak / MiB:.1f} MiB during upload_part"


def test_buffer_body_reads_seeks_and_reads_into() -> None:
    body = BufferBody(memoryview(b"0123456789")[2:])
    assert len(body) == 8 and body.seekable() and body.readable()
    assert body.read(3) == b"234"
    dest = bytearray(4)
    assert body.readinto(dest) == 4 and dest == b"5678"
    assert body.read() == b"9" and body.read(5) == b""
    assert body.seek(-2, io.SEEK_END) == 6 and body.read() == b"89"
    assert body.seek(1) == 1 and body.tell() == 1 and body.read(None) == b"3456789"
    with pytest.raises(ValueError):
        body.seek(-1)


def test_buffer_body_read_is_a_read_only_view_not_a_copy() -> None:
    part = bytearray(b"abcdefgh")
    body = BufferBody(part)
    chunk = body.read(4)
    assert isinstance(chunk, memoryview) and chunk.readonly and chunk == b"abcd"
    part[0:1] = b"X"  # the view sees the buffer: nothing was copied
    assert chunk == b"Xbcd"
    with pytest.raises(TypeError):
        chunk[0] = 0  # type: ignore[index]
    # The loop idiom botocore's MD5/SHA-256 helpers use ends on an empty view.
    assert list(iter(lambda: body.read(3), b"")) == [b"efg", b"h"]
