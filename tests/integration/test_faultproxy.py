"""Tests for the fault-injecting reverse proxy, :class:`s3ckpt.testing.FaultProxy`.

Two upstreams are used: a real moto S3 server (``ThreadedMotoServer``)
driven through boto3, and a tiny stdlib HTTP/1.1 echo server for the
framing corner cases moto does not produce on demand (chunked request and
response bodies, 204/304, HEAD, close-delimited bodies, ``Expect``).
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import boto3
import botocore.exceptions as bexc
import botocore.retries.standard
import crc32c
import pytest
import urllib3.exceptions
from botocore.config import Config
from moto.server import ThreadedMotoServer

from s3ckpt.testing._faultproxy import (
    _IO_TIMEOUT,
    ALL_FAULT_KINDS,
    FAULT_KINDS,
    OPERATIONS,
    FaultProxy,
    classify,
)
from tests._http import serve

pytestmark = pytest.mark.integration

MiB = 1024 * 1024

# What a client may see when the proxy aborts a connection.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    bexc.ConnectionError,  # EndpointConnectionError & co.
    bexc.HTTPClientError,  # ConnectionClosedError, ReadTimeoutError, ...
    urllib3.exceptions.ProtocolError,
    ConnectionError,  # builtin ConnectionResetError & co.
)
# What reading a truncated streaming body may raise.
BODY_ERRORS: tuple[type[BaseException], ...] = (
    bexc.IncompleteReadError,
    bexc.ResponseStreamingError,
    urllib3.exceptions.ProtocolError,
    bexc.HTTPClientError,
    ConnectionError,
    http.client.IncompleteRead,
)


# --------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
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
    name = f"fp-{uuid.uuid4().hex[:12]}"
    make_client(moto_url).create_bucket(Bucket=name)
    return name


def crc32c_b64(data: bytes) -> str:
    return base64.b64encode(crc32c.crc32c(data).to_bytes(4, "big")).decode()


class _EchoHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 test upstream; reports what it received in X-Seen-* headers."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    wbufsize = 256 * 1024  # one send per small response (flushed per request)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def handle_expect_100(self) -> bool:
        # Record that an Expect header reached us (the proxy should strip it).
        self.saw_expect = True
        return super().handle_expect_100()

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length", "0")))

    def _reply(self, status: int, body: bytes, **headers: str) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key.replace("_", "-"), value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_PUT(self) -> None:
        chunked = "chunked" in self.headers.get("Transfer-Encoding", "")
        body = self._read_body()
        if self.path == "/sink":  # large uploads: answer with a digest only
            self._reply(200, hashlib.sha256(body).hexdigest().encode())
            return
        self._reply(
            200,
            body,
            X_Seen_Host=self.headers.get("Host", ""),
            X_Seen_Expect=str(getattr(self, "saw_expect", False)),
            X_Seen_Chunked=str(chunked),
        )

    do_POST = do_PUT

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "1234")
        self.end_headers()

    def do_GET(self) -> None:
        if self.path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for piece in (b"hello ", b"chunked ", b"world"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
        elif self.path == "/204":
            self.send_response(204)
            self.end_headers()
        elif self.path == "/304":
            self.send_response(304)
            self.send_header("ETag", '"x"')
            self.end_headers()
        elif self.path == "/eof":  # body delimited by connection close
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(b"until-eof-body")
            self.close_connection = True
        elif self.path.startswith("/source/"):
            size = int(self.path.rsplit("/", 1)[1])
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            block = bytes(range(256)) * 1024
            while size > 0:
                n = min(size, len(block))
                self.wfile.write(block[:n])
                size -= n
        else:
            self._reply(200, b"x" * 1000)


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    # quiet: the proxy cuts upstream connections on purpose (reset_mid_body)
    with serve(_EchoHandler, quiet=True) as url:
        yield url


def _conn(proxy: FaultProxy) -> http.client.HTTPConnection:
    port = int(proxy.endpoint_url.rsplit(":", 1)[1])
    return http.client.HTTPConnection("127.0.0.1", port, timeout=10)


def _statuses(proxy: FaultProxy, n: int, path: str = "/") -> list[int]:
    """The status of each of ``n`` GETs of ``path`` sent one after another on one connection."""
    conn = _conn(proxy)
    statuses = []
    for _ in range(n):
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        statuses.append(resp.status)
    conn.close()
    return statuses


# --------------------------------------------------------------------------
# boto3 against moto, no faults


def test_passthrough_s3_operations(moto_url: str) -> None:
    with FaultProxy(moto_url, fault_rate=0.0) as proxy:
        s3 = make_client(proxy.endpoint_url)
        bucket = f"fp-{uuid.uuid4().hex[:12]}"
        s3.create_bucket(Bucket=bucket)

        small = os.urandom(300_000)
        s3.put_object(Bucket=bucket, Key="small", Body=small)

        parts_data = [os.urandom(5 * MiB), os.urandom(1 * MiB)]
        mpu = s3.create_multipart_upload(Bucket=bucket, Key="big", ChecksumAlgorithm="CRC32C")
        parts = []
        for number, data in enumerate(parts_data, start=1):
            resp = s3.upload_part(
                Bucket=bucket,
                Key="big",
                UploadId=mpu["UploadId"],
                PartNumber=number,
                Body=data,
                ChecksumAlgorithm="CRC32C",
                ChecksumCRC32C=crc32c_b64(data),
            )
            assert resp["ChecksumCRC32C"] == crc32c_b64(data)
            parts.append(
                {
                    "PartNumber": number,
                    "ETag": resp["ETag"],
                    "ChecksumCRC32C": resp["ChecksumCRC32C"],
                }
            )
        s3.complete_multipart_upload(
            Bucket=bucket,
            Key="big",
            UploadId=mpu["UploadId"],
            MultipartUpload={"Parts": parts},
        )
        big = b"".join(parts_data)

        assert s3.get_object(Bucket=bucket, Key="small")["Body"].read() == small
        assert s3.get_object(Bucket=bucket, Key="big")["Body"].read() == big
        ranged = s3.get_object(Bucket=bucket, Key="big", Range="bytes=5242870-5242889")
        assert ranged["ContentLength"] == 20
        assert ranged["Body"].read() == big[5242870:5242890]
        head = s3.head_object(Bucket=bucket, Key="big")
        assert head["ContentLength"] == len(big)
        listed = s3.list_objects_v2(Bucket=bucket)
        assert sorted(o["Key"] for o in listed["Contents"]) == ["big", "small"]
        deleted = s3.delete_objects(
            Bucket=bucket,
            Delete={"Objects": [{"Key": "big"}, {"Key": "small"}], "Quiet": False},
        )
        assert sorted(d["Key"] for d in deleted["Deleted"]) == ["big", "small"]
        assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0

        stats = proxy.stats
        assert stats["faults"] == 0
        assert stats["requests"] == stats["forwarded"] >= 12


# --------------------------------------------------------------------------
# boto3 against moto, one fault kind at a time


@pytest.mark.parametrize(
    ("kind", "code"), [("slowdown", "SlowDown"), ("internal", "InternalError")]
)
def test_error_faults(moto_url: str, kind: str, code: str) -> None:
    bucket = new_bucket(moto_url)
    with FaultProxy(moto_url, fault_rate=1.0, faults=[kind]) as proxy:
        s3 = make_client(proxy.endpoint_url)
        with pytest.raises(bexc.ClientError) as info:
            s3.put_object(Bucket=bucket, Key="k", Body=b"payload" * 1000)
        assert info.value.response["Error"]["Code"] == code
        with pytest.raises(bexc.ClientError) as info:
            s3.get_object(Bucket=bucket, Key="k")
        assert info.value.response["Error"]["Code"] == code
        # The connection stays usable (keep-alive) after an injected error.
        proxy.set_fault_rate(0.0)
        s3.put_object(Bucket=bucket, Key="k", Body=b"ok")
        assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"ok"
        stats = proxy.stats
    assert stats[kind] == 2
    assert stats["faults"] == 2
    assert stats["requests"] == 4
    assert stats["forwarded"] == 2


def test_error_fault_response_shape(echo_url: str) -> None:
    with FaultProxy(echo_url, fault_rate=1.0, faults=["slowdown"]) as proxy:
        conn = _conn(proxy)
        conn.request("GET", "/bucket/key?x=1")
        resp = conn.getresponse()
        body = resp.read()
        assert resp.status == 503
        assert resp.getheader("Content-Type") == "application/xml"
        assert int(resp.getheader("Content-Length") or -1) == len(body)
        assert b"<Code>SlowDown</Code>" in body
        assert b"<Message>Please reduce your request rate.</Message>" in body
        conn.request("HEAD", "/bucket/key")  # same connection, no body for HEAD
        resp = conn.getresponse()
        assert resp.status == 503 and resp.read() == b""
        conn.close()


def test_reset_fault(moto_url: str) -> None:
    bucket = new_bucket(moto_url)
    with FaultProxy(moto_url, fault_rate=1.0, faults=["reset"]) as proxy:
        s3 = make_client(proxy.endpoint_url)
        with pytest.raises(CONNECTION_ERRORS):
            s3.put_object(Bucket=bucket, Key="k", Body=os.urandom(200_000))
        with pytest.raises(CONNECTION_ERRORS):
            s3.get_object(Bucket=bucket, Key="k")
        assert proxy.stats["reset"] == 2
        assert proxy.stats["forwarded"] == 0
    # Nothing reached the server.
    assert make_client(moto_url).list_objects_v2(Bucket=bucket)["KeyCount"] == 0


def test_reset_mid_body_fault(moto_url: str) -> None:
    bucket = new_bucket(moto_url)
    data = os.urandom(512 * 1024)
    with FaultProxy(moto_url, fault_rate=1.0, faults=["reset_mid_body"]) as proxy:
        s3 = make_client(proxy.endpoint_url)
        # PUT/HEAD responses have no body: delivered normally, not counted.
        s3.put_object(Bucket=bucket, Key="k", Body=data)
        assert s3.head_object(Bucket=bucket, Key="k")["ContentLength"] == len(data)
        assert proxy.stats["reset_mid_body"] == 0

        for _ in range(3):
            try:
                resp = s3.get_object(Bucket=bucket, Key="k")
            except CONNECTION_ERRORS:
                continue  # also acceptable, but never silent corruption
            assert resp["ContentLength"] == len(data)
            try:
                got = resp["Body"].read()
            except BODY_ERRORS:
                continue
            # If no exception surfaced, the data must visibly be short.
            assert len(got) < len(data)
        stats = proxy.stats
        assert stats["reset_mid_body"] == 3
        assert stats["forwarded"] == stats["requests"] == 5

        proxy.set_fault_rate(0.0)
        assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == data


def test_reset_mid_body_sends_strict_prefix(echo_url: str) -> None:
    with FaultProxy(echo_url, fault_rate=1.0, faults=["reset_mid_body"]) as proxy:
        port = int(proxy.endpoint_url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"GET /source/100000 HTTP/1.1\r\nHost: x\r\n\r\n")
            received = bytearray()
            with pytest.raises(ConnectionResetError):
                while chunk := sock.recv(65536):
                    received += chunk
        head, _, body = bytes(received).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 200") or head.startswith(b"HTTP/1.1 200")
        assert b"Content-Length: 100000" in head
        assert 0 < len(body) < 100000
        assert body == (bytes(range(256)) * 1024)[: len(body)]

        # Chunked response: head, chunk-size line, part of the first chunk.
        conn = _conn(proxy)
        conn.request("GET", "/chunked")
        resp = conn.getresponse()
        with pytest.raises((http.client.IncompleteRead, ConnectionError)):
            resp.read()
        assert proxy.stats["reset_mid_body"] == 2


# --------------------------------------------------------------------------
# retries


def test_standard_retries_survive_faults(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Keep the test fast: no back-off sleeps between botocore retries.
    monkeypatch.setattr(
        botocore.retries.standard.ExponentialBackoff,
        "delay_amount",
        lambda self, context: 0.001,
    )
    bucket = new_bucket(moto_url)
    rng = random.Random(1234)
    body_retries = 0
    with FaultProxy(moto_url, fault_rate=0.2, seed=7) as proxy:
        s3 = make_client(proxy.endpoint_url, max_attempts=10, mode="standard")
        for i in range(50):
            data = rng.randbytes(rng.randint(1, 64 * 1024))
            s3.put_object(Bucket=bucket, Key=f"obj/{i}", Body=data)
            # botocore cannot retry a failure while the caller reads the
            # streaming body (reset_mid_body); that is the job of an
            # application-level retry such as s3ckpt's, emulated here.
            for _attempt in range(5):
                try:
                    got = s3.get_object(Bucket=bucket, Key=f"obj/{i}")["Body"].read()
                    break
                except BODY_ERRORS:
                    body_retries += 1
            else:
                pytest.fail("GET kept failing")
            assert got == data
        stats = proxy.stats
    assert stats["faults"] >= 5, stats
    assert all(stats[kind] > 0 for kind in FAULT_KINDS), stats  # seed 7 hits all
    assert stats["requests"] == stats["forwarded"] + stats["faults"] - stats["reset_mid_body"]
    assert stats["requests"] == 100 + stats["faults"]  # each op succeeds exactly once
    # A mid-body reset surfaces while reading, never as a botocore retry.
    assert body_retries == stats["reset_mid_body"]
    assert sum(stats[k] for k in FAULT_KINDS) == stats["faults"]


def test_max_faults_caps_injection(echo_url: str) -> None:
    with FaultProxy(echo_url, fault_rate=1.0, faults=["internal"], max_faults=2) as proxy:
        statuses = _statuses(proxy, 5)
    assert statuses == [500, 500, 200, 200, 200]
    assert proxy.stats["internal"] == 2


def test_same_seed_same_fault_sequence(echo_url: str) -> None:
    def run(seed: int) -> list[int]:
        with FaultProxy(
            echo_url, fault_rate=0.5, faults=["internal", "slowdown"], seed=seed
        ) as proxy:
            return _statuses(proxy, 30)

    first = run(3)
    assert first == run(3)
    assert {200, 500, 503} <= set(first)
    assert first != run(4)


# --------------------------------------------------------------------------
# HTTP framing (echo upstream)


def test_framing_passthrough(echo_url: str) -> None:
    with FaultProxy(echo_url, fault_rate=0.0) as proxy:
        conn = _conn(proxy)
        # Content-Length body, Host preserved verbatim.
        conn.request("PUT", "/echo", body=b"abc" * 1000, headers={"Host": "bucket.example:9"})
        resp = conn.getresponse()
        assert resp.read() == b"abc" * 1000
        assert resp.getheader("X-Seen-Host") == "bucket.example:9"
        # Chunked request body, relayed as chunked.
        pieces = [b"one-", b"two-", b"three" * 5000]
        conn.request("PUT", "/echo", body=iter(pieces), encode_chunked=True)
        resp = conn.getresponse()
        assert resp.read() == b"".join(pieces)
        assert resp.getheader("X-Seen-Chunked") == "True"
        # Chunked response.
        conn.request("GET", "/chunked")
        resp = conn.getresponse()
        assert resp.getheader("Transfer-Encoding") == "chunked"
        assert resp.read() == b"hello chunked world"
        # HEAD: Content-Length but no body.
        conn.request("HEAD", "/anything")
        resp = conn.getresponse()
        assert resp.getheader("Content-Length") == "1234"
        assert resp.read() == b""
        # 204 and 304 carry no body.
        for path, status in (("/204", 204), ("/304", 304)):
            conn.request("GET", path)
            resp = conn.getresponse()
            assert resp.status == status
            assert resp.read() == b""
        # Still the same connection after all of that.
        conn.request("GET", "/")
        assert conn.getresponse().read() == b"x" * 1000
        # Body delimited by connection close.
        conn.request("GET", "/eof")
        resp = conn.getresponse()
        assert resp.read() == b"until-eof-body"
        conn.close()
        assert proxy.stats["requests"] == proxy.stats["forwarded"] == 8


def test_expect_100_continue(echo_url: str) -> None:
    with FaultProxy(echo_url, fault_rate=0.0) as proxy:
        port = int(proxy.endpoint_url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(
                b"PUT /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n"
                b"Expect: 100-continue\r\n\r\n"
            )
            rfile = sock.makefile("rb")
            assert rfile.readline() == b"HTTP/1.1 100 Continue\r\n"
            assert rfile.readline() == b"\r\n"
            sock.sendall(b"hello")
            status = rfile.readline()
            assert status.split()[1] == b"200"
            headers = {}
            while (line := rfile.readline()) != b"\r\n":
                key, _, value = line.decode().partition(":")
                headers[key.strip().lower()] = value.strip()
            assert rfile.read(int(headers["content-length"])) == b"hello"
            assert headers["x-seen-expect"] == "False"  # stripped by the proxy
            rfile.close()


def test_large_bodies_stream(echo_url: str) -> None:
    size = 16 * MiB
    payload = os.urandom(size)
    with FaultProxy(echo_url, fault_rate=0.0) as proxy:
        conn = _conn(proxy)
        conn.request("PUT", "/sink", body=payload)
        resp = conn.getresponse()
        assert resp.read() == hashlib.sha256(payload).hexdigest().encode()
        conn.request("GET", f"/source/{size}")
        resp = conn.getresponse()
        digest = hashlib.sha256()
        total = 0
        while chunk := resp.read(MiB):
            digest.update(chunk)
            total += len(chunk)
        assert total == size
        block = bytes(range(256)) * 1024
        assert digest.digest() == hashlib.sha256(block * (size // len(block))).digest()
        conn.close()


# --------------------------------------------------------------------------
# lifecycle / validation


def _stop_timing(moto_url: str) -> float:
    """Start a proxy with assorted open connections; return how long stop() took."""
    proxy = FaultProxy(moto_url, fault_rate=0.0)
    proxy.start()
    port = int(proxy.endpoint_url.rsplit(":", 1)[1])
    make_client(proxy.endpoint_url).list_buckets()  # leaves a pooled keep-alive connection
    idle = socket.create_connection(("127.0.0.1", port), timeout=5)
    half = socket.create_connection(("127.0.0.1", port), timeout=5)
    half.sendall(b"PUT /x HTTP/1.1\r\nHost: h\r\nContent-Length: 100\r\n\r\nabc")
    time.sleep(0.1)

    started = time.monotonic()
    proxy.stop()
    elapsed = time.monotonic() - started

    for sock in (idle, half):  # the proxy ended both connections
        try:
            assert sock.recv(10) == b""
        except ConnectionResetError:
            pass
        sock.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    # Handler threads were woken by the shutdown and wind down on their own, long before
    # their socket timeout would have freed them.
    deadline = time.monotonic() + _PROMPT
    while any(t.name.endswith(f"-{port}") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "proxy threads did not exit"
        time.sleep(0.02)
    return elapsed


# stop() normally takes milliseconds, but a loaded CI machine can deschedule this process for
# seconds, so the bound is not a timing claim: it separates "woke the blocked threads" from
# "waited for them", which takes the proxy's socket timeout (_IO_TIMEOUT, 120 s).
_PROMPT = _IO_TIMEOUT / 4


def test_stop_is_prompt(moto_url: str) -> None:
    elapsed = _stop_timing(moto_url)
    assert elapsed < _PROMPT, f"stop() took {elapsed:.1f} s: it waited on a blocked thread"


def test_argument_validation(moto_url: str) -> None:
    with pytest.raises(ValueError):
        FaultProxy(moto_url, fault_rate=1.5)
    with pytest.raises(ValueError):
        FaultProxy(moto_url, faults=["nope"])
    with pytest.raises(ValueError):
        FaultProxy(moto_url, host="0.0.0.0")
    with pytest.raises(ValueError):
        FaultProxy("https://127.0.0.1:1")
    proxy = FaultProxy(moto_url, fault_rate=0.0)
    with pytest.raises(ValueError):
        proxy.set_fault_rate(-0.1)
    assert set(proxy.stats) == {"requests", "forwarded", "faults", *FAULT_KINDS}


# --------------------------------------------------------------------------
# operation classification, deterministic arms, hooks, lost replies, stalls


@pytest.mark.parametrize(
    ("method", "target", "headers", "expected"),
    [
        ("PUT", "/b/a/b%20c.bin", {}, ("PutObject", "a/b c.bin")),
        ("PUT", "/b/k?x-id=PutObject", {"If-None-Match": "*"}, ("PutObject", "k")),
        ("PUT", "/b/k", {"x-amz-copy-source": "/b/j"}, ("Other", "k")),
        ("PUT", "/b/k?tagging", {}, ("Other", "k")),
        ("PUT", "/b/k?partNumber=3&uploadId=u1", {}, ("UploadPart", "k")),
        ("POST", "/b/k?uploads", {}, ("CreateMultipartUpload", "k")),
        ("POST", "/b/k?uploadId=u1", {}, ("CompleteMultipartUpload", "k")),
        ("DELETE", "/b/k?uploadId=u1", {}, ("AbortMultipartUpload", "k")),
        ("POST", "/b?delete", {}, ("DeleteObjects", "")),
        ("DELETE", "/b/dir/k", {}, ("DeleteObject", "dir/k")),
        ("GET", "/b/k", {}, ("GetObject", "k")),
        ("GET", "/b/k?partNumber=1&response-content-type=x", {}, ("GetObject", "k")),
        ("GET", "/b/k?uploadId=u1", {}, ("Other", "k")),
        ("HEAD", "/b/k%2Fx", {}, ("HeadObject", "k/x")),
        ("GET", "/b?list-type=2&prefix=a%2F&delimiter=%2F", {}, ("ListObjectsV2", "")),
        ("GET", "/b?uploads&prefix=a", {}, ("ListMultipartUploads", "")),
        ("GET", "/b", {}, ("Other", "")),
        ("PUT", "/b", {}, ("Other", "")),
        ("HEAD", "/b", {}, ("Other", "")),
        ("GET", "/", {}, ("Other", "")),
        ("get", "http://127.0.0.1:9/b/k?versionId=1", {}, ("GetObject", "k")),
        ("PUT", "/b//lead", {}, ("PutObject", "/lead")),
    ],
)
def test_classify(
    method: str, target: str, headers: dict[str, str], expected: tuple[str, str]
) -> None:
    assert classify(method, target, headers) == expected
    assert expected[0] in OPERATIONS


def test_classify_sees_what_boto3_sends(moto_url: str) -> None:
    bucket = new_bucket(moto_url)
    seen: list[tuple[str, str, str]] = []
    with FaultProxy(
        moto_url, fault_rate=0.0, hook=lambda op, key, phase: seen.append((op, key, phase))
    ) as proxy:
        s3 = make_client(proxy.endpoint_url)
        s3.put_object(Bucket=bucket, Key="d/k 1", Body=b"x")
        s3.put_object(Bucket=bucket, Key="d/c", Body=b"y", IfNoneMatch="*")
        s3.head_object(Bucket=bucket, Key="d/k 1")
        s3.get_object(Bucket=bucket, Key="d/k 1")["Body"].read()
        s3.list_objects_v2(Bucket=bucket, Prefix="d/")
        up = s3.create_multipart_upload(Bucket=bucket, Key="m")["UploadId"]
        etag = s3.upload_part(Bucket=bucket, Key="m", UploadId=up, PartNumber=1, Body=b"p" * 100)[
            "ETag"
        ]
        s3.list_multipart_uploads(Bucket=bucket)
        s3.complete_multipart_upload(
            Bucket=bucket,
            Key="m",
            UploadId=up,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]},
        )
        up2 = s3.create_multipart_upload(Bucket=bucket, Key="m2")["UploadId"]
        s3.abort_multipart_upload(Bucket=bucket, Key="m2", UploadId=up2)
        s3.delete_object(Bucket=bucket, Key="d/c")
        s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "m"}]})
        stats = proxy.stats
    ops = [(op, key) for op, key, phase in seen if phase == "before"]
    assert ops == [
        ("PutObject", "d/k 1"),
        ("PutObject", "d/c"),
        ("HeadObject", "d/k 1"),
        ("GetObject", "d/k 1"),
        ("ListObjectsV2", ""),
        ("CreateMultipartUpload", "m"),
        ("UploadPart", "m"),
        ("ListMultipartUploads", ""),
        ("CompleteMultipartUpload", "m"),
        ("CreateMultipartUpload", "m2"),
        ("AbortMultipartUpload", "m2"),
        ("DeleteObject", "d/c"),
        ("DeleteObjects", ""),
    ]
    # Every forwarded request has its "after", right behind its "before".
    assert [p for _, _, p in seen] == ["before", "after"] * len(ops)
    assert stats["op:PutObject"] == 2
    assert stats["op:CreateMultipartUpload"] == 2
    assert stats["op:HeadObject"] == 1
    assert stats["op:Nope"] == 0  # missing keys read as 0
    assert stats["hook_errors"] == 0


def test_lost_reply_applies_upstream(moto_url: str) -> None:
    bucket = new_bucket(moto_url)
    direct = make_client(moto_url)
    with FaultProxy(moto_url, fault_rate=0.0) as proxy:
        armed = proxy.arm("PutObject", "lost_reply")
        s3 = make_client(proxy.endpoint_url)
        with pytest.raises(CONNECTION_ERRORS):
            s3.put_object(Bucket=bucket, Key="k", Body=b"applied")
        # The server applied it although the client saw only a connection error.
        assert direct.get_object(Bucket=bucket, Key="k")["Body"].read() == b"applied"
        assert armed.hits == 1 and armed.exhausted
        s3.put_object(Bucket=bucket, Key="k", Body=b"second")  # the arm fired once only
        stats = proxy.stats
    assert direct.get_object(Bucket=bucket, Key="k")["Body"].read() == b"second"
    assert stats["lost_reply"] == 1 and stats["faults"] == 1
    assert stats["forwarded"] == stats["requests"] == 2


def test_lost_reply_sends_no_byte(echo_url: str) -> None:
    with FaultProxy(echo_url, fault_rate=1.0, faults=["lost_reply"]) as proxy:
        port = int(proxy.endpoint_url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"GET /source/100000 HTTP/1.1\r\nHost: x\r\n\r\n")
            received = b""
            with pytest.raises(ConnectionResetError):
                while chunk := sock.recv(65536):
                    received += chunk
            assert received == b""
        assert proxy.stats["lost_reply"] == 1
        assert proxy.stats["forwarded"] == 1


def test_lost_reply_random_restricted_by_ops(moto_url: str) -> None:
    bucket = new_bucket(moto_url)
    direct = make_client(moto_url)
    direct.put_object(Bucket=bucket, Key="k", Body=b"v")
    with FaultProxy(moto_url, fault_rate=1.0, faults=["lost_reply"], ops={"PutObject"}) as proxy:
        s3 = make_client(proxy.endpoint_url)
        assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"  # not in ops
        s3.head_object(Bucket=bucket, Key="k")
        with pytest.raises(CONNECTION_ERRORS):
            s3.put_object(Bucket=bucket, Key="k2", Body=b"w")
        stats = proxy.stats
    assert direct.get_object(Bucket=bucket, Key="k2")["Body"].read() == b"w"
    assert stats["lost_reply"] == 1 and stats["requests"] == 3


def test_stall_black_holes_request(moto_url: str) -> None:
    bucket = new_bucket(moto_url)
    with FaultProxy(moto_url, fault_rate=0.0) as proxy:
        armed = proxy.arm("PutObject", "stall")
        s3 = make_client(proxy.endpoint_url, read_timeout=1)
        started = time.monotonic()
        with pytest.raises(bexc.ReadTimeoutError):
            s3.put_object(Bucket=bucket, Key="k", Body=b"never")
        assert 0.9 <= time.monotonic() - started < 10
        assert armed.hits == 1
        assert proxy.stats["forwarded"] == 0
        # A stalled connection the client keeps open does not slow stop() down.
        port = int(proxy.endpoint_url.rsplit(":", 1)[1])
        proxy.arm("*", "stall")
        held = socket.create_connection(("127.0.0.1", port), timeout=5)
        held.sendall(b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n")
        time.sleep(0.2)
        assert not _readable(held)  # nothing came back
        started = time.monotonic()
        proxy.stop()
        assert time.monotonic() - started < _PROMPT
        try:
            assert held.recv(10) == b""
        except ConnectionResetError:
            pass
        held.close()
    keys = make_client(moto_url).list_objects_v2(Bucket=bucket)["KeyCount"]
    assert keys == 0  # never reached the server


def test_stall_after_applies_then_black_holes(moto_url: str) -> None:
    bucket = new_bucket(moto_url)
    with FaultProxy(moto_url, fault_rate=1.0, faults=["stall_after"]) as proxy:
        s3 = make_client(proxy.endpoint_url, read_timeout=1)
        with pytest.raises(bexc.ReadTimeoutError):
            s3.put_object(Bucket=bucket, Key="k", Body=b"applied")
        assert proxy.stats["stall_after"] == 1 and proxy.stats["forwarded"] == 1
    got = make_client(moto_url).get_object(Bucket=bucket, Key="k")["Body"].read()
    assert got == b"applied"


def _readable(sock: socket.socket) -> bool:
    import select

    return bool(select.select([sock], [], [], 0)[0])


def test_arm_window_glob_and_conditional(moto_url: str) -> None:
    bucket = new_bucket(moto_url)
    with FaultProxy(moto_url, fault_rate=0.0) as proxy:
        s3 = make_client(proxy.endpoint_url)
        windowed = proxy.arm("PutObject", "internal", skip=1, times=2, key_glob="a/*")
        results = []
        for key in ("a/1", "b/1", "a/2", "a/3", "a/4"):
            try:
                s3.put_object(Bucket=bucket, Key=key, Body=b"x")
                results.append("ok")
            except bexc.ClientError as exc:
                results.append(exc.response["Error"]["Code"])
        assert results == ["ok", "ok", "InternalError", "InternalError", "ok"]
        assert (windowed.seen, windowed.hits, windowed.exhausted) == (4, 2, True)

        cond = proxy.arm("PutObject", "slowdown", conditional=True, times=5)
        s3.put_object(Bucket=bucket, Key="c", Body=b"plain")  # not conditional: passes
        with pytest.raises(bexc.ClientError) as info:
            s3.put_object(Bucket=bucket, Key="d", Body=b"x", IfNoneMatch="*")
        assert info.value.response["Error"]["Code"] == "SlowDown"
        assert cond.hits == 1
        proxy.disarm(cond)
        s3.put_object(Bucket=bucket, Key="d", Body=b"x", IfNoneMatch="*")
        assert cond.hits == 1
        unconditional = proxy.arm("PutObject", "internal", conditional=False)
        s3.put_object(Bucket=bucket, Key="e", Body=b"x", IfNoneMatch="*")
        assert unconditional.hits == 0
        proxy.disarm()
        s3.put_object(Bucket=bucket, Key="e2", Body=b"x")
        assert unconditional.hits == 0


def test_arm_beats_random_draw_and_max_faults(echo_url: str) -> None:
    with FaultProxy(echo_url, fault_rate=1.0, faults=["internal"], max_faults=0) as proxy:
        first = proxy.arm("*", "slowdown")
        second = proxy.arm("*", "internal", times=2)  # first armed wins the shared request
        statuses = _statuses(proxy, 4, "/bucket/key")
    assert statuses == [503, 500, 200, 200]
    assert (first.hits, second.hits) == (1, 1)


def test_arm_keeps_random_sequence(echo_url: str) -> None:
    def run(arm: bool) -> list[int]:
        with FaultProxy(echo_url, fault_rate=0.5, faults=["internal"], seed=5) as proxy:
            if arm:
                proxy.arm("*", "slowdown", skip=3)
            return _statuses(proxy, 20, "/b/k")

    plain, armed = run(False), run(True)
    assert armed[3] == 503
    assert armed[:3] + armed[4:] == plain[:3] + plain[4:]


def test_hook_crash_points(moto_url: str) -> None:
    """Killing the client at "before" drops the request; at "after" it was applied."""
    bucket = new_bucket(moto_url)
    clients: dict[str, socket.socket] = {}
    calls: list[tuple[str, str, str]] = []

    def hook(op: str, key: str, phase: str) -> None:
        calls.append((op, key, phase))
        if key == "boom":
            raise RuntimeError("a broken hook")
        if op == "PutObject" and key in clients and phase == key.split("-")[0]:
            clients[key].close()  # the "client process" dies here
            time.sleep(0.05)

    with FaultProxy(moto_url, fault_rate=0.0, hook=hook) as proxy:
        port = int(proxy.endpoint_url.rsplit(":", 1)[1])
        for key in ("before-kill", "after-kill"):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            clients[key] = sock
            sock.sendall(
                f"PUT /{bucket}/{key} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                "Content-Length: 4\r\n\r\nbody".encode()
            )
        deadline = time.monotonic() + 10
        while len(calls) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        s3 = make_client(proxy.endpoint_url)
        s3.put_object(Bucket=bucket, Key="boom", Body=b"still works")
        stats = proxy.stats
    direct = make_client(moto_url)
    keys = sorted(o["Key"] for o in direct.list_objects_v2(Bucket=bucket).get("Contents", []))
    assert keys == ["after-kill", "boom"]
    assert ("PutObject", "before-kill", "after") not in calls
    assert ("PutObject", "after-kill", "after") in calls
    assert stats["hook_errors"] == 2  # "before" and "after" of boom
    assert stats["forwarded"] == 2


def test_hook_can_block_a_request(moto_url: str) -> None:
    bucket = new_bucket(moto_url)
    entered, release = threading.Event(), threading.Event()

    def hook(op: str, key: str, phase: str) -> None:
        if op == "PutObject" and phase == "before":
            entered.set()
            release.wait(10)

    direct = make_client(moto_url)
    with FaultProxy(moto_url, fault_rate=0.0, hook=hook) as proxy:
        s3 = make_client(proxy.endpoint_url)
        worker = threading.Thread(
            target=lambda: s3.put_object(Bucket=bucket, Key="k", Body=b"v" * 2_000_000)
        )
        worker.start()
        assert entered.wait(10)
        # Held at "before": the whole body has been read, nothing reached the server.
        assert direct.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
        release.set()
        worker.join(10)
        assert not worker.is_alive()
    assert direct.head_object(Bucket=bucket, Key="k")["ContentLength"] == 2_000_000


def test_new_argument_validation(moto_url: str) -> None:
    with pytest.raises(ValueError):
        FaultProxy(moto_url, ops=["PutObjects"])
    with pytest.raises(ValueError):
        FaultProxy(moto_url, ops="PutObject")
    FaultProxy(moto_url, faults=ALL_FAULT_KINDS)
    proxy = FaultProxy(moto_url, fault_rate=0.0)
    with pytest.raises(ValueError):
        proxy.arm("Nope", "reset")
    with pytest.raises(ValueError):
        proxy.arm("PutObject", "nope")
    with pytest.raises(ValueError):
        proxy.arm("PutObject", "reset", times=0)
    assert set(ALL_FAULT_KINDS) > set(FAULT_KINDS)
    assert FAULT_KINDS == ("slowdown", "internal", "reset", "reset_mid_body")
