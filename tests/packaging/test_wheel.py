"""The package as a user gets it: build the sdist and, from it, the wheel (what
``python -m build`` does), check what each holds, install the wheel into a fresh venv without
torch and run ``s3ckpt ls``, ``prune --policy pretraining`` (a built-in name) and ``gc``
against the moto server.

Marked ``packaging`` (``make check-wheel``; ``make test`` runs it as its own phase). The
fixtures ``dists`` and ``venv`` live in tests/packaging/conftest.py (session scope: the doc test
uses the same wheel). Its cost
is one venv and one ``pip install`` of the wheel and its six small dependencies (about 10 s
here, from the pip cache or the registry), plus the builds and commands (a few seconds).
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import time
import tomllib
import zipfile
from pathlib import Path

import pytest

from s3ckpt.store import open_store
from tests._retention_util import write_checkpoint

pytestmark = [pytest.mark.packaging, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
POLICY_FILES = sorted(p.name for p in (ROOT / "policies").glob("*.toml"))
DAY = 86400.0


def test_the_wheel_holds_the_package_license_py_typed_and_policies(
    dists: tuple[Path, Path],
) -> None:
    _, wheel = dists
    names = set(zipfile.ZipFile(wheel).namelist())
    info = f"s3ckpt-{VERSION}.dist-info"
    assert f"{info}/licenses/LICENSE" in names
    assert "s3ckpt/py.typed" in names
    assert {f"s3ckpt/policies/{f}" for f in POLICY_FILES} <= names
    assert {"s3ckpt/tools/_report/report.css", "s3ckpt/tools/_report/report.js"} <= names
    modules = {
        str(p.relative_to(ROOT))
        for p in (ROOT / "s3ckpt").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert modules <= names, f"missing from the wheel: {sorted(modules - names)}"
    assert not [n for n in names if n.startswith(("tests/", "policies/", "benchmarks/"))]
    # The testing kit is the embedded server, the assertions and the fixtures; the fault proxy
    # is the repository's (tests/faultproxy/), never the wheel's.
    kit = {"__init__", "_server", "_asserts", "pytest_plugin"}
    assert {n for n in names if n.startswith("s3ckpt/testing/")} == {
        f"s3ckpt/testing/{m}.py" for m in kit
    }
    assert not [n for n in names if "faultproxy" in n.lower()]
    meta = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
    assert "License-Expression: Apache-2.0" in meta
    assert "Requires-Python: >=3.11" in meta
    assert "Classifier: Typing :: Typed" in meta
    assert "Project-URL: Homepage, https://github.com/s3ckpt/s3ckpt" in meta
    base = [line for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    assert not [
        line for line in base if ("torch" in line or "numpy" in line) and "extra" not in line
    ]


def test_the_sdist_holds_what_builds_the_wheel_and_no_strays(dists: tuple[Path, Path]) -> None:
    sdist, _ = dists
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    top = {n.split("/", 1)[0] for n in names}
    # s3ckpt.egg-info and setup.cfg are the metadata setuptools writes into every sdist.
    assert top == {
        "LICENSE",
        "MANIFEST.in",
        "PKG-INFO",
        "README.md",
        "pyproject.toml",
        "setup.cfg",
        "policies",
        "s3ckpt",
        "s3ckpt.egg-info",
    }, top
    assert {f"policies/{f}" for f in POLICY_FILES} <= names
    assert "s3ckpt/py.typed" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".pyo"))]


@pytest.fixture
def seeded_bucket(bucket: str) -> str:
    """Six committed checkpoints whose writers' clocks put them a day apart, and a save in
    progress, under runs/a/. Retention ages them by the store's clock, which saw all six
    commit just now."""
    store, run = open_store(f"s3://{bucket}/runs/a/")
    now = time.time()
    for i in range(6):
        write_checkpoint(store, run, 1000 * (i + 1), created=now - (6 - i) * DAY)
    write_checkpoint(store, run, 9000, created=now, commit=False)
    return bucket


def _s3ckpt(bin_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    t0 = time.perf_counter()
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(
        [str(bin_dir / "s3ckpt"), *args], capture_output=True, text=True, env=env, timeout=120
    )
    print(f"s3ckpt {' '.join(args)}: exit {proc.returncode}, {time.perf_counter() - t0:.1f}s")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


def test_the_installed_cli_runs_ls_prune_and_gc_without_torch(
    venv: Path, seeded_bucket: str, moto_endpoint: str
) -> None:
    python = str(venv / "python")
    probe = (
        "import importlib.util as u, importlib.metadata as m; "
        "assert u.find_spec('torch') is None and u.find_spec('numpy') is None; "
        "print(m.version('s3ckpt'))"
    )
    out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == VERSION
    assert _s3ckpt(venv, "--version").stdout.strip() == f"s3ckpt {VERSION}"

    root = f"s3://{seeded_bucket}/runs/"
    listing = _s3ckpt(venv, "ls", root).stdout
    assert "a/" in listing

    # The endpoint from the environment (AWS_ENDPOINT_URL, set by the moto fixture) and from
    # the flag.
    doc = json.loads(
        _s3ckpt(
            venv,
            "prune",
            root,
            "--policy",
            "pretraining",
            "--json",
            "--endpoint-url",
            moto_endpoint,
        ).stdout
    )
    assert doc["applied"] is False and doc["exit_code"] == 0
    (run,) = doc["runs"]
    assert run["policy"].startswith("last 5 | every 10000 steps | calendar")
    actions = {d["name"]: d["action"] for d in run["decisions"]}
    # The last five are kept; the oldest shares today's calendar slot with them in the
    # store's time (its writer's `created` of six days ago is only shown), so it goes.
    assert actions.pop("step_000001000") == "delete"
    assert sorted(actions.values()) == ["keep"] * 5 + ["skip"]

    # Another built-in: keep-last-3 plans the three oldest for deletion (a dry run).
    doc = json.loads(_s3ckpt(venv, "prune", root, "--policy", "keep-last-3", "--json").stdout)
    deleted = sorted(d["name"] for d in doc["runs"][0]["decisions"] if d["action"] == "delete")
    assert deleted == ["step_000001000", "step_000002000", "step_000003000"]

    doc = json.loads(_s3ckpt(venv, "gc", root, "--json").stdout)
    assert doc["applied"] is False and doc["exit_code"] == 0


def test_the_demo_prints_its_retention_reasons_from_the_wheel(
    venv: Path, seeded_bucket: str, tmp_path: Path
) -> None:
    # The demo's catalog and reasons (its step 3) need no torch: run them from the installed
    # wheel, in a folder without the repository's policies/.
    code = (
        "from s3ckpt.demo._train import print_checkpoints; from s3ckpt.store import Location; "
        f"print_checkpoints(Location.of('s3://{seeded_bucket}/runs/a/'))"
    )
    proc = subprocess.run(
        [str(venv / "python"), "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    kept = {line.split()[0]: line.partition("kept: ")[2] for line in proc.stdout.splitlines()}
    assert kept["step_000006000"] == "newest committed; last 3", proc.stdout
    assert kept["step_000004000"] == "last 3" and kept["step_000001000"] == "-"


def test_commands_that_need_an_extra_say_which_without_torch(venv: Path, bucket: str) -> None:
    cases = {
        ("demo",): 's3ckpt[demo]"',
        ("inspect", f"s3://{bucket}/runs/a/step_000000001"): 'pip install "s3ckpt[torch]"',
    }
    for args, hint in cases.items():
        proc = subprocess.run(
            [str(venv / "s3ckpt"), *args], capture_output=True, text=True, timeout=120
        )
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and hint in lines[0], (args, proc.stderr)
