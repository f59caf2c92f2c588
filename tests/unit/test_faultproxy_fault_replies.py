"""What a client receives from a fault, byte for byte: the S3 XML error reply, a strict
prefix of the body before a reset, not one byte before a lost reply's reset. Against the echo
upstream on loopback (tests/unit/_faultproxy_echo.py), no S3 server."""

from __future__ import annotations

import http.client
import socket
from collections.abc import Iterator

import pytest

from tests.faultproxy import FaultProxy
from tests.unit._faultproxy_echo import connect, echo_server


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    with echo_server() as url:
        yield url


def test_error_fault_response_shape(echo_url: str) -> None:
    with FaultProxy(echo_url, fault_rate=1.0, faults=["slowdown"]) as proxy:
        conn = connect(proxy)
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
        conn = connect(proxy)
        conn.request("GET", "/chunked")
        resp = conn.getresponse()
        with pytest.raises((http.client.IncompleteRead, ConnectionError)):
            resp.read()
        assert proxy.stats["reset_mid_body"] == 2


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
