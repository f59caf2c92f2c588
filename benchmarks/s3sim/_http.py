"""HTTP/1.1 over asyncio's buffered protocol: zero-copy request bodies, paced responses.

Why not aiohttp: its request streams hand bodies over as a queue of ``bytes`` chunks that
must then be copied into place; :class:`asyncio.BufferedProtocol` instead lets the kernel
``recv_into`` the object's own preallocated bytearray. One connection is one
:class:`Connection`; it parses the request head itself (one ``find`` for the blank line, one
``split`` per line), then reads the body straight into place:

* ``Content-Length`` bodies into ``bytearray(Content-Length)``;
* ``Content-Encoding: aws-chunked`` bodies (SigV4 streaming: ``<hex size>[;chunk-signature=
  ...]\\r\\n<data>\\r\\n ... 0\\r\\n<trailers>\\r\\n\\r\\n``, sent by the CRT and by botocore for
  unseekable bodies) into ``bytearray(x-amz-decoded-content-length)``: chunk *data* is
  received in place, only the few bytes of chunk headers go through a small scratch buffer;
* ``Transfer-Encoding: chunked`` (rare from S3 clients) through the scratch buffer.

Responses are written segment by segment (memoryviews of the stored object), at most
:data:`WRITE_CHUNK` at a time and only once the transport's buffer has drained, so a large
GET neither doubles in memory nor waits on a full copy. With a per-connection bandwidth the
same loop sleeps between chunks (:class:`~benchmarks.s3sim._shaping.Pacer`), and reading a
body pauses the transport instead of spinning.
"""

from __future__ import annotations

import asyncio
import itertools
import mmap
import os
import time
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, Protocol
from urllib.parse import parse_qsl, unquote

from ._shaping import Pacer

__all__ = ["App", "Connection", "Request", "Response"]

HEAD_LIMIT = 64 * 1024
SCRATCH = 64 * 1024
WRITE_CHUNK = 1024 * 1024
PACE_CHUNK = 256 * 1024
SMALL_BODY = 64 * 1024

_REASONS = {s.value: s.phrase for s in HTTPStatus}
_rid_prefix = os.urandom(4).hex().upper()
_rid = itertools.count(1)


class BadRequest(Exception):
    """The bytes on the wire are not an HTTP/1.1 request we can read (the connection closes)."""


class Request:
    """One parsed request; the server adds its routing fields (``op``, ``bucket``...)."""

    __slots__ = (
        "body",
        "bucket",
        "close",
        "expect_continue",
        "headers",
        "key",
        "kind",
        "method",
        "op",
        "path",
        "query",
        "raw_len",
        "request_id",
        "t_done",
        "target",
        "trailers",
    )

    def __init__(self, method: str, target: str, headers: dict[str, str], close: bool) -> None:
        self.method = method
        self.target = target
        self.headers = headers
        self.close = close
        raw_path, _, raw_query = target.partition("?")
        self.path = unquote(raw_path)
        self.query: dict[str, str] = (
            dict(parse_qsl(raw_query, keep_blank_values=True)) if raw_query else {}
        )
        self.expect_continue = headers.get("expect", "").lower() == "100-continue"
        self.body: bytearray | bytes | mmap.mmap = b""
        self.raw_len = 0
        self.trailers: dict[str, str] = {}
        self.t_done = 0.0
        self.request_id = f"{_rid_prefix}{next(_rid):08X}"
        self.op = ""
        self.kind = ""
        self.bucket = ""
        self.key = ""


class Response:
    """A response: status, headers, body segments; ``length`` is the Content-Length (a HEAD
    carries the object's length and no body)."""

    __slots__ = ("body", "close", "headers", "length", "no_body", "status")

    def __init__(
        self,
        status: int,
        headers: list[tuple[str, str]] | None = None,
        body: list[Any] | None = None,
        *,
        length: int | None = None,
        no_body: bool = False,
    ) -> None:
        self.status = status
        self.headers = headers if headers is not None else []
        self.body = body if body is not None else []
        self.length = sum(len(b) for b in self.body) if length is None else length
        self.no_body = no_body
        self.close = False


class App(Protocol):
    """What a :class:`Connection` asks of the server."""

    def on_headers(self, req: Request) -> Response | None:
        """Route and admit a request whose head has arrived; a response rejects it early."""

    def handle(self, req: Request) -> Response:
        """Answer a request whose body has arrived."""

    def ttfb(self, req: Request) -> float:
        """Seconds to wait after the request was received before answering it."""

    def conn_rate(self) -> float | None:
        """Bandwidth of one connection, each direction (bytes per second; None: unlimited)."""

    def done(self, req: Request, resp: Response) -> None:
        """Account a response that has been queued for sending."""

    def connection_change(self, delta: int) -> None:
        """A connection opened (+1) or closed (-1)."""


class _Body:
    """A body being received: ``direct()`` is where the kernel may write next (None: feed
    through the scratch buffer), ``feed()`` takes bytes that arrived in scratch."""

    done = False

    def direct(self) -> memoryview | None:
        return None

    def wrote(self, n: int) -> None:
        raise NotImplementedError

    def feed(self, data: memoryview) -> int:
        raise NotImplementedError

    def limit(self) -> int:
        """How many more raw bytes may be read (-1: unknown, i.e. chunked framing)."""
        return -1


#: Bodies this large are received into anonymous ``MAP_POPULATE`` mappings: the kernel
#: zeroes and maps all pages in one call, where ``bytearray(n)`` takes one page fault per
#: page and then zero-fills again (7 ms instead of 13 ms per 16 MiB of new memory here).
MMAP_MIN = 1024 * 1024


def alloc(n: int) -> bytearray | mmap.mmap:
    """A writable buffer of ``n`` bytes for a body (never resized, never mutated once
    stored)."""
    if n < MMAP_MIN or not hasattr(mmap, "MAP_POPULATE"):
        return bytearray(n)
    return mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)


class _FixedBody(_Body):
    def __init__(self, n: int) -> None:
        self.buf = alloc(n)
        self.mv = memoryview(self.buf)
        self.pos = 0
        self.n = n
        self.done = n == 0

    def direct(self) -> memoryview | None:
        return self.mv[self.pos :]

    def wrote(self, n: int) -> None:
        self.pos += n
        self.done = self.pos >= self.n

    def feed(self, data: memoryview) -> int:
        k = min(len(data), self.n - self.pos)
        self.mv[self.pos : self.pos + k] = data[:k]
        self.wrote(k)
        return k

    def limit(self) -> int:
        return self.n - self.pos


class _DiscardBody(_Body):
    """A body nobody wants (a request already answered): read into scratch, dropped."""

    def __init__(self, n: int, scratch: memoryview) -> None:
        self.left = n
        self.scratch = scratch
        self.done = n == 0

    def direct(self) -> memoryview | None:
        return self.scratch[: min(len(self.scratch), self.left)]

    def wrote(self, n: int) -> None:
        self.left -= n
        self.done = self.left <= 0

    def feed(self, data: memoryview) -> int:
        k = min(len(data), self.left)
        self.wrote(k)
        return k

    def limit(self) -> int:
        return self.left


_HEADER, _DATA, _DATA_END, _TRAILER, _END = range(5)


class _ChunkedBody(_Body):
    """``<hex>[;ext]\\r\\n<data>\\r\\n ... 0[;ext]\\r\\n[trailer lines]\\r\\n``: aws-chunked
    inside a Content-Length (``raw`` bytes), or HTTP chunked framing (``raw`` None).

    With ``decoded`` known, data goes into a bytearray of that size (chunk data received in
    place); otherwise into a growing one (copies).
    """

    def __init__(self, raw: int | None, decoded: int | None) -> None:
        self.raw_left = raw
        self.fixed = decoded is not None
        self.buf: bytearray | mmap.mmap = alloc(decoded) if decoded is not None else bytearray()
        self.mv = memoryview(self.buf) if self.fixed else None
        self.pos = 0
        self.state = _HEADER
        self.line = bytearray()
        self.chunk_left = 0
        self.trailers: dict[str, str] = {}

    def direct(self) -> memoryview | None:
        if self.state == _DATA and self.mv is not None and self.chunk_left > 0:
            n = self.chunk_left if self.raw_left is None else min(self.chunk_left, self.raw_left)
            return self.mv[self.pos : self.pos + n]
        return None

    def limit(self) -> int:
        return -1 if self.raw_left is None else self.raw_left

    def wrote(self, n: int) -> None:
        self.pos += n
        self.chunk_left -= n
        if self.chunk_left == 0:
            self.state = _DATA_END
        self._count(n)

    def _count(self, n: int) -> None:
        if self.raw_left is not None:
            self.raw_left -= n
            if self.raw_left <= 0:
                self.done = True

    def _put(self, data: memoryview) -> None:
        if self.mv is not None:
            if self.pos + len(data) > len(self.buf):
                raise BadRequest("aws-chunked body longer than x-amz-decoded-content-length")
            self.mv[self.pos : self.pos + len(data)] = data
        else:
            assert isinstance(self.buf, bytearray)
            self.buf += data
        self.pos += len(data)

    def feed(self, data: memoryview) -> int:
        if self.raw_left is not None and len(data) > self.raw_left:
            data = data[: self.raw_left]
        i, n = 0, len(data)
        while i < n and self.state != _END:
            if self.state == _DATA:
                k = min(self.chunk_left, n - i)
                self._put(data[i : i + k])
                self.chunk_left -= k
                i += k
                if self.chunk_left == 0:
                    self.state = _DATA_END
                continue
            j = bytes(data[i:n]).find(b"\n")  # header/trailer lines are short
            if j < 0:
                self.line += data[i:n]
                i = n
                if len(self.line) > HEAD_LIMIT:
                    raise BadRequest("chunk header line too long")
                break
            self.line += data[i : i + j + 1]
            i += j + 1
            line = bytes(self.line).rstrip(b"\r\n")
            self.line.clear()
            self._line(line)
        self._count(i)
        if self.state == _END:
            self.done = True
        return i

    def _line(self, line: bytes) -> None:
        if self.state == _DATA_END:
            if line:
                raise BadRequest("chunk data longer than its size")
            self.state = _HEADER
        elif self.state == _HEADER:
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise BadRequest(f"bad chunk size line {line[:40]!r}") from None
            if size == 0:
                self.state = _TRAILER
            else:
                self.state = _DATA
                self.chunk_left = size
                if self.mv is not None and self.pos + size > len(self.buf):
                    raise BadRequest("aws-chunked body longer than x-amz-decoded-content-length")
        elif self.state == _TRAILER:
            if not line:
                self.state = _END
            else:
                name, _, value = line.decode("latin-1").partition(":")
                self.trailers[name.strip().lower()] = value.strip()

    def result(self) -> bytearray | mmap.mmap:
        if self.state not in (_TRAILER, _END) or (self.fixed and self.pos != len(self.buf)):
            raise BadRequest("incomplete chunked body")
        return self.buf


class Connection(asyncio.BufferedProtocol):
    """One client connection: read a request, answer it, repeat (no pipelining needed)."""

    def __init__(self, app: App, loop: asyncio.AbstractEventLoop) -> None:
        self.app = app
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.hbuf = bytearray(HEAD_LIMIT)
        self.hview = memoryview(self.hbuf)
        self.hlen = 0
        self.scratch = memoryview(bytearray(SCRATCH))
        self.req: Request | None = None
        self.body: _Body | None = None
        self.inner_chunked = False
        self.busy = False
        self.use_direct = False
        self.paused_read = False
        self.paused_head = False
        self.early: Response | None = None
        self.closed = False
        self.read_pacer: Pacer | None = None
        self.write_pacer: Pacer | None = None
        self.pacer_rate: float | None = None
        self.drained: asyncio.Future[None] | None = None
        self.task: asyncio.Task[None] | None = None

    # -- asyncio protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        # Pause as soon as anything is queued, so responses go out chunk by chunk (no copy
        # of a whole object into the transport's buffer).
        transport.set_write_buffer_limits(high=0)
        self.app.connection_change(1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)
        if self.task is not None and not self.task.done():
            self.task.cancel()
        self.app.connection_change(-1)

    def pause_writing(self) -> None:
        if self.drained is None or self.drained.done():
            self.drained = self.loop.create_future()

    def resume_writing(self) -> None:
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    def get_buffer(self, sizehint: int) -> memoryview:
        body = self.body
        if body is not None and not self.busy:
            d = body.direct()
            if d is not None and len(d):
                self.use_direct = True
                return d
            self.use_direct = False
            lim = body.limit()
            return self.scratch if lim < 0 else self.scratch[: max(1, min(SCRATCH, lim))]
        self.use_direct = False
        return self.hview[self.hlen :]

    def buffer_updated(self, nbytes: int) -> None:
        try:
            if self.body is not None and not self.busy:
                if self.use_direct:
                    self.body.wrote(nbytes)
                else:
                    used = self.body.feed(self.scratch[:nbytes])
                    if used < nbytes:  # chunked framing: the rest is the next request
                        self._stash(self.scratch[used:nbytes])
                delay = self._pace_read(nbytes)
                if self.body.done:
                    if delay > 0:  # the last bytes too arrive no faster than the bandwidth
                        self.busy = True
                        self.loop.call_later(delay, self._body_done)
                    else:
                        self._body_done()
            else:
                old = self.hlen
                self.hlen += nbytes
                if not self.busy:
                    self._parse_head(max(0, old - 3))
                elif self.hlen >= HEAD_LIMIT and self.transport is not None:
                    self.transport.pause_reading()
                    self.paused_head = True
        except (BadRequest, ValueError) as exc:  # ValueError: a number header is not one
            self._fail(400, str(exc))

    def eof_received(self) -> bool | None:
        return None

    # -- reading -------------------------------------------------------------------------------

    def _stash(self, data: memoryview) -> None:
        n = len(data)
        if self.hlen + n > HEAD_LIMIT:
            raise BadRequest("pipelined data too long")
        self.hview[self.hlen : self.hlen + n] = data
        self.hlen += n

    def _pace_read(self, n: int) -> float:
        """Book ``n`` received bytes; pause reading while the connection is over its
        bandwidth. Returns the pause (0: none)."""
        if self.read_pacer is None:
            return 0.0
        delay = self.read_pacer.delay(self.loop.time(), n)
        if delay <= 0.002:
            return 0.0
        if self.transport is not None and not self.paused_read:
            self.transport.pause_reading()
            self.paused_read = True
            self.loop.call_later(delay, self._resume_read)
        return delay

    def _resume_read(self) -> None:
        if self.paused_read and not self.closed and self.transport is not None:
            self.paused_read = False
            self.transport.resume_reading()

    def _parse_head(self, search_from: int) -> None:
        end = self.hbuf.find(b"\r\n\r\n", search_from, self.hlen)
        if end < 0:
            if self.hlen >= HEAD_LIMIT:
                raise BadRequest("request head too large")
            return
        head = bytes(self.hview[:end]).decode("latin-1")
        rest = self.hlen - (end + 4)
        if rest:
            self.hview[:rest] = self.hview[end + 4 : self.hlen]
        self.hlen = rest
        lines = head.split("\r\n")
        while lines and not lines[0]:  # stray CRLF between requests
            lines.pop(0)
        if not lines:
            return
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise BadRequest(f"bad request line {lines[0][:80]!r}")
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise BadRequest(f"bad header line {line[:80]!r}")
            name = name.strip().lower()
            value = value.strip()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        conn = headers.get("connection", "").lower()
        close = "close" in conn or (version == "HTTP/1.0" and "keep-alive" not in conn)
        req = Request(method, target, headers, close)
        self._start(req)

    def _start(self, req: Request) -> None:
        self.req = req
        self._setup_pacers()
        h = req.headers
        te = h.get("transfer-encoding", "").lower()
        chunked = "chunked" in te
        try:
            length = int(h.get("content-length", "0") or "0") if not chunked else -1
        except ValueError:
            raise BadRequest("bad Content-Length") from None
        aws_chunked = "aws-chunked" in h.get("content-encoding", "").lower() or h.get(
            "x-amz-content-sha256", ""
        ).startswith("STREAMING-")
        early = self.app.on_headers(req)
        if early is not None:
            if req.expect_continue and (length > 0 or chunked):
                early.close = True  # the client never sends the body: S3 closes
                self._dispatch(req, early)
                return
            self.body = (
                _DiscardBody(length, self.scratch) if not chunked else _ChunkedBody(None, None)
            )
            self.early = early
        else:
            self.early = None
            decoded = h.get("x-amz-decoded-content-length")
            self.inner_chunked = False
            if chunked:
                self.body = _ChunkedBody(None, None)
                self.inner_chunked = aws_chunked
            elif aws_chunked and length > 0:
                self.body = _ChunkedBody(length, int(decoded) if decoded else None)
            else:
                self.body = _FixedBody(max(0, length))
            req.raw_len = max(0, length)
        if req.expect_continue and self.transport is not None and (length > 0 or chunked):
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if self.hlen and self.body is not None:  # body bytes that came with the head
            used = self.body.feed(self.hview[: self.hlen])
            rest = self.hlen - used
            if rest:
                self.hview[:rest] = self.hview[used : self.hlen]
            self.hlen = rest
        if self.body is not None and self.body.done:
            self._body_done()

    def _setup_pacers(self) -> None:
        rate = self.app.conn_rate()
        if rate != self.pacer_rate:
            self.pacer_rate = rate
            self.read_pacer = None if rate is None else Pacer(rate)
            self.write_pacer = None if rate is None else Pacer(rate)

    def _body_done(self) -> None:
        req, body = self.req, self.body
        if self.closed or req is None or body is None:
            return
        self.body = None
        early = self.early
        if early is not None:
            self.early = None
            self._dispatch(req, early)
            return
        if isinstance(body, _FixedBody):
            req.body = body.buf
        elif isinstance(body, _ChunkedBody):
            data = body.result()
            req.raw_len = req.raw_len or len(data)
            if self.inner_chunked:  # aws-chunked inside HTTP chunked framing
                decoded = req.headers.get("x-amz-decoded-content-length")
                inner = _ChunkedBody(len(data), int(decoded) if decoded else None)
                inner.feed(memoryview(data))
                data = inner.result()
                req.trailers = inner.trailers
            else:
                req.trailers = body.trailers
            req.body = data
        req.t_done = self.loop.time()
        self._dispatch(req, None)

    # -- answering -----------------------------------------------------------------------------

    def _dispatch(self, req: Request, resp: Response | None) -> None:
        self.busy = True
        if resp is None:
            resp = self.app.handle(req)
        if req.close:
            resp.close = True
        ttfb = self.app.ttfb(req)
        self.app.done(req, resp)
        big = not resp.no_body and resp.length > WRITE_CHUNK
        if ttfb <= 0 and self.write_pacer is None and not big:
            head = self._head(req, resp)
            if resp.no_body or not resp.body:
                self._write(head)
            elif resp.length <= SMALL_BODY:  # one send: a syscall costs more than the copy
                self._write(b"".join([head, *resp.body]))
            else:
                self._write(head)
                for seg in resp.body:
                    self._write(seg)
            self._finish(resp)
        else:
            self.task = self.loop.create_task(self._respond(req, resp, ttfb))

    async def _respond(self, req: Request, resp: Response, ttfb: float) -> None:
        if ttfb > 0:
            await asyncio.sleep(
                max(0.0, req.t_done + ttfb - self.loop.time()) if req.t_done else ttfb
            )
        if self.closed:
            return
        self._write(self._head(req, resp))
        if not resp.no_body:
            chunk = PACE_CHUNK if self.write_pacer is not None else WRITE_CHUNK
            for seg in resp.body:
                for off in range(0, len(seg), chunk):
                    piece = seg[off : off + chunk]
                    self._write(piece)
                    if self.drained is not None and not self.drained.done():
                        await self.drained
                    if self.closed:
                        return
                    if self.write_pacer is not None:
                        delay = self.write_pacer.delay(self.loop.time(), len(piece))
                        if delay > 0:
                            await asyncio.sleep(delay)
        self._finish(resp)

    def _write(self, data: Any) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def _head(self, req: Request, resp: Response) -> bytes:
        out = [
            f"HTTP/1.1 {resp.status} {_REASONS.get(resp.status, 'Unknown')}\r\n"
            f"x-amz-request-id: {req.request_id}\r\n"
            f"Date: {_http_date()}\r\nServer: AmazonS3\r\n"
        ]
        for name, value in resp.headers:
            out.append(f"{name}: {value}\r\n")
        if resp.status != 304 and not (100 <= resp.status < 200) and resp.status != 204:
            out.append(f"Content-Length: {resp.length}\r\n")
        if resp.close:
            out.append("Connection: close\r\n")
        out.append("\r\n")
        return "".join(out).encode("latin-1")

    def _finish(self, resp: Response) -> None:
        self.task = None
        self.req = None
        self.busy = False
        if resp.close:
            if self.transport is not None:
                self.transport.close()
            return
        if self.paused_head and self.transport is not None:
            self.paused_head = False
            self.transport.resume_reading()
        if self.hlen:
            try:
                self._parse_head(0)
            except BadRequest as exc:
                self._fail(400, str(exc))

    def _fail(self, status: int, message: str) -> None:
        if self.transport is None or self.closed:
            return
        body = message.encode()
        self.transport.write(
            f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + body
        )
        self.transport.close()


_date_cache: list[Any] = [0, ""]


def _http_date() -> str:
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache[0] = now
        _date_cache[1] = formatdate(now, usegmt=True)
    return str(_date_cache[1])
