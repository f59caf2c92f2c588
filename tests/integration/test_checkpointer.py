"""Checkpointer against the moto server over HTTP: FSDP2 on world size 2 (gloo, spawn),
resumed on world sizes 1 and 2; a process killed during an async save."""

from __future__ import annotations

import json
import signal
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest
import torch

from tests._helpers import list_keys, open_uploads
from tests._http import free_port
from tests._spawn import event, run_ranks, start_process
from tests.integration import _ckpt_workers

pytestmark = [pytest.mark.integration]

TOTAL = 6
SAVE_AT = [2, 4]


def _train(world: int, url: str, out: Path, *, resume: bool) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    save_at = [] if resume else SAVE_AT
    args = (world, free_port(), url, TOTAL, save_at, resume, str(out))
    run_ranks(_ckpt_workers.train_worker, world, args)
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    result["losses"] = {int(k): v for k, v in result["losses"].items()}
    return result


def _assert_same_state(a: dict[str, Any], b: dict[str, Any], *, exact: bool) -> None:
    def walk(x: Any, y: Any, path: str) -> None:
        if isinstance(x, dict):
            assert set(x) == set(y), f"{path}: keys differ: {set(x) ^ set(y)}"
            for k in x:
                walk(x[k], y[k], f"{path}.{k}")
        elif isinstance(x, (list, tuple)):
            assert len(x) == len(y), path
            for i, (u, v) in enumerate(zip(x, y, strict=False)):
                walk(u, v, f"{path}[{i}]")
        elif isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and x.shape == y.shape, path
            if exact:
                assert torch.equal(x, y), f"{path} differs"
            else:
                torch.testing.assert_close(x, y, msg=path)
        else:
            assert x == y, f"{path}: {x!r} != {y!r}"

    walk(a, b, "")


@pytest.fixture(scope="module")
def uninterrupted(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """World size 2, FSDP2: train TOTAL steps with async saves at SAVE_AT."""
    s3 = boto3.client("s3", endpoint_url=moto_endpoint)
    name = f"ckpt-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    url = f"s3://{name}/runs/fsdp"
    out = tmp_path_factory.mktemp("uninterrupted")
    result = _train(2, url, out, resume=False)
    return {"url": url, "out": out, "result": result, "bucket": name, "client": s3}


@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_async_saves_commit_and_point_latest(uninterrupted: dict[str, Any]) -> None:
    s3, bucket = uninterrupted["client"], uninterrupted["bucket"]
    keys = list_keys(s3, bucket, "runs/fsdp/")
    for step in SAVE_AT:
        assert f"runs/fsdp/step_{step:09d}/s3ckpt.json" in keys
    body = s3.get_object(Bucket=bucket, Key="runs/fsdp/s3ckpt.latest.json")["Body"].read()
    pointer = json.loads(body)
    assert pointer["step"] == SAVE_AT[-1]
    assert open_uploads(s3, bucket, "runs/fsdp/") == []
    blocked = uninterrupted["result"]["blocked"]
    assert set(int(k) for k in blocked) == set(SAVE_AT)
    assert all(v is not None and v >= 0 for v in blocked.values())


@pytest.mark.multiprocess
@pytest.mark.timeout(900)
@pytest.mark.parametrize("world", [2, 1])
def test_fsdp2_resume_matches_uninterrupted_run(
    uninterrupted: dict[str, Any], world: int, tmp_path: Path
) -> None:
    resumed = _train(world, uninterrupted["url"], tmp_path, resume=True)
    last = SAVE_AT[-1]
    assert resumed["resumed_from"] == last
    # Model and optimizer state right after the resume equal the saved run's at that step
    # (gathered to full tensors on both sides), bit for bit, on either world size.
    saved = torch.load(uninterrupted["out"] / f"state_{last}.pt", weights_only=True)
    loaded = torch.load(tmp_path / f"state_{last}.pt", weights_only=True)
    _assert_same_state(saved, loaded, exact=True)
    # The resumed run's next losses are the uninterrupted run's: bit-identical on the same
    # world size; within float tolerance on another (the reductions differ).
    expected = {s: uninterrupted["result"]["losses"][s] for s in range(last + 1, TOTAL + 1)}
    assert set(resumed["losses"]) == set(expected)
    for s, v in expected.items():
        if world == 2:
            assert resumed["losses"][s] == v, (s, resumed["losses"][s], v)
        else:
            assert resumed["losses"][s] == pytest.approx(v, rel=1e-5, abs=1e-7)


@pytest.mark.timeout(300)
def test_process_killed_during_async_save_resumes_from_previous_commit(
    bucket: str, s3_client: Any, moto_endpoint: str
) -> None:
    url = f"s3://{bucket}/runs/killed"
    uploading = event()
    child = start_process(_ckpt_workers.kill_child, (url, uploading))
    try:
        if not uploading.wait(240):
            pytest.fail(f"child never reached the upload of step 2 (exit code {child.exitcode})")
        child.kill()  # SIGKILL, in the middle of the async upload
    finally:
        child.kill()
        child.join(30)
    assert child.exitcode == -signal.SIGKILL
    keys = list_keys(s3_client, bucket, "runs/killed/")
    assert "runs/killed/step_000000001/s3ckpt.json" in keys
    assert "runs/killed/step_000000002/s3ckpt.json" not in keys
    # The killed upload was open when the process died (gc aborts it later).
    assert open_uploads(s3_client, bucket, "runs/killed/step_000000002/")

    from s3ckpt import Checkpointer

    model = torch.nn.Linear(1024, 4096)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ts = _ckpt_workers.TrainState()
    with Checkpointer(url) as ckpt:
        assert ckpt.latest() == 1
        assert ckpt.load(model, opt, ts) == 1
    assert ts.step == 1
    torch.manual_seed(0)
    expected = torch.nn.Linear(1024, 4096)
    assert torch.equal(model.weight, expected.weight)
