"""A stdlib HTTP/1.1 echo upstream for the fault proxy's loopback-only tests.

It produces the framing corner cases moto does not produce on demand (chunked request and
response bodies, 204/304, HEAD, close-delimited bodies, ``Expect``) and reports what it
received in ``X-Seen-*`` headers. No S3 server, no boto3: the tests that use it are unit
tests (loopback sockets only).
"""

from __future__ import annotations

import hashlib
import http.client
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests._http import serve
from tests.faultproxy import FaultProxy

__all__ = ["MiB", "EchoHandler", "connect", "echo_server", "get_statuses", "port"]

MiB = 1024 * 1024


class EchoHandler(BaseHTTPRequestHandler):
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


@contextmanager
def echo_server() -> Iterator[str]:
    """The echo upstream on 127.0.0.1; yields its ``http://127.0.0.1:PORT``."""
    # quiet: the proxy cuts upstream connections on purpose (reset_mid_body)
    with serve(EchoHandler, quiet=True) as url:
        yield url


def port(proxy: FaultProxy) -> int:
    """The port ``proxy`` listens on."""
    return int(proxy.endpoint_url.rsplit(":", 1)[1])


def connect(proxy: FaultProxy) -> http.client.HTTPConnection:
    """A plain HTTP connection to ``proxy`` (10 s timeout)."""
    return http.client.HTTPConnection("127.0.0.1", port(proxy), timeout=10)


def get_statuses(proxy: FaultProxy, n: int, path: str = "/") -> list[int]:
    """The status of each of ``n`` GETs of ``path`` sent one after another on one connection."""
    connection = connect(proxy)
    out: list[int] = []
    for _ in range(n):
        connection.request("GET", path)
        resp = connection.getresponse()
        resp.read()
        out.append(resp.status)
    connection.close()
    return out
