"""Issue 37 items 2-4 over HTTP against moto: one state read by everyone, a resume that heals.

Steps 100/200/300 saved by the Checkpointer, one byte of a late item of step 300 flipped:

* ``s3ckpt check --read-data all`` names it; ``prune --policy <keep last 1> --apply`` then
  deletes only step 100 (the damaged 300 is kept, shown damaged, and does not count: the
  newest good, 200, is kept); ``ls --json``, ``prune --json`` and ``report --json`` say so.
* ``load(step="latest")`` skips 300 (known damaged from the check record, or found while
  loading) with a WARNING, and every tensor is then step 200's; ``fallback=False`` raises.
* every failure of ``load`` is an s3ckpt error (an ``Exception``), never torch's
  ``CheckpointException``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.api import CheckpointException

from s3ckpt import Checkpointer
from s3ckpt.cli import main
from s3ckpt.errors import ChecksumMismatchError, CorruptCheckpointError, S3CkptError
from tests._helpers import boto_get, committed_manifest

pytestmark = pytest.mark.integration

STEPS = (100, 200, 300)


def model_at(step: int) -> torch.nn.Module:
    torch.manual_seed(step)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))


@pytest.fixture
def run(bucket: str) -> str:
    url = f"s3://{bucket}/run/"
    with Checkpointer(url) as ckpt:
        for step in STEPS:
            ckpt.save(step, model_at(step))
    return url


def flip_late_item(s3: Any, bucket: str, step: int) -> str:
    """Flip one byte in the last item (by offset) of ``step``'s largest object."""
    prefix = f"run/step_{step:09d}"
    m = committed_manifest(boto_get(s3, bucket), f"{prefix}/")
    item = max(m.records, key=lambda i: (i.object, i.start))
    key = f"{prefix}/{item.object}"
    body = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[item.start + item.length - 20] ^= 0x01
    s3.put_object(Bucket=bucket, Key=key, Body=bytes(body))
    return item.fqn


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_is(model: torch.nn.Module, step: int) -> None:
    want = model_at(step).state_dict()
    for k, v in model.state_dict().items():
        assert torch.equal(v, want[k]), f"{k} is not step {step}'s"


def test_check_then_prune_keeps_the_newest_good_and_every_command_shows_the_damage(
    run: str, bucket: str, s3_client: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    flip_late_item(s3_client, bucket, 300)
    code, _, _ = cli(capsys, "check", run, "--read-data", "all")
    assert code == 1

    policy = tmp_path / "last1.toml"
    policy.write_text("[keep]\nlast = 1\n")
    code, out, err = cli(capsys, "prune", run, "--policy", str(policy), "--json", "--no-progress")
    doc = json.loads(out)
    decisions = {d["name"]: d for d in doc["runs"][0]["decisions"]}
    assert {n: d["action"] for n, d in decisions.items()} == {
        "step_000000100": "delete",
        "step_000000200": "keep",
        "step_000000300": "skip",
    }
    assert (
        decisions["step_000000300"]["damaged"] and decisions["step_000000300"]["life"] == "damaged"
    )
    assert "newest committed" in decisions["step_000000200"]["reasons"]
    assert code == 1 and "damaged checkpoint" in err

    code, out, err = cli(capsys, "prune", run, "--policy", str(policy), "--apply", "--no-progress")
    assert code == 1 and "Traceback" not in err
    rows = {
        ln.split()[0]: ln.split()[2] for ln in out.splitlines() if ln.strip().startswith("step_")
    }
    assert rows["step_000000300"] == "damaged"
    left = {
        o["Key"].split("/")[1]
        for o in s3_client.list_objects_v2(Bucket=bucket, Prefix="run/")["Contents"]
        if o["Key"].endswith("/s3ckpt.json")
    }
    assert left == {"step_000000200", "step_000000300"}  # the good one stays

    code, out, _ = cli(capsys, "ls", run, "--json", "--no-progress")
    listed = {c["name"]: c for c in json.loads(out)["runs"][0]["checkpoints"]}
    assert code == 1 and listed["step_000000300"]["life"] == "damaged"
    assert listed["step_000000200"]["life"] == "committed"
    page = tmp_path / "report.html"
    code, out, _ = cli(capsys, "report", run, "--html", str(page), "--json", "--no-progress")
    summary = json.loads(out)
    assert code == 1 and summary["damaged"] == 1 and ">damaged<" in page.read_text()
    assert [d["name"] for d in summary["per_run"][0]["damaged_checkpoints"]] == ["step_000000300"]


def test_load_latest_skips_a_checkpoint_the_check_found_damaged(
    run: str, bucket: str, s3_client: Any, capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    flip_late_item(s3_client, bucket, 300)
    assert cli(capsys, "check", run, "--read-data", "all")[0] == 1
    model = model_at(0)
    with caplog.at_level(logging.WARNING, logger="s3ckpt"), Checkpointer(run) as ckpt:
        assert ckpt.latest() == 200
        assert ckpt.load(model) == 200
    assert_is(model, 200)
    assert any("skipping step 300" in r.getMessage() for r in caplog.records)
    with Checkpointer(run) as ckpt, pytest.raises(CorruptCheckpointError, match="step 300"):
        ckpt.load(model_at(0), fallback=False)


def test_load_latest_falls_back_past_damage_found_while_loading_and_overwrites_every_tensor(
    run: str, bucket: str, s3_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fqn = flip_late_item(s3_client, bucket, 300)  # no check ran: found only by the load
    model = model_at(0)
    with caplog.at_level(logging.WARNING, logger="s3ckpt"), Checkpointer(run) as ckpt:
        assert ckpt.latest() == 300  # nothing known yet
        assert ckpt.load(model) == 200
    assert_is(model, 200)  # items read from 300 before the bad one are overwritten too
    warned = [r.getMessage() for r in caplog.records if "skipping step 300" in r.getMessage()]
    assert warned and "verification" in warned[0], fqn


def test_fallback_false_keeps_the_strictness_and_every_error_is_an_s3ckpt_exception(
    run: str, bucket: str, s3_client: Any
) -> None:
    flip_late_item(s3_client, bucket, 300)
    model = model_at(0)
    with Checkpointer(run) as ckpt:
        try:
            ckpt.load(model, fallback=False)
        except S3CkptError as exc:  # an Exception: `except Exception` catches it too
            assert isinstance(exc, ChecksumMismatchError), repr(exc)
            assert not isinstance(exc, CheckpointException)
        else:
            raise AssertionError("a damaged checkpoint loaded")
        # a numbered step is read as asked, never replaced by another
        with pytest.raises(ChecksumMismatchError):
            ckpt.load(model_at(0), step=300)


def test_no_good_checkpoint_left_is_an_error_not_a_fresh_start(bucket: str, s3_client: Any) -> None:
    url = f"s3://{bucket}/run/"
    with Checkpointer(url) as ckpt:
        ckpt.save(100, model_at(100))
    flip_late_item(s3_client, bucket, 100)
    with (
        Checkpointer(url) as ckpt,
        pytest.raises(CorruptCheckpointError, match="no good checkpoint"),
    ):
        ckpt.load(model_at(0))


def test_inspect_shows_the_catalogs_state(
    run: str, bucket: str, s3_client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    flip_late_item(s3_client, bucket, 300)
    code, out, _ = cli(capsys, "inspect", f"{run}step_000000300", "--json", "--summary")
    assert code == 0 and json.loads(out)["life"] == "committed"  # nothing known yet
    assert cli(capsys, "check", run, "--read-data", "all")[0] == 1
    code, out, err = cli(capsys, "inspect", f"{run}step_000000300", "--json", "--summary")
    doc = json.loads(out)
    assert code == 1 and doc["life"] == "damaged" and "s3ckpt check" in doc["damage"]
    assert "damaged checkpoint" in err
    code, out, _ = cli(capsys, "inspect", f"{run}step_000000300", "--summary")
    assert code == 1 and "damaged: s3ckpt check" in out
    code, out, _ = cli(capsys, "inspect", f"{run}step_000000200", "--json", "--summary")
    assert (
        code == 0 and json.loads(out)["life"] == "committed" and json.loads(out)["damage"] is None
    )
