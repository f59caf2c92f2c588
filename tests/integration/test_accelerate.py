"""s3ckpt.accelerate against the moto server: ``accelerator.save_state("s3://...")`` during
training with a retention policy pruning, then ``load_state`` in fresh processes resumes
exactly (every tensor equal, the same losses), on one rank, two DDP ranks and two FSDP2
ranks (gloo). The workers run with s3fs blocked (tests/no_s3fs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from s3ckpt.store import Location
from tests._http import free_port
from tests._spawn import run_ranks
from tests.integration import _accelerate_workers as workers

pytestmark = [pytest.mark.integration]

EPOCHS = 4


def _train(world: int, mode: str, run: str, out: Path, resume_step: int | None = None) -> Any:
    out.mkdir(parents=True)
    every = 2 * workers.steps_per_epoch(world)
    args = (world, free_port(), mode, run, EPOCHS, resume_step, every, str(out))
    run_ranks(workers.train_worker, world, args)
    results = [json.loads((out / f"result_{r}.json").read_text()) for r in range(world)]
    snaps = [torch.load(out / f"snaps_{r}.pt", weights_only=False) for r in range(world)]
    return results, snaps


def _assert_identical(a: Any, b: Any, path: str = "") -> None:
    """Every tensor equal bit for bit (torch.equal), every other value equal."""
    if isinstance(a, dict):
        assert set(a) == set(b), f"{path}: keys differ: {set(a) ^ set(b)}"
        for k in a:
            _assert_identical(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_identical(x, y, f"{path}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(a, b), f"{path} differs"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def _committed(run: str) -> dict[str, int | None]:
    from s3ckpt.retention import list_checkpoints
    from s3ckpt.retention._catalog import CheckpointState
    from s3ckpt.store import open_store

    store, url = open_store(run)
    return {
        c.name: c.step
        for c in list_checkpoints(Location.of(url, store=store))
        if c.state == CheckpointState.COMMITTED
    }


def _load_model(url: str, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The ``model`` entry of a checkpoint, loaded in this process (one rank: DCP gathers
    FSDP shards into whole tensors)."""
    import torch.distributed.checkpoint as dcp

    from s3ckpt.dcp import S3StorageReader, quiet_dcp

    sd = {"model": {k: torch.empty_like(v) for k, v in like.items()}}
    with quiet_dcp():
        dcp.load(sd, storage_reader=S3StorageReader(url))
    return sd["model"]


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("world", "mode"), [(1, "single"), (2, "ddp"), (2, "fsdp")], ids=["1rank", "ddp2", "fsdp2"]
)
def test_resume_in_a_fresh_process_is_exact(
    world: int,
    mode: str,
    bucket: str,
    s3_client: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = f"s3://{bucket}/runs/acc"
    spe = workers.steps_per_epoch(world)
    middle, last = 2 * spe, EPOCHS * spe

    first, first_snaps = _train(world, mode, run, tmp_path / "first")
    # Saved at every epoch's end; KeepLast(1) | KeepEvery(2 epochs) pruned the others while
    # training ran. The step is the manifest's (s3ckpt.json), as every rank agreed.
    assert _committed(run) == {f"step_{middle}": middle, f"step_{last}": last}
    marker = s3_client.get_object(Bucket=bucket, Key=f"runs/acc/step_{middle}/s3ckpt.json")
    manifest = json.loads(marker["Body"].read())
    assert manifest["step"] == middle and manifest["world_size"] == world
    assert first[0]["latest"] is None
    assert first[0]["hooks"] == [f"save {run}/step_{s}/" for s in range(spe, last + 1, spe)]

    # Fresh processes resume from the middle checkpoint and run to the end: the state right
    # after load_state is the state the save captured, and training goes on identically.
    resumed, resumed_snaps = _train(world, mode, run, tmp_path / "resumed", resume_step=middle)
    assert resumed[0]["latest"] == f"{run}/step_{last}/"
    for r in range(world):
        _assert_identical(resumed_snaps[r]["resumed"], first_snaps[r][f"step_{middle}"])
        _assert_identical(resumed_snaps[r][f"step_{last}"], first_snaps[r][f"step_{last}"])
        tail = {s: first[r]["losses"][str(s)] for s in range(middle + 1, last + 1)}
        assert {int(s): v for s, v in resumed[r]["losses"].items()} == tail

    # The resumed run saved step_{last} again over the committed one (a safe overwrite) and
    # step_{middle + spe} anew, which retention pruned again.
    assert _committed(run) == {f"step_{middle}": middle, f"step_{last}": last}
    final = [s[f"step_{last}"]["model"] for s in first_snaps]
    whole = {
        k: torch.cat([f[k] for f in final]) if mode == "fsdp" else final[0][k] for k in final[0]
    }
    _assert_identical(_load_model(f"{run}/step_{last}", whole), whole)

    from s3ckpt.cli import main

    capsys.readouterr()
    assert main(["ls", run]) == 0
    listing = capsys.readouterr().out
    rows = [line.split() for line in listing.splitlines() if "step_" in line]
    assert [row[:2] for row in rows] == [
        [f"step_{middle}", str(middle)],
        [f"step_{last}", str(last)],
    ], listing
