"""One client connection through the fault proxy: read a request, decide its fault, relay or
fault it, and again, until the connection ends.

Each client connection has its own thread and its own upstream connection, reused across
keep-alive requests; an upstream connection found readable while idle was closed by the
server and is replaced rather than lose the next request. ``Expect: 100-continue`` is
answered here (``100 Continue`` before the body is read) and the header stripped before
forwarding (botocore never signs it), so the client's body is read in every case and the
connection stays in sync; interim 1xx replies from upstream are swallowed. With a hook,
request bodies are buffered in memory before forwarding, so that ``"before"`` really means
"the whole request has left the client". A connection ends by raising :class:`Closed`
(``abort``: with a RST); garbage from either side or a vanished peer ends it with a RST.
"""

from __future__ import annotations

import contextlib
import io
import socket
import threading
from typing import Protocol

from tests.faultproxy._faults import LOCAL_FAULTS, REPLY_FAULTS, Hook, Injector, Pending
from tests.faultproxy._http1 import (
    CHUNK,
    Head,
    ProtocolError,
    Write,
    chunk_size,
    content_length,
    cut_lines,
    discard,
    is_chunked,
    read_head,
    read_line,
    relay_chunked,
    relay_exact,
    relay_trailers,
    relay_until_eof,
    sender,
)
from tests.faultproxy._s3errors import error_reply, simple_reply
from tests.faultproxy._s3ops import classify
from tests.faultproxy._sockets import peer_closed, readable_now, wait_readable, wait_sent

__all__ = ["IO_TIMEOUT", "Closed", "Connection", "ProxySide"]

IO_TIMEOUT = 120.0
"""Seconds per socket operation; frees the threads of abandoned connections."""

_DRAIN_TIMEOUT = 2.0  # how long reset_mid_body waits for the partial body to leave
DRIP_INTERVAL = 1.0  # seconds between the bytes of a dripped body
_HOLD_POLL = 0.1  # how often a stalled connection checks for stop()
# Headers a "cut_head" reply still carries: none of them says what the request did.
_GENERIC_HEADERS = frozenset(
    {b"date", b"server", b"x-amz-request-id", b"x-amz-id-2", b"x-amzn-requestid", b"content-type"}
)
_CONDITIONAL_HEADERS = frozenset({b"if-none-match", b"if-match"})


class ProxySide(Protocol):
    """What a connection uses of its :class:`FaultProxy` (named here, not imported:
    ``_faultproxy`` imports this module)."""

    _stopping: threading.Event
    _upstream: tuple[str, int]
    _hook: Hook | None
    _injector: Injector

    def _call_hook(self, op: str, key: str, phase: str) -> None: ...

    def _track(self, sock: socket.socket) -> bool: ...

    def _untrack_close(self, sock: socket.socket | None, *, abort: bool = False) -> None: ...


class Closed(Exception):
    """Raised inside a connection handler to end the connection."""

    def __init__(self, *, abort: bool = False) -> None:
        super().__init__()
        self.abort = abort


class Connection:
    """State for one client connection (and its upstream connection)."""

    def __init__(self, proxy: ProxySide, client: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.client.settimeout(IO_TIMEOUT)
        with contextlib.suppress(OSError):
            self.client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.crfile: io.BufferedReader = client.makefile("rb")
        self.cwrite = sender(client)
        self.upstream: socket.socket | None = None
        self.urfile: io.BufferedReader | None = None
        self.pending: Pending | None = None  # fault decided but not yet applied
        self.op = "Other"  # classify() of the current request
        self.key = ""

    # -- lifecycle

    def run(self) -> None:
        """Serve requests until the connection ends; then close both sides."""
        abort = False
        try:
            while not self.proxy._stopping.is_set():
                if not self._one_request():
                    break
        except Closed as exc:
            abort = exc.abort
        except (ProtocolError, OSError, ValueError):
            abort = True  # garbage, peer vanished, or sockets shut down by stop()
        finally:
            self._settle(applied=False)
            self._close_upstream()
            with contextlib.suppress(OSError):
                self.crfile.close()
            self.proxy._untrack_close(self.client, abort=abort)

    def _settle(self, *, applied: bool) -> None:
        """Record the pending fault as injected, or release its reservation."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        if applied:
            self.proxy._injector.commit(pending)
        else:
            self.proxy._injector.cancel(pending)

    @property
    def kind(self) -> str | None:
        """The pending fault's kind, if any."""
        return self.pending.kind if self.pending is not None else None

    def _hold(self) -> None:
        """Send nothing; return once the client closes or the proxy stops."""
        while not self.proxy._stopping.is_set():
            if not wait_readable(self.client, _HOLD_POLL):
                continue
            try:
                data = self.client.recv(CHUNK)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                return
            if not data:
                return  # client gave up (read timeout) or stop() shut the socket

    def _close_upstream(self) -> None:
        if self.urfile is not None:
            with contextlib.suppress(OSError):
                self.urfile.close()
        self.proxy._untrack_close(self.upstream)
        self.upstream = None
        self.urfile = None

    def _ensure_upstream(self) -> tuple[socket.socket, io.BufferedReader]:
        # A reused connection that is readable while idle was closed by the
        # server (or sent garbage): reconnect rather than lose the request.
        if self.upstream is not None and readable_now(self.upstream):
            self._close_upstream()
        if self.upstream is None or self.urfile is None:
            sock = socket.create_connection(self.proxy._upstream, timeout=IO_TIMEOUT)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if not self.proxy._track(sock):
                sock.close()
                raise Closed()
            self.upstream = sock
            self.urfile = sock.makefile("rb")
        return self.upstream, self.urfile

    # -- one request/response exchange; returns False to close the connection

    def _one_request(self) -> bool:
        head = read_head(self.crfile)
        if head is None:
            return False
        parts = head.start.split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            self.cwrite(simple_reply(400, "Bad Request", b"", close=True))
            return False
        method, version = parts[0].upper(), parts[2]
        chunked = is_chunked(head)
        length = 0 if chunked else (content_length(head) or 0)
        req_tokens = head.tokens(b"connection")
        if version == b"HTTP/1.0":
            keep_alive = b"keep-alive" in req_tokens
        else:
            keep_alive = b"close" not in req_tokens

        fields = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in head.headers}
        self.op, self.key = classify(method.decode("latin-1"), parts[1].decode("latin-1"), fields)
        conditional = "if-none-match" in fields or "if-match" in fields
        self.pending = self.proxy._injector.decide(self.op, self.key, conditional)
        kind = self.kind

        # We always honour "Expect: 100-continue" ourselves (and strip the
        # header before forwarding), so that the client's body is read in
        # every case and the connection stays in sync.
        if b"100-continue" in head.tokens(b"expect") and version != b"HTTP/1.0":
            self.cwrite(b"HTTP/1.1 100 Continue\r\n\r\n")

        if kind in LOCAL_FAULTS:
            self._read_body(chunked, length, None)  # discard
            self.proxy._call_hook(self.op, self.key, "before")
            self._settle(applied=True)
            if kind == "reset":
                raise Closed(abort=True)
            if kind == "stall":
                self._hold()
                raise Closed()
            assert kind is not None
            self.cwrite(error_reply(kind, head, close=not keep_alive, head_only=method == b"HEAD"))
            return keep_alive

        if kind == "strip_conditions":
            kept = [(k, v) for k, v in head.headers if k.lower() not in _CONDITIONAL_HEADERS]
            self._settle(applied=len(kept) < len(head.headers))
            head = Head(head.start, kept)

        if self.proxy._hook is not None or kind == "flip_byte":
            # Buffer the body so "before" means the whole request has left the client.
            body = bytearray()
            self._read_body(chunked, length, body.extend)
            self.proxy._call_hook(self.op, self.key, "before")
            if self.proxy._hook is not None and peer_closed(self.client):
                raise Closed()  # the client died before its request was sent on: drop it
            if kind == "flip_byte":
                if chunked or not body:  # chunk framing is left alone: deliver intact
                    self._settle(applied=False)
                else:
                    body[len(body) // 2] ^= 0xFF
                    self._settle(applied=True)
            upstream, urfile = self._ensure_upstream()
            upstream.sendall(head.serialize(drop=frozenset({b"expect"})) + body)
            del body
        else:
            upstream, urfile = self._ensure_upstream()
            upstream.sendall(head.serialize(drop=frozenset({b"expect"})))
            self._read_body(chunked, length, sender(upstream))
        self.proxy._injector.bump("forwarded")
        return self._relay_response(method, urfile, keep_alive)

    def _read_body(self, chunked: bool, length: int, write: Write | None) -> None:
        if chunked:
            relay_chunked(self.crfile, write)
        else:
            relay_exact(self.crfile, length, write)

    def _relay_response(self, method: bytes, urfile: io.BufferedReader, keep_alive: bool) -> bool:
        while True:
            resp = read_head(urfile)
            if resp is None:
                raise ProtocolError("upstream closed without a response")
            rparts = resp.start.split(None, 2)
            if len(rparts) < 2 or not rparts[0].startswith(b"HTTP/"):
                raise ProtocolError(f"bad upstream status line {resp.start!r}")
            try:
                status = int(rparts[1])
            except ValueError:
                raise ProtocolError(f"bad upstream status {resp.start!r}") from None
            if 100 <= status < 200 and status != 101:
                continue  # interim response (Expect was handled by us)
            break

        upstream_close = b"close" in resp.tokens(b"connection") or rparts[0] == b"HTTP/1.0"
        bodiless = method == b"HEAD" or status in (204, 304) or status < 200
        chunked = not bodiless and is_chunked(resp)
        length = None if bodiless or chunked else content_length(resp)
        until_eof = not bodiless and not chunked and length is None

        # Upstream has answered: the request was applied.
        self.proxy._call_hook(self.op, self.key, "after")

        if self.kind in REPLY_FAULTS:
            # Read (and drop) the whole response so the store certainly applied it.
            if chunked:
                relay_chunked(urfile, None)
            elif until_eof:
                relay_until_eof(urfile, discard)
            elif length:
                relay_exact(urfile, length, None)
            if upstream_close or until_eof:
                self._close_upstream()
            kind = self.kind
            self._settle(applied=True)
            if kind == "lost_reply":
                raise Closed(abort=True)  # RST, not one response byte
            if kind == "cut_head":
                generic = [(k, v) for k, v in resp.headers if k.lower() in _GENERIC_HEADERS]
                self.cwrite(b"".join(line + b"\r\n" for line in cut_lines(resp.start, generic)))
                wait_sent(self.client, _DRAIN_TIMEOUT, self.proxy._stopping)
                raise Closed()  # FIN inside the header block
            self._hold()  # stall_after
            raise Closed()

        if self.kind == "reset_mid_body" and not bodiless and length != 0:
            self._cut_body(resp, urfile, chunked, length)  # raises Closed
        if self.kind == "drip" and not bodiless and length:
            self._drip(resp, urfile, length)  # raises Closed
        self._settle(applied=False)  # no fault applicable: deliver normally

        self.cwrite(resp.serialize())
        if chunked:
            relay_chunked(urfile, self.cwrite)
        elif until_eof:
            relay_until_eof(urfile, self.cwrite)
        elif length:
            relay_exact(urfile, length, self.cwrite)

        if upstream_close or until_eof:
            self._close_upstream()
            return False  # keep it simple: one upstream connection per client
        return keep_alive

    def _drip(self, resp: Head, urfile: io.BufferedReader, length: int) -> None:
        """Send the head, then the body a byte every :data:`DRIP_INTERVAL` seconds."""
        body = bytearray()
        relay_exact(urfile, length, body.extend)
        self._settle(applied=True)
        self.cwrite(resp.serialize())
        for i in range(len(body)):
            if self.proxy._stopping.wait(DRIP_INTERVAL) or peer_closed(self.client):
                break
            self.client.sendall(body[i : i + 1])
        raise Closed()

    def _cut_body(
        self,
        resp: Head,
        urfile: io.BufferedReader,
        chunked: bool,
        length: int | None,
    ) -> None:
        """Send the head and a strict prefix of the body, then abort."""
        head = resp.serialize()
        if chunked:
            line = read_line(urfile)
            size = chunk_size(line)
            if size == 0:  # empty chunked body: deliver it intact, then close
                self._settle(applied=False)
                self.cwrite(head + line)
                relay_trailers(urfile, self.cwrite)
                raise Closed()
            self.cwrite(head + line)
            relay_exact(urfile, size // 2, self.cwrite)
        elif length:
            self.cwrite(head)
            relay_exact(urfile, length // 2, self.cwrite)
        else:  # body delimited by connection close
            first = urfile.read1(CHUNK)
            if not first:  # empty: deliver intact
                self._settle(applied=False)
                self.cwrite(head)
                raise Closed()
            self.cwrite(head + first[: len(first) // 2])
        self._settle(applied=True)
        self._close_upstream()  # unread upstream body: connection is unusable
        wait_sent(self.client, _DRAIN_TIMEOUT, self.proxy._stopping)
        raise Closed(abort=True)
