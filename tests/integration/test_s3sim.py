"""benchmarks/s3sim against moto: the same boto3 calls, answer by answer; then the real clients.

Every ``test_*_match_moto`` runs one script of boto3 calls against the session's moto server
and against an s3sim server (shaping off, MD5 ETags so that ETags compare) and compares each
answer field by field: status, error code and message (and every extra error element moto
sends), headers boto3 parses, bodies. Fields that are opaque or that moto gets wrong are
named where they are left out; benchmarks/s3sim/README.md lists them. Then s3sim-only checks
where moto is plainly wrong or silent (part order, checksums, aws-chunked bodies, upload
pagination), a round trip of a small state dict through s3ckpt, s3torchconnector and s3fs,
and the shaping model through the server (throttling, a split, latency, bandwidth).
"""

from __future__ import annotations

import base64
import datetime
import http.client
import os
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import crc32c
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from benchmarks.s3sim import Options, S3Sim, Shaping, Throttle
from benchmarks.s3sim._store import Store, successor

pytestmark = [pytest.mark.integration, pytest.mark.bench]

MIB = 1024 * 1024
#: Response fields that differ by design or are opaque (see README.md, "Differences").
ALWAYS_IGNORED = frozenset({"ResponseMetadata", "VersionId", "Owner", "Initiator", "HostId"})
OPAQUE = frozenset({"UploadId", "RequestId"})


@pytest.fixture(scope="module")
def sim() -> Iterator[S3Sim]:
    with S3Sim(options=Options(md5_etags=True)) as server:
        yield server


def _client(endpoint: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        config=Config(retries={"total_max_attempts": 1}),
    )


@pytest.fixture(scope="module")
def clients(moto_endpoint: str, sim: S3Sim) -> dict[str, Any]:
    return {"moto": _client(moto_endpoint), "s3sim": _client(sim.endpoint)}


@pytest.fixture
def pair(clients: dict[str, Any]) -> str:
    """A fresh bucket of the same name on both servers."""
    name = f"sim-{uuid.uuid4().hex[:12]}"
    for c in clients.values():
        c.create_bucket(Bucket=name)
    return name


@pytest.fixture
def s3(clients: dict[str, Any], pair: str) -> Any:
    """The s3sim client (for s3sim-only checks, on ``pair``'s bucket)."""
    return clients["s3sim"]


def _norm(value: Any, ignore: frozenset[str]) -> Any:
    if isinstance(value, dict):
        return {k: _norm(v, ignore) for k, v in value.items() if k not in ignore}
    if isinstance(value, list):
        return [_norm(v, ignore) for v in value]
    if isinstance(value, datetime.datetime):
        return "<time>"
    return value


def call(client: Any, op: str, ignore: frozenset[str] = frozenset(), **kwargs: Any) -> dict:
    """One boto3 call as a comparable dict: status plus parsed fields, or status plus error."""
    try:
        resp = getattr(client, op)(**kwargs)
    except ClientError as exc:
        err = dict(exc.response.get("Error", {}))
        return {"status": exc.response["ResponseMetadata"]["HTTPStatusCode"], "error": err}
    out = {"status": resp["ResponseMetadata"]["HTTPStatusCode"], **resp}
    if "Body" in out:
        out["Body"] = out["Body"].read()
    return dict(_norm(out, ALWAYS_IGNORED | ignore))


Script = Callable[[Any, str, Callable[..., dict]], None]


def compare(clients: dict[str, Any], bucket: str, script: Script) -> list[tuple[str, dict]]:
    """Run ``script(client, bucket, step)`` on both servers; assert the steps answer alike.

    ``step(name, op, ignore=..., **kwargs)`` makes one call and returns its answer (so that a
    script can use an UploadId or an ETag). An error compares by status, code, message and
    every element moto sends (s3sim may send more, as S3 does).
    """
    answers: dict[str, list[tuple[str, dict]]] = {}
    for server, client in clients.items():
        log: list[tuple[str, dict]] = []

        def step(name: str, op: str, ignore: frozenset[str] = frozenset(), **kw: Any) -> dict:
            got = call(client, op, ignore, **kw)  # noqa: B023 - used right away
            log.append((name, got))  # noqa: B023
            return got

        script(client, bucket, step)
        answers[server] = log
    for (name, m), (_, s) in zip(answers["moto"], answers["s3sim"], strict=True):
        if "error" in m or "error" in s:
            assert s.get("status") == m.get("status"), (name, m, s)
            me, se = m.get("error", {}), s.get("error", {})
            for k in OPAQUE & me.keys() & se.keys():  # server-made ids: present, not equal
                me[k] = se[k] = "<id>"
            assert {k: se.get(k) for k in me} == me, (name, me, se)
        else:
            assert s == m, name
    return answers["s3sim"]


def _crc32c(data: bytes) -> str:
    return base64.b64encode(crc32c.crc32c(data).to_bytes(4, "big")).decode()


# -- objects ----------------------------------------------------------------------------------

RANGES = [
    "bytes=0-0", "bytes=0-9", "bytes=2-5", "bytes=5-2", "bytes=8-20", "bytes=9-9",
    "bytes=10-20", "bytes=-3", "bytes=-20", "bytes=-0", "bytes=3-", "bytes=9-", "bytes=10-",
    "bytes=0-1,3-4", "bytes=abc", "bytes=-",
]  # fmt: skip


def test_objects_and_ranges_match_moto(clients: dict[str, Any], pair: str) -> None:
    def script(c: Any, b: str, step: Callable[..., dict]) -> None:
        step("put", "put_object", Bucket=b, Key="k", Body=b"0123456789", ChecksumAlgorithm="CRC32C")
        step("put empty", "put_object", Bucket=b, Key="empty", Body=b"")
        step(
            "put meta", "put_object", Bucket=b, Key="dir/meta", Body=b"m", ContentType="text/x",
            Metadata={"who": "me"}, CacheControl="no-cache", ContentDisposition="inline",
        )  # fmt: skip
        step("get", "get_object", Bucket=b, Key="k")
        step("get+mode", "get_object", Bucket=b, Key="k", ChecksumMode="ENABLED")
        step("head", "head_object", Bucket=b, Key="k")
        step("head+mode", "head_object", Bucket=b, Key="k", ChecksumMode="ENABLED")
        step("head meta", "head_object", Bucket=b, Key="dir/meta")
        for r in RANGES:
            step(f"range {r}", "get_object", Bucket=b, Key="k", Range=r)
            step(
                f"range {r} +mode", "get_object", Bucket=b, Key="k", Range=r, ChecksumMode="ENABLED"
            )
        for r in ("bytes=0-0", "bytes=-1", "bytes=0-"):
            step(f"empty {r}", "get_object", Bucket=b, Key="empty", Range=r)
        step("head range", "head_object", Bucket=b, Key="k", Range="bytes=0-1")
        step("head bad range", "head_object", Bucket=b, Key="k", Range="bytes=20-30")
        step("get missing", "get_object", Bucket=b, Key="nope")
        step("head missing", "head_object", Bucket=b, Key="nope")
        step("delete missing", "delete_object", Bucket=b, Key="nope")
        step("no bucket", "get_object", Bucket="no-such-bucket-s3sim", Key="k")
        step("put no bucket", "put_object", Bucket="no-such-bucket-s3sim", Key="k", Body=b"x")

    compare(clients, pair, script)


def test_conditional_requests_match_moto(clients: dict[str, Any], pair: str) -> None:
    def script(c: Any, b: str, step: Callable[..., dict]) -> None:
        etag = step("put", "put_object", Bucket=b, Key="k", Body=b"v1")["ETag"]
        step("inm exists", "put_object", Bucket=b, Key="k", Body=b"v2", IfNoneMatch="*")
        step("inm new", "put_object", Bucket=b, Key="n", Body=b"v2", IfNoneMatch="*")
        step("im wrong", "put_object", Bucket=b, Key="k", Body=b"v2", IfMatch='"0000"')
        step("im missing", "put_object", Bucket=b, Key="gone", Body=b"v2", IfMatch=etag)
        step("im right", "put_object", Bucket=b, Key="k", Body=b"v2", IfMatch=etag)
        new = step("head", "head_object", Bucket=b, Key="k")["ETag"]
        step("get im wrong", "get_object", Bucket=b, Key="k", IfMatch=etag)
        step("get im right", "get_object", Bucket=b, Key="k", IfMatch=new)
        step("get inm same", "get_object", Bucket=b, Key="k", IfNoneMatch=new)
        step("head im wrong", "head_object", Bucket=b, Key="k", IfMatch=etag)
        step("head inm same", "head_object", Bucket=b, Key="k", IfNoneMatch=new)
        step("delete im wrong", "delete_object", Bucket=b, Key="k", IfMatch=etag)
        step("delete im missing", "delete_object", Bucket=b, Key="gone", IfMatch=etag)
        step("delete im right", "delete_object", Bucket=b, Key="k", IfMatch=new)
        step("gone", "head_object", Bucket=b, Key="k")

    compare(clients, pair, script)


def test_copy_and_buckets_match_moto(clients: dict[str, Any], pair: str) -> None:
    def script(c: Any, b: str, step: Callable[..., dict]) -> None:
        step("put", "put_object", Bucket=b, Key="src", Body=b"abc", Metadata={"a": "1"},
             ContentType="text/plain", ChecksumAlgorithm="CRC32")  # fmt: skip
        src = {"Bucket": b, "Key": "src"}
        step("copy", "copy_object", Bucket=b, Key="dst", CopySource=src)
        step("head dst", "head_object", Bucket=b, Key="dst", ChecksumMode="ENABLED")
        step("get dst", "get_object", Bucket=b, Key="dst")
        step("copy self", "copy_object", Bucket=b, Key="src", CopySource=src)
        step("copy replace", "copy_object", Bucket=b, Key="src", CopySource=src,
             MetadataDirective="REPLACE", Metadata={"b": "2"})  # fmt: skip
        step("head src", "head_object", Bucket=b, Key="src")
        step(
            "copy missing", "copy_object", Bucket=b, Key="x", CopySource={"Bucket": b, "Key": "no"}
        )
        step("copy no bucket", "copy_object", Bucket=b, Key="x",
             CopySource={"Bucket": "no-such-bucket-s3sim", "Key": "src"})  # fmt: skip
        step("head bucket", "head_bucket", Bucket=b)
        step("head no bucket", "head_bucket", Bucket="no-such-bucket-s3sim")
        step("create again", "create_bucket", Bucket=b)
        step("location", "get_bucket_location", Bucket=b)
        step("delete non-empty", "delete_bucket", Bucket=b)
        step("list no bucket", "list_objects_v2", Bucket="no-such-bucket-s3sim")

    compare(clients, pair, script)


# -- listings ---------------------------------------------------------------------------------

KEYS = [
    "a/1", "a/2", "a/b/3", "a/b/4", "a/c", "b", "c/x/y", "c/z", "d", "d/", "d/e",
    "e+f g", "e/%41", "q/1/2/3", "\u00fc/x", "z",
]  # fmt: skip
LISTINGS: list[dict[str, Any]] = [
    {},
    {"MaxKeys": 1},
    {"MaxKeys": 3},
    {"Delimiter": "/"},
    {"Delimiter": "/", "MaxKeys": 1},
    {"Delimiter": "/", "MaxKeys": 2},
    {"Prefix": "a/", "Delimiter": "/"},
    {"Prefix": "a/", "Delimiter": "/", "MaxKeys": 1},
    {"Prefix": "a/", "Delimiter": "/", "StartAfter": "a/1"},
    {"Prefix": "a", "MaxKeys": 2},
    {"StartAfter": "c/x", "MaxKeys": 2},
    {"Prefix": "d", "Delimiter": "/"},
    {"Prefix": "zz"},
    {"MaxKeys": 0},
    {"Delimiter": "1"},
]


def test_list_objects_v2_pages_match_moto(clients: dict[str, Any], pair: str) -> None:
    def script(c: Any, b: str, step: Callable[..., dict]) -> None:
        for k in KEYS:
            c.put_object(Bucket=b, Key=k, Body=b"x")
        for args in LISTINGS:
            token: str | None = None
            for page in range(20):
                kw = dict(args, **({"ContinuationToken": token} if token else {}))
                got = step(f"{args} page {page}", "list_objects_v2",
                           frozenset({"NextContinuationToken", "ContinuationToken"}),
                           Bucket=b, **kw)  # fmt: skip
                if not got.get("IsTruncated") or args.get("MaxKeys") == 0:
                    break
                token = c.list_objects_v2(Bucket=b, **kw)["NextContinuationToken"]
        # moto's ListObjects (v1) leaves out ChecksumAlgorithm and the empty Prefix/Marker.
        v1 = frozenset({"ChecksumAlgorithm", "Marker", "Prefix"})
        step("v1", "list_objects", v1, Bucket=b)
        step("v1 delimiter", "list_objects", v1, Bucket=b, Delimiter="/", Prefix="a/")

    answers = compare(clients, pair, script)
    listed = [
        e["Key"] for name, a in answers if name.startswith("{} ") for e in a.get("Contents", [])
    ]
    assert listed == sorted(KEYS)  # and sorted the way S3 sorts (UTF-8 bytes)


def test_listing_pages_equal_a_brute_force_model() -> None:
    """Store.list against the definition, for every page size, delimiter and prefix."""
    store = Store(Options())
    store.create_bucket("bkt")
    from benchmarks.s3sim._store import Blob, Obj

    keys = sorted({*KEYS, "a/b/3/4", "aa", "a//x", "a/b", "\U0010ffff", "a/\U0010ffff/x"})
    for k in keys:
        store.put("bkt", Obj(k, Blob([memoryview(b"")]), '"e"'))

    def model(prefix: str, delim: str) -> list[str]:
        out: list[str] = []
        for k in keys:
            if not k.startswith(prefix):
                continue
            j = k.find(delim, len(prefix)) if delim else -1
            entry = k[: j + len(delim)] if j >= 0 else k
            if not out or out[-1] != entry:
                out.append(entry)
        return out

    for prefix in ("", "a", "a/", "a/b", "q/", "\U0010ffff", "nope"):
        for delim in ("", "/", "b", "//"):
            for size in (1, 2, 3, 1000):
                got: list[str] = []
                after_key = after_prefix = None
                while True:
                    page = store.list("bkt", prefix, delim, size, after_key, after_prefix)
                    got += [e if isinstance(e, str) else e.key for e in page.entries]
                    if not page.truncated:
                        break
                    last = page.last
                    after_key, after_prefix = (
                        (None, last) if isinstance(last, str) else (last.key, None)
                    )
                assert got == model(prefix, delim), (prefix, delim, size)
    assert successor("a/") == "a0" and successor("") is None


# -- multipart --------------------------------------------------------------------------------


def test_multipart_matches_moto(clients: dict[str, Any], pair: str) -> None:
    big, small = b"a" * (5 * MIB), b"bc"
    ck = frozenset({"ChecksumCRC32C", "ChecksumType", "ChecksumAlgorithm"})

    def script(c: Any, b: str, step: Callable[..., dict]) -> None:
        uid = c.create_multipart_upload(Bucket=b, Key="m", ChecksumAlgorithm="CRC32C")["UploadId"]
        step("create", "create_multipart_upload", frozenset({"UploadId"}), Bucket=b, Key="m2",
             ChecksumAlgorithm="CRC32C")  # fmt: skip
        p = {"Bucket": b, "Key": "m", "UploadId": uid}
        e1 = step("part 1", "upload_part", **p, PartNumber=1, Body=big, ChecksumCRC32C=_crc32c(big))
        e2 = step(
            "part 2", "upload_part", **p, PartNumber=2, Body=small, ChecksumCRC32C=_crc32c(small)
        )
        # moto leaves the part checksums out of ListParts (S3 and s3sim list them).
        step("list parts", "list_parts", ck | {"UploadId"}, **p)
        step("list parts page", "list_parts", ck | {"UploadId"}, **p, MaxParts=1)
        step("list parts after", "list_parts", ck | {"UploadId"}, **p, PartNumberMarker=1)
        step(
            "uploads",
            "list_multipart_uploads",
            frozenset({"UploadId", "Prefix"}),
            Bucket=b,
            Prefix="m",
        )
        parts = [
            {"PartNumber": 1, "ETag": e1["ETag"], "ChecksumCRC32C": _crc32c(big)},
            {"PartNumber": 2, "ETag": e2["ETag"], "ChecksumCRC32C": _crc32c(small)},
        ]
        bad = [dict(parts[0]), parts[1]]
        bad[0]["ETag"] = '"00000000000000000000000000000000"'
        step("bad etag", "complete_multipart_upload", **p, MultipartUpload={"Parts": bad})
        missing = [*parts, {"PartNumber": 3, "ETag": e2["ETag"]}]
        step("missing part", "complete_multipart_upload", **p, MultipartUpload={"Parts": missing})
        c.put_object(Bucket=b, Key="m", Body=b"old")
        step("inm exists", "complete_multipart_upload", **p, MultipartUpload={"Parts": parts},
             IfNoneMatch="*")  # fmt: skip
        # moto does not return the multipart checksum from Complete (S3 and s3sim do).
        step("complete", "complete_multipart_upload", ck, **p, MultipartUpload={"Parts": parts})
        step(
            "complete again", "complete_multipart_upload", ck, **p, MultipartUpload={"Parts": parts}
        )
        step("get+mode", "get_object", Bucket=b, Key="m", ChecksumMode="ENABLED")
        # moto's HEAD drops the "-2" of a composite checksum that its GET has.
        step("head+mode", "head_object", ck, Bucket=b, Key="m", ChecksumMode="ENABLED")
        step("range across parts", "get_object", Bucket=b, Key="m", Range=f"bytes={5 * MIB - 2}-")
        step("no upload", "list_parts", Bucket=b, Key="m", UploadId="nope")
        step("abort none", "abort_multipart_upload", Bucket=b, Key="m", UploadId="nope")
        # EntityTooSmall and an empty part list, on a second upload.
        uid2 = c.create_multipart_upload(Bucket=b, Key="s")["UploadId"]
        q = {"Bucket": b, "Key": "s", "UploadId": uid2}
        f1 = step("tiny 1", "upload_part", **q, PartNumber=1, Body=b"x")["ETag"]
        f2 = step("tiny 2", "upload_part", **q, PartNumber=2, Body=b"y")["ETag"]
        tiny = [{"PartNumber": 1, "ETag": f1}, {"PartNumber": 2, "ETag": f2}]
        step("too small", "complete_multipart_upload", **q, MultipartUpload={"Parts": tiny})
        step("empty list", "complete_multipart_upload", **q, MultipartUpload={"Parts": []})
        step("abort", "abort_multipart_upload", **q)
        step("abort twice", "abort_multipart_upload", **q)
        step("uploads after", "list_multipart_uploads", frozenset({"UploadId"}), Bucket=b)

    compare(clients, pair, script)


def test_delete_objects_matches_moto(clients: dict[str, Any], pair: str) -> None:
    def script(c: Any, b: str, step: Callable[..., dict]) -> None:
        for k in ("a", "b", "c"):
            c.put_object(Bucket=b, Key=k, Body=b"x")
        objs = [{"Key": "a"}, {"Key": "missing"}, {"Key": "b"}]
        step("delete", "delete_objects", Bucket=b, Delete={"Objects": objs})
        step("list", "list_objects_v2", Bucket=b)

    compare(clients, pair, script)


# -- s3sim where moto is wrong or silent ------------------------------------------------------


def _error(fn: Callable[[], Any]) -> tuple[int, str]:
    with pytest.raises(ClientError) as info:
        fn()
    r = info.value.response
    return r["ResponseMetadata"]["HTTPStatusCode"], r["Error"]["Code"]


def test_part_order_numbers_and_unknown_uploads(s3: Any, pair: str) -> None:
    uid = s3.create_multipart_upload(Bucket=pair, Key="m")["UploadId"]
    p = {"Bucket": pair, "Key": "m", "UploadId": uid}
    e1 = s3.upload_part(**p, PartNumber=1, Body=b"a" * (5 * MIB))["ETag"]
    e2 = s3.upload_part(**p, PartNumber=2, Body=b"b")["ETag"]
    # moto never answers InvalidPartOrder (it does not remember the previous part number).
    for parts in ([(2, e2), (1, e1)], [(1, e1), (1, e1)]):
        body = {"Parts": [{"PartNumber": n, "ETag": e} for n, e in parts]}

        def complete(body: dict[str, Any] = body) -> Any:
            return s3.complete_multipart_upload(**p, MultipartUpload=body)

        assert _error(complete) == (400, "InvalidPartOrder")
    # moto answers 500 to these two.
    assert _error(lambda: s3.upload_part(**{**p, "UploadId": "nope"}, PartNumber=1, Body=b"x")) == (
        404,
        "NoSuchUpload",
    )
    assert _error(lambda: s3.upload_part(**p, PartNumber=0, Body=b"x")) == (400, "InvalidArgument")
    nope = {"Parts": [{"PartNumber": 1, "ETag": e1}]}
    assert _error(
        lambda: s3.complete_multipart_upload(**{**p, "UploadId": "nope"}, MultipartUpload=nope)
    ) == (404, "NoSuchUpload")
    assert _error(lambda: s3.upload_part(**p, PartNumber=10001, Body=b"x")) == (
        400,
        "InvalidArgument",
    )


def test_list_multipart_uploads_paginates(s3: Any, pair: str) -> None:
    made = [(k, s3.create_multipart_upload(Bucket=pair, Key=k)["UploadId"]) for k in
            ("a/1", "a/1", "a/2", "b/3", "c")]  # fmt: skip
    pages: list[list[tuple[str, str]]] = []
    kw: dict[str, str] = {}
    while True:
        r = s3.list_multipart_uploads(Bucket=pair, MaxUploads=2, **kw)
        pages.append([(u["Key"], u["UploadId"]) for u in r.get("Uploads", [])])
        if not r["IsTruncated"]:
            break
        kw = {"KeyMarker": r["NextKeyMarker"], "UploadIdMarker": r["NextUploadIdMarker"]}
    assert [len(p) for p in pages] == [2, 2, 1]
    assert [u for p in pages for u in p] == made  # by key, then oldest first
    r = s3.list_multipart_uploads(Bucket=pair, Delimiter="/")
    assert [c["Prefix"] for c in r["CommonPrefixes"]] == ["a/", "b/"]
    assert [u["Key"] for u in r["Uploads"]] == ["c"]
    assert [u["Key"] for u in s3.list_multipart_uploads(Bucket=pair, Prefix="a/")["Uploads"]] == [
        "a/1", "a/1", "a/2",
    ]  # fmt: skip


def test_checksums_are_verified(s3: Any, pair: str) -> None:
    # moto stores a wrong checksum as given; S3 and s3sim answer BadDigest.
    wrong = _crc32c(b"something else")
    assert _error(
        lambda: s3.put_object(Bucket=pair, Key="k", Body=b"data", ChecksumCRC32C=wrong)
    ) == (
        400,
        "BadDigest",
    )
    assert _error(
        lambda: s3.put_object(Bucket=pair, Key="k", Body=b"data", ChecksumCRC32C="!!")
    ) == (
        400,
        "InvalidRequest",
    )
    uid = s3.create_multipart_upload(Bucket=pair, Key="m", ChecksumAlgorithm="CRC32C")["UploadId"]
    part = {"Bucket": pair, "Key": "m", "UploadId": uid, "PartNumber": 1, "Body": b"data"}
    assert _error(lambda: s3.upload_part(**part, ChecksumCRC32C=wrong)) == (400, "BadDigest")
    ok = s3.upload_part(**part, ChecksumAlgorithm="CRC32C", ChecksumCRC32C=_crc32c(b"data"))
    assert ok["ChecksumCRC32C"] == _crc32c(b"data")
    # A non-bytes Range unit is ignored (moto reads it as bytes).
    s3.put_object(Bucket=pair, Key="r", Body=b"0123")
    assert s3.get_object(Bucket=pair, Key="r", Range="items=0-1")["Body"].read() == b"0123"
    # DeleteObjects in Quiet mode reports only errors (moto lists every key as Deleted).
    r = s3.delete_objects(Bucket=pair, Delete={"Objects": [{"Key": "r"}], "Quiet": True})
    assert "Deleted" not in r and "Errors" not in r


def _raw(
    sim: S3Sim, method: str, path: str, body: bytes, headers: dict[str, str]
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=30)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for k, v in headers.items():
            conn.putheader(k, v)
        conn.endheaders()
        for i in range(0, len(body), 7919):  # odd pieces: chunk headers split across reads
            conn.send(body[i : i + 7919])
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _aws_chunked(
    data: bytes, sizes: list[int], signed: bool, trailer: tuple[str, str] | None
) -> bytes:
    out, pos = [], 0
    sig = ";chunk-signature=" + "0" * 64 if signed else ""
    for n in [*sizes, 0]:
        piece = data[pos : pos + n]
        pos += n
        out.append(f"{len(piece):x}{sig}\r\n".encode() + piece + (b"\r\n" if n else b""))
    if trailer:
        out.append(f"{trailer[0]}:{trailer[1]}\r\n".encode())
    out.append(b"\r\n")
    return b"".join(out)


def test_aws_chunked_bodies_are_decoded(sim: S3Sim, s3: Any, pair: str) -> None:
    data = os.urandom(300_000)
    crc = base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
    cases = {
        "signed": (
            _aws_chunked(data, [65536] * 4 + [37856], True, None),
            "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
        ),
        "trailer": (
            _aws_chunked(data, [100_000, 200_000], False, ("x-amz-checksum-crc32", crc)),
            "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
        ),
    }
    for key, (body, sha) in cases.items():
        headers = {
            "Content-Encoding": "aws-chunked",
            "Content-Length": str(len(body)),
            "x-amz-decoded-content-length": str(len(data)),
            "x-amz-content-sha256": sha,
        }
        status, reply = _raw(sim, "PUT", f"/{pair}/{key}", body, headers)
        assert status == 200, reply
        assert s3.get_object(Bucket=pair, Key=key)["Body"].read() == data
    head = s3.head_object(Bucket=pair, Key="trailer", ChecksumMode="ENABLED")
    assert head["ChecksumCRC32"] == crc and "ContentEncoding" not in head
    # HTTP chunked framing around aws-chunked, and a bad trailer checksum (verified: "all").
    inner = _aws_chunked(data, [150_000, 150_000], False, ("x-amz-checksum-crc32", crc))
    framed = b"".join(f"{len(inner[i:i + 50_000]):x}\r\n".encode() + inner[i : i + 50_000] + b"\r\n"
                      for i in range(0, len(inner), 50_000)) + b"0\r\n\r\n"  # fmt: skip
    te = {"Transfer-Encoding": "chunked", "Content-Encoding": "aws-chunked",
          "x-amz-decoded-content-length": str(len(data))}  # fmt: skip
    assert _raw(sim, "PUT", f"/{pair}/te", framed, te)[0] == 200
    assert s3.get_object(Bucket=pair, Key="te")["Body"].read() == data
    bad = _aws_chunked(data, [300_000], False, ("x-amz-checksum-crc32", _crc32c(b"x")))
    sim.configure(checksums="all")
    try:
        status, reply = _raw(sim, "PUT", f"/{pair}/bad", bad, {
            "Content-Encoding": "aws-chunked", "Content-Length": str(len(bad)),
            "x-amz-decoded-content-length": str(len(data)),
        })  # fmt: skip
    finally:
        sim.configure(checksums="fast")
    assert status == 400 and b"<Code>BadDigest</Code>" in reply


# -- the real clients -------------------------------------------------------------------------


def test_clients_round_trip_a_state_dict(
    sim: S3Sim, s3: Any, pair: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    import torch.distributed.checkpoint as dcp
    from s3torchconnector import S3ClientConfig
    from s3torchconnector.dcp import S3StorageReader as TcReader
    from s3torchconnector.dcp import S3StorageWriter as TcWriter
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

    from s3ckpt import S3Config, S3StorageReader, S3StorageWriter

    monkeypatch.setenv("AWS_ENDPOINT_URL", sim.endpoint)  # the CRT client reads it
    g = torch.Generator().manual_seed(0)
    sd = {"w": torch.randn(512, 1024, generator=g), "b": torch.arange(7), "step": 3}
    cfg, tc = S3Config(endpoint_url=sim.endpoint), S3ClientConfig(force_path_style=True)
    kw = {"client_kwargs": {"endpoint_url": sim.endpoint}}
    backends = {
        "s3ckpt": (lambda u: S3StorageWriter(u, s3_config=cfg),
                   lambda u: S3StorageReader(u, s3_config=cfg)),
        "s3tc": (lambda u: TcWriter("us-east-1", u, s3client_config=tc),
                 lambda u: TcReader("us-east-1", u, s3client_config=tc)),
        "s3fs": (lambda u: FsspecWriter(u, **kw), lambda u: FsspecReader(u, **kw)),
    }  # fmt: skip
    # The round trip itself must make no errors. The first s3ckpt save of a process to an
    # (endpoint, bucket) also probes the store once: conditional PUTs that must fail with 412
    # (store/_capabilities.py) and one PUT with a wrong CRC32C that a verifying store refuses
    # with 400 (store/_capabilities.py). Those errors are the probes' expected answers, not the
    # round trip's, so one save to a scratch prefix warms the per-process caches first.
    dcp.save(sd, storage_writer=S3StorageWriter(f"s3://{pair}/warm-up/step_0", s3_config=cfg))
    sim.reset_stats()
    for name, (writer, reader) in backends.items():
        url = f"s3://{pair}/{name}/step_3"
        dcp.save(sd, storage_writer=writer(url))
        out = {"w": torch.zeros(512, 1024), "b": torch.zeros(7, dtype=torch.int64), "step": 0}
        dcp.load(out, storage_reader=reader(url))
        assert torch.equal(out["w"], sd["w"]) and torch.equal(out["b"], sd["b"]), name
        assert out["step"] == 3, name
    stats = sim.stats()
    assert stats["errors"] == 0 or all(
        op in ("HeadObject", "GetObject", "ListObjectsV2")
        for op, r in stats["ops"].items()
        if r["errors"]
    ), stats["ops"]  # existence probes may 404
    assert stats["slowdowns"] == 0 and stats["bytes_in"] >= 3 * 2 * MIB


# -- shaping ----------------------------------------------------------------------------------


@pytest.fixture
def shaped(sim: S3Sim) -> Iterator[S3Sim]:
    """The module's server; its shaping is reset to none afterwards."""
    yield sim
    sim.configure(profile="none")


def _put_burst(sim: S3Sim, paths: list[str]) -> list[int]:
    """Unsigned 0-byte PUTs on one keep-alive connection (s3sim ignores auth)."""
    conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=30)
    statuses = []
    try:
        for path in paths:
            conn.request("PUT", path, body=b"")
            resp = conn.getresponse()
            body = resp.read()
            if resp.status == 503:
                assert b"<Code>SlowDown</Code>" in body
                assert b"Please reduce your request rate." in body
            statuses.append(resp.status)
    finally:
        conn.close()
    return statuses


def test_a_throttled_prefix_answers_slowdown_and_counts_it(
    shaped: S3Sim, s3: Any, pair: str
) -> None:
    shaped.configure(throttles=[Throttle(f"{pair}/hot/", None, 5)], burst_s=1.0)
    shaped.reset_stats()
    hot = _put_burst(shaped, [f"/{pair}/hot/k{i}" for i in range(30)])
    cold = _put_burst(shaped, [f"/{pair}/cold/k{i}" for i in range(30)])
    assert 5 <= hot.count(200) <= 8 and hot.count(503) == 30 - hot.count(200)
    assert cold == [200] * 30
    with pytest.raises(ClientError) as info:  # boto3 sees S3's error, without retries
        for i in range(10):
            s3.put_object(Bucket=pair, Key=f"hot/boto{i}", Body=b"x")
    assert info.value.response["Error"]["Code"] == "SlowDown"
    stats = shaped.stats()
    assert stats["ops"]["PutObject"]["slowdown"] == stats["slowdowns"] >= hot.count(503) + 1
    part = next(p for p in stats["partitions"] if p["prefix"] == f"{pair}/hot/")
    assert part["pinned"] and part["throttled_writes"] == stats["slowdowns"]
    assert stats["prefixes"][f"{pair}/hot"]["writes"] >= 31


def test_sustained_load_splits_a_partition(shaped: S3Sim, pair: str) -> None:
    shaped.configure(write_rate=40.0, burst_s=0.5, split_after_s=1.0)
    t0, n = time.monotonic(), 0
    # Far above the rate (throttled past the burst) until a window closes hot.
    while not shaped.stats()["splits"] and time.monotonic() - t0 < 5:
        _put_burst(shaped, [f"/{pair}/run/{'xy'[i % 2]}{i}" for i in range(n, n + 40)])
        n += 40
    splits = shaped.stats()["splits"]
    assert splits and splits[0]["parent"] == f"{pair}/", splits
    assert splits[0]["children"] == [f"{pair}/run/x", f"{pair}/run/y"]
    prefixes = {p["prefix"] for p in shaped.stats()["partitions"]}
    assert {f"{pair}/", f"{pair}/run/x", f"{pair}/run/y"} <= prefixes


def test_latency_and_bandwidth(shaped: S3Sim, s3: Any, pair: str) -> None:
    s3.put_object(Bucket=pair, Key="blob", Body=b"z" * (4 * MIB))
    shaped.configure(ttfb_s=0.1)
    t = time.perf_counter()
    s3.head_object(Bucket=pair, Key="blob")
    assert time.perf_counter() - t >= 0.1
    shaped.configure(ttfb_s=0.0, conn_mb_per_s=20.0)
    # 4.2 MB at 20 MB/s each way: ~0.2 s less the 256 KiB allowance.
    t = time.perf_counter()
    assert len(s3.get_object(Bucket=pair, Key="blob")["Body"].read()) == 4 * MIB
    assert 0.15 <= time.perf_counter() - t < 2.0
    t = time.perf_counter()
    s3.put_object(Bucket=pair, Key="blob2", Body=b"z" * (4 * MIB))
    assert 0.15 <= time.perf_counter() - t < 2.0


# -- the process and its API ------------------------------------------------------------------


def test_start_stop_and_stats_schema() -> None:
    threads = threading.active_count()
    sim = S3Sim(buckets=["one"])
    with sim:
        proc = sim.process
        assert proc is not None and proc.poll() is None
        stats = sim.stats()
        keys = "cpu_s cpu_s_since_reset requests slowdowns bytes_in bytes_out ops partitions"
        for key in (*keys.split(), "splits", "prefixes", "store", "shaping", "options"):
            assert key in stats, key
        assert stats["store"]["buckets"] == 1
        cfg = sim.configure(profile="s3", rate_scale=0.01, min_part_size=1)
        assert cfg["shaping"]["read_rate"] == 5500 and cfg["shaping"]["rate_scale"] == 0.01
        assert cfg["options"]["min_part_size"] == 1
        assert sim.shaping == Shaping.s3(rate_scale=0.01) and sim.options.min_part_size == 1
        sim.clear()
        assert sim.stats()["store"]["buckets"] == 0
    assert proc.poll() is not None  # terminated
    assert threading.active_count() == threads
