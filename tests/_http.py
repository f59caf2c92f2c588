"""Loopback HTTP for tests: a stdlib server running a test's handler, and free ports.

Tests that must shape responses byte by byte (a body cut short, a range ignored, a reply
that never comes) run their own ``BaseHTTPRequestHandler`` on 127.0.0.1 through
:func:`serve`. Importing this module imports neither torch nor boto3.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["free_port", "serve"]


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the client cut the connection on purpose


@contextmanager
def serve(handler: type[BaseHTTPRequestHandler], *, quiet: bool = False) -> Iterator[str]:
    """Serve ``handler`` on 127.0.0.1 in a daemon thread; yields ``http://127.0.0.1:PORT``.

    Each connection gets its own daemon thread. ``quiet`` drops the traceback the server
    prints when a handler raises (a client that resets connections on purpose). The server
    is shut down and its socket closed on exit.
    """
    server = (_QuietServer if quiet else ThreadingHTTPServer)(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago (closed again)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
