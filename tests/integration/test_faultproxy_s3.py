"""The fault-injecting reverse proxy, :class:`s3ckpt.testing.FaultProxy`, in front of a
real moto S3 server (``ThreadedMotoServer``) driven through boto3: relaying every request a
checkpoint sends, each random fault kind as boto3 meets it, botocore's retries through a fault
mix, and a prompt ``stop()``. Arms, hooks, lost replies and stalls against moto:
``test_faultproxy_arms_s3.py``.

The proxy's tests that need no S3 server (framing, classification, arming, fault replies
byte for byte, argument checks) are unit tests: ``tests/unit/test_faultproxy_*.py``.
"""

from __future__ import annotations

import base64
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import botocore.exceptions as bexc
import botocore.retries.standard
import crc32c
import pytest

from tests.faultproxy import FAULT_KINDS, FaultProxy
from tests.integration._faultproxy_moto import (
    BODY_ERRORS,
    CONNECTION_ERRORS,
    PROMPT,
    make_client,
    moto_server,
    new_bucket,
)

pytestmark = pytest.mark.integration

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with moto_server() as url:
        yield url


def crc32c_b64(data: bytes) -> str:
    return base64.b64encode(crc32c.crc32c(data).to_bytes(4, "big")).decode()


def test_passthrough_s3_operations(moto_url: str) -> None:
    with FaultProxy(moto_url, fault_rate=0.0) as proxy:
        s3 = make_client(proxy.endpoint_url)
        bucket = f"fp-{uuid.uuid4().hex[:12]}"
        s3.create_bucket(Bucket=bucket)

        small = os.urandom(300_000)
        s3.put_object(Bucket=bucket, Key="small", Body=small)

        parts_data = [os.urandom(5 * MiB), os.urandom(1 * MiB)]
        mpu = s3.create_multipart_upload(Bucket=bucket, Key="big", ChecksumAlgorithm="CRC32C")
        parts = []
        for number, data in enumerate(parts_data, start=1):
            resp = s3.upload_part(
                Bucket=bucket,
                Key="big",
                UploadId=mpu["UploadId"],
                PartNumber=number,
                Body=data,
                ChecksumAlgorithm="CRC32C",
                ChecksumCRC32C=crc32c_b64(data),
            )
            assert resp["ChecksumCRC32C"] == crc32c_b64(data)
            parts.append(
                {
                    "PartNumber": number,
                    "ETag": resp["ETag"],
                    "ChecksumCRC32C": resp["ChecksumCRC32C"],
                }
            )
        s3.complete_multipart_upload(
            Bucket=bucket,
            Key="big",
            UploadId=mpu["UploadId"],
            MultipartUpload={"Parts": parts},
        )
        big = b"".join(parts_data)

        assert s3.get_object(Bucket=bucket, Key="small")["Body"].read() == small
        assert s3.get_object(Bucket=bucket, Key="big")["Body"].read() == big
        ranged = s3.get_object(Bucket=bucket, Key="big", Range="bytes=5242870-5242889")
        assert ranged["ContentLength"] == 20
        assert ranged["Body"].read() == big[5242870:5242890]
        head = s3.head_object(Bucket=bucket, Key="big")
        assert head["ContentLength"] == len(big)
        listed = s3.list_objects_v2(Bucket=bucket)
        assert sorted(o["Key"] for o in listed["Contents"]) == ["big", "small"]
        deleted = s3.delete_objects(
            Bucket=bucket,
            Delete={"Objects": [{"Key": "big"}, {"Key": "small"}], "Quiet": False},
        )
        assert sorted(d["Key"] for d in deleted["Deleted"]) == ["big", "small"]
        assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0

        stats = proxy.stats
        assert stats["faults"] == 0
        assert stats["requests"] == stats["forwarded"] >= 12


@pytest.mark.parametrize(
    ("kind", "code"), [("slowdown", "SlowDown"), ("internal", "InternalError")]
)
def test_error_faults(moto_url: str, kind: str, code: str) -> None:
    bucket = new_bucket(moto_url)
    with FaultProxy(moto_url, fault_rate=1.0, faults=[kind]) as proxy:
        s3 = make_client(proxy.endpoint_url)
        with pytest.raises(bexc.ClientError) as info:
            s3.put_object(Bucket=bucket, Key="k", Body=b"payload" * 1000)
        assert info.value.response["Error"]["Code"] == code
        with pytest.raises(bexc.ClientError) as info:
            s3.get_object(Bucket=bucket, Key="k")
        assert info.value.response["Error"]["Code"] == code
        # The connection stays usable (keep-alive) after an injected error.
        proxy.set_fault_rate(0.0)
        s3.put_object(Bucket=bucket, Key="k", Body=b"ok")
        assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"ok"
        stats = proxy.stats
    assert stats[kind] == 2
    assert stats["faults"] == 2
    assert stats["requests"] == 4
    assert stats["forwarded"] == 2


def test_reset_fault(moto_url: str) -> None:
    bucket = new_bucket(moto_url)
    with FaultProxy(moto_url, fault_rate=1.0, faults=["reset"]) as proxy:
        s3 = make_client(proxy.endpoint_url)
        with pytest.raises(CONNECTION_ERRORS):
            s3.put_object(Bucket=bucket, Key="k", Body=os.urandom(200_000))
        with pytest.raises(CONNECTION_ERRORS):
            s3.get_object(Bucket=bucket, Key="k")
        assert proxy.stats["reset"] == 2
        assert proxy.stats["forwarded"] == 0
    # Nothing reached the server.
    assert make_client(moto_url).list_objects_v2(Bucket=bucket)["KeyCount"] == 0


def test_reset_mid_body_fault(moto_url: str) -> None:
    bucket = new_bucket(moto_url)
    data = os.urandom(512 * 1024)
    with FaultProxy(moto_url, fault_rate=1.0, faults=["reset_mid_body"]) as proxy:
        s3 = make_client(proxy.endpoint_url)
        # PUT/HEAD responses have no body: delivered normally, not counted.
        s3.put_object(Bucket=bucket, Key="k", Body=data)
        assert s3.head_object(Bucket=bucket, Key="k")["ContentLength"] == len(data)
        assert proxy.stats["reset_mid_body"] == 0

        for _ in range(3):
            try:
                resp = s3.get_object(Bucket=bucket, Key="k")
            except CONNECTION_ERRORS:
                continue  # also acceptable, but never silent corruption
            assert resp["ContentLength"] == len(data)
            try:
                got = resp["Body"].read()
            except BODY_ERRORS:
                continue
            # If no exception surfaced, the data must visibly be short.
            assert len(got) < len(data)
        stats = proxy.stats
        assert stats["reset_mid_body"] == 3
        assert stats["forwarded"] == stats["requests"] == 5

        proxy.set_fault_rate(0.0)
        assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == data


def test_standard_retries_survive_faults(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Keep the test fast: no back-off sleeps between botocore retries.
    monkeypatch.setattr(
        botocore.retries.standard.ExponentialBackoff,
        "delay_amount",
        lambda self, context: 0.001,
    )
    bucket = new_bucket(moto_url)
    rng = random.Random(1234)
    body_retries = 0
    with FaultProxy(moto_url, fault_rate=0.2, seed=7) as proxy:
        s3 = make_client(proxy.endpoint_url, max_attempts=10, mode="standard")
        for i in range(50):
            data = rng.randbytes(rng.randint(1, 64 * 1024))
            s3.put_object(Bucket=bucket, Key=f"obj/{i}", Body=data)
            # botocore cannot retry a failure while the caller reads the
            # streaming body (reset_mid_body); that is the job of an
            # application-level retry such as s3ckpt's, emulated here.
            for _attempt in range(5):
                try:
                    got = s3.get_object(Bucket=bucket, Key=f"obj/{i}")["Body"].read()
                    break
                except BODY_ERRORS:
                    body_retries += 1
            else:
                pytest.fail("GET kept failing")
            assert got == data
        stats = proxy.stats
    assert stats["faults"] >= 5, stats
    assert all(stats[kind] > 0 for kind in FAULT_KINDS), stats  # seed 7 hits all
    assert stats["requests"] == stats["forwarded"] + stats["faults"] - stats["reset_mid_body"]
    assert stats["requests"] == 100 + stats["faults"]  # each op succeeds exactly once
    # A mid-body reset surfaces while reading, never as a botocore retry.
    assert body_retries == stats["reset_mid_body"]
    assert sum(stats[k] for k in FAULT_KINDS) == stats["faults"]


def _stop_timing(moto_url: str) -> float:
    """Start a proxy with assorted open connections; return how long stop() took."""
    proxy = FaultProxy(moto_url, fault_rate=0.0)
    proxy.start()
    port = int(proxy.endpoint_url.rsplit(":", 1)[1])
    make_client(proxy.endpoint_url).list_buckets()  # leaves a pooled keep-alive connection
    idle = socket.create_connection(("127.0.0.1", port), timeout=5)
    half = socket.create_connection(("127.0.0.1", port), timeout=5)
    half.sendall(b"PUT /x HTTP/1.1\r\nHost: h\r\nContent-Length: 100\r\n\r\nabc")
    time.sleep(0.1)

    started = time.monotonic()
    proxy.stop()
    elapsed = time.monotonic() - started

    for sock in (idle, half):  # the proxy ended both connections
        try:
            assert sock.recv(10) == b""
        except ConnectionResetError:
            pass
        sock.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    # Handler threads were woken by the shutdown and wind down on their own, long before
    # their socket timeout would have freed them.
    deadline = time.monotonic() + PROMPT
    while any(t.name.endswith(f"-{port}") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "proxy threads did not exit"
        time.sleep(0.02)
    return elapsed


def test_stop_is_prompt(moto_url: str) -> None:
    elapsed = _stop_timing(moto_url)
    assert elapsed < PROMPT, f"stop() took {elapsed:.1f} s: it waited on a blocked thread"
