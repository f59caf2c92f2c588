"""DCP save/load through S3StorageWriter/Reader against a moto S3 server over HTTP."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from s3ckpt import S3Config, S3StorageReader, S3StorageWriter
from s3ckpt.config import MiB
from s3ckpt.errors import CheckpointExistsError
from tests import _helpers
from tests._helpers import assert_same, list_keys, open_uploads, zeros_like_state
from tests._http import free_port
from tests._spawn import run_ranks
from tests.integration import _workers

pytestmark = pytest.mark.integration

SMALL = dataclasses.replace(_helpers.SMALL, target_object_size=4 * MiB)


def state() -> dict:
    g = torch.Generator().manual_seed(1)
    return {
        "w": torch.randn(768, 1024, generator=g),  # 3 MiB
        "b": torch.randn(1024, generator=g).to(torch.bfloat16),
        "step": 3,
        "opt": {"m": torch.randn(512, 512, generator=g), "lr": 1e-3},
    }


def test_save_load_over_http(bucket: str, s3_client) -> None:  # type: ignore[no-untyped-def]
    url = f"s3://{bucket}/run/step_3"
    sd = state()
    dcp.save(sd, storage_writer=S3StorageWriter(url, transfer_config=SMALL))
    keys = list_keys(s3_client, bucket)
    assert keys[0] == "run/step_3/.metadata" and keys[-1] == "run/step_3/s3ckpt.json"
    assert len(keys) >= 4  # several data objects
    out = zeros_like_state(sd)
    dcp.load(out, storage_reader=S3StorageReader(url, transfer_config=SMALL))
    assert_same(sd, out)
    with pytest.raises(CheckpointExistsError):
        S3StorageWriter(url)
    # Uploads carried CRC32C checksums the server stored.
    head = s3_client.head_object(Bucket=bucket, Key=keys[1], ChecksumMode="ENABLED")
    assert "ChecksumCRC32C" in head


def test_sse_kms_and_storage_class_reach_every_upload(
    bucket: str, s3_client, moto_endpoint: str
) -> None:  # type: ignore[no-untyped-def]
    import boto3

    kms = boto3.client("kms", endpoint_url=moto_endpoint, region_name="us-east-1")
    key_id = kms.create_key()["KeyMetadata"]["KeyId"]
    cfg = S3Config(sse_kms_key_id=key_id, storage_class="STANDARD_IA")
    url = f"s3://{bucket}/enc"
    dcp.save(state(), storage_writer=S3StorageWriter(url, s3_config=cfg, transfer_config=SMALL))
    for key in list_keys(s3_client, bucket, "enc/"):
        head = s3_client.head_object(Bucket=bucket, Key=key)
        assert head.get("ServerSideEncryption") == "aws:kms", key
        assert key_id in head.get("SSEKMSKeyId", ""), key
        assert head.get("StorageClass") == "STANDARD_IA", key


def test_async_save_thread(bucket: str) -> None:
    url = f"s3://{bucket}/async_thread"
    sd = state()
    fut = dcp.async_save(sd, storage_writer=S3StorageWriter(url, transfer_config=SMALL))
    fut.result(timeout=120)
    out = zeros_like_state(sd)
    dcp.load(out, storage_reader=S3StorageReader(url))
    assert_same(sd, out)


def test_writer_pickles_for_the_process_executor(bucket: str) -> None:
    """DCP's process executor ships the writer to a daemon process by pickle: it must
    travel without a live client (or credentials) and work on the other side."""
    import pickle

    url = f"s3://{bucket}/pickled"
    writer = S3StorageWriter(url, transfer_config=SMALL)
    writer.store.head("warm-up")  # creates a client, which must not be pickled
    blob = pickle.dumps(writer)
    assert b"testing" not in blob  # no credentials inside
    clone = pickle.loads(blob)
    sd = state()
    dcp.save(sd, storage_writer=clone)
    out = zeros_like_state(sd)
    dcp.load(out, storage_reader=S3StorageReader(url))
    assert_same(sd, out)


def test_failed_save_leaves_no_object_and_no_upload(bucket: str, s3_client) -> None:  # type: ignore[no-untyped-def]
    url = f"s3://{bucket}/fail"
    writer = S3StorageWriter(url, transfer_config=SMALL)
    store = writer.store
    real_put, real_part = store.put, store.upload_part
    calls = {"n": 0}

    def failing_second(real):  # type: ignore[no-untyped-def]
        def call(key, *args, **kwargs):  # type: ignore[no-untyped-def]
            calls["n"] += 1
            if calls["n"] == 2:
                raise OSError("disk on fire")
            return real(key, *args, **kwargs)

        return call

    # The second data request (a PUT or a part, whichever comes second) fails.
    store.put = failing_second(real_put)  # type: ignore[method-assign]
    store.upload_part = failing_second(real_part)  # type: ignore[method-assign]
    with pytest.raises(CheckpointException, match="disk on fire"):
        dcp.save(state(), storage_writer=writer)
    assert list_keys(s3_client, bucket) == []
    assert open_uploads(s3_client, bucket) == []


@pytest.fixture(scope="module")
def saved_by_two_ranks(moto_endpoint: str) -> str:
    """A checkpoint saved by world size 2 (DTensor shards + per-rank state)."""
    import uuid

    import boto3

    name = f"dist-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_endpoint).create_bucket(Bucket=name)
    url = f"s3://{name}/dist/step_11"
    run_ranks(_workers.save_worker, 2, (2, free_port(), url))
    return url


@pytest.mark.multiprocess
@pytest.mark.timeout(900)
@pytest.mark.parametrize("world", [1, 2, 3])
def test_world_size_2_checkpoint_loads_with_world_size(saved_by_two_ranks: str, world: int) -> None:
    run_ranks(_workers.load_worker, world, (world, free_port(), saved_by_two_ranks, 2))


@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_one_rank_failing_fails_the_save_without_commit(bucket: str, s3_client) -> None:  # type: ignore[no-untyped-def]
    url = f"s3://{bucket}/dist_fail"
    run_ranks(_workers.failing_save_worker, 2, (2, free_port(), url))
    keys = list_keys(s3_client, bucket)
    assert not any(k.endswith(("s3ckpt.json", ".metadata")) for k in keys)
    assert not any(k.startswith("dist_fail/__1_") for k in keys), "the failing rank cleans up"
    assert open_uploads(s3_client, bucket) == []
