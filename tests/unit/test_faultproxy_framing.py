"""The fault proxy relays HTTP/1.1 byte for byte: Content-Length and chunked bodies both
ways, HEAD/204/304, close-delimited bodies, ``Expect: 100-continue``, large bodies streamed.
Against the echo upstream on loopback (tests/unit/_faultproxy_echo.py), no S3 server."""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Iterator

import pytest

from tests.faultproxy import FaultProxy
from tests.unit._faultproxy_echo import MiB, connect, echo_server


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    with echo_server() as url:
        yield url


def test_framing_passthrough(echo_url: str) -> None:
    with FaultProxy(echo_url, fault_rate=0.0) as proxy:
        conn = connect(proxy)
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
        conn = connect(proxy)
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
