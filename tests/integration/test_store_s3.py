"""S3Store against moto over HTTP: semantics, error mapping, bad input, injected faults."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed.checkpoint as dcp

from s3ckpt import CheckpointNotFoundError, S3Config, S3StorageReader, S3StorageWriter
from s3ckpt.config import MiB
from s3ckpt.errors import (
    AccessDeniedError,
    EndpointError,
    InvalidURLError,
    NoSuchBucketError,
    PreconditionFailedError,
)
from s3ckpt.store.s3 import S3Store
from tests._helpers import SMALL, assert_same, list_keys, open_uploads, zeros_like_state
from tests._http import free_port
from tests.faultproxy import FaultProxy

pytestmark = pytest.mark.integration


def test_store_semantics(bucket: str, s3_client) -> None:  # type: ignore[no-untyped-def]
    store = S3Store(bucket)
    store.put("a/x", b"hello")
    with pytest.raises(PreconditionFailedError) as info:
        store.put("a/x", b"again", if_none_match=True)
    assert info.value.key == "a/x" and info.value.bucket == bucket
    assert store.get("a/x") == b"hello"
    assert store.head("a/missing") is None
    uid = store.create_multipart("a/big")
    p2 = store.upload_part("a/big", uid, 2, b"tail")
    p1 = store.upload_part("a/big", uid, 1, bytearray(5 * MiB))
    assert [u.key for u in store.list_multipart_uploads("a/")] == ["a/big"]
    store.complete_multipart("a/big", uid, [p2, p1])
    assert store.head("a/big").size == 5 * MiB + 4  # type: ignore[union-attr]
    r = store.open_range("a/big", 5 * MiB, 10)  # clipped at the end
    buf = bytearray(10)
    n = r.readinto(memoryview(buf))
    assert bytes(buf[:n]) == b"tail"
    # Paged listing and batched deletes (small pages so the test stays fast).
    paged = S3Store(bucket, page_size=7, delete_batch_size=5)
    for i in range(23):
        s3_client.put_object(Bucket=bucket, Key=f"many/{i:05d}", Body=b"")
    assert [o.key for o in paged.list("many/")] == [f"many/{i:05d}" for i in range(23)]
    assert list(paged.list_prefixes("")) == ["a/", "many/"]
    assert paged.delete([f"many/{i:05d}" for i in range(23)]) == []
    assert list_keys(s3_client, bucket, "many/") == []


def test_missing_bucket_names_bucket_and_what_to_check(moto_endpoint: str) -> None:
    with pytest.raises(NoSuchBucketError) as info:
        S3StorageWriter("s3://no-such-bucket-here/run/1")
    msg = str(info.value)
    assert "no-such-bucket-here" in msg and "endpoint" in msg.lower()
    with pytest.raises((NoSuchBucketError, CheckpointNotFoundError)):
        S3StorageReader("s3://no-such-bucket-here/run/1")


def test_malformed_url() -> None:
    with pytest.raises(InvalidURLError, match="s3://BUCKET/PREFIX"):
        S3StorageWriter("not-a-url")
    with pytest.raises(InvalidURLError, match="bucket name"):
        S3StorageReader("s3://UPPER_case/x")


@pytest.mark.parametrize(
    "endpoint",
    [
        # The port is picked when the test runs, so the id is the same in every
        # pytest-xdist worker's collection.
        pytest.param("http://127.0.0.1:{port}", id="http://127.0.0.1:PORT"),
        "http://no-such-host.invalid:9000",
    ],
)
def test_unreachable_endpoint_fails_without_retrying(endpoint: str) -> None:
    """A refused connection or an unknown host is not retried: no back-off sleep at all."""
    endpoint = endpoint.format(port=free_port())  # nothing listens there
    sleeps: list[float] = []
    store = S3Store("some-bucket", S3Config(endpoint_url=endpoint), sleep=sleeps.append)
    with pytest.raises(EndpointError) as info:
        store.get("run/s3ckpt.json")
    assert sleeps == []
    host = endpoint.split("//")[1].split(":")[0]
    assert host in str(info.value) and "some-bucket" in str(info.value)
    assert "endpoint_url" in str(info.value)
    # The public entry points raise the same error directly.
    with pytest.raises(EndpointError):
        S3StorageWriter("s3://some-bucket/run", s3_config=S3Config(endpoint_url=endpoint))


def test_missing_credentials(monkeypatch: pytest.MonkeyPatch, bucket: str) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(AccessDeniedError, match="AWS_ACCESS_KEY_ID"):
        S3StorageWriter(f"s3://{bucket}/run")


@pytest.fixture(scope="module")
def auth_endpoint():  # type: ignore[no-untyped-def]
    """A moto server that checks credentials (IAM enforcement on), in its own process."""
    port = free_port()
    env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="0")
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.2)
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_wrong_credentials(auth_endpoint: str) -> None:
    cfg = S3Config(endpoint_url=auth_endpoint)
    with pytest.raises(AccessDeniedError) as info:
        S3StorageWriter("s3://any-bucket/run", s3_config=cfg)
    assert "any-bucket" in str(info.value)
    assert "AWS_ACCESS_KEY_ID" in str(info.value) or "credentials" in str(info.value)


def _state() -> dict:
    g = torch.Generator().manual_seed(5)
    sd: dict = {f"layer{i}.w": torch.randn(256, 256, generator=g) for i in range(24)}  # 6 MiB
    # 16 MiB: multipart, and at 5 MiB parts whole parts are sent from the tensor's own memory
    sd["big"] = torch.randn(4096, 1024, generator=g)
    sd["meta"] = {"step": 9}
    return sd


def test_save_and_load_through_20_percent_faults(
    bucket: str, moto_endpoint: str, s3_client
) -> None:  # type: ignore[no-untyped-def]
    """503 SlowDown, 500s, resets and mid-body resets on ~20 % of requests."""
    tc = dataclasses.replace(
        SMALL,
        target_object_size=4 * MiB,
        read_request_size=3 * MiB,
        max_attempts=12,
        retry_initial_delay=0.01,
        retry_max_delay=0.2,
    )
    sd = _state()
    with FaultProxy(moto_endpoint, fault_rate=0.2, seed=7) as proxy:
        cfg = S3Config(endpoint_url=proxy.endpoint_url)
        url = f"s3://{bucket}/faulty/step_9"
        dcp.save(sd, storage_writer=S3StorageWriter(url, s3_config=cfg, transfer_config=tc))
        out = zeros_like_state(sd)
        dcp.load(out, storage_reader=S3StorageReader(url, s3_config=cfg, transfer_config=tc))
        stats = proxy.stats
    assert_same(sd, out)
    injected = sum(stats.get(k, 0) for k in ("slowdown", "internal", "reset", "reset_mid_body"))
    assert injected >= 5, stats
    assert open_uploads(s3_client, bucket) == []
