"""Issue 37 item 3, the resume that heals, where it runs in more than one process or in a
plug-in, against the moto server (each run a fresh process, tests._spawn):

* the Checkpointer at world size 2 (gloo): a byte flipped in step 3's data, both ranks load
  "latest" and both end at step 2 with equal tensors;
* ``s3ckpt.accelerate``: ``load_state()`` by automatic naming and ``load_latest`` fall back
  past a checkpoint that fails verification while loading, with a WARNING naming it;
  ``use_s3ckpt(fallback=False)`` raises s3ckpt's error instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from s3ckpt import Checkpointer
from tests._helpers import boto_get, committed_manifest
from tests._http import free_port
from tests._spawn import run_ranks
from tests.integration import _heal_workers as workers

pytestmark = [pytest.mark.integration, pytest.mark.multiprocess]


def flip(s3: Any, bucket: str, prefix: str) -> None:
    """Flip one byte of the last item (by offset) of the checkpoint at ``prefix``."""
    m = committed_manifest(boto_get(s3, bucket), f"{prefix}/")
    item = max(m.records, key=lambda i: (i.object, i.start))
    key = f"{prefix}/{item.object}"
    body = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[item.start + item.length - 20] ^= 0x01
    s3.put_object(Bucket=bucket, Key=key, Body=bytes(body))


def same_as(state: dict[str, torch.Tensor], step: int) -> bool:
    want = workers.model_at(step).state_dict()
    return state.keys() == want.keys() and all(torch.equal(state[k], want[k]) for k in want)


@pytest.mark.timeout(240)
def test_both_ranks_fall_back_to_step_2_with_equal_tensors(
    bucket: str, s3_client: Any, tmp_path: Path
) -> None:
    run = f"s3://{bucket}/run/"
    with Checkpointer(run) as ckpt:
        for step in (1, 2, 3):
            ckpt.save(step, workers.model_at(step))
    flip(s3_client, bucket, "run/step_000000003")
    run_ranks(workers.checkpointer_load, 2, (2, free_port(), run, str(tmp_path)))
    results = [json.loads((tmp_path / f"result_{r}.json").read_text()) for r in range(2)]
    assert [r["step"] for r in results] == [2, 2]
    models = [torch.load(tmp_path / f"model_{r}.pt") for r in range(2)]
    assert all(torch.equal(models[0][k], models[1][k]) for k in models[0])
    assert same_as(models[0], 2)
    for r in results:  # each rank says what it skipped and why
        assert any("skipping step 3" in w and "verification" in w for w in r["warned"]), r


@pytest.mark.timeout(240)
def test_accelerate_load_state_and_load_latest_fall_back_past_damage(
    bucket: str, s3_client: Any, tmp_path: Path
) -> None:
    pytest.importorskip("accelerate")
    project = f"s3://{bucket}/acc"
    run_ranks(workers.accelerate_run, 1, (1, free_port(), project, str(tmp_path), "save"))
    flip(s3_client, bucket, "acc/checkpoints/checkpoint_2")
    run_ranks(workers.accelerate_run, 1, (1, free_port(), project, str(tmp_path), "load"))
    result = json.loads((tmp_path / "load.json").read_text())
    assert same_as(torch.load(tmp_path / "load_state.pt"), 200)
    assert any(
        "skipping step 2 " in w and "checkpoint_2" in w and "verification" in w
        for w in result["load_state_warned"]
    ), result
    assert result["load_latest"] == f"{project}/checkpoints/checkpoint_1/"  # as latest()
    assert same_as(torch.load(tmp_path / "load_latest.pt"), 200)
    name, text = result["strict"]
    assert name == "ChecksumMismatchError" and "checkpoint_2" in text, result
