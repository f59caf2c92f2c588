"""Socket operations the fault proxy's faults are made of: readiness polls, a close with a
TCP RST, and waiting until sent bytes have left the send queue.

``poll`` where there is one (no ``FD_SETSIZE`` limit on busy test machines), ``select``
elsewhere; a socket that errors while polled counts as readable, so its reader finds out.
Stdlib only.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time

try:  # Linux: lets us wait until a partial body has left the send queue.
    import fcntl
    import termios

    _TIOCOUTQ: int | None = getattr(termios, "TIOCOUTQ", None)
except ImportError:  # pragma: no cover - non-Unix
    _TIOCOUTQ = None

__all__ = ["close_with_rst", "peer_closed", "readable_now", "wait_readable", "wait_sent"]


def readable_now(sock: socket.socket) -> bool:
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


def wait_readable(sock: socket.socket, timeout: float) -> bool:
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


def peer_closed(sock: socket.socket) -> bool:
    """Whether the peer has closed (or reset) the connection; pending data is not EOF."""
    if not readable_now(sock):
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True


def close_with_rst(sock: socket.socket) -> None:
    """Close ``sock`` with a TCP RST instead of an orderly FIN."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


def wait_sent(sock: socket.socket, timeout: float, stop: threading.Event) -> None:
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
