"""HTTP/1.1 framing for the fault proxy: message heads, and bodies relayed byte for byte.

Only what a relay needs is parsed: the start line, the header fields and the framing
(``Content-Length`` / ``Transfer-Encoding: chunked`` / until EOF). Bodies are streamed in
bounded pieces and chunked bodies are copied with their framing, so headers (``Host``
included, which keeps SigV4 signatures valid) and bodies reach the other side verbatim.
A malformed or truncated message raises :class:`ProtocolError`; the caller drops the
connection. Stdlib only.
"""

from __future__ import annotations

import io
import socket
from collections.abc import Callable, Sequence

__all__ = [
    "CHUNK",
    "Head",
    "ProtocolError",
    "Write",
    "chunk_size",
    "content_length",
    "cut_lines",
    "discard",
    "is_chunked",
    "read_head",
    "read_line",
    "relay_chunked",
    "relay_exact",
    "relay_trailers",
    "relay_until_eof",
    "sender",
]

CHUNK = 1024 * 1024
"""The most bytes read or relayed in one piece."""

_MAX_LINE = 64 * 1024
_MAX_HEADERS = 200

Write = Callable[[bytes], None]
"""Where relayed bytes go: a socket's ``sendall``, a buffer's ``extend``, or nowhere."""


class ProtocolError(Exception):
    """Malformed or truncated HTTP message."""


class Head:
    """Parsed start line + header fields of an HTTP message."""

    __slots__ = ("headers", "start")

    def __init__(self, start: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        self.start = start
        self.headers = headers

    def get(self, name: bytes) -> bytes | None:
        """Last value of header ``name`` (case-insensitive), or ``None``."""
        name = name.lower()
        value = None
        for key, val in self.headers:
            if key.lower() == name:
                value = val
        return value

    def tokens(self, name: bytes) -> set[bytes]:
        """Lower-cased comma-separated tokens of all ``name`` headers."""
        name = name.lower()
        out: set[bytes] = set()
        for key, val in self.headers:
            if key.lower() == name:
                out.update(t.strip().lower() for t in val.split(b",") if t.strip())
        return out

    def serialize(self, drop: frozenset[bytes] = frozenset()) -> bytes:
        """The head as sent on the wire (lower-cased names in ``drop`` left out)."""
        lines = [self.start]
        lines.extend(k + b": " + v for k, v in self.headers if k.lower() not in drop)
        return b"\r\n".join(lines) + b"\r\n\r\n"


def read_line(rfile: io.BufferedReader) -> bytes:
    """One line, its line end included (``b""`` at EOF); longer than 64 KiB is an error."""
    line = rfile.readline(_MAX_LINE + 1)
    if len(line) > _MAX_LINE:
        raise ProtocolError("line too long")
    return line


def read_head(rfile: io.BufferedReader) -> Head | None:
    """Read a message head; ``None`` on a clean EOF before the first byte."""
    start = read_line(rfile)
    while start in (b"\r\n", b"\n"):  # tolerate stray CRLF between messages
        start = read_line(rfile)
    if not start:
        return None
    if not start.endswith(b"\n"):
        raise ProtocolError("truncated start line")
    headers: list[tuple[bytes, bytes]] = []
    while True:
        line = read_line(rfile)
        if not line.endswith(b"\n"):
            raise ProtocolError("truncated header block")
        if line in (b"\r\n", b"\n"):
            break
        if len(headers) >= _MAX_HEADERS:
            raise ProtocolError("too many headers")
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise ProtocolError(f"bad header line {line!r}")
        headers.append((name, value.strip()))
    return Head(start.rstrip(b"\r\n"), headers)


def content_length(head: Head) -> int | None:
    """The ``Content-Length`` of ``head``, or ``None`` without one."""
    raw = head.get(b"content-length")
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ProtocolError(f"bad Content-Length {raw!r}") from None
    if value < 0:
        raise ProtocolError(f"bad Content-Length {raw!r}")
    return value


def is_chunked(head: Head) -> bool:
    """Whether the body after ``head`` is chunked."""
    return b"chunked" in head.tokens(b"transfer-encoding")


def relay_exact(rfile: io.BufferedReader, n: int, write: Write | None) -> None:
    """Copy exactly ``n`` bytes from ``rfile`` to ``write`` (or discard)."""
    while n > 0:
        data = rfile.read1(min(n, CHUNK))
        if not data:
            raise ProtocolError("unexpected EOF in body")
        n -= len(data)
        if write is not None:
            write(data)


def relay_until_eof(rfile: io.BufferedReader, write: Write) -> None:
    """Copy everything up to EOF (a body delimited by the connection's close)."""
    while True:
        data = rfile.read1(CHUNK)
        if not data:
            return
        write(data)


def chunk_size(line: bytes) -> int:
    """The size a chunk-size line announces (extensions ignored)."""
    if not line.endswith(b"\n"):
        raise ProtocolError("truncated chunk size line")
    try:
        size = int(line.split(b";", 1)[0].strip(), 16)
    except ValueError:
        raise ProtocolError(f"bad chunk size line {line!r}") from None
    if size < 0:
        raise ProtocolError("negative chunk size")
    return size


def _relay_chunk_data_and_crlf(rfile: io.BufferedReader, size: int, write: Write | None) -> None:
    relay_exact(rfile, size, write)
    crlf = read_line(rfile)
    if crlf not in (b"\r\n", b"\n"):
        raise ProtocolError("missing CRLF after chunk")
    if write is not None:
        write(crlf)


def relay_trailers(rfile: io.BufferedReader, write: Write | None) -> None:
    """Copy a chunked body's trailer fields and the blank line that ends them."""
    while True:
        line = read_line(rfile)
        if not line.endswith(b"\n"):
            raise ProtocolError("truncated trailer")
        if write is not None:
            write(line)
        if line in (b"\r\n", b"\n"):
            return


def relay_chunked(rfile: io.BufferedReader, write: Write | None) -> None:
    """Copy a chunked body verbatim (framing included) until its last chunk."""
    while True:
        line = read_line(rfile)
        size = chunk_size(line)
        if write is not None:
            write(line)
        if size == 0:
            relay_trailers(rfile, write)
            return
        _relay_chunk_data_and_crlf(rfile, size, write)


def discard(data: bytes) -> None:
    """A :data:`Write` that drops what it is given."""


def sender(sock: socket.socket) -> Write:
    """A :data:`Write` that sends everything it is given on ``sock``."""

    def write(data: bytes) -> None:
        sock.sendall(data)

    return write


def cut_lines(start: bytes, headers: Sequence[tuple[bytes, bytes]]) -> list[bytes]:
    """The lines of a reply head cut after ``headers``: no blank line ends it."""
    return [start, *(k + b": " + v for k, v in headers)]
