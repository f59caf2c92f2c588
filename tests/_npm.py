"""Azurite (Azure Blob's emulator) and s3rver from npm, on 127.0.0.1, for the ``npmstores``
tier (tests/integration/test_npm_stores.py).

:func:`install` runs ``npm install`` of :data:`PACKAGES` into ``build/npm-stores`` once
(``make npm-stores`` does the same; a lock file keeps xdist workers from racing), ~20 s on
a quiet host. :class:`NodeServer` starts one of them on a free port and waits until it
answers HTTP (Azurite and s3rver each answer in about a second). Without node or npm the
tests skip, or fail when ``CI`` is set (CI installs them). Imports neither torch nor boto3.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

__all__ = ["AZURITE_KEY", "PACKAGES", "NodeServer", "install"]

PACKAGES = ("azurite@3.35.0", "s3rver@3.7.1")
DIR = Path(__file__).resolve().parent.parent / "build" / "npm-stores"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
"""Azurite's fixed, published development account key (devstoreaccount1)."""


def _unavailable(msg: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


def install() -> Path:
    """``build/npm-stores/node_modules``, installed if missing (skips or fails without npm)."""
    modules = DIR / "node_modules"
    if shutil.which("node") is None or shutil.which("npm") is None:
        _unavailable("no node/npm: install Node.js >= 18 (Debian: apt-get install nodejs npm)")
    DIR.mkdir(parents=True, exist_ok=True)
    with open(DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not all((modules / p.split("@")[0] / "package.json").is_file() for p in PACKAGES):
            cmd = ["npm", "install", "--prefix", str(DIR), "--no-audit", "--no-fund", *PACKAGES]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
            if done.returncode:
                _unavailable(f"{' '.join(cmd)} failed: {done.stderr[-2000:]}")
    return modules


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NodeServer:
    """One node server (``azurite-blob`` or ``s3rver``) on ``http://127.0.0.1:PORT``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.port = _free_port()
        self.data = tempfile.mkdtemp(prefix=f"s3ckpt-{name}-")
        self.log = Path(self.data) / "server.log"
        self.startup_seconds = 0.0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _command(self, modules: Path) -> list[str]:
        store = Path(self.data) / "store"
        if self.name == "azurite":
            main = modules / "azurite" / "dist" / "src" / "blob" / "main.js"
            return ["node", str(main), "--silent", "--location", str(store), "--blobHost",
                    "127.0.0.1", "--blobPort", str(self.port), "--skipApiVersionCheck"]  # fmt: skip
        # s3rver's continuation tokens use DES, which Node >= 17 hides behind this flag.
        main = modules / "s3rver" / "bin" / "s3rver.js"
        return ["node", "--openssl-legacy-provider", str(main), "-d", str(store), "-a",
                "127.0.0.1", "-p", str(self.port), "--configure-bucket", "ckpt"]  # fmt: skip

    def __enter__(self) -> NodeServer:
        modules = install()
        (Path(self.data) / "store").mkdir()
        t0 = time.monotonic()
        with open(self.log, "wb") as log:
            self._proc = subprocess.Popen(self._command(modules), stdout=log, stderr=log)
        while time.monotonic() - t0 < 60:
            if self._proc.poll() is not None:
                break
            try:
                urllib.request.urlopen(self.url, timeout=2).close()
            except urllib.error.HTTPError:
                pass  # an error reply is an answer
            except OSError:
                time.sleep(0.1)
                continue
            self.startup_seconds = time.monotonic() - t0
            return self
        self.__exit__()
        pytest.fail(f"{self.name} did not answer in 60 s: {self.log.read_text()[-2000:]}")

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # a loaded CI machine: SIGTERM not handled yet
                self._proc.kill()
                self._proc.wait(timeout=30)
        shutil.rmtree(self.data, ignore_errors=True)
