"""The fixed-seed slice of the chaos harness (benchmarks/chaos.py --quick).

One run of the slice (about three minutes on a quiet two-core machine, mostly waiting) covers
every class of docs/reliability.md with a few trials each (one each for classes 8-12: skewed
clocks, a same-hostname host, a store without conditional writes, truncated replies, deleters
racing overwrites); each class is then its own test, so a failure names the class and the
violated invariant. The full run (>= 600 trials) is in docs/reliability.md ("Running it").
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# The slice's module fixture runs the harness (~3 min here, mostly waiting out stalls and
# timeouts, not CPU): the first test pays for it, so the suite-wide 300 s would cut it on a
# slow host. The subprocess's own 900 s is the hang guard.
pytestmark = [pytest.mark.integration, pytest.mark.bench, pytest.mark.timeout(960)]

ROOT = Path(__file__).resolve().parents[2]
CLASSES = range(1, 13)


@pytest.fixture(scope="module")
def slice_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("chaos") / "results.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "chaos.py"),
            "--quick",
            "--seed",
            "0",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        # A hang guard, not a speed check: the slice takes ~3 minutes on a quiet 2-core
        # machine (mostly waiting); CI machines run many times slower.
        timeout=900,
    )
    if not out.exists():
        pytest.fail(
            f"the chaos slice wrote no results (exit {proc.returncode}):\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    doc: dict[str, Any] = json.loads(out.read_text())
    doc["_rc"] = proc.returncode
    doc["_log"] = proc.stdout[-4000:]
    return doc


def test_slice_ran_every_class(slice_results: dict[str, Any]) -> None:
    assert not slice_results["harness_errors"], slice_results["harness_errors"]
    assert slice_results["_rc"] in (0, 1), slice_results["_log"]
    for cls in CLASSES:
        assert slice_results["summary"][str(cls)]["trials"] > 0, f"class {cls} ran no trial"


@pytest.mark.parametrize("cls", CLASSES)
def test_no_invariant_violated(slice_results: dict[str, Any], cls: int) -> None:
    bad = [t for t in slice_results["trials"] if t["class"] == cls and t["violations"]]
    detail = "\n".join(
        f"{t['name']} {t['params']}: "
        + "; ".join(f"{v['kind']}: {v['detail']}" for v in t["violations"])
        for t in bad
    )
    assert not bad, f"class {cls}: {len(bad)} trial(s) violated an invariant:\n{detail}"
