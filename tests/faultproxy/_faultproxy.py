"""Fault-injecting HTTP/1.1 reverse proxy for S3 tests (public as :mod:`tests.faultproxy`).

The proxy listens on loopback and relays every request to an *upstream*
S3-compatible server (in s3ckpt's own tests and benchmarks, a ``moto`` server). A
configurable fraction of requests is answered with an injected fault instead, so that the
retry behaviour of botocore, of s3ckpt's own retry layer and of a training loop's save and
resume can be exercised against realistic failures: the kinds are described in ``_faults``
(and in this folder's README.md), the made-up S3 error replies in ``_s3errors``.

This module holds the server: :class:`FaultProxy`, its listener, its accept loop and
the sockets and threads it must tear down on :meth:`FaultProxy.stop`. What happens on
one connection is ``_connection``; the HTTP/1.1 framing ``_http1``; which S3 operation
a request is ``_s3ops``; which fault it gets ``_faults``.

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

Stdlib only. One daemon thread per client connection, each with its own upstream
connection that is reused across keep-alive requests.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Collection, Sequence
from types import TracebackType
from urllib.parse import urlsplit

from tests.faultproxy._connection import Connection
from tests.faultproxy._faults import (
    ALL_FAULT_KINDS,
    FAULT_KINDS,
    Arm,
    Hook,
    Injector,
    check_rate,
)
from tests.faultproxy._s3ops import OPERATIONS
from tests.faultproxy._sockets import close_with_rst

__all__ = ["FaultProxy"]

log = logging.getLogger(__name__)


class FaultProxy:
    """Loopback reverse proxy that injects S3-style faults into requests.

    ``upstream`` is the base URL of the real server (``http://host:port``).
    Each request is, with probability ``fault_rate`` and while fewer than
    ``max_faults`` faults have been injected, answered with a fault kind
    chosen uniformly from ``faults`` (the kinds: README.md, "The fault
    proxy"); otherwise it is relayed unchanged.  Point the client's ``endpoint_url`` at
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
        check_rate(fault_rate)
        self._host = host
        self._port = port
        self._injector = Injector(
            faults, fault_rate, seed, max_faults, frozenset(ops) if ops is not None else None
        )
        self._hook = hook
        self._lock = threading.Lock()  # guards _sockets and _threads
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()

    # ------------------------------------------------------------------ API

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
        return self._injector.stats

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
        return self._injector.arm(
            op, kind, times=times, skip=skip, key_glob=key_glob, conditional=conditional
        )

    def disarm(self, armed: Arm | None = None) -> None:
        """Remove one arm (or, with no argument, every arm)."""
        self._injector.disarm(armed)

    @property
    def fault_rate(self) -> float:
        """The probability of a random fault per request (see :meth:`set_fault_rate`)."""
        return self._injector.fault_rate

    def set_fault_rate(self, rate: float) -> None:
        """Change the fault probability for subsequent requests (thread-safe)."""
        self._injector.set_fault_rate(rate)

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

    def _call_hook(self, op: str, key: str, phase: str) -> None:
        hook = self._hook
        if hook is None:
            return
        try:
            hook(op, key, phase)
        except Exception:  # a broken hook must not take the proxy down
            log.exception("FaultProxy hook failed for %s %r (%s)", op, key, phase)
            self._injector.bump("hook_errors")

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
            close_with_rst(sock)
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
            Connection(self, client).run()
        except OSError:  # socket already shut down by stop()
            self._untrack_close(client)
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())
