"""The fault proxy's deterministic faults against a real moto S3 server driven through boto3:
:func:`~s3ckpt.testing.classify` on what boto3 really sends, arms aimed by operation, key
window and condition, lost replies the server applied, stalls, and hooks as crash points.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import botocore.exceptions as bexc
import pytest

from tests.faultproxy import FaultProxy
from tests.integration._faultproxy_moto import (
    CONNECTION_ERRORS,
    PROMPT,
    make_client,
    moto_server,
    new_bucket,
    readable,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with moto_server() as url:
        yield url


def test_classify_sees_what_boto3_sends(moto_url: str) -> None:
    bucket = new_bucket(moto_url)
    seen: list[tuple[str, str, str]] = []
    with FaultProxy(
        moto_url, fault_rate=0.0, hook=lambda op, key, phase: seen.append((op, key, phase))
    ) as proxy:
        s3 = make_client(proxy.endpoint_url)
        s3.put_object(Bucket=bucket, Key="d/k 1", Body=b"x")
        s3.put_object(Bucket=bucket, Key="d/c", Body=b"y", IfNoneMatch="*")
        s3.head_object(Bucket=bucket, Key="d/k 1")
        s3.get_object(Bucket=bucket, Key="d/k 1")["Body"].read()
        s3.list_objects_v2(Bucket=bucket, Prefix="d/")
        up = s3.create_multipart_upload(Bucket=bucket, Key="m")["UploadId"]
        etag = s3.upload_part(Bucket=bucket, Key="m", UploadId=up, PartNumber=1, Body=b"p" * 100)[
            "ETag"
        ]
        s3.list_multipart_uploads(Bucket=bucket)
        s3.complete_multipart_upload(
            Bucket=bucket,
            Key="m",
            UploadId=up,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]},
        )
        up2 = s3.create_multipart_upload(Bucket=bucket, Key="m2")["UploadId"]
        s3.abort_multipart_upload(Bucket=bucket, Key="m2", UploadId=up2)
        s3.delete_object(Bucket=bucket, Key="d/c")
        s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "m"}]})
        stats = proxy.stats
    ops = [(op, key) for op, key, phase in seen if phase == "before"]
    assert ops == [
        ("PutObject", "d/k 1"),
        ("PutObject", "d/c"),
        ("HeadObject", "d/k 1"),
        ("GetObject", "d/k 1"),
        ("ListObjectsV2", ""),
        ("CreateMultipartUpload", "m"),
        ("UploadPart", "m"),
        ("ListMultipartUploads", ""),
        ("CompleteMultipartUpload", "m"),
        ("CreateMultipartUpload", "m2"),
        ("AbortMultipartUpload", "m2"),
        ("DeleteObject", "d/c"),
        ("DeleteObjects", ""),
    ]
    # Every forwarded request has its "after", right behind its "before".
    assert [p for _, _, p in seen] == ["before", "after"] * len(ops)
    assert stats["op:PutObject"] == 2
    assert stats["op:CreateMultipartUpload"] == 2
    assert stats["op:HeadObject"] == 1
    assert stats["op:Nope"] == 0  # missing keys read as 0
    assert stats["hook_errors"] == 0


def test_lost_reply_applies_upstream(moto_url: str) -> None:
    bucket = new_bucket(moto_url)
    direct = make_client(moto_url)
    with FaultProxy(moto_url, fault_rate=0.0) as proxy:
        armed = proxy.arm("PutObject", "lost_reply")
        s3 = make_client(proxy.endpoint_url)
        with pytest.raises(CONNECTION_ERRORS):
            s3.put_object(Bucket=bucket, Key="k", Body=b"applied")
        # The server applied it although the client saw only a connection error.
        assert direct.get_object(Bucket=bucket, Key="k")["Body"].read() == b"applied"
        assert armed.hits == 1 and armed.exhausted
        s3.put_object(Bucket=bucket, Key="k", Body=b"second")  # the arm fired once only
        stats = proxy.stats
    assert direct.get_object(Bucket=bucket, Key="k")["Body"].read() == b"second"
    assert stats["lost_reply"] == 1 and stats["faults"] == 1
    assert stats["forwarded"] == stats["requests"] == 2


def test_lost_reply_random_restricted_by_ops(moto_url: str) -> None:
    bucket = new_bucket(moto_url)
    direct = make_client(moto_url)
    direct.put_object(Bucket=bucket, Key="k", Body=b"v")
    with FaultProxy(moto_url, fault_rate=1.0, faults=["lost_reply"], ops={"PutObject"}) as proxy:
        s3 = make_client(proxy.endpoint_url)
        assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"  # not in ops
        s3.head_object(Bucket=bucket, Key="k")
        with pytest.raises(CONNECTION_ERRORS):
            s3.put_object(Bucket=bucket, Key="k2", Body=b"w")
        stats = proxy.stats
    assert direct.get_object(Bucket=bucket, Key="k2")["Body"].read() == b"w"
    assert stats["lost_reply"] == 1 and stats["requests"] == 3


def test_stall_black_holes_request(moto_url: str) -> None:
    bucket = new_bucket(moto_url)
    with FaultProxy(moto_url, fault_rate=0.0) as proxy:
        armed = proxy.arm("PutObject", "stall")
        s3 = make_client(proxy.endpoint_url, read_timeout=1)
        started = time.monotonic()
        with pytest.raises(bexc.ReadTimeoutError):
            s3.put_object(Bucket=bucket, Key="k", Body=b"never")
        assert 0.9 <= time.monotonic() - started < 10
        assert armed.hits == 1
        assert proxy.stats["forwarded"] == 0
        # A stalled connection the client keeps open does not slow stop() down.
        port = int(proxy.endpoint_url.rsplit(":", 1)[1])
        proxy.arm("*", "stall")
        held = socket.create_connection(("127.0.0.1", port), timeout=5)
        held.sendall(b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n")
        time.sleep(0.2)
        assert not readable(held)  # nothing came back
        started = time.monotonic()
        proxy.stop()
        assert time.monotonic() - started < PROMPT
        try:
            assert held.recv(10) == b""
        except ConnectionResetError:
            pass
        held.close()
    keys = make_client(moto_url).list_objects_v2(Bucket=bucket)["KeyCount"]
    assert keys == 0  # never reached the server


def test_stall_after_applies_then_black_holes(moto_url: str) -> None:
    bucket = new_bucket(moto_url)
    with FaultProxy(moto_url, fault_rate=1.0, faults=["stall_after"]) as proxy:
        s3 = make_client(proxy.endpoint_url, read_timeout=1)
        with pytest.raises(bexc.ReadTimeoutError):
            s3.put_object(Bucket=bucket, Key="k", Body=b"applied")
        assert proxy.stats["stall_after"] == 1 and proxy.stats["forwarded"] == 1
    got = make_client(moto_url).get_object(Bucket=bucket, Key="k")["Body"].read()
    assert got == b"applied"


def test_arm_window_glob_and_conditional(moto_url: str) -> None:
    bucket = new_bucket(moto_url)
    with FaultProxy(moto_url, fault_rate=0.0) as proxy:
        s3 = make_client(proxy.endpoint_url)
        windowed = proxy.arm("PutObject", "internal", skip=1, times=2, key_glob="a/*")
        results = []
        for key in ("a/1", "b/1", "a/2", "a/3", "a/4"):
            try:
                s3.put_object(Bucket=bucket, Key=key, Body=b"x")
                results.append("ok")
            except bexc.ClientError as exc:
                results.append(exc.response["Error"]["Code"])
        assert results == ["ok", "ok", "InternalError", "InternalError", "ok"]
        assert (windowed.seen, windowed.hits, windowed.exhausted) == (4, 2, True)

        cond = proxy.arm("PutObject", "slowdown", conditional=True, times=5)
        s3.put_object(Bucket=bucket, Key="c", Body=b"plain")  # not conditional: passes
        with pytest.raises(bexc.ClientError) as info:
            s3.put_object(Bucket=bucket, Key="d", Body=b"x", IfNoneMatch="*")
        assert info.value.response["Error"]["Code"] == "SlowDown"
        assert cond.hits == 1
        proxy.disarm(cond)
        s3.put_object(Bucket=bucket, Key="d", Body=b"x", IfNoneMatch="*")
        assert cond.hits == 1
        unconditional = proxy.arm("PutObject", "internal", conditional=False)
        s3.put_object(Bucket=bucket, Key="e", Body=b"x", IfNoneMatch="*")
        assert unconditional.hits == 0
        proxy.disarm()
        s3.put_object(Bucket=bucket, Key="e2", Body=b"x")
        assert unconditional.hits == 0


def test_hook_crash_points(moto_url: str) -> None:
    """Killing the client at "before" drops the request; at "after" it was applied."""
    bucket = new_bucket(moto_url)
    clients: dict[str, socket.socket] = {}
    calls: list[tuple[str, str, str]] = []

    def hook(op: str, key: str, phase: str) -> None:
        calls.append((op, key, phase))
        if key == "boom":
            raise RuntimeError("a broken hook")
        if op == "PutObject" and key in clients and phase == key.split("-")[0]:
            clients[key].close()  # the "client process" dies here
            time.sleep(0.05)

    with FaultProxy(moto_url, fault_rate=0.0, hook=hook) as proxy:
        port = int(proxy.endpoint_url.rsplit(":", 1)[1])
        for key in ("before-kill", "after-kill"):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            clients[key] = sock
            sock.sendall(
                f"PUT /{bucket}/{key} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                "Content-Length: 4\r\n\r\nbody".encode()
            )
        deadline = time.monotonic() + 10
        while len(calls) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        s3 = make_client(proxy.endpoint_url)
        s3.put_object(Bucket=bucket, Key="boom", Body=b"still works")
        stats = proxy.stats
    direct = make_client(moto_url)
    keys = sorted(o["Key"] for o in direct.list_objects_v2(Bucket=bucket).get("Contents", []))
    assert keys == ["after-kill", "boom"]
    assert ("PutObject", "before-kill", "after") not in calls
    assert ("PutObject", "after-kill", "after") in calls
    assert stats["hook_errors"] == 2  # "before" and "after" of boom
    assert stats["forwarded"] == 2


def test_hook_can_block_a_request(moto_url: str) -> None:
    bucket = new_bucket(moto_url)
    entered, release = threading.Event(), threading.Event()

    def hook(op: str, key: str, phase: str) -> None:
        if op == "PutObject" and phase == "before":
            entered.set()
            release.wait(10)

    direct = make_client(moto_url)
    with FaultProxy(moto_url, fault_rate=0.0, hook=hook) as proxy:
        s3 = make_client(proxy.endpoint_url)
        worker = threading.Thread(
            target=lambda: s3.put_object(Bucket=bucket, Key="k", Body=b"v" * 2_000_000)
        )
        worker.start()
        assert entered.wait(10)
        # Held at "before": the whole body has been read, nothing reached the server.
        assert direct.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
        release.set()
        worker.join(10)
        assert not worker.is_alive()
    assert direct.head_object(Bucket=bucket, Key="k")["ContentLength"] == 2_000_000
