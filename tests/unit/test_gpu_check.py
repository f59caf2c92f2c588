"""benchmarks/gpu_check.py without a GPU: its CPU dry run end to end, and its parts.

The script runs on lent GPU machines only now and then; the dry run (``--dry-run-cpu``)
takes the same code paths on CPU (s3sim in its own process, the sync/async rounds, the
bit-exact load, the fan-out with two gloo ranks) so that it cannot rot between them.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_check
from benchmarks._gpu_budget import WATCHDOG_EXIT, Budget, Run

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def _run_script(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_dry_run_cpu_runs_every_phase_and_reports_figures(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    proc = _run_script("--dry-run-cpu", "--out", str(out), timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    phases = {p["name"]: p["status"] for p in data["phases"]}
    assert phases == {
        "environment": "ok",
        "server": "ok",
        "warmup": "ok",
        "rounds[none]": "ok",
        "load": "ok",
        "fanout": "ok",
    }
    # Every phase printed its duration as it went.
    for name in phases:
        assert f"] {name}: ok in " in proc.stdout
    res = data["results"]
    assert res["environment"]["torch"] == torch.__version__
    rounds = res["rounds[none]"]
    assert len(rounds["sync_s"]) == len(rounds["async_blocked_s"]) == 2
    assert rounds["async_first_blocked_s"] == rounds["async_blocked_s"][0] > 0
    assert rounds["async_warm_fraction"] is not None
    assert all(
        c >= b for c, b in zip(rounds["async_commit_s"], rounds["async_blocked_s"], strict=True)
    )
    load = res["load"]
    assert load["bit_exact"] is True and load["step"] == 4 and load["load_mbps"] > 0
    fan = res["fanout"]
    assert fan["world"] == 2
    # Direct: each rank GETs every byte; fan-out: the group GETs each byte once.
    assert fan["direct"]["get_bytes"] >= 2 * fan["bytes"]
    assert fan["fan_out"]["get_bytes"] < fan["direct"]["get_bytes"]
    assert fan["fan_out"]["bytes_received"] > 0
    assert fan["fan_out_over_direct"]["get_bytes"] <= 0.55
    # The same JSON on stdout as in --out.
    assert json.loads(proc.stdout[proc.stdout.index('{\n  "phases"') :]) == data


def test_watchdog_ends_a_run_past_its_budget(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    proc = _run_script(
        "--dry-run-cpu", "--budget-s", "0", "--grace-s", "0", "--out", str(out), timeout=120
    )
    assert proc.returncode == WATCHDOG_EXIT, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "watchdog:" in proc.stdout
    data = json.loads(out.read_text())
    assert data["phases"][-1]["status"] == "failed"
    assert "budget" in data["phases"][-1]["error"]


def test_bit_mismatches_finds_one_flipped_bit() -> None:
    a = {"w": torch.randn(64), "b": torch.zeros(3)}
    same = {k: v.clone() for k, v in a.items()}
    assert gpu_check.bit_mismatches(a, same) == []
    flipped = {k: v.clone() for k, v in a.items()}
    flipped["w"].view(torch.int32)[17] ^= 1  # the lowest mantissa bit of one element
    assert gpu_check.bit_mismatches(a, flipped) == ["w"]
    negative_zero = {"w": a["w"].clone(), "b": -torch.zeros(3)}  # equal as values, not bits
    assert gpu_check.bit_mismatches(a, negative_zero) == ["b"]
    assert gpu_check.bit_mismatches(a, {"w": a["w"]}) == ["b"]


def test_phases_that_do_not_fit_are_skipped_and_errors_marked_failed() -> None:
    clock = itertools.chain([0.0], itertools.repeat(100.0))
    run = Run(Budget(60.0, clock=lambda: next(clock)), out=None)
    assert run.budget.left() == -40.0 and not run.budget.fits(0.0)
    # No server, no state: a phase that tried to run would raise KeyError, not skip.
    ctx = {"nbytes": 2**30, "runs": 3}
    gpu_check.rounds(run, "rounds[none]", ctx, reserve_s=0.0)
    gpu_check.load(run, ctx, reserve_s=0.0)
    args = argparse.Namespace(dry_run_cpu=True, fanout_size_mib=4, piece_mib=64)
    gpu_check.fanout(run, ctx, args)
    assert [(p["name"], p["status"]) for p in run.data["phases"]] == [
        ("rounds[none]", "skipped"),
        ("load", "skipped"),
        ("fanout", "skipped"),
    ]
    assert "left" in run.data["phases"][0]["reason"]
    assert not run.failed()
    with run.phase("broken"):
        raise RuntimeError("boom")
    assert run.data["phases"][-1]["status"] == "failed"
    assert "boom" in run.data["phases"][-1]["error"]
    assert run.failed()


@pytest.mark.parametrize(("size_mib", "n_small"), [(8, 64), (2048, 2000)])
def test_shapes_hold_the_asked_size(size_mib: int, n_small: int) -> None:
    shapes = gpu_check.shapes(size_mib, n_small)
    total = sum(4 * torch.Size(s).numel() for s in shapes)
    assert len(shapes) == 4 + n_small
    assert 0.99 * size_mib * 2**20 <= total <= size_mib * 2**20
