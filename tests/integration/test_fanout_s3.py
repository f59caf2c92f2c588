"""Fan-out load (``S3StorageReader(fan_out=True)``): ranks that load the same stored items
read each byte range once per group and share it over gloo.

GET requests are counted on the wire by a :class:`~s3ckpt.testing.FaultProxy` (no faults)
in front of moto; every rank checks the values it loaded and writes its counters (or the
error it raised) to a file the test reads.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from s3ckpt import S3StorageReader, S3StorageWriter, TransferConfig
from s3ckpt.config import KiB
from tests._http import free_port
from tests._spawn import run_ranks
from tests.faultproxy import FaultProxy
from tests.integration import _fanout_workers as fw
from tests.integration import _workers

pytestmark = [pytest.mark.integration, pytest.mark.multiprocess]

WORLD = 4


class Gets:
    """GetObject requests seen by the proxy, by key."""

    def __init__(self) -> None:
        self.by_key: Counter[str] = Counter()
        self._lock = threading.Lock()

    def hook(self, op: str, key: str, phase: str) -> None:
        if phase == "before" and op == "GetObject":
            with self._lock:
                self.by_key[key] += 1

    def data(self) -> int:
        """GETs of data objects (not the marker nor ``.metadata``)."""
        return sum(n for k, n in self.by_key.items() if k.endswith(".distcp"))

    def reset(self) -> None:
        with self._lock:
            self.by_key.clear()


@pytest.fixture
def gets(moto_endpoint: str) -> Iterator[dict[str, tuple[Gets, str]]]:
    """Two counting proxies, ``direct`` and ``fan_out``: ``(counter, endpoint)`` each."""
    direct, fan_out = Gets(), Gets()
    with (
        FaultProxy(moto_endpoint, fault_rate=0.0, hook=direct.hook) as p1,
        FaultProxy(moto_endpoint, fault_rate=0.0, hook=fan_out.hook) as p2,
    ):
        yield {"direct": (direct, p1.endpoint_url), "fan_out": (fan_out, p2.endpoint_url)}


def _save_replicated(url: str) -> None:
    """The replicated state dict, 2 MiB in 4 objects (one process, as DDP's rank 0 saves)."""
    tc = TransferConfig(target_object_size=512 * KiB)
    dcp.save(
        fw.replicated_state(),
        storage_writer=S3StorageWriter(url, transfer_config=tc),
        no_dist=True,
    )


def _records(out: Path) -> list[dict[str, Any]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.timeout(120)
def test_replicated_load_reads_each_byte_once_per_group(
    bucket: str, s3_client: Any, gets: dict[str, tuple[Gets, str]], tmp_path: Path
) -> None:
    url = f"s3://{bucket}/dp/step_42"
    _save_replicated(url)
    objects = len(_data_keys(s3_client, bucket, "dp/"))
    endpoints = {mode: endpoint for mode, (_, endpoint) in gets.items()}
    run_ranks(fw.replicated_load_worker, WORLD, (WORLD, free_port(), url, endpoints, str(tmp_path)))
    records = _records(tmp_path)
    count = {mode: seen.data() for mode, (seen, _) in gets.items()}
    read = {mode: sum(r[mode]["bytes_read"] for r in records) for mode in gets}
    # Direct: every rank GETs each object. Fan-out: each byte once for the group, in pieces
    # cut at object boundaries where they can be.
    assert objects >= 4 and count["direct"] == objects * WORLD, (objects, count)
    assert 1 <= count["fan_out"] <= count["direct"] // 3, count
    assert read["fan_out"] <= read["direct"] // 3, read
    assert all(r["direct"]["received"] == 0 for r in records), records
    # 2 MiB is one piece (pieces are no smaller than 8 MiB): one rank reads, three receive.
    assert sorted(r["fan_out"]["received"] > 0 for r in records) == [False] + [True] * 3


@pytest.fixture(scope="module")
def saved_by_two_ranks(moto_endpoint: str) -> str:
    """A checkpoint saved by world size 2 (DTensor shards, a replicated tensor, per-rank
    state, an int)."""
    import boto3

    name = f"fanout-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_endpoint).create_bucket(Bucket=name)
    url = f"s3://{name}/dist/step_11"
    run_ranks(_workers.save_worker, 2, (2, free_port(), url))
    return url


@pytest.mark.timeout(120)
def test_checkpoint_saved_on_two_ranks_loads_on_four_with_fan_out(
    saved_by_two_ranks: str, tmp_path: Path
) -> None:
    # 1 KiB pieces: many rounds, items cut across pieces and owners.
    args = (WORLD, free_port(), saved_by_two_ranks, 2, 1 * KiB, str(tmp_path))
    run_ranks(fw.resharded_load_worker, WORLD, args)
    records = _records(tmp_path)
    assert all(r["received"] > 0 for r in records), records


def test_fan_out_without_a_process_group_reads_directly(
    bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"s3://{bucket}/one/step_42"
    _save_replicated(url)
    sd = fw.blank_replicated()
    reader = S3StorageReader(url, fan_out=True)
    with caplog.at_level(logging.DEBUG, logger="s3ckpt.dcp._fanout"):
        dcp.load(sd, storage_reader=reader)
    assert "fan_out=True but no process group is initialised" in caplog.text
    assert torch.equal(sd["layer3.w"], fw.replicated_state()["layer3.w"])
    assert sd["train_state"] == {"lr": 0.125, "tokens": [1, 2, 3]}
    assert reader.bytes_received == 0 and reader.bytes_read > 0


def _corrupt(s3_client: Any, bucket: str, key: str, at: int) -> None:
    body = bytearray(s3_client.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[at] ^= 0xFF
    s3_client.put_object(Bucket=bucket, Key=key, Body=bytes(body))


def _data_keys(s3_client: Any, bucket: str, prefix: str) -> list[str]:
    listing = s3_client.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]
    return sorted(o["Key"] for o in listing if o["Key"].endswith(".distcp"))


@pytest.mark.timeout(60)
def test_a_corrupted_item_fails_every_rank(bucket: str, s3_client: Any, tmp_path: Path) -> None:
    url = f"s3://{bucket}/bad/step_42"
    _save_replicated(url)
    key = _data_keys(s3_client, bucket, "bad/")[1]
    storage = S3StorageReader(url).read_metadata().storage_data
    fqn = next(i.fqn for i, s in storage.items() if key.endswith(s.relative_path) and s.offset == 0)
    _corrupt(s3_client, bucket, key, at=200 * KiB)  # inside the bytes of its first tensor
    # Ranks 0 and 1 load the damaged item (and find the mismatch); 2 and 3 do not load it.
    args = (WORLD, free_port(), url, 64 * KiB, None, (2, fqn), str(tmp_path))
    run_ranks(fw.failing_load_worker, WORLD, args)
    mismatch = f"ChecksumMismatchError: checksum mismatch in {fqn!r}"
    relayed = (
        "ChecksumMismatchError: rank 0 failed in a fan-out load (it reads for the whole "
        f"group): checksum mismatch in {fqn!r}"
    )
    for rank, rec in enumerate(_records(tmp_path)):
        failures = rec["failures"]
        assert failures and set(failures) == {"0", "1", "2", "3"}, (rank, failures)
        for r, msg in failures.items():
            assert msg.startswith(mismatch if r in "01" else relayed), (r, msg)
            assert f"s3://{bucket}/{key}" in msg, msg


@pytest.mark.timeout(60)
def test_a_rank_that_cannot_read_fails_every_rank(bucket: str, tmp_path: Path) -> None:
    url = f"s3://{bucket}/refused/step_42"
    _save_replicated(url)
    args = (WORLD, free_port(), url, 64 * KiB, 2, None, str(tmp_path))
    run_ranks(fw.failing_load_worker, WORLD, args)
    for rank, rec in enumerate(_records(tmp_path)):
        failures = rec["failures"]
        assert failures and set(failures) == {str(r) for r in range(WORLD)}, (rank, failures)
        assert failures["2"].startswith("EndpointError: simulated: connection refused"), failures
        for r in (0, 1, 3):
            msg = failures[str(r)]
            assert msg.startswith("EndpointError: rank 2 failed in a fan-out load"), msg
            assert f"s3://{bucket}/refused/step_42/__0_" in msg and "rank 2]" in msg, msg


@pytest.mark.timeout(120)
def test_checkpointer_load_with_fan_out_reads_the_data_once(
    bucket: str, gets: dict[str, tuple[Gets, str]]
) -> None:
    seen, endpoint = gets["fan_out"]
    run_ranks(fw.checkpointer_worker, WORLD, (WORLD, free_port(), f"s3://{bucket}/ddp", endpoint))
    data = {k: n for k, n in seen.by_key.items() if k.endswith(".distcp")}
    # Each object GET once for the four ranks (reading directly: once per rank). The worker
    # saves with verify_after_write=False: on moto the save's own re-read of its data
    # (auto-on where a store accepts a wrong CRC32C) would add one GET per object here.
    assert data and set(data.values()) == {1}, data
