"""Ranged GETs: streamed from the socket into the caller's buffer, resumed where a body
ended early, and refused when the endpoint ignores ``Range``.

The endpoint is a small HTTP server on 127.0.0.1 serving one object, so each case can
shape the response exactly (a body cut short with a clean close, a 200 that ignores the
range) and count requests and connections.
"""

from __future__ import annotations

import re
import time
import tracemalloc
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any, ClassVar

import pytest

from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.errors import StoreError
from s3ckpt.store.s3 import S3Store
from tests._http import serve

MiB = 1 << 20
DATA = bytes(range(256)) * (24 * MiB // 256)


class _Objects(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    mode: ClassVar[str] = "normal"
    ranges: ClassVar[list[tuple[int, int]]] = []
    clients: ClassVar[set[int]] = set()

    def do_GET(self) -> None:
        _Objects.clients.add(self.client_address[1])
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        assert m is not None
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) else len(DATA) - 1
        _Objects.ranges.append((first, last))
        if _Objects.mode == "ignore_range":
            body = memoryview(DATA)
            self.send_response(200)
        else:
            body = memoryview(DATA)[first : last + 1]  # no copy: tracemalloc sees the server
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {first}-{last}/{len(DATA)}")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", '"etag"')
        self.end_headers()
        if _Objects.mode == "truncate_first" and len(_Objects.ranges) == 1:
            # Half the body, then a clean close (FIN): the client sees EOF early.
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client stopped reading (a refused response)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def store() -> Iterator[S3Store]:
    _Objects.mode = "normal"
    _Objects.ranges = []
    _Objects.clients = set()
    with serve(_Objects) as endpoint:
        yield S3Store(
            "bucket",
            S3Config(endpoint_url=endpoint, region="us-east-1"),
            TransferConfig(retry_initial_delay=0.01, retry_max_delay=0.05),
        )


def _read(store: S3Store, start: int, length: int, chunk: int = 8 * MiB) -> bytes:
    out = bytearray(length)
    view = memoryview(out)
    stream = store.open_range("obj", start, length)
    try:
        off = 0
        while off < length:
            got = stream.readinto(view[off : off + chunk])
            assert got > 0, f"stream ended at {off} of {length}"
            off += got
        assert stream.readinto(view[:0] if length == 0 else memoryview(bytearray(1))) == 0
    finally:
        stream.close()
    return bytes(out)


def test_body_streams_into_the_buffer_without_a_copy(store: S3Store) -> None:
    _read(store, 0, MiB)  # warm up the client and its connection
    out = bytearray(20 * MiB)
    view = memoryview(out)
    stream: Any = store.open_range("obj", 1000, len(out))
    tracemalloc.start()
    try:
        off = 0
        while off < len(out):
            off += stream.readinto(view[off : off + 8 * MiB])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        stream.close()
    assert bytes(out) == DATA[1000 : 1000 + len(out)]
    # Reading through StreamingBody.read allocates each 8 MiB chunk (twice) before
    # copying it into ``out``.
    assert peak < MiB, f"reading 20 MiB allocated {peak} bytes"


def test_connection_is_reused_after_a_complete_body(store: S3Store) -> None:
    for start in (0, 5 * MiB, 11 * MiB):
        assert _read(store, start, 3 * MiB) == DATA[start : start + 3 * MiB]
    assert len(_Objects.ranges) == 3
    assert len(_Objects.clients) == 1


def test_body_ending_early_resumes_at_the_offset_reached(store: S3Store) -> None:
    _Objects.mode = "truncate_first"
    start, length = 3 * MiB + 7, 16 * MiB
    assert _read(store, start, length) == DATA[start : start + length]
    (f1, l1), (f2, l2) = _Objects.ranges
    assert (f1, l1) == (start, start + length - 1)
    assert f2 == start + length // 2 and l2 == l1


def test_endpoint_ignoring_range_is_refused(store: S3Store) -> None:
    _Objects.mode = "ignore_range"
    with pytest.raises(StoreError, match="Range") as info:
        _read(store, 4096, MiB)
    assert info.value.key == "obj"
    assert info.value.bucket == "bucket"


def test_open_ended_range_still_reads_through_botocore(store: S3Store) -> None:
    stream = store.open_range("obj", len(DATA) - 5000, None)
    buf = bytearray(8192)
    got = 0
    try:
        while True:
            n = stream.readinto(memoryview(buf)[got:])
            if n == 0:
                break
            got += n
    finally:
        stream.close()
    assert bytes(buf[:got]) == DATA[-5000:]


def test_time_the_reader_spends_between_reads_is_not_the_endpoints(store: S3Store) -> None:
    # A body's deadline is read_timeout + bytes / min_rate: 0.3 + 0.25 s for 1 MiB here.
    # The reader takes ~1.6 s in all, sleeping between reads (decoding what it read): the
    # body moves fast whenever it is read, so it is never cut and never resumed.
    slow = S3Store(
        "bucket",
        S3Config(endpoint_url=store.s3_config.endpoint_url, region="us-east-1"),
        TransferConfig(read_timeout=0.3, min_rate=4 * MiB, retry_initial_delay=0.01),
    )
    out = bytearray(MiB)
    view = memoryview(out)
    stream = slow.open_range("obj", 0, MiB)
    try:
        off = 0
        while off < MiB:
            off += stream.readinto(view[off : off + 64 * 1024])
            time.sleep(0.1)
    finally:
        stream.close()
    assert bytes(out) == DATA[:MiB]
    assert _Objects.ranges == [(0, MiB - 1)]  # one GET: no cut, no resume
