"""s3ckpt.accelerate at the seams users touch next to resume (issue 28, items 8-11):
mid-epoch resume with a stateful data loader equals accelerate's own resume batch for batch;
``skip_first_batches`` resume equals accelerate's own; the step comes back through a
registered object (docs/frameworks/accelerate.md's snippet). Against the moto server, each
run a fresh process (tests._spawn)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests._http import free_port
from tests._spawn import run_ranks
from tests.integration import _accelerate_workers as workers

pytestmark = [pytest.mark.integration]


def _run(phase: str, world: int, mode: str, url: str, local: Path, out: Path) -> list[Any]:
    args = (world, free_port(), mode, url, str(local), str(out), phase)
    run_ranks(workers.resume_worker, world, args)
    return [json.loads((out / f"{phase}_{r}.json").read_text()) for r in range(world)]


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("mode", "world"), [("stateful", 2), ("skip", 1)], ids=["stateful_ddp2", "skip_1rank"]
)
def test_mid_epoch_resume_equals_accelerates_own(
    mode: str, world: int, bucket: str, tmp_path: Path
) -> None:
    url = f"s3://{bucket}/runs/acc/step_{workers.MID}"
    local = tmp_path / "local"
    saved = _run("save", world, mode, url, local, tmp_path)
    resumed = _run("resume", world, mode, url, local, tmp_path)
    for r in range(world):
        via_s3, via_local = resumed[r][url], resumed[r][str(local)]
        per_epoch = workers.RESUME_SAMPLES // (workers.BATCH * world)
        assert len(via_s3) == len(via_local) == 2 * per_epoch - workers.MID
        assert via_s3 == via_local  # batch for batch, and every RNG draw after each
        assert resumed[r][f"step_{url}"] == resumed[r][f"step_{local}"] == workers.MID
        if mode == "stateful":  # exact: the same batches as the run that never stopped
            assert [b[0] for b in via_s3] == [b[0] for b in saved[r]["run"]]
            # (not always the same global draws: the new iterator draws its base seed from
            # torch's RNG again, in accelerate's own resume too; docs/frameworks/accelerate.md)


def _same(a: Any, b: Any, path: str = "") -> None:
    """Equal values of the same types, all the way down (NumPy arrays by dtype and bytes)."""
    import numpy as np
    import torch

    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            _same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), path
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_numpy_state_loads_a_refusal_is_an_s3ckpt_error_and_save_model_goes_to_s3(
    bucket: str, s3_client: Any, tmp_path: Path
) -> None:
    import safetensors.torch
    import torch

    run = f"s3://{bucket}/runs/seams"
    run_ranks(workers.seams_worker, 1, (1, free_port(), run, str(tmp_path)))
    result = json.loads((tmp_path / "seams.json").read_text())

    # Item 9: NumPy arrays, dtypes and scalars load by default, and every value comes back
    # as it was (None leaves, int keys, tuples, an empty dict).
    loaded = torch.load(tmp_path / "loaded.pt", weights_only=False)
    _same(loaded, workers.numpy_state())

    # A class no allow-list knows: s3ckpt's error, an Exception, naming the global.
    name, unsafe, text = result["refused"]
    assert name == "UnsafeCheckpointError" and unsafe, result
    assert "_accelerate_workers.Opaque" in text and "safe_globals=[" in text

    # Item 10: no local "s3:" folder, ever; on S3 accelerate's files, read by safetensors.
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith("s3:")]
    expected = dict(sorted(torch.load(tmp_path / "model.pt").items()))

    def objects(prefix: str) -> dict[str, bytes]:
        keys = s3_client.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]
        return {
            o["Key"].removeprefix(prefix): s3_client.get_object(Bucket=bucket, Key=o["Key"])[
                "Body"
            ].read()
            for o in keys
        }

    sharded = objects("runs/seams/sharded/")
    shards = sorted(n for n in sharded if n.endswith(".safetensors"))
    n = len(shards)  # 100-byte shards of 232 bytes of weights (128 of them one tensor's)
    assert n >= 2 and shards == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    assert sorted(sharded) == [*shards, "model.safetensors.index.json"]
    index = json.loads(sharded["model.safetensors.index.json"])
    weights: dict[str, Any] = {}
    for shard in shards:
        part = safetensors.torch.load(sharded[shard])
        assert all(index["weight_map"][k] == shard for k in part)
        weights.update(part)
    _same(dict(sorted(weights.items())), expected)
    # Saved again as one file over the shards: the shards and the index are gone.
    single = objects("runs/seams/export/")
    assert list(single) == ["model.safetensors"]
    _same(dict(sorted(safetensors.torch.load(single["model.safetensors"]).items())), expected)
