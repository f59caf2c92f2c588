"""Hashed key prefixes against the moto S3 server over HTTP: a save by two gloo ranks lands in
the run's shard folders, loads on one rank, passes ``s3ckpt verify``, is listed with its
shards by ``s3ckpt ls``, and ``s3ckpt rm`` removes every object it wrote."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed.checkpoint as dcp

from s3ckpt import S3StorageReader
from s3ckpt.cli import main
from s3ckpt.format._names import MANIFEST_NAME, SHARDS_DIR
from tests._helpers import list_keys
from tests._http import free_port
from tests._spawn import run_ranks
from tests.integration import _workers

pytestmark = pytest.mark.integration


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_two_rank_hashed_save_loads_verifies_lists_and_is_removed_by_rm(
    bucket: str,
    s3_client,  # type: ignore[no-untyped-def]
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = f"s3://{bucket}/runs/a/"
    url = run + "step_000000011"
    run_ranks(_workers.save_worker, 2, (2, free_port(), url, 4))
    keys = list_keys(s3_client, bucket)
    data = [k for k in keys if k.startswith(f"runs/a/{SHARDS_DIR}/")]
    assert {k.rsplit("/", 2)[1] for k in data} == {"step_000000011"}
    assert {k.split("/")[3] for k in data} <= {"0", "1", "2", "3"}
    assert {k.rpartition("/")[2][:4] for k in data} == {"__0_", "__1_"}  # both ranks' objects
    assert all(k.endswith(".shard") for k in data) and not any(".distcp" in k for k in keys)
    marker = json.loads(
        s3_client.get_object(Bucket=bucket, Key=f"runs/a/step_000000011/{MANIFEST_NAME}")[
            "Body"
        ].read()
    )
    assert (marker["format_version"], marker["layout"]["fanout"]) == (4, 4)

    # Saved by two ranks (DTensor shards), loaded whole by one process.
    sd = {
        "model.w": torch.zeros(_workers.FULL_SHAPE),
        "model.i": torch.zeros(100, dtype=torch.int64),
        "replicated": torch.zeros(4),
        "rank0.state": torch.zeros(5, 3),
        "rank1.state": torch.zeros(5, 3),
        "step": 0,
    }
    dcp.load(sd, storage_reader=S3StorageReader(url), no_dist=True)
    assert torch.equal(sd["model.w"], _workers.full_tensor())
    assert torch.equal(sd["model.i"], _workers.full_int()) and sd["step"] == 11
    assert all(torch.equal(sd[f"rank{r}.state"], _workers.rank_tensor(r)) for r in range(2))

    assert main(["verify", url]) == 0
    capsys.readouterr()
    assert main(["ls", run, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["run"] for r in listed["runs"]] == [run]  # s3ckpt-shards/ is no run
    (ckpt,) = listed["runs"][0]["checkpoints"]
    sizes = {o["Key"]: o["Size"] for o in s3_client.list_objects_v2(Bucket=bucket)["Contents"]}
    assert ckpt["size"] == sum(sizes.values()) and ckpt["num_objects"] == len(sizes)

    assert main(["rm", url, "--allow-newest"]) == 0
    assert [k for k in list_keys(s3_client, bucket) if not k.endswith("s3ckpt.lease")] == []
