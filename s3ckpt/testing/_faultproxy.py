"""Fault-injecting HTTP/1.1 reverse proxy for S3 tests (public as :mod:`s3ckpt.testing`).

The proxy listens on loopback and relays every request to an *upstream*
S3-compatible server (in s3ckpt's own tests and in :func:`s3ckpt.testing.local_s3`
a ``moto`` ``ThreadedMotoServer``). A configurable fraction of requests is answered
with an injected fault instead, so that the retry behaviour of botocore, of s3ckpt's
own retry layer and of a training loop's save and resume can be exercised against
realistic failures:

``"slowdown"``
    ``503 SlowDown`` with an S3 XML error body; the request is not forwarded.
``"internal"``
    ``500 InternalError`` with an S3 XML error body; not forwarded.
``"reset"``
    the request is read completely and the TCP connection is then aborted
    with a RST (``SO_LINGER`` 0) without any response; not forwarded.
``"reset_mid_body"``
    the request *is* forwarded and executed upstream; the response status
    line, headers and only part of the body are sent to the client before
    the connection is aborted with a RST.  Only applies to responses that
    have a body; bodiless responses are delivered normally and the fault is
    not counted.

Kinds outside the default :data:`FAULT_KINDS` (all are in
:data:`ALL_FAULT_KINDS`; ask for them with ``faults=`` or :meth:`FaultProxy.arm`):

``"lost_reply"``
    the request *is* forwarded and applied upstream and the complete
    response is read from upstream, then the client connection is aborted
    with a RST without a single response byte: the client cannot tell
    whether its request took effect.
``"stall"``
    the request is read but not forwarded; nothing is sent back and the
    connection is held open until the client closes it or the proxy stops
    (a black-holed endpoint: the client must hit its read timeout).
``"stall_after"``
    like ``"stall"``, but the request is forwarded and applied upstream
    first (its response is read and dropped).
``"cut_head"``
    the request is forwarded and applied upstream and the complete response
    is read from upstream; the client then gets the status line and only the
    reply's generic headers (``Date``, ``Server``, request ids,
    ``Content-Type``), never the end of the header block, and the connection
    closes (FIN): a reply cut inside its headers, without the ``ETag``,
    ``Content-Length``, checksums or body that carry the result.
``"flip_byte"``
    the request is forwarded with one byte of its body flipped (the middle
    byte, XOR 0xFF) and the reply is relayed unchanged: corruption in
    transit that only a store verifying checksums notices. Only applies to
    requests with a ``Content-Length`` body; others are forwarded intact and
    the fault is not counted.
``"strip_conditions"``
    the request is forwarded without its ``If-None-Match`` / ``If-Match``
    headers and the reply relayed unchanged: the upstream then behaves as a
    store that ignores conditional writes (s3rver, old MinIO). Only counted
    on requests that carry one; an upstream checking SigV4 signatures (not
    moto) refuses the altered request.
``"not_implemented"``
    ``501 NotImplemented`` with an S3 XML error body; not forwarded (arm it
    on ``ListMultipartUploads`` for a store without it, as s3rver).

Deterministic targeting and crash points::

    arm = proxy.arm("CompleteMultipartUpload", "lost_reply")   # next one only
    proxy.arm("PutObject", "lost_reply", conditional=True, times=2, skip=1)
    FaultProxy(url, hook=lambda op, key, phase: ...)  # phase "before" / "after"

:func:`classify` names the S3 operation of a path-style request; arms,
``ops=`` and the hook all use those names (see :data:`OPERATIONS`).

Typical use::

    with FaultProxy(moto_endpoint, fault_rate=0.2, seed=1) as proxy:
        s3 = boto3.client("s3", endpoint_url=proxy.endpoint_url, ...)
        ...                        # exercise the code under test
        proxy.set_fault_rate(0.0)  # e.g. verify the end state fault-free
        assert proxy.stats["faults"] > 0

Note that botocore only retries failures that happen before it returns a
response; a ``reset_mid_body`` fault surfaces while the caller reads the
streaming body (``ResponseStreamingError`` / ``IncompleteReadError``) and
must be retried by the caller.  Also note that botocore's
``retries={"max_attempts": n}`` counts *retries*; use
``{"total_max_attempts": 1}`` for a client that never retries.

Implementation notes:

* Stdlib only.  One daemon thread per client connection, each with its own
  upstream connection that is reused across keep-alive requests.  Requests
  and responses are relayed at the byte level: only the message head and
  the framing (``Content-Length`` / ``Transfer-Encoding: chunked``) are
  parsed, bodies are streamed in bounded chunks and headers (including
  ``Host``, so SigV4 signatures stay valid) are passed through verbatim.
* ``Expect: 100-continue`` is handled by the proxy itself: it answers
  ``100 Continue`` before reading the request body and strips the
  ``Expect`` header before forwarding (botocore never signs ``Expect``).
  Interim 1xx responses from upstream are swallowed.
* Fault decisions are drawn per request from ``random.Random(seed)`` under a
  lock, so a single-threaded client sees a reproducible fault sequence.
  One number is drawn for every request (armed, filtered out by ``ops`` or
  not), so arming a fault does not shift the random sequence of the rest.
* With a hook, request bodies are buffered in memory before forwarding, so
  that "before" really means "the whole request has left the client".
"""

from __future__ import annotations

import contextlib
import fnmatch
import io
import ipaddress
import logging
import random
import select
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from email.utils import formatdate
from types import TracebackType
from urllib.parse import parse_qs, unquote, urlsplit

try:  # Linux: lets us wait until a partial body has left the send queue.
    import fcntl
    import termios

    _TIOCOUTQ: int | None = getattr(termios, "TIOCOUTQ", None)
except ImportError:  # pragma: no cover - non-Unix
    _TIOCOUTQ = None

__all__ = ["ALL_FAULT_KINDS", "FAULT_KINDS", "OPERATIONS", "Arm", "FaultProxy", "Hook", "classify"]

log = logging.getLogger(__name__)

FAULT_KINDS: tuple[str, ...] = ("slowdown", "internal", "reset", "reset_mid_body")
"""The kinds a proxy draws from by default (unchanged, so seeded sequences stay put)."""

ALL_FAULT_KINDS: tuple[str, ...] = (
    *FAULT_KINDS,
    "lost_reply",
    "stall",
    "stall_after",
    "cut_head",
    "flip_byte",
    "strip_conditions",
    "not_implemented",
)
"""Every fault kind the proxy can inject."""

OPERATIONS: tuple[str, ...] = (
    "PutObject",
    "CreateMultipartUpload",
    "UploadPart",
    "CompleteMultipartUpload",
    "AbortMultipartUpload",
    "DeleteObjects",
    "DeleteObject",
    "GetObject",
    "HeadObject",
    "ListObjectsV2",
    "ListMultipartUploads",
    "Other",
)
"""The operation names :func:`classify` returns."""

Hook = Callable[[str, str, str], None]
"""``hook(op, key, phase)``: see :class:`FaultProxy`."""

# Faults answered without forwarding the request upstream.
_LOCAL_FAULTS = frozenset({"slowdown", "internal", "reset", "stall", "not_implemented"})
# Faults applied once the upstream response head is in.
_REPLY_FAULTS = frozenset({"lost_reply", "stall_after", "cut_head"})
# Headers a "cut_head" reply still carries: none of them says what the request did.
_GENERIC_HEADERS = frozenset(
    {b"date", b"server", b"x-amz-request-id", b"x-amz-id-2", b"x-amzn-requestid", b"content-type"}
)
_HOLD_POLL = 0.1  # how often a stalled connection checks for stop()

_CHUNK = 1024 * 1024
_MAX_LINE = 64 * 1024
_MAX_HEADERS = 200
_IO_TIMEOUT = 120.0  # per socket operation; frees threads of abandoned connections
_DRAIN_TIMEOUT = 2.0  # how long reset_mid_body waits for the partial body to leave

_ERRORS: dict[str, tuple[int, str, str, str]] = {
    "slowdown": (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
    "internal": (
        500,
        "Internal Server Error",
        "InternalError",
        "We encountered an internal error. Please try again.",
    ),
    "not_implemented": (
        501,
        "Not Implemented",
        "NotImplemented",
        "A header you provided implies functionality that is not implemented.",
    ),
}
_CONDITIONAL_HEADERS = frozenset({b"if-none-match", b"if-match"})

Write = Callable[[bytes], None]


class _ProtocolError(Exception):
    """Malformed or truncated HTTP message."""


class _Head:
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
        lines = [self.start]
        lines.extend(k + b": " + v for k, v in self.headers if k.lower() not in drop)
        return b"\r\n".join(lines) + b"\r\n\r\n"


def _read_line(rfile: io.BufferedReader) -> bytes:
    line = rfile.readline(_MAX_LINE + 1)
    if len(line) > _MAX_LINE:
        raise _ProtocolError("line too long")
    return line


def _read_head(rfile: io.BufferedReader) -> _Head | None:
    """Read a message head; ``None`` on a clean EOF before the first byte."""
    start = _read_line(rfile)
    while start in (b"\r\n", b"\n"):  # tolerate stray CRLF between messages
        start = _read_line(rfile)
    if not start:
        return None
    if not start.endswith(b"\n"):
        raise _ProtocolError("truncated start line")
    headers: list[tuple[bytes, bytes]] = []
    while True:
        line = _read_line(rfile)
        if not line.endswith(b"\n"):
            raise _ProtocolError("truncated header block")
        if line in (b"\r\n", b"\n"):
            break
        if len(headers) >= _MAX_HEADERS:
            raise _ProtocolError("too many headers")
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise _ProtocolError(f"bad header line {line!r}")
        headers.append((name, value.strip()))
    return _Head(start.rstrip(b"\r\n"), headers)


def _content_length(head: _Head) -> int | None:
    raw = head.get(b"content-length")
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise _ProtocolError(f"bad Content-Length {raw!r}") from None
    if value < 0:
        raise _ProtocolError(f"bad Content-Length {raw!r}")
    return value


def _is_chunked(head: _Head) -> bool:
    return b"chunked" in head.tokens(b"transfer-encoding")


def _relay_exact(rfile: io.BufferedReader, n: int, write: Write | None) -> None:
    """Copy exactly ``n`` bytes from ``rfile`` to ``write`` (or discard)."""
    while n > 0:
        data = rfile.read1(min(n, _CHUNK))
        if not data:
            raise _ProtocolError("unexpected EOF in body")
        n -= len(data)
        if write is not None:
            write(data)


def _relay_until_eof(rfile: io.BufferedReader, write: Write) -> None:
    while True:
        data = rfile.read1(_CHUNK)
        if not data:
            return
        write(data)


def _chunk_size(line: bytes) -> int:
    if not line.endswith(b"\n"):
        raise _ProtocolError("truncated chunk size line")
    try:
        size = int(line.split(b";", 1)[0].strip(), 16)
    except ValueError:
        raise _ProtocolError(f"bad chunk size line {line!r}") from None
    if size < 0:
        raise _ProtocolError("negative chunk size")
    return size


def _relay_chunk_data_and_crlf(rfile: io.BufferedReader, size: int, write: Write | None) -> None:
    _relay_exact(rfile, size, write)
    crlf = _read_line(rfile)
    if crlf not in (b"\r\n", b"\n"):
        raise _ProtocolError("missing CRLF after chunk")
    if write is not None:
        write(crlf)


def _relay_trailers(rfile: io.BufferedReader, write: Write | None) -> None:
    while True:
        line = _read_line(rfile)
        if not line.endswith(b"\n"):
            raise _ProtocolError("truncated trailer")
        if write is not None:
            write(line)
        if line in (b"\r\n", b"\n"):
            return


def _relay_chunked(rfile: io.BufferedReader, write: Write | None) -> None:
    """Copy a chunked body verbatim (framing included) until its last chunk."""
    while True:
        line = _read_line(rfile)
        size = _chunk_size(line)
        if write is not None:
            write(line)
        if size == 0:
            _relay_trailers(rfile, write)
            return
        _relay_chunk_data_and_crlf(rfile, size, write)


def _discard(data: bytes) -> None:
    pass


def _sender(sock: socket.socket) -> Write:
    def write(data: bytes) -> None:
        sock.sendall(data)

    return write


def _readable_now(sock: socket.socket) -> bool:
    """Whether ``sock`` has data or EOF pending (poll: no FD_SETSIZE limit)."""
    try:
        if hasattr(select, "poll"):
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            return bool(poller.poll(0))
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable)
    except (OSError, ValueError):
        return True


def _abort(sock: socket.socket) -> None:
    """Close ``sock`` with a TCP RST instead of an orderly FIN."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


def _wait_sent(sock: socket.socket, timeout: float, stop: threading.Event) -> None:
    """Best effort: wait until the kernel send queue of ``sock`` is empty.

    A RST discards unsent data, so without this a ``reset_mid_body`` fault
    could degrade into a plain reset when the client is slow to read.
    """
    if _TIOCOUTQ is None:
        time.sleep(0.05)
        return
    deadline = time.monotonic() + timeout
    buf = bytearray(4)
    while time.monotonic() < deadline and not stop.is_set():
        try:
            fcntl.ioctl(sock.fileno(), _TIOCOUTQ, buf)
        except OSError:
            return
        if struct.unpack("i", bytes(buf))[0] == 0:
            return
        time.sleep(0.002)


class _Closed(Exception):
    """Raised inside a connection handler to end the connection."""

    def __init__(self, *, abort: bool = False) -> None:
        super().__init__()
        self.abort = abort


def _wait_readable(sock: socket.socket, timeout: float) -> bool:
    """Whether ``sock`` becomes readable (data, EOF or error) within ``timeout`` seconds."""
    try:
        if hasattr(select, "poll"):
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            return bool(poller.poll(int(timeout * 1000)))
        readable, _, _ = select.select([sock], [], [], timeout)
        return bool(readable)
    except (OSError, ValueError):
        return True


def _peer_closed(sock: socket.socket) -> bool:
    """Whether the peer has closed (or reset) the connection; pending data is not EOF."""
    if not _readable_now(sock):
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True


# Query parameters that do not turn an object request into another operation.
_PLAIN_PARAMS = frozenset({"x-id", "versionId", "partNumber"})


def classify(method: str, target: str, headers: Mapping[str, str]) -> tuple[str, str]:
    """The S3 operation and object key of a path-style request ``/{bucket}/{key}?query``.

    Returns ``(operation, key)`` with the key URL-decoded (``""`` for bucket-level
    requests). ``operation`` is one of :data:`OPERATIONS`; anything this proxy has no
    use for telling apart (CreateBucket, HeadBucket, CopyObject, ListParts, tagging ...)
    is ``"Other"``. Virtual-hosted-style requests are not recognised (loopback
    endpoints are IP addresses, which botocore always addresses path-style).
    """
    method = method.upper()
    if target.startswith(("http://", "https://")):  # absolute-form request target
        parts = urlsplit(target)
        path, query = parts.path, parts.query
    else:
        path, _, query = target.partition("?")
    params = parse_qs(query, keep_blank_values=True)
    _bucket, _, raw_key = path.lstrip("/").partition("/")
    key = unquote(raw_key)
    names = {h.lower() for h in headers}
    extra = {p for p in params if p not in _PLAIN_PARAMS and not p.startswith("response-")}

    if not key:
        if method == "GET" and "uploads" in params:
            return "ListMultipartUploads", key
        if method == "GET" and params.get("list-type") == ["2"]:
            return "ListObjectsV2", key
        if method == "POST" and "delete" in params:
            return "DeleteObjects", key
        return "Other", key

    copy = "x-amz-copy-source" in names
    if method == "PUT":
        if "partNumber" in params and "uploadId" in params:
            return ("Other" if copy else "UploadPart"), key
        if copy or extra:
            return "Other", key
        return "PutObject", key
    if method == "POST":
        if "uploads" in params:
            return "CreateMultipartUpload", key
        if "uploadId" in params:
            return "CompleteMultipartUpload", key
        return "Other", key
    if method == "DELETE":
        if "uploadId" in params:
            return "AbortMultipartUpload", key
        return ("Other" if extra else "DeleteObject"), key
    if method == "GET":
        return ("Other" if extra else "GetObject"), key
    if method == "HEAD":
        return ("Other" if extra else "HeadObject"), key
    return "Other", key


class Arm:
    """A deterministic fault: see :meth:`FaultProxy.arm`. Counters are live."""

    def __init__(
        self,
        op: str,
        kind: str,
        *,
        times: int,
        skip: int,
        key_glob: str,
        conditional: bool | None,
    ) -> None:
        self.op = op
        self.kind = kind
        self.times = times
        self.skip = skip
        self.key_glob = key_glob
        self.conditional = conditional
        self._seen = 0
        self._hits = 0
        self._active = True

    @property
    def seen(self) -> int:
        """Matching requests so far (fired or not)."""
        return self._seen

    @property
    def hits(self) -> int:
        """How many times the fault was actually injected."""
        return self._hits

    @property
    def exhausted(self) -> bool:
        """Whether every request in the arm's window has gone past."""
        return self._seen >= self.skip + self.times

    def _matches(self, op: str, key: str, conditional: bool) -> bool:
        return (
            self._active
            and (self.op == "*" or self.op == op)
            and (self.conditional is None or self.conditional == conditional)
            and fnmatch.fnmatchcase(key, self.key_glob)
        )

    def __repr__(self) -> str:
        return (
            f"Arm(op={self.op!r}, kind={self.kind!r}, times={self.times}, skip={self.skip}, "
            f"key_glob={self.key_glob!r}, conditional={self.conditional}, "
            f"seen={self._seen}, hits={self._hits})"
        )


class _Pending:
    """A fault decided for the current request (armed, or drawn at random)."""

    __slots__ = ("arm", "kind")

    def __init__(self, kind: str, arm: Arm | None) -> None:
        self.kind = kind
        self.arm = arm


class _Stats(dict[str, int]):
    """Counter snapshot: a key never counted reads as 0 (e.g. ``op:HeadObject``)."""

    def __missing__(self, key: str) -> int:
        return 0


class FaultProxy:
    """Loopback reverse proxy that injects S3-style faults into requests.

    ``upstream`` is the base URL of the real server (``http://host:port``).
    Each request is, with probability ``fault_rate`` and while fewer than
    ``max_faults`` faults have been injected, answered with a fault kind
    chosen uniformly from ``faults`` (see the module docstring); otherwise it
    is relayed unchanged.  Point the client's ``endpoint_url`` at
    :attr:`endpoint_url`.

    :attr:`stats` counts ``requests`` (all requests seen), ``forwarded``
    (requests sent upstream, including those hit by ``reset_mid_body``,
    ``lost_reply`` and ``stall_after``), ``faults`` (total injected), one
    entry per fault kind, ``op:<Operation>`` per :func:`classify` name and
    ``hook_errors``; a key never counted reads as 0.

    ``ops`` (operation names, see :data:`OPERATIONS`) restricts the *random*
    faults to those operations; :meth:`arm` injects faults deterministically.

    ``hook(op, key, phase)`` is called from the connection's thread with
    phase ``"before"`` once a request has been read completely from the
    client (before any fault is applied, before it is forwarded) and
    ``"after"`` once upstream has answered a forwarded request (it was
    applied) and before the response is relayed. The hook may block (that
    connection waits) or kill the client process. If the client has closed
    the connection by the time a ``"before"`` hook returns, the request is
    dropped rather than forwarded: a client killed at ``"before"`` crashed
    before its request reached the store, one killed at ``"after"`` crashed
    after the store applied it. Exceptions from the hook are logged and
    counted in ``hook_errors``; the request then proceeds normally.

    Use as a context manager or call :meth:`start` / :meth:`stop`.
    """

    def __init__(
        self,
        upstream: str,
        *,
        fault_rate: float = 0.2,
        faults: Sequence[str] = FAULT_KINDS,
        seed: int = 0,
        max_faults: int | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        ops: Collection[str] | None = None,
        hook: Hook | None = None,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be an http:// URL, got {upstream!r}")
        self._upstream = (parts.hostname, parts.port or 80)
        faults = tuple(faults)
        unknown = sorted(set(faults) - set(ALL_FAULT_KINDS))
        if unknown:
            raise ValueError(f"unknown fault kinds {unknown}; known: {ALL_FAULT_KINDS}")
        if ops is not None:
            if isinstance(ops, str):
                raise ValueError("ops must be a collection of operation names, not a string")
            bad_ops = sorted(set(ops) - set(OPERATIONS))
            if bad_ops:
                raise ValueError(f"unknown operations {bad_ops}; known: {OPERATIONS}")
        if fault_rate > 0 and not faults:
            raise ValueError("fault_rate > 0 needs at least one fault kind")
        if max_faults is not None and max_faults < 0:
            raise ValueError("max_faults must be >= 0")
        if host == "localhost":
            host = "127.0.0.1"
        if not ipaddress.ip_address(host).is_loopback:
            raise ValueError(f"FaultProxy only listens on loopback, not {host!r}")
        self._check_rate(fault_rate)
        self._host = host
        self._port = port
        self._faults = faults
        self._fault_rate = float(fault_rate)
        self._max_faults = max_faults
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._reserved = 0  # random faults decided (possibly not yet applied)
        self._ops = frozenset(ops) if ops is not None else None
        self._hook = hook
        self._arms: list[Arm] = []
        self._stats: dict[str, int] = dict.fromkeys(
            ("requests", "forwarded", "faults", *FAULT_KINDS), 0
        )
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()

    # ------------------------------------------------------------------ API

    @staticmethod
    def _check_rate(rate: float) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"fault_rate must be within [0, 1], got {rate!r}")

    def start(self) -> None:
        """Bind the listening socket and start accepting connections."""
        if self._listener is not None:
            raise RuntimeError("FaultProxy already started")
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self._host, self._port))
            listener.listen(128)
            listener.settimeout(0.1)  # lets the accept loop notice stop()
        except BaseException:
            listener.close()
            raise
        self._port = listener.getsockname()[1]
        self._stopping.clear()
        self._listener = listener
        self._accept_thread = threading.Thread(
            target=self._accept_loop,
            name=f"faultproxy-accept-{self._port}",
            daemon=True,
        )
        self._accept_thread.start()

    def stop(self) -> None:
        """Stop listening and tear down every open connection (promptly).

        Sockets are shut down first (which wakes every blocked thread and
        ends the TCP connections at once); threads then get at most half a
        second, in total, to finish before the remaining sockets are closed.
        """
        self._stopping.set()
        listener, self._listener = self._listener, None
        accept_thread, self._accept_thread = self._accept_thread, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
        with self._lock:
            sockets = list(self._sockets)
            threads = list(self._threads)
        for sock in sockets:  # wakes handler threads blocked in recv/send
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + 0.5
        for thread in [accept_thread, *threads]:
            if thread is not None:
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.close()
        with self._lock:
            leftovers = list(self._sockets)
            self._sockets.clear()
        for sock in leftovers:
            with contextlib.suppress(OSError):
                sock.close()

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:PORT`` -- the URL clients should talk to."""
        if self._listener is None and self._port == 0:
            raise RuntimeError("FaultProxy not started")
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._port}"

    @property
    def stats(self) -> dict[str, int]:
        """Snapshot of the counters (see class docstring); missing keys read as 0."""
        with self._lock:
            return _Stats(self._stats)

    def arm(
        self,
        op: str,
        kind: str,
        *,
        times: int = 1,
        skip: int = 0,
        key_glob: str = "*",
        conditional: bool | None = None,
    ) -> Arm:
        """Inject ``kind`` into matching requests number ``skip+1`` .. ``skip+times``.

        A request matches when its :func:`classify` operation is ``op`` (``"*"``: any),
        its key matches ``key_glob`` (:func:`fnmatch.fnmatchcase`) and, unless
        ``conditional`` is None, it does (True) or does not (False) carry an
        ``If-None-Match`` / ``If-Match`` header. Armed faults take precedence over the
        random draw and do not count against ``max_faults``. Every arm counts every
        request it matches; when several arms would fire on one request, the one armed
        first wins. A ``reset_mid_body`` that meets a bodiless response is not injected
        and still uses up its slot (``hits`` tells what fired).
        """
        if op != "*" and op not in OPERATIONS:
            raise ValueError(f"unknown operation {op!r}; known: {OPERATIONS} or '*'")
        if kind not in ALL_FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; known: {ALL_FAULT_KINDS}")
        if times < 1 or skip < 0:
            raise ValueError("arm needs times >= 1 and skip >= 0")
        armed = Arm(op, kind, times=times, skip=skip, key_glob=key_glob, conditional=conditional)
        with self._lock:
            self._arms.append(armed)
        return armed

    def disarm(self, armed: Arm | None = None) -> None:
        """Remove one arm (or, with no argument, every arm)."""
        with self._lock:
            for a in self._arms if armed is None else [armed]:
                a._active = False
            self._arms = [] if armed is None else [a for a in self._arms if a is not armed]

    @property
    def fault_rate(self) -> float:
        """The probability of a random fault per request (see :meth:`set_fault_rate`)."""
        with self._lock:
            return self._fault_rate

    def set_fault_rate(self, rate: float) -> None:
        """Change the fault probability for subsequent requests (thread-safe)."""
        self._check_rate(rate)
        if rate > 0 and not self._faults:
            raise ValueError("fault_rate > 0 needs at least one fault kind")
        with self._lock:
            self._fault_rate = float(rate)

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ----------------------------------------------------------- internals

    def _bump(self, key: str) -> None:
        with self._lock:
            self._stats[key] = self._stats.get(key, 0) + 1

    def _decide(self, op: str, key: str, conditional: bool) -> _Pending | None:
        """Count a request and decide whether (and which) fault to inject."""
        with self._lock:
            self._stats["requests"] += 1
            op_key = f"op:{op}"
            self._stats[op_key] = self._stats.get(op_key, 0) + 1
            # Drawn for every request, so arms and ops= do not shift the sequence.
            roll = self._rng.random()
            kind = self._rng.choice(self._faults) if self._faults else None
            chosen: Arm | None = None
            for armed in self._arms:
                if armed._matches(op, key, conditional):
                    armed._seen += 1
                    if chosen is None and armed.skip < armed._seen <= armed.skip + armed.times:
                        chosen = armed
            if chosen is not None:
                return _Pending(chosen.kind, chosen)
            if roll >= self._fault_rate or kind is None:
                return None
            if self._ops is not None and op not in self._ops:
                return None
            if self._max_faults is not None and self._reserved >= self._max_faults:
                return None
            self._reserved += 1
            return _Pending(kind, None)

    def _commit(self, pending: _Pending) -> None:
        with self._lock:
            self._stats[pending.kind] = self._stats.get(pending.kind, 0) + 1
            self._stats["faults"] += 1
            if pending.arm is not None:
                pending.arm._hits += 1

    def _cancel(self, pending: _Pending) -> None:
        if pending.arm is not None:
            return  # an armed slot is used up either way (see arm())
        with self._lock:
            self._reserved -= 1

    def _call_hook(self, op: str, key: str, phase: str) -> None:
        hook = self._hook
        if hook is None:
            return
        try:
            hook(op, key, phase)
        except Exception:  # a broken hook must not take the proxy down
            log.exception("FaultProxy hook failed for %s %r (%s)", op, key, phase)
            self._bump("hook_errors")

    def _track(self, sock: socket.socket) -> bool:
        with self._lock:
            if self._stopping.is_set():
                return False
            self._sockets.add(sock)
            return True

    def _untrack_close(self, sock: socket.socket | None, *, abort: bool = False) -> None:
        if sock is None:
            return
        with self._lock:
            self._sockets.discard(sock)
        if abort:
            _abort(sock)
        else:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept_loop(self) -> None:
        listener = self._listener
        assert listener is not None
        while not self._stopping.is_set():
            try:
                conn, _addr = listener.accept()  # listener has a 0.1 s timeout
            except TimeoutError:
                continue
            except OSError:
                if self._stopping.is_set():
                    return
                time.sleep(0.01)  # e.g. EMFILE: back off instead of spinning
                continue
            if not self._track(conn):
                conn.close()
                return
            thread = threading.Thread(
                target=self._serve_connection,
                args=(conn,),
                name=f"faultproxy-conn-{self._port}",
                daemon=True,
            )
            with self._lock:
                self._threads.add(thread)
            thread.start()

    def _serve_connection(self, client: socket.socket) -> None:
        try:
            _Connection(self, client).run()
        except OSError:  # socket already shut down by stop()
            self._untrack_close(client)
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())


class _Connection:
    """State for one client connection (and its upstream connection)."""

    def __init__(self, proxy: FaultProxy, client: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.client.settimeout(_IO_TIMEOUT)
        with contextlib.suppress(OSError):
            self.client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.crfile: io.BufferedReader = client.makefile("rb")
        self.cwrite = _sender(client)
        self.upstream: socket.socket | None = None
        self.urfile: io.BufferedReader | None = None
        self.pending: _Pending | None = None  # fault decided but not yet applied
        self.op = "Other"  # classify() of the current request
        self.key = ""

    # -- lifecycle

    def run(self) -> None:
        abort = False
        try:
            while not self.proxy._stopping.is_set():
                if not self._one_request():
                    break
        except _Closed as exc:
            abort = exc.abort
        except (_ProtocolError, OSError, ValueError):
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
            self.proxy._commit(pending)
        else:
            self.proxy._cancel(pending)

    @property
    def kind(self) -> str | None:
        """The pending fault's kind, if any."""
        return self.pending.kind if self.pending is not None else None

    def _hold(self) -> None:
        """Send nothing; return once the client closes or the proxy stops."""
        while not self.proxy._stopping.is_set():
            if not _wait_readable(self.client, _HOLD_POLL):
                continue
            try:
                data = self.client.recv(_CHUNK)
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
        if self.upstream is not None and _readable_now(self.upstream):
            self._close_upstream()
        if self.upstream is None or self.urfile is None:
            sock = socket.create_connection(self.proxy._upstream, timeout=_IO_TIMEOUT)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if not self.proxy._track(sock):
                sock.close()
                raise _Closed()
            self.upstream = sock
            self.urfile = sock.makefile("rb")
        return self.upstream, self.urfile

    # -- one request/response exchange; returns False to close the connection

    def _one_request(self) -> bool:
        head = _read_head(self.crfile)
        if head is None:
            return False
        parts = head.start.split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            self._send_simple(400, "Bad Request", b"", close=True)
            return False
        method, version = parts[0].upper(), parts[2]
        chunked = _is_chunked(head)
        length = 0 if chunked else (_content_length(head) or 0)
        req_tokens = head.tokens(b"connection")
        if version == b"HTTP/1.0":
            keep_alive = b"keep-alive" in req_tokens
        else:
            keep_alive = b"close" not in req_tokens

        fields = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in head.headers}
        self.op, self.key = classify(method.decode("latin-1"), parts[1].decode("latin-1"), fields)
        conditional = "if-none-match" in fields or "if-match" in fields
        self.pending = self.proxy._decide(self.op, self.key, conditional)
        kind = self.kind

        # We always honour "Expect: 100-continue" ourselves (and strip the
        # header before forwarding), so that the client's body is read in
        # every case and the connection stays in sync.
        if b"100-continue" in head.tokens(b"expect") and version != b"HTTP/1.0":
            self.cwrite(b"HTTP/1.1 100 Continue\r\n\r\n")

        if kind in _LOCAL_FAULTS:
            self._read_body(chunked, length, None)  # discard
            self.proxy._call_hook(self.op, self.key, "before")
            self._settle(applied=True)
            if kind == "reset":
                raise _Closed(abort=True)
            if kind == "stall":
                self._hold()
                raise _Closed()
            assert kind is not None
            status, reason, code, message = _ERRORS[kind]
            self._send_simple(
                status,
                reason,
                _error_xml(code, message, head),
                close=not keep_alive,
                head_only=method == b"HEAD",
                extra=[(b"Content-Type", b"application/xml")],
            )
            return keep_alive

        if kind == "strip_conditions":
            kept = [(k, v) for k, v in head.headers if k.lower() not in _CONDITIONAL_HEADERS]
            self._settle(applied=len(kept) < len(head.headers))
            head = _Head(head.start, kept)

        if self.proxy._hook is not None or kind == "flip_byte":
            # Buffer the body so "before" means the whole request has left the client.
            body = bytearray()
            self._read_body(chunked, length, body.extend)
            self.proxy._call_hook(self.op, self.key, "before")
            if self.proxy._hook is not None and _peer_closed(self.client):
                raise _Closed()  # the client died before its request was sent on: drop it
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
            self._read_body(chunked, length, _sender(upstream))
        self.proxy._bump("forwarded")
        return self._relay_response(method, urfile, keep_alive)

    def _read_body(self, chunked: bool, length: int, write: Write | None) -> None:
        if chunked:
            _relay_chunked(self.crfile, write)
        else:
            _relay_exact(self.crfile, length, write)

    def _relay_response(self, method: bytes, urfile: io.BufferedReader, keep_alive: bool) -> bool:
        while True:
            resp = _read_head(urfile)
            if resp is None:
                raise _ProtocolError("upstream closed without a response")
            rparts = resp.start.split(None, 2)
            if len(rparts) < 2 or not rparts[0].startswith(b"HTTP/"):
                raise _ProtocolError(f"bad upstream status line {resp.start!r}")
            try:
                status = int(rparts[1])
            except ValueError:
                raise _ProtocolError(f"bad upstream status {resp.start!r}") from None
            if 100 <= status < 200 and status != 101:
                continue  # interim response (Expect was handled by us)
            break

        upstream_close = b"close" in resp.tokens(b"connection") or rparts[0] == b"HTTP/1.0"
        bodiless = method == b"HEAD" or status in (204, 304) or status < 200
        chunked = not bodiless and _is_chunked(resp)
        length = None if bodiless or chunked else _content_length(resp)
        until_eof = not bodiless and not chunked and length is None

        # Upstream has answered: the request was applied.
        self.proxy._call_hook(self.op, self.key, "after")

        if self.kind in _REPLY_FAULTS:
            # Read (and drop) the whole response so the store certainly applied it.
            if chunked:
                _relay_chunked(urfile, None)
            elif until_eof:
                _relay_until_eof(urfile, _discard)
            elif length:
                _relay_exact(urfile, length, None)
            if upstream_close or until_eof:
                self._close_upstream()
            kind = self.kind
            self._settle(applied=True)
            if kind == "lost_reply":
                raise _Closed(abort=True)  # RST, not one response byte
            if kind == "cut_head":
                generic = [(k, v) for k, v in resp.headers if k.lower() in _GENERIC_HEADERS]
                self.cwrite(b"".join(line + b"\r\n" for line in _cut_lines(resp.start, generic)))
                _wait_sent(self.client, _DRAIN_TIMEOUT, self.proxy._stopping)
                raise _Closed()  # FIN inside the header block
            self._hold()  # stall_after
            raise _Closed()

        if self.kind == "reset_mid_body" and not bodiless and length != 0:
            self._cut_body(resp, urfile, chunked, length)  # raises _Closed
        self._settle(applied=False)  # no fault applicable: deliver normally

        self.cwrite(resp.serialize())
        if chunked:
            _relay_chunked(urfile, self.cwrite)
        elif until_eof:
            _relay_until_eof(urfile, self.cwrite)
        elif length:
            _relay_exact(urfile, length, self.cwrite)

        if upstream_close or until_eof:
            self._close_upstream()
            return False  # keep it simple: one upstream connection per client
        return keep_alive

    def _cut_body(
        self,
        resp: _Head,
        urfile: io.BufferedReader,
        chunked: bool,
        length: int | None,
    ) -> None:
        """Send the head and a strict prefix of the body, then abort."""
        head = resp.serialize()
        if chunked:
            line = _read_line(urfile)
            size = _chunk_size(line)
            if size == 0:  # empty chunked body: deliver it intact, then close
                self._settle(applied=False)
                self.cwrite(head + line)
                _relay_trailers(urfile, self.cwrite)
                raise _Closed()
            self.cwrite(head + line)
            _relay_exact(urfile, size // 2, self.cwrite)
        elif length:
            self.cwrite(head)
            _relay_exact(urfile, length // 2, self.cwrite)
        else:  # body delimited by connection close
            first = urfile.read1(_CHUNK)
            if not first:  # empty: deliver intact
                self._settle(applied=False)
                self.cwrite(head)
                raise _Closed()
            self.cwrite(head + first[: len(first) // 2])
        self._settle(applied=True)
        self._close_upstream()  # unread upstream body: connection is unusable
        _wait_sent(self.client, _DRAIN_TIMEOUT, self.proxy._stopping)
        raise _Closed(abort=True)

    def _send_simple(
        self,
        status: int,
        reason: str,
        body: bytes,
        *,
        close: bool,
        head_only: bool = False,
        extra: Sequence[tuple[bytes, bytes]] = (),
    ) -> None:
        request_id = uuid.uuid4().hex[:16].upper().encode()
        headers: list[tuple[bytes, bytes]] = [
            (b"Date", formatdate(usegmt=True).encode()),
            (b"Server", b"FaultProxy"),
            (b"x-amz-request-id", request_id),
            (b"x-amz-id-2", request_id),
            *extra,
            (b"Content-Length", str(len(body)).encode()),
        ]
        if close:
            headers.append((b"Connection", b"close"))
        head = _Head(f"HTTP/1.1 {status} {reason}".encode(), headers)
        self.cwrite(head.serialize() + (b"" if head_only else body))


def _cut_lines(start: bytes, headers: Sequence[tuple[bytes, bytes]]) -> list[bytes]:
    """The lines of a reply head cut after ``headers``: no blank line ends it."""
    return [start, *(k + b": " + v for k, v in headers)]


def _error_xml(code: str, message: str, head: _Head) -> bytes:
    parts = head.start.split()
    resource = parts[1].decode("latin-1") if len(parts) > 1 else "/"
    resource = resource.split("?", 1)[0]
    request_id = uuid.uuid4().hex[:16].upper()
    xml = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<Resource>{_xml_escape(resource)}</Resource>"
        f"<RequestId>{request_id}</RequestId></Error>"
    )
    return xml.encode()


def _xml_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
