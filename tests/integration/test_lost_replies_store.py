"""S3Store against lost replies and silent endpoints, over HTTP to moto (through FaultProxy).

* A black-holed endpoint (accepts, never answers) fails with a TransientStoreError that says
  so, within ``TransferConfig.request_deadline`` -- under a minute with the defaults.
* A retried CreateMultipartUpload whose first reply was lost leaves no orphan upload.
* ``list_prefixes(start_after=...)`` returns only what sorts after the given name.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any, ClassVar

import pytest

from s3ckpt.config import MiB, S3Config, TransferConfig
from s3ckpt.errors import StoreError, TransientStoreError
from s3ckpt.store.s3 import S3Store
from tests._http import serve
from tests.faultproxy import FaultProxy

pytestmark = pytest.mark.integration


@pytest.fixture
def black_hole() -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a server that accepts connections and never answers."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    listener.settimeout(0.1)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except (TimeoutError, OSError):
                continue
            held.append(conn)  # read nothing, answer nothing

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        listener.close()


def _fails_in(fn: Callable[[], Any]) -> tuple[BaseException, float]:
    started = time.monotonic()
    try:
        fn()
    except BaseException as exc:
        return exc, time.monotonic() - started
    raise AssertionError("did not fail")


def _read_range(store: S3Store, key: str) -> bytes:
    reader = store.open_range(key, 0, 10)
    try:
        buf = bytearray(10)
        n = reader.readinto(memoryview(buf))
        return bytes(buf[:n])
    finally:
        reader.close()


def test_black_hole_fails_within_a_minute_with_defaults(black_hole: str) -> None:
    """The one slow test (~40 s): put, get and open_range at once, default TransferConfig."""
    store = S3Store("bucket", S3Config(endpoint_url=black_hole, region="us-east-1"))
    assert store.transfer_config == TransferConfig()
    calls: dict[str, Callable[[], Any]] = {
        "put": lambda: store.put("k", b"x" * 1000),
        "get": lambda: store.get("k"),
        "open_range": lambda: _read_range(store, "k"),
    }
    results: dict[str, tuple[BaseException, float]] = {}
    threads = [
        threading.Thread(target=lambda n=name, f=fn: results.__setitem__(n, _fails_in(f)))
        for name, fn in calls.items()
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert set(results) == set(calls)
    for name, (exc, elapsed) in results.items():
        assert isinstance(exc, TransientStoreError), (name, exc)
        assert elapsed < 60, (name, elapsed)
        # Two 20 s attempts: the third could not end before the 50 s deadline.
        assert elapsed >= 2 * TransferConfig().read_timeout - 1, (name, elapsed)
        msg = str(exc)
        assert "did not answer within" in msg and "black-holed" in msg, msg
        assert "s3://bucket/k" in msg and "read_timeout" in msg and "request_deadline" in msg


def test_stalled_proxy_fails_by_the_deadline(moto_endpoint: str, bucket: str) -> None:
    tc = TransferConfig(read_timeout=1, request_deadline=3, retry_max_delay=0.1)
    with FaultProxy(moto_endpoint, fault_rate=1.0, faults=["stall"]) as proxy:
        store = S3Store(bucket, S3Config(endpoint_url=proxy.endpoint_url), tc)
        for op in (
            lambda: store.put("a/k", b"payload"),
            lambda: store.get("a/k"),
            lambda: _read_range(store, "a/k"),
            lambda: store.create_multipart("a/m"),
        ):
            exc, elapsed = _fails_in(op)
            assert isinstance(exc, TransientStoreError), exc
            assert elapsed < 10
            assert "did not answer within" in str(exc)
        # 4 operations x about 2 attempts each (a third 1 s attempt would pass the 3 s
        # mark), never the 8 attempts each that max_attempts allows. How many fit depends
        # on the machine's load, so this bounds the count rather than pinning it.
        assert 4 <= proxy.stats["stall"] <= 12


def test_deadline_does_not_stop_quick_retries(moto_endpoint: str, bucket: str) -> None:
    # read_timeout above the deadline (as benchmarks set it): throttling is still retried.
    tc = TransferConfig(
        read_timeout=600, request_deadline=5, retry_initial_delay=0.01, retry_max_delay=0.02
    )
    with FaultProxy(moto_endpoint, fault_rate=0.0) as proxy:
        store = S3Store(bucket, S3Config(endpoint_url=proxy.endpoint_url), tc)
        armed = proxy.arm("PutObject", "slowdown", times=3)
        store.put("k", b"v")
        assert armed.hits == 3
        proxy.arm("PutObject", "reset", times=2)
        store.put("k2", b"w")
        assert store.get("k") == b"v" and store.get("k2") == b"w"


def test_transfer_config_validates_deadline() -> None:
    from s3ckpt.errors import ConfigError

    assert TransferConfig().read_timeout == 20.0
    assert TransferConfig().request_deadline == 50.0
    assert TransferConfig().connect_timeout == 5.0
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ConfigError, match="request_deadline"):
            TransferConfig(request_deadline=bad)


class _SlowBody(BaseHTTPRequestHandler):
    """Serves ranges of DATA in slow pieces; the first response is cut short (FIN)."""

    protocol_version = "HTTP/1.1"
    data: ClassVar[bytes] = bytes(range(256)) * 32  # 8 KiB
    pieces: ClassVar[int] = 8
    gap: ClassVar[float] = 0.25
    requests: ClassVar[int] = 0
    stall: ClassVar[bool] = False

    def do_GET(self) -> None:
        _SlowBody.requests += 1
        first = int(self.headers["Range"].split("=")[1].split("-")[0])
        body = self.data[first:]
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {first}-{len(self.data) - 1}/{len(self.data)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.flush()
        if _SlowBody.stall:
            time.sleep(30)  # headers, then silence
            return
        step = -(-len(self.data) // self.pieces)
        with contextlib.suppress(OSError):
            for off in range(0, len(body), step):
                if _SlowBody.requests == 1 and off >= len(body) // 2:
                    self.close_connection = True
                    return  # cut: the client sees EOF mid-body
                self.wfile.write(body[off : off + step])
                self.wfile.flush()
                time.sleep(self.gap)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def slow_server() -> Iterator[str]:
    _SlowBody.requests = 0
    _SlowBody.stall = False
    with serve(_SlowBody) as url:
        yield url


def test_progressing_range_read_is_not_cut_by_the_deadline(slow_server: str) -> None:
    # The whole read takes ~3 s, three times the deadline, and needs one resume after ~1 s:
    # both fine, because the deadline only gates new attempts after a stretch without data.
    tc = TransferConfig(
        read_timeout=2, request_deadline=1, retry_initial_delay=0.01, retry_max_delay=0.01
    )
    store = S3Store("bucket", S3Config(endpoint_url=slow_server, region="us-east-1"), tc)
    data = _SlowBody.data
    reader = store.open_range("obj", 0, len(data))
    out = bytearray(len(data))
    view = memoryview(out)
    off = 0
    started = time.monotonic()
    while off < len(data):
        n = reader.readinto(view[off:])
        assert n > 0
        off += n
    reader.close()
    assert bytes(out) == data
    assert _SlowBody.requests == 2  # the cut body was resumed
    assert time.monotonic() - started > tc.request_deadline


def test_stalled_range_body_fails_by_the_deadline(slow_server: str) -> None:
    _SlowBody.stall = True
    tc = TransferConfig(
        read_timeout=1, request_deadline=3, retry_initial_delay=0.01, retry_max_delay=0.01
    )
    store = S3Store("bucket", S3Config(endpoint_url=slow_server, region="us-east-1"), tc)
    exc, elapsed = _fails_in(lambda: _read_range(store, "obj"))
    assert isinstance(exc, TransientStoreError), exc
    assert elapsed < 10
    assert "did not answer within" in str(exc) and "s3://bucket/obj" in str(exc)
    # The reader's own retry loop honours the deadline: a retry or two, never its 8
    # attempts (how many fit in 3 s depends on the machine's load).
    assert 1 <= _SlowBody.requests <= 3


def test_lost_create_multipart_reply_leaves_no_orphan(
    moto_endpoint: str, bucket: str, s3_client: Any
) -> None:
    with FaultProxy(moto_endpoint, fault_rate=0.0) as proxy:
        store = S3Store(bucket, S3Config(endpoint_url=proxy.endpoint_url))
        s3_client.create_multipart_upload(Bucket=bucket, Key="other")  # not ours to touch
        armed = proxy.arm("CreateMultipartUpload", "lost_reply", key_glob="run/data")
        upload_id = store.create_multipart("run/data")
        assert armed.hits == 1
        uploads = s3_client.list_multipart_uploads(Bucket=bucket)["Uploads"]
        by_key = sorted((u["Key"], u["UploadId"]) for u in uploads)
        assert [k for k, _ in by_key] == ["other", "run/data"]
        assert ("run/data", upload_id) in by_key
        part = store.upload_part("run/data", upload_id, 1, b"x" * 10)
        store.complete_multipart("run/data", upload_id, [part])
    assert s3_client.get_object(Bucket=bucket, Key="run/data")["Body"].read() == b"x" * 10


def test_create_multipart_first_try_does_not_list(moto_endpoint: str, bucket: str) -> None:
    with FaultProxy(moto_endpoint, fault_rate=0.0) as proxy:
        store = S3Store(bucket, S3Config(endpoint_url=proxy.endpoint_url))
        store.create_multipart("k")
        assert proxy.stats["op:ListMultipartUploads"] == 0


def test_list_prefixes_start_after(bucket: str, s3_client: Any) -> None:
    for key in ("run/step-001/a", "run/step-002/a", "run/step-002/b", "run/step-010/a", "run/x"):
        s3_client.put_object(Bucket=bucket, Key=key, Body=b"")
    store = S3Store(bucket, page_size=1)  # pages: StartAfter applies to the first only
    everything = ["run/step-001/", "run/step-002/", "run/step-010/"]
    assert list(store.list_prefixes("run/")) == everything
    assert list(store.list_prefixes("run/", start_after="run/step-001/")) == everything[1:]
    assert list(store.list_prefixes("run/", start_after="run/step-002/a")) == everything[2:]
    assert list(store.list_prefixes("run/", start_after="run/step-0")) == everything
    assert list(store.list_prefixes("run/", start_after="run/z")) == []


def test_big_put_through_lost_reply_is_retried(moto_endpoint: str, bucket: str) -> None:
    """An unconditional put whose reply is lost is simply applied again."""
    with FaultProxy(moto_endpoint, fault_rate=0.0) as proxy:
        store = S3Store(bucket, S3Config(endpoint_url=proxy.endpoint_url))
        proxy.arm("PutObject", "lost_reply")
        store.put("k", b"z" * MiB)
        assert proxy.stats["lost_reply"] == 1
        assert store.get("k") == b"z" * MiB

    with pytest.raises(StoreError):  # nothing hides a real failure
        S3Store(bucket, S3Config(endpoint_url=moto_endpoint)).get("missing")


@pytest.mark.parametrize("region", ["us-east-1", "eu-west-1"])
def test_create_bucket_whose_reply_was_lost_is_a_success(moto_endpoint: str, region: str) -> None:
    """The demo's one request above the keys: CreateBucket applied, its reply lost, retried
    (outside us-east-1 the retry is answered BucketAlreadyOwnedByYou): the bucket exists and
    the call succeeds."""
    from s3ckpt.store import create_bucket

    name = f"created-{uuid.uuid4().hex[:12]}"
    with FaultProxy(moto_endpoint, fault_rate=0.0) as proxy:
        store = S3Store(name, S3Config(endpoint_url=proxy.endpoint_url, region=region))
        armed = proxy.arm("*", "lost_reply")  # the first request through: CreateBucket
        create_bucket(store)
        assert armed.hits == 1 and proxy.stats["forwarded"] == 2
        store.put("k", b"v")
        assert S3Store(name, S3Config(endpoint_url=moto_endpoint, region=region)).get("k") == b"v"
