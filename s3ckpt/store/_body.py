"""Request and response bodies of the S3 store.

* :class:`S3RangeReader` streams one ranged GET into the caller's buffers, resumed at the
  offset reached when the body breaks off.
* :class:`BufferBody` hands a part to botocore as a stream over the caller's buffer.
* :func:`socket_body` finds the standard library's ``http.client`` response under a ranged
  GET's ``StreamingBody``, so that :class:`SocketBody` reads the body with ``readinto``
  straight from the socket into the caller's buffer (the destination tensor).
  ``StreamingBody.read`` allocates a fresh ``bytes`` per call in http.client, copies it
  once more there and again into the caller's buffer: three passes and two fresh
  allocations per chunk instead of one pass.

The shortcut needs four private names: botocore's ``StreamingBody._raw_stream`` and
``_amount_read``, urllib3's ``HTTPResponse._fp`` and (urllib3 2) ``_decoded_buffer``. They
are probed once, by reading a canned response through the same layers botocore builds
(:func:`shortcut_available`); where they differ every body is read through the public
``StreamingBody.read``. Each response is checked again before the shortcut is taken: any
other shape (a content encoding, bytes already buffered above the socket, a body wrapped
by botocore's checksum validation, another urllib3) is read through ``StreamingBody``.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import io
import logging
import socket
import time
from typing import Any

import botocore.exceptions as bce
import urllib3
from botocore.response import StreamingBody
from tenacity import RetryCallState, retry_if_exception

from s3ckpt.errors import StoreError
from s3ckpt.metrics.instrument import record_retry
from s3ckpt.store._errors import is_transient, map_error
from s3ckpt.store._request import AttemptTimedOut, Watch, start_watch
from s3ckpt.store.base import Buffer, S3Requests

__all__ = [
    "SOCKET_ATTR", "BufferBody", "S3RangeReader", "SocketBody", "body_socket",
    "shortcut_available", "shutdown_socket", "socket_body",
]


log = logging.getLogger(__name__)

# The private names the shortcut reads (tests rename them to force each fallback).
_RAW_STREAM = "_raw_stream"  # StreamingBody -> urllib3 HTTPResponse (botocore)
_AMOUNT_READ = "_amount_read"  # StreamingBody: bytes handed out so far (botocore)
_FP = "_fp"  # urllib3 HTTPResponse -> http.client.HTTPResponse (urllib3)
_DECODED_BUFFER = "_decoded_buffer"  # urllib3 2: bytes held above the socket (urllib3)
_RELEASE_CONN = "release_conn"  # urllib3 HTTPResponse: the connection back to the pool
SOCKET_ATTR = "s3ckpt_socket"  # set by store/_client.py on each urllib3 response: its socket


class BufferBody(io.RawIOBase):
    """A read-only, seekable stream over a buffer: how a request body is handed to botocore.

    Passing a ``bytearray`` (or a ``bytes`` copy of a view) costs a full copy of every
    part: botocore's CRT signer, used whenever ``awscrt`` is installed, wraps any body
    without ``seek`` in ``io.BytesIO``, which copies a bytearray; with eight parts in
    flight that is 8 x part_size of extra memory plus the page faults of touching it. A
    stream is signed (SHA-256 read through :meth:`readinto` / :meth:`read` and rewound)
    and sent in urllib3's blocks without ever holding a second copy.

    A fresh one is made for every attempt, so a retry always starts at byte 0.
    """

    def __init__(self, data: Buffer) -> None:
        super().__init__()
        self._view = memoryview(data).cast("B").toreadonly()
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def __len__(self) -> int:
        return self._view.nbytes

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._view.nbytes}
        if whence not in base:
            raise ValueError(f"invalid whence {whence!r}")
        pos = base[whence] + offset
        if pos < 0:
            raise ValueError(f"negative seek position {pos}")
        self._pos = pos
        return pos

    def readinto(self, b: Any) -> int:
        dest = memoryview(b).cast("B")
        n = max(0, min(dest.nbytes, self._view.nbytes - self._pos))
        dest[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def read(self, size: int | None = -1) -> memoryview:
        """Up to ``size`` bytes as a read-only view into the buffer, not a copy.

        urllib3 sends a file-like body in ``blocksize`` ``read()`` blocks (botocore sets
        128 KiB; urllib3's own default is 16 KiB); returning ``bytes`` would copy every
        byte uploaded once more only for ``sendall`` to copy it into the socket. Every consumer
        on the path (``sendall``, hashlib, ``chunk == b""`` loop ends) takes a view.
        """
        end = self._view.nbytes if size is None or size < 0 else self._pos + size
        chunk = self._view[self._pos : end]
        self._pos += chunk.nbytes
        return chunk


class SocketBody:
    """A response body of known ``length`` read with ``http.client``'s ``readinto``.

    Failures surface as botocore's own streaming errors, as ``StreamingBody`` would raise
    them: a reset as ``ResponseStreamingError``, a body that ends early (a connection
    closed before ``length`` bytes) as ``IncompleteReadError``. Once the whole body is
    read the connection goes back to urllib3's pool.
    """

    def __init__(self, raw: Any, fp: http.client.HTTPResponse, length: int) -> None:
        self._raw = raw
        self._fp = fp
        self.length = length
        self.consumed = 0

    def readinto(self, buffer: memoryview) -> int:
        """Read up to ``len(buffer)`` bytes (at least one) into ``buffer``."""
        try:
            n = self._fp.readinto(buffer)
        except (OSError, http.client.HTTPException) as exc:
            # What urllib3 and botocore would make of it: a failure while streaming.
            raise bce.ResponseStreamingError(error=exc) from exc
        if n <= 0:
            raise bce.IncompleteReadError(actual_bytes=self.consumed, expected_bytes=self.length)
        self.consumed += n
        if self._fp.isclosed():  # the whole body is read: the socket can be reused
            getattr(self._raw, _RELEASE_CONN)()
        return n


def _plain_layers(body: Any, length: int) -> SocketBody | None:
    """A :class:`SocketBody` over the urllib3 and http.client responses under a plain,
    untouched ``StreamingBody`` of ``length`` bytes; ``None`` when reading the socket
    directly would skip a layer that matters."""
    if type(body) is not StreamingBody:
        return None  # e.g. botocore's checksum-validating body
    raw = getattr(body, _RAW_STREAM, None)
    fp = getattr(raw, _FP, None)
    if not isinstance(fp, http.client.HTTPResponse) or not callable(
        getattr(raw, _RELEASE_CONN, None)
    ):
        return None
    headers = getattr(raw, "headers", None)
    encoding = headers.get("content-encoding", "") if headers is not None else None
    buffered = getattr(raw, _DECODED_BUFFER, None)  # urllib3 1.26 has none
    if encoding not in ("", "identity") or (buffered is not None and len(buffered)):
        return None
    if getattr(body, _AMOUNT_READ, 0):
        return None
    return SocketBody(raw, fp, length)


class _CannedSocket:
    """Just enough of a socket for ``http.client.HTTPResponse`` to parse ``data``."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(io.BytesIO(self._data))


def _probe() -> bool:
    """Read a canned response through ``http.client``, urllib3 and ``StreamingBody`` as
    botocore stacks them, by the shortcut; ``True`` when every byte arrives."""
    payload = bytes(range(256)) * 4
    head = f"HTTP/1.1 206 Partial Content\r\nContent-Length: {len(payload)}\r\n\r\n"
    try:
        fp = http.client.HTTPResponse(_CannedSocket(head.encode() + payload))  # type: ignore[arg-type]
        fp.begin()
        raw = urllib3.HTTPResponse(
            body=fp,
            headers=dict(fp.getheaders()),
            status=fp.status,
            preload_content=False,
            decode_content=False,
            original_response=fp,
        )
        reader = _plain_layers(StreamingBody(raw, len(payload)), len(payload))
        if reader is None:
            return False
        out = bytearray(len(payload))
        view = memoryview(out)
        got = 0
        while got < len(out):
            got += reader.readinto(view[got:])
        return bytes(out) == payload and fp.isclosed()
    except Exception:  # any change in those private names means "use StreamingBody.read"
        return False


@functools.cache
def shortcut_available() -> bool:
    """Whether this botocore and urllib3 let a body be read from the socket (probed once)."""
    available = _probe()
    if not available:
        log.debug(
            "botocore/urllib3 response internals differ from what s3ckpt knows: "
            "ranged GET bodies are read through StreamingBody.read"
        )
    return available


def socket_body(body: Any, length: int) -> SocketBody | None:
    """A :class:`SocketBody` over ``body`` (a ranged GET's ``StreamingBody`` that should
    hold ``length`` bytes), or ``None`` when it must be read through ``body.read``."""
    return _plain_layers(body, length) if shortcut_available() else None


def body_socket(body: Any) -> Any:
    """The socket a response ``body`` (a ``StreamingBody``) is read from, or ``None``: the
    one the S3 client's connection noted on the response (:data:`SOCKET_ATTR`), else its
    urllib3 connection's (gone once a ``Connection: close`` reply took the socket over)."""
    raw = getattr(body, _RAW_STREAM, None)
    sock = getattr(raw, SOCKET_ATTR, None)
    return sock if sock is not None else getattr(getattr(raw, "connection", None), "sock", None)


def shutdown_socket(sock: Any) -> None:
    """Shut ``sock`` down both ways, so a thread blocked reading or writing it wakes
    (a reply that drips past its deadline, :class:`~s3ckpt.store._request.Watch`)."""
    if sock is not None:
        sock.shutdown(socket.SHUT_RDWR)


class S3RangeReader:
    """A ranged GET whose body is streamed; resets mid-body resume at the current offset.

    When the range's length is known, the body is read from the socket straight into the
    caller's buffer where :func:`~s3ckpt.store._body.socket_body` allows it, else through
    botocore's ``StreamingBody.read``. A body that ends before the range does (a
    connection closed early) is treated like a reset.

    A failed read is retried under the store's ``retry_policy`` by a new GET from the
    current offset. Attempts count over the whole stream (``attempts_used``); the deadline
    counts from the start of each :meth:`readinto` call, so a long transfer that keeps
    making progress is never cut by it. Each GET's body has a total deadline,
    ``read_timeout + bytes / min_rate`` from the reply (a
    :class:`~s3ckpt.store._request.Watch` shuts the body's socket down when it passes),
    so a body that drips a byte at a time ends in a timeout, resumed and then reported
    like any other.
    """

    def __init__(self, store: S3Requests, key: str, start: int, length: int | None) -> None:
        self._store = store
        self._key = key
        self._pos = start
        self._end = None if length is None else start + length  # exclusive
        self._body: Any = None
        self._direct: SocketBody | None = None  # set when reading the socket directly
        self._watch: Watch | None = None  # the open body's total deadline
        self._failures = 0
        self._opened = 0.0  # when the open GET was sent
        # When the first GET cut for being too slow (its Watch expired) was sent:
        # request_deadline counts from it for every later resume. A body that drips a byte
        # at a time makes some progress on each attempt, so per-read starts would never add
        # up to a deadline; a body that moves at min_rate or faster is never cut by it.
        self._slow_since: float | None = None

    def _open(self) -> None:
        last = None if self._end is None else self._end - 1
        self._opened = time.monotonic()
        resp = self._store._get_object(self._key, self._pos, last)
        body = self._body = resp["Body"]
        tc = self._store.transfer_config
        length = int(resp.get("ContentLength") or 0)
        self._watch = start_watch(tc.read_timeout, tc.min_rate, nbytes=length)
        self._watch.guard(lambda: shutdown_socket(body_socket(body)))
        self._check_range(resp.get("ContentRange"))
        if self._end is not None:
            self._direct = socket_body(self._body, self._end - self._pos)

    def _check_range(self, content_range: str | None) -> None:
        # A server that ignores Range answers 200 with the object from byte 0.
        first = 0
        if content_range:
            try:
                first = int(content_range.split()[1].split("-")[0])
            except (IndexError, ValueError):
                first = -1
        if first != self._pos:
            self.close()
            raise StoreError(
                f"asked for bytes from {self._pos} and got {content_range or 'the whole object'}"
                "; the endpoint does not honour HTTP Range requests, which s3ckpt needs",
                bucket=self._store.bucket,
                key=self._key,
                operation="get",
            )

    def readinto(self, buffer: memoryview) -> int:
        """Read up to ``len(buffer)`` bytes; ``0`` at the end of the range or object."""
        want = len(buffer) if self._end is None else min(len(buffer), self._end - self._pos)
        if self._end is not None and want <= 0:
            return 0
        started = time.monotonic()
        try:
            try:
                return self._read(buffer, want)
            except StoreError:
                raise
            except Exception as exc:  # resumed, or mapped, by the retry policy
                return self._resume(buffer, want, exc, started)
        except StoreError as exc:
            if exc.code == "InvalidRange":
                return 0  # the object ends before the range starts
            raise

    def _read(self, buffer: memoryview, want: int) -> int:
        """One read, opening the GET first when none is open; a failure closes it."""
        try:
            if self._body is None:
                self._open()
            elif self._watch is not None:
                self._watch.resume()
            try:
                if self._direct is not None:
                    n = self._direct.readinto(buffer[:want])
                else:
                    chunk = self._body.read(want)
                    n = len(chunk)
                    buffer[:n] = chunk
            except Exception as exc:
                watch = self._watch
                if watch is not None and watch.expired:
                    if self._slow_since is None:
                        self._slow_since = self._opened
                    tc = self._store.transfer_config
                    raise AttemptTimedOut(
                        f"the body ({watch.nbytes} bytes) not read within {watch.limit:.1f} s "
                        f"(read_timeout={tc.read_timeout:g} s + min_rate={tc.min_rate:g} B/s)"
                    ) from exc
                raise
        except StoreError:
            raise
        except Exception:
            self.close()
            self._failures += 1
            raise
        self._pos += n
        if self._watch is not None and (n == 0 or self._pos == self._end):
            self._watch.finish()  # read: its connection may serve another request now
            self._watch = None
        elif self._watch is not None:
            # Until the next read the caller works on these bytes (decodes items, copies
            # them): its time, not the endpoint's, so it never cuts a body that moves.
            self._watch.pause()
        return n

    def _resume(self, buffer: memoryview, want: int, failure: Exception, started: float) -> int:
        """Retry the read that raised ``failure`` (attempt 1 of the policy's loop) from the
        offset reached, or raise the mapped error when the policy gives up."""
        store = self._store
        replay = [failure]
        if self._slow_since is not None:
            started = min(started, self._slow_since)

        def attempt() -> int:
            if replay:
                raise replay.pop()
            return self._read(buffer, want)

        resumed = store.retry_policy.retrying(
            retry=retry_if_exception(is_transient),
            since=started,
            attempts_used=self._failures - 1,
            before_sleep=self._log_resume,
        )
        try:
            return resumed(attempt)
        except StoreError:
            raise
        except Exception as exc:
            raise map_error(
                exc,
                operation="get",
                bucket=store.bucket,
                key=self._key,
                endpoint=store.endpoint_url,
                attempts=self._failures,
                elapsed=time.monotonic() - started,
                transfer_config=store.transfer_config,
            ) from exc

    def _log_resume(self, state: RetryCallState) -> None:
        record_retry("get")  # the GET that resumes is counted as a request by call()
        exc = state.outcome.exception() if state.outcome is not None else None
        log.debug(
            "resuming GET s3://%s/%s at %d after %r", self._store.bucket, self._key, self._pos, exc
        )

    def close(self) -> None:
        """Close the GET in flight, if any."""
        self._direct = None
        if self._watch is not None:
            self._watch.finish()
            self._watch = None
        with contextlib.suppress(Exception):  # closing a broken stream can itself fail
            if self._body is not None:
                self._body.close()
        self._body = None
