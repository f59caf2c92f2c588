"""The package as a user gets it, built once per session for every packaging test: the sdist
of the checkout and the wheel built from that sdist (``dists``), and a fresh venv with the
wheel and its dependencies installed (``venv``, no torch)."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]


def _hook(hook: str, out: Path, cwd: Path) -> Path:
    """Run setuptools' PEP 517 ``hook`` in ``cwd`` (no isolation: the venv's setuptools)."""
    code = f"from setuptools import build_meta as b; print(b.{hook}({str(out)!r}))"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return out / proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(sdist, wheel): the sdist of the checkout, and the wheel built from that sdist."""
    out = tmp_path_factory.mktemp("dist")
    t0 = time.perf_counter()
    sdist = _hook("build_sdist", out, ROOT)
    with tarfile.open(sdist) as tar:
        tar.extractall(out / "src", filter="data")
    wheel = _hook("build_wheel", out, out / "src" / f"s3ckpt-{VERSION}")
    print(f"\nsdist and wheel built in {time.perf_counter() - t0:.1f}s")
    return sdist, wheel


@pytest.fixture(scope="session")
def venv(dists: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh venv with the wheel installed (no extras): its ``bin`` directory."""
    where = tmp_path_factory.mktemp("venv") / "v"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=120)
    pip = [str(where / "bin" / "python"), "-m", "pip", "install", "-q"]
    pip += ["--disable-pip-version-check", "--prefer-binary", "--no-compile"]
    proc = subprocess.run(
        [*pip, "-c", str(ROOT / "constraints.txt"), str(dists[1])],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    print(f"\nfresh venv with the wheel installed in {time.perf_counter() - t0:.1f}s")
    yield where / "bin"


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """The doc test's tally: per page, what ran and every block not run, with its reason."""
    from tests.packaging.test_docs import SUMMARY

    lines = config.stash.get(SUMMARY, [])
    if lines:
        terminalreporter.section("doc blocks (tests/packaging/test_docs.py)")
        for line in lines:
            terminalreporter.write_line(line)
