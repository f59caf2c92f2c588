"""A loopback S3 endpoint with other stores' quirks: a stdlib HTTP server on 127.0.0.1 that
relays every request to an upstream S3 server (the test moto server) except where a quirk
answers instead, as a real store was seen to answer (issue 38):

``abort_405``
    AbortMultipartUpload (``DELETE ?uploadId=``) answers ``405 MethodNotAllowed``, as s3rver
    3.7.1 does; nothing is relayed, so the upload stays open.
``conditional_delete_501``
    DeleteObject with ``If-Match`` answers ``501 NotImplemented``, as LocalStack does;
    nothing is relayed, so the object stays.
``object_key_count``
    ListObjectsV2 with a ``delimiter``: the upstream's reply with its ``KeyCount`` set to
    the number of objects alone (common prefixes not counted), as s3rver does.

Each quirk counts how often it answered (:attr:`QuirkyS3.hits`), so a test can tell the
quirk was met. The relay reads each request and reply whole (tests move small objects) and
keeps each client connection alive (HTTP/1.1). Imports neither torch nor boto3.
"""

from __future__ import annotations

import http.client
import re
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

from tests._http import serve

__all__ = ["QUIRKS", "QuirkyS3", "quirky_s3"]

QUIRKS = ("abort_405", "conditional_delete_501", "object_key_count")

_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"}
_HOP |= {"expect"}  # the relay answers 100-continue itself
_KEY_COUNT = re.compile(rb"<KeyCount>\d+</KeyCount>")
_NOT_ALLOWED = "The specified method is not allowed against this resource."
_NOT_IMPLEMENTED = "A header you provided implies functionality that is not implemented"

_ERROR = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
    "<Message>{message}</Message><Resource>{path}</Resource></Error>"
)


class QuirkyS3:
    """The quirks switched on, the upstream, and what each quirk answered (:attr:`hits`)."""

    def __init__(self, upstream: str, quirks: tuple[str, ...] = QUIRKS) -> None:
        unknown = set(quirks) - set(QUIRKS)
        if unknown:
            raise ValueError(f"unknown quirks {sorted(unknown)}: choose from {QUIRKS}")
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.quirks = frozenset(quirks)
        self.hits: Counter[str] = Counter()
        self.endpoint_url = ""
        self._lock = threading.Lock()

    def hit(self, quirk: str) -> None:
        with self._lock:
            self.hits[quirk] += 1

    def handler(self) -> type[BaseHTTPRequestHandler]:
        """A request handler class bound to this endpoint."""
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_any(self) -> None:
                body = self._body()
                query = parse_qs(urlsplit(self.path).query, keep_blank_values=True)
                quirks = endpoint.quirks
                if self.command == "DELETE" and "uploadId" in query and "abort_405" in quirks:
                    endpoint.hit("abort_405")
                    return self._error(405, "MethodNotAllowed", _NOT_ALLOWED)
                if (
                    self.command == "DELETE"
                    and "uploadId" not in query
                    and self.headers.get("If-Match")
                    and "conditional_delete_501" in quirks
                ):
                    endpoint.hit("conditional_delete_501")
                    return self._error(501, "NotImplemented", _NOT_IMPLEMENTED)
                status, reason, headers, reply = self._relay(body)
                if (
                    self.command == "GET"
                    and query.get("list-type") == ["2"]
                    and query.get("delimiter", [""]) != [""]
                    and "object_key_count" in quirks
                    and b"<KeyCount>" in reply
                ):
                    objects = reply.count(b"<Contents>")
                    reply = _KEY_COUNT.sub(b"<KeyCount>%d</KeyCount>" % objects, reply)
                    endpoint.hit("object_key_count")
                self._answer(status, reason, headers, reply)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_any

            def _body(self) -> bytes:
                if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                    chunks = []
                    while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _relay(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
                conn = http.client.HTTPConnection(*endpoint.upstream, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                    if body or self.command in ("PUT", "POST"):
                        headers["Content-Length"] = str(len(body))
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    resp = conn.getresponse()
                    return resp.status, resp.reason, resp.getheaders(), resp.read()
                finally:
                    conn.close()

            def _error(self, status: int, code: str, message: str) -> None:
                xml = _ERROR.format(code=code, message=message, path=urlsplit(self.path).path)
                headers = [("Content-Type", "application/xml"), ("Date", self.date_time_string())]
                self._answer(status, code, headers, xml.encode())

            def _answer(
                self, status: int, reason: str, headers: list[tuple[str, str]], body: bytes
            ) -> None:
                self.send_response_only(status, reason)
                for name, value in headers:
                    if name.lower() not in _HOP and name.lower() != "content-length":
                        self.send_header(name, value)
                if self.command == "HEAD":  # the upstream's length of the object, no body
                    length = dict((k.lower(), v) for k, v in headers).get("content-length")
                    self.send_header("Content-Length", length or "0")
                    self.end_headers()
                    return
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler


@contextmanager
def quirky_s3(upstream: str, quirks: tuple[str, ...] = QUIRKS) -> Iterator[QuirkyS3]:
    """Serve a :class:`QuirkyS3` relaying to ``upstream`` on 127.0.0.1 for the block; its
    ``endpoint_url`` is where to point s3ckpt (``--endpoint-url`` / ``AWS_ENDPOINT_URL``)."""
    endpoint = QuirkyS3(upstream, quirks)
    with serve(endpoint.handler(), quiet=True) as url:
        endpoint.endpoint_url = url
        yield endpoint
