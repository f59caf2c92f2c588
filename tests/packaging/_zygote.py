"""A fork server for the doc test's ``s3ckpt`` commands: torch imported once, not per command.

The docs run dozens of ``s3ckpt inspect / verify / diff / export`` commands; each would
start a fresh interpreter and import torch (seconds each, minutes per run on a slow CI
host). Instead, :func:`serve` runs in the docs venv's interpreter (the wheel's ``s3ckpt``),
imports ``s3ckpt.cli`` and what its commands import, and forks one child per command. The
``s3ckpt`` on the blocks' ``PATH`` is :data:`CLIENT`, a stdlib-only script (``python -IS``)
that hands the server its stdin, stdout and stderr (SCM_RIGHTS), argv, working directory
and environment, and exits with the child's status. The child runs exactly what the wheel's
console script runs (``sys.exit(s3ckpt.cli.main())``) with that argv, environment and
working directory. The server never runs torch code itself, so no thread pool exists when
it forks. Where the server cannot be reached, the client runs the wheel's own script.

    python _zygote.py SOCKET          serve until killed (the parent removes SOCKET)
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import sys
from typing import Any

CLIENT = r"""#!{python} -IS
# The doc test's `s3ckpt`: run by the fork server of tests/packaging/_zygote.py.
import array, json, os, socket, sys
REAL = {real!r}
try:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect({sock!r})
except OSError:
    os.execv(REAL, [REAL, *sys.argv[1:]])
msg = json.dumps({{"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}})
fds = array.array("i", [0, 1, 2])
s.sendmsg([msg.encode() + b"\0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
rc = b""
while len(rc) < 4:
    chunk = s.recv(4 - len(rc))
    if not chunk:
        sys.exit(70)  # the server died: EX_SOFTWARE
    rc += chunk
sys.exit(int.from_bytes(rc, "big", signed=True))
"""


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds = b"", array.array("i")
    while not data.endswith(b"\0"):
        msg, ancdata, _, _ = conn.recvmsg(1 << 20, socket.CMSG_SPACE(3 * fds.itemsize))
        if not msg:
            raise EOFError("client went away")
        data += msg
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return json.loads(data[:-1]), list(fds)


def _child(conn: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
    code = 1
    try:
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        os.chdir(str(request["cwd"]))
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in dict(request["env"]).items()})
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.argv = ["s3ckpt", *[str(a) for a in request["argv"]]]
        from s3ckpt.cli import main

        try:
            sys.exit(main())
        except SystemExit as exc:  # what the interpreter does with sys.exit's argument
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            conn.sendall(int(code).to_bytes(4, "big", signed=True))
        finally:
            os._exit(code)


def serve(path: str) -> None:
    """Import what the commands need, then fork one child per connection on ``path``."""
    import torch  # noqa: F401

    import s3ckpt.cli
    import s3ckpt.dcp
    import s3ckpt.tools

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    print(f"ready {s3ckpt.cli.__file__}", flush=True)
    while True:
        conn, _ = server.accept()
        try:
            request, fds = _receive(conn)
        except (EOFError, OSError, ValueError):
            conn.close()
            continue
        if os.fork() == 0:
            server.close()
            _child(conn, request, fds)
        for fd in fds:
            os.close(fd)
        conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])
