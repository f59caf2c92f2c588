""":class:`S3Sim`: start the server in its own process and talk to its control API.

The server never shares a process (or a GIL) with the code under test. Starting waits for
the child's ready line and then for the port to answer; stopping terminates the child
(SIGTERM, then SIGKILL). The client side uses no threads: control calls are plain
``http.client`` requests on a fresh connection each.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import select
import subprocess
import sys
import time
import weakref
from pathlib import Path
from typing import IO, Any

from ._options import Options
from ._shaping import Shaping

__all__ = ["S3Sim"]

_ROOT = Path(__file__).resolve().parents[2]  # the directory that holds benchmarks/


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class S3Sim:
    """An s3sim server process on ``host`` (default 127.0.0.1) and a free port.

    Example::

        with S3Sim(shaping=Shaping.s3(rate_scale=0.01)) as sim:
            s3 = boto3.client("s3", endpoint_url=sim.endpoint)
            ...
            print(sim.stats()["ops"])

    Args:
        shaping: the shaping model (default: none, as fast as the server goes).
        options: server options (default :class:`Options()`: 5 MiB minimum part size,
            random ETags, CRC32C/CRC64NVME verified).
        host: address to listen on.
        port: port to listen on; 0 picks a free one.
        buckets: buckets to create at start.
        log: a file the server's stderr goes to (default: this process's stderr).
        startup_timeout: seconds to wait for the server to listen.
    """

    def __init__(
        self,
        shaping: Shaping | None = None,
        *,
        options: Options | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        buckets: tuple[str, ...] | list[str] = (),
        log: str | os.PathLike[str] | None = None,
        startup_timeout: float = 60.0,
    ) -> None:
        self.shaping = shaping or Shaping.none()
        self.options = options or Options()
        self.host = host
        self.port = port
        self.buckets = tuple(buckets)
        self.log = log
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """``http://HOST:PORT`` (only once started)."""
        if self.process is None:
            raise RuntimeError("S3Sim is not started")
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        """The server's process id."""
        if self.process is None:
            raise RuntimeError("S3Sim is not started")
        return self.process.pid

    def start(self) -> S3Sim:
        """Start the server process and wait until its port answers."""
        if self.process is not None:
            return self
        cfg = json.dumps({"shaping": self.shaping.to_json(), "options": self.options.to_json()})
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.s3sim",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--config",
            cfg,
            "--ready-line",
        ]
        for b in self.buckets:
            cmd += ["--bucket", b]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH")) if p)
        if self.log is not None:
            self._log_file = open(self.log, "ab")  # noqa: SIM115 - lives as long as the server
        proc = subprocess.Popen(
            cmd,
            cwd=_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
        )
        self.process = proc
        self._finalizer = weakref.finalize(self, _kill, proc)
        try:
            ready = self._read_ready(proc)
            self.port = int(ready["port"])
            self._wait_answering()
        except BaseException:
            self.stop()
            raise
        return self

    def _read_ready(self, proc: subprocess.Popen[bytes]) -> dict[str, Any]:
        assert proc.stdout is not None
        deadline = time.monotonic() + self.startup_timeout
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"s3sim did not start within {self.startup_timeout} s")
            readable, _, _ = select.select([proc.stdout], [], [], min(left, 0.5))
            if readable:
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    raise RuntimeError(f"s3sim exited during start (code {proc.wait()})")
                line += chunk
            elif proc.poll() is not None:
                raise RuntimeError(f"s3sim exited during start (code {proc.returncode})")
        proc.stdout.close()
        return dict(json.loads(line.decode().splitlines()[0]))

    def _wait_answering(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while True:
            try:
                self._call("GET", "/_s3sim/config", timeout=5)
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        """Terminate the server (idempotent)."""
        proc, self.process = self.process, None
        if proc is not None:
            _kill(proc)
            if proc.stdout is not None and not proc.stdout.closed:
                proc.stdout.close()
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> S3Sim:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- control API ---------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: Any = None, timeout: float = 60) -> Any:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {} if data is None else {"Content-Type": "application/json"}
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            payload = resp.read()
        finally:
            conn.close()
        result = json.loads(payload) if payload else None
        if resp.status != 200:
            raise RuntimeError(f"s3sim {method} {path}: {resp.status} {result}")
        return result

    def stats(self) -> dict[str, Any]:
        """The server's stats (schema in README.md)."""
        return dict(self._call("GET", "/_s3sim/stats"))

    def reset_stats(self) -> None:
        """Zero the stats (objects and the partition layout stay)."""
        self._call("POST", "/_s3sim/reset")

    def clear(self) -> None:
        """Drop every bucket and object."""
        self._call("POST", "/_s3sim/clear")

    def config(self) -> dict[str, Any]:
        """``{"shaping": {...}, "options": {...}}`` as the server has them now."""
        return dict(self._call("GET", "/_s3sim/config"))

    def configure(self, shaping: Shaping | None = None, **knobs: Any) -> dict[str, Any]:
        """Change shaping and options at runtime; returns :meth:`config`.

        ``shaping`` replaces the whole shaping model; ``knobs`` are single fields of
        :class:`Shaping` or :class:`Options` (``profile="s3"`` starts from a preset).
        Any shaping knob (even one that changes nothing, e.g. ``configure(sim.shaping)``)
        starts a fresh partition layout (one partition per bucket); options alone keep it.
        """
        body: dict[str, Any] = {}
        if shaping is not None:
            body.update(shaping.to_json())
            body.pop("profile", None)
        body.update(knobs)
        if "throttles" in body:
            body["throttles"] = [
                t.to_json() if hasattr(t, "to_json") else t for t in body["throttles"] or ()
            ]
        result = dict(self._call("POST", "/_s3sim/config", body))
        self.shaping = Shaping.from_json(result["shaping"])
        self.options = Options(**result["options"])
        return result

    def create_bucket(self, name: str) -> None:
        """Create a bucket (a plain unsigned PUT)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        with contextlib.closing(conn):
            conn.request("PUT", f"/{name}", body=b"")
            resp = conn.getresponse()
            resp.read()
        if resp.status != 200:
            raise RuntimeError(f"s3sim: CreateBucket {name}: {resp.status}")

    def cpu_seconds(self) -> float:
        """Server CPU (user + system) since it started."""
        return float(self.stats()["cpu_s"])
