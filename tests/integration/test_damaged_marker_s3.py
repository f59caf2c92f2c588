"""A root with one bad commit marker, on the moto S3 server over HTTP (issue 27, item 8):
``s3ckpt ls``, ``prune`` (dry run and ``--apply``), ``gc`` and ``report`` process every other
run, list the damaged checkpoint as one row with one warning on stderr, exit 1 ("done in
part"), print no traceback, and never delete it nor the newest readable checkpoint."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from s3ckpt.cli import main
from s3ckpt.format._names import MANIFEST_NAME
from s3ckpt.store.s3 import S3Store
from s3ckpt.uri import StoreURL
from tests._helpers import list_keys
from tests._retention_util import write_checkpoint

pytestmark = pytest.mark.integration

BAD = "step_000000003"


@pytest.fixture
def root(bucket: str, s3_client: Any) -> str:
    """Runs a (steps 1-3) and b (steps 1-2) under ``root/``; run a's newest marker says it
    was created in the year 3,170,843,205 (``created: 1e20``)."""
    store = S3Store(bucket)
    now = time.time()
    for run, steps in (("a", (1, 2, 3)), ("b", (1, 2))):
        for s in steps:
            write_checkpoint(
                store, StoreURL("s3", bucket, f"root/{run}/"), s, created=now - 86400 + s
            )
    key = f"root/a/{BAD}/{MANIFEST_NAME}"
    doc = json.loads(store.get(key))
    doc["created"] = 1e20  # and no valid digest: either check makes it damaged
    s3_client.put_object(Bucket=bucket, Key=key, Body=json.dumps(doc).encode())
    return f"s3://{bucket}/root/"


def _warned_once(err: str, command: str) -> None:
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if "warning: damaged checkpoint" in ln]
    assert len(lines) == 1 and lines[0].startswith(f"s3ckpt {command}: warning"), err
    assert f"root/a/{BAD}/{MANIFEST_NAME}" in lines[0], err


def test_ls_prune_gc_and_report_go_on_past_one_bad_marker(
    root: str, bucket: str, s3_client: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["ls", root, "--no-progress"]) == 1
    out, err = capsys.readouterr()
    _warned_once(err, "ls")
    rows = [ln.split() for ln in out.splitlines() if ln.strip().startswith("step_")]
    assert len(rows) == 5 and [r[2] for r in rows].count("damaged") == 1, out

    policy = tmp_path / "keep1.toml"
    policy.write_text("[keep]\nlast = 1\n")
    assert main(["prune", root, "--policy", str(policy), "--json"]) == 1
    out, err = capsys.readouterr()
    _warned_once(err, "prune")
    doc = json.loads(out)
    assert doc["exit_code"] == 1 and len(doc["runs"]) == 2

    assert main(["prune", root, "--policy", str(policy), "--apply", "--no-progress"]) == 1
    _warned_once(capsys.readouterr().err, "prune")
    markers = [k for k in list_keys(s3_client, bucket, "root/") if k.endswith(MANIFEST_NAME)]
    assert markers == [
        f"root/a/step_000000002/{MANIFEST_NAME}",  # the newest readable one, kept
        f"root/a/{BAD}/{MANIFEST_NAME}",  # the damaged one, never deleted by a plan
        f"root/b/step_000000002/{MANIFEST_NAME}",  # run b pruned as usual
    ]

    assert main(["gc", root, "--apply", "--no-progress"]) == 1
    _warned_once(capsys.readouterr().err, "gc")
    assert f"root/a/{BAD}/{MANIFEST_NAME}" in list_keys(s3_client, bucket, "root/a/")

    page = tmp_path / "report.html"
    assert main(["report", root, "--html", str(page), "--policy", str(policy)]) == 1
    _warned_once(capsys.readouterr().err, "report")
    assert ">damaged</span>" in page.read_text()
