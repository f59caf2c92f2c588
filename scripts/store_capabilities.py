#!/usr/bin/env python3
"""Measure, with raw boto3 calls, what an S3 endpoint does with the requests s3ckpt relies on.

    python scripts/store_capabilities.py --endpoint http://127.0.0.1:9000 [--bucket NAME]
        [--create-bucket] [--region us-east-1] [--label NAME] [--json]

Every check is one or a few plain requests against a scratch prefix (removed at the end), so
the table says what the *store* does, not what s3ckpt makes of it. The expected column is
what AWS S3 documents. docs/compatibility.md's measured columns come from this script:
rerun it against a store to regenerate a row. Credentials come from boto3's default chain
(``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``); retries are off so an unsupported
operation answers at once.

Then the checks no single request can answer, made with s3ckpt's own store and the very
probes ``s3ckpt doctor`` runs (the ``s3ckpt`` package must be importable: run it from the
checkout's venv): ``--pairs`` races each of conditional create (two ``PUT If-None-Match: *``),
If-Match replace (two ``PUT If-Match``) and conditional delete (``DELETE If-Match`` against
``PUT If-Match``) of one key at the same instant (:func:`s3ckpt.store._capabilities.race`); an open
upload made by another process must be listed by ``ListMultipartUploads``; and a run laid
out as s3ckpt writes it (checkpoint folders, a marker, a shard folder) must list with
``Delimiter=/``, two keys a page, every folder and object exactly once
(:mod:`s3ckpt.tools._doctor_store`).
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import email.utils
import json
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any

import boto3
import crc32c
from botocore.config import Config
from botocore.exceptions import ClientError

MiB = 1024 * 1024


@dataclasses.dataclass
class Result:
    """One check: its name, what AWS S3 does, what this store did, and whether they agree."""

    name: str
    expected: str
    observed: str
    ok: bool | None  # None: informative, no verdict


_RACED = {
    "create": "PUT If-None-Match:* x2",
    "replace": "PUT If-Match x2",
    "delete": "DELETE If-Match vs PUT If-Match",
}


def _location(args: argparse.Namespace, bucket: str) -> Any:
    """The bucket as an s3ckpt Location, path-style as the raw client."""
    from s3ckpt.config import S3Config
    from s3ckpt.store import Location

    config = S3Config(endpoint_url=args.endpoint, region=args.region, addressing_style="path")
    return Location.of(f"s3://{bucket}/", s3_config=config)


def _b64crc(data: bytes) -> str:
    return base64.b64encode(crc32c.crc32c(data).to_bytes(4, "big")).decode()


def _status(exc: ClientError) -> str:
    err = exc.response.get("Error", {})
    code = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?")
    return f"{code} {err.get('Code', '')}".strip()


class Probe:
    """Runs the checks against ``bucket`` under a fresh scratch prefix."""

    def __init__(self, client: Any, bucket: str, s3ckpt: Any = None, pairs: int = 8) -> None:
        self.c = client
        self.bucket = bucket
        self.prefix = f"s3ckpt-capabilities-{uuid.uuid4().hex[:8]}/"
        self.results: list[Result] = []
        # An s3ckpt Location of the scratch prefix, for the races and doctor's probes.
        self.s3ckpt = s3ckpt.child(self.prefix) if s3ckpt is not None else None
        self.pairs = pairs

    def key(self, name: str) -> str:
        return self.prefix + name

    def _try(self, fn: Callable[[], Any]) -> tuple[Any, str]:
        """``(response, "200")`` or ``(None, "<status> <code>")``."""
        try:
            resp = fn()
        except ClientError as exc:
            return None, _status(exc)
        status = resp.get("ResponseMetadata", {}).get("HTTPStatusCode", "?")
        return resp, str(status)

    def add(self, name: str, expected: str, observed: str, ok: bool | None) -> None:
        self.results.append(Result(name, expected, observed, ok))

    def put(self, key: str, body: bytes = b"x", **kw: Any) -> tuple[Any, str]:
        return self._try(lambda: self.c.put_object(Bucket=self.bucket, Key=key, Body=body, **kw))

    # -- the checks --------------------------------------------------------------------------
    def conditional_put(self) -> None:
        k = self.key("cond")
        _, s = self.put(k, b"absent", IfNoneMatch="*")
        self.add("PUT If-None-Match:* (absent key)", "200", s, s == "200")
        _, s = self.put(k, b"again", IfNoneMatch="*")
        self.add("PUT If-None-Match:* (existing key)", "412", s, s.startswith("412"))
        etag = self.c.head_object(Bucket=self.bucket, Key=k)["ETag"]
        _, s = self.put(k, b"wrong", IfMatch='"0123456789abcdef0123456789abcdef"')
        self.add("PUT If-Match (wrong ETag)", "412", s, s.startswith("412"))
        _, s = self.put(k, b"right", IfMatch=etag)
        body = self.c.get_object(Bucket=self.bucket, Key=k)["Body"].read()
        self.add("PUT If-Match (current ETag)", "200", f"{s}, body={body!r}", s == "200")

    def conditional_delete(self) -> None:
        k = self.key("cdel")
        self.put(k)
        etag = self.c.head_object(Bucket=self.bucket, Key=k)["ETag"]
        _, s = self._try(
            lambda: self.c.delete_object(
                Bucket=self.bucket, Key=k, IfMatch='"0123456789abcdef0123456789abcdef"'
            )
        )
        alive = self._exists(k)
        self.add(
            "DELETE If-Match (wrong ETag)",
            "412, object kept",
            f"{s}, object {'kept' if alive else 'DELETED'}",
            s.startswith("412") and alive,
        )
        if alive:
            _, s = self._try(lambda: self.c.delete_object(Bucket=self.bucket, Key=k, IfMatch=etag))
            gone = not self._exists(k)
            self.add(
                "DELETE If-Match (current ETag)",
                "204, object gone",
                f"{s}, object {'gone' if gone else 'kept'}",
                s == "204" and gone,
            )

    def _exists(self, key: str) -> bool:
        resp, _ = self._try(lambda: self.c.head_object(Bucket=self.bucket, Key=key))
        return resp is not None

    def checksums(self) -> None:
        k, data = self.key("crc"), b"checksum me" * 100
        resp, s = self.put(k, data, ChecksumAlgorithm="CRC32C", ChecksumCRC32C=_b64crc(data))
        echoed = (resp or {}).get("ChecksumCRC32C")
        self.add(
            "PUT x-amz-checksum-crc32c echoed",
            "same value",
            f"{s}, echoed={echoed}" if echoed else f"{s}, not echoed",
            echoed == _b64crc(data),
        )
        wrong = _b64crc(b"other")
        resp, s = self.put(
            self.key("badcrc"), data, ChecksumAlgorithm="CRC32C", ChecksumCRC32C=wrong
        )
        stored = self._exists(self.key("badcrc"))
        echo = (resp or {}).get("ChecksumCRC32C")
        said = {
            None: "",
            wrong: ", echoes the wrong value",
            _b64crc(data): ", echoes the true value",
        }
        self.add(
            "PUT with a wrong CRC32C",
            "400 BadDigest, not stored",
            f"{s}, {'STORED' if stored else 'not stored'}{said.get(echo, f', echoes {echo}')}",
            s.startswith("400") and not stored,
        )

    def multipart(self) -> None:
        k = self.key("mpu")
        up, s = self._try(
            lambda: self.c.create_multipart_upload(
                Bucket=self.bucket, Key=k, ChecksumAlgorithm="CRC32C"
            )
        )
        if up is None:
            self.add("CreateMultipartUpload", "200", s, False)
            return
        uid = up["UploadId"]
        listed, s = self._try(
            lambda: self.c.list_multipart_uploads(Bucket=self.bucket, Prefix=self.prefix)
        )
        ids = [u["UploadId"] for u in (listed or {}).get("Uploads", []) or []]
        self.add(
            "ListMultipartUploads",
            "200, lists the open upload",
            f"{s}, {'listed' if uid in ids else 'NOT listed'}" if listed else s,
            uid in ids,
        )
        part1, part2 = b"a" * (5 * MiB), b"b" * 1000
        parts: list[dict[str, Any]] = []
        echo: list[bool] = []
        for n, data in ((1, part1), (2, part2)):
            resp, s = self._try(
                partial(
                    self.c.upload_part,
                    Bucket=self.bucket,
                    Key=k,
                    UploadId=uid,
                    PartNumber=n,
                    Body=data,
                    ChecksumAlgorithm="CRC32C",
                    ChecksumCRC32C=_b64crc(data),
                )
            )
            if resp is None:
                self.add(f"UploadPart {n}", "200", s, False)
                return
            echo.append(resp.get("ChecksumCRC32C") == _b64crc(data))
            parts.append({"PartNumber": n, "ETag": resp["ETag"], "ChecksumCRC32C": _b64crc(data)})
        self.add(
            "UploadPart x-amz-checksum-crc32c echoed",
            "same value",
            "echoed" if all(echo) else "not echoed",
            all(echo),
        )
        _, s = self._try(
            lambda: self.c.complete_multipart_upload(
                Bucket=self.bucket, Key=k, UploadId=uid, MultipartUpload={"Parts": parts}
            )
        )
        size = self.c.head_object(Bucket=self.bucket, Key=k)["ContentLength"] if s == "200" else 0
        self.add(
            "Multipart 5 MiB + 1000 B parts",
            "200, 5,243,880 bytes",
            f"{s}, {size:,} bytes",
            size == len(part1) + len(part2),
        )
        self.complete_if_none_match(k)
        self.small_parts()

    def complete_if_none_match(self, existing: str) -> None:
        uid = self.c.create_multipart_upload(Bucket=self.bucket, Key=existing)["UploadId"]
        etag = self.c.upload_part(
            Bucket=self.bucket, Key=existing, UploadId=uid, PartNumber=1, Body=b"late"
        )["ETag"]
        _, s = self._try(
            lambda: self.c.complete_multipart_upload(
                Bucket=self.bucket,
                Key=existing,
                UploadId=uid,
                MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]},
                IfNoneMatch="*",
            )
        )
        size = self.c.head_object(Bucket=self.bucket, Key=existing)["ContentLength"]
        self.add(
            "CompleteMultipartUpload If-None-Match:* (existing key)",
            "412, object kept",
            f"{s}, object {'kept' if size > 4 else 'REPLACED'}",
            s.startswith("412") and size > 4,
        )
        self._try(
            lambda: self.c.abort_multipart_upload(Bucket=self.bucket, Key=existing, UploadId=uid)
        )

    def small_parts(self) -> None:
        k = self.key("small-parts")
        uid = self.c.create_multipart_upload(Bucket=self.bucket, Key=k)["UploadId"]
        parts = []
        for n in (1, 2):
            etag = self.c.upload_part(
                Bucket=self.bucket, Key=k, UploadId=uid, PartNumber=n, Body=b"s" * 1000
            )["ETag"]
            parts.append({"PartNumber": n, "ETag": etag})
        _, s = self._try(
            lambda: self.c.complete_multipart_upload(
                Bucket=self.bucket, Key=k, UploadId=uid, MultipartUpload={"Parts": parts}
            )
        )
        # Informative: s3ckpt never sends a non-last part under 5 MiB.
        self.add("Multipart non-last part < 5 MiB", "400 EntityTooSmall", s, None)
        self._try(lambda: self.c.abort_multipart_upload(Bucket=self.bucket, Key=k, UploadId=uid))

    def delete_objects(self) -> None:
        keys = [self.key(f"del/{i}") for i in range(3)]
        for k in keys[:2]:
            self.put(k)
        resp, s = self._try(
            lambda: self.c.delete_objects(
                Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True}
            )
        )
        left = [k for k in keys if self._exists(k)]
        errors = (resp or {}).get("Errors", []) or []
        self.add(
            "DeleteObjects (3 keys, 1 absent, Quiet)",
            "200, no errors, all gone",
            f"{s}, {len(errors)} errors, {len(left)} left" if resp else s,
            s == "200" and not errors and not left,
        )

    def ranged_get(self) -> None:
        k = self.key("range")
        self.put(k, bytes(range(256)))
        resp, s = self._try(
            lambda: self.c.get_object(Bucket=self.bucket, Key=k, Range="bytes=10-19")
        )
        body = resp["Body"].read() if resp else b""
        self.add(
            "GET Range: bytes=10-19",
            "206, 10 bytes",
            f"{s}, {len(body)} bytes",
            s == "206" and body == bytes(range(10, 20)),
        )

    def clock(self) -> None:
        before = time.time()
        resp = self.c.head_bucket(Bucket=self.bucket)
        after = time.time()
        date = resp["ResponseMetadata"]["HTTPHeaders"].get("date")
        if date is None:
            self.add("Date header", "present", "absent", False)
            return
        store = email.utils.parsedate_to_datetime(date).timestamp()
        skew = (before + after) / 2 - store
        self.add("Date header (local - store)", "present", f"present, {skew:+.1f} s", True)
        k = self.key("clock")
        self.put(k)
        lm = self.c.head_object(Bucket=self.bucket, Key=k)["LastModified"]
        lag = datetime.now(UTC).timestamp() - lm.timestamp()
        self.add("LastModified of a fresh PUT (local - it)", "about 0 s", f"{lag:+.1f} s", None)

    def list_delimiter(self) -> None:
        self.put(self.key("dir/a"))
        resp, s = self._try(
            lambda: self.c.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix, Delimiter="/")
        )
        prefixes = [p["Prefix"] for p in (resp or {}).get("CommonPrefixes", []) or []]
        want = self.key("dir/")
        self.add(
            "ListObjectsV2 Delimiter=/",
            "CommonPrefixes",
            f"{s}, {'has' if want in prefixes else 'MISSING'} {want[len(self.prefix) :]}",
            want in prefixes,
        )
        if resp is not None and "KeyCount" in resp:
            objects = len(resp.get("Contents", []) or [])
            count, both = resp["KeyCount"], objects + len(prefixes)
            # Informative: s3ckpt accepts either count (s3ckpt/store/_reply.py).
            said = {both: "objects + prefixes", objects: "objects only"}.get(count, "neither")
            self.add(
                "ListObjectsV2 Delimiter=/ KeyCount",
                "objects + prefixes",
                f"{count} ({said}: {objects} objects, {len(prefixes)} prefixes)",
                None,
            )

    def abort(self) -> None:
        k = self.key("abort")
        up, s = self._try(lambda: self.c.create_multipart_upload(Bucket=self.bucket, Key=k))
        if up is not None:
            uid = up["UploadId"]
            _, s = self._try(
                lambda: self.c.abort_multipart_upload(Bucket=self.bucket, Key=k, UploadId=uid)
            )
        self.add("AbortMultipartUpload", "204", s, s == "204")

    def cleanup(self) -> None:
        try:
            for up in self.c.list_multipart_uploads(Bucket=self.bucket, Prefix=self.prefix).get(
                "Uploads", []
            ):
                self.c.abort_multipart_upload(
                    Bucket=self.bucket, Key=up["Key"], UploadId=up["UploadId"]
                )
        except ClientError:
            pass
        keys = [
            o["Key"]
            for page in self.c.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.prefix
            )
            for o in page.get("Contents", []) or []
        ]
        for k in keys:
            self._try(partial(self.c.delete_object, Bucket=self.bucket, Key=k))

    def races(self) -> None:
        """``pairs`` races of each conditional request, through s3ckpt's store."""
        from s3ckpt.errors import S3CkptError
        from s3ckpt.store._capabilities import race

        store = self.s3ckpt.store
        for kind in ("create", "replace", "delete"):
            name = f"race: {_RACED[kind]}, {self.pairs} pairs"
            try:
                raced = race(store, self.key(f"race-{kind}"), kind, pairs=self.pairs)
            except S3CkptError as exc:
                self.add(name, "one winner each time", f"request failed: {exc.code}", False)
                continue
            seen = raced.describe().rsplit(": ", 1)[1]
            self.add(name, "one winner each time", seen, raced.atomic)

    def doctor_probes(self) -> None:
        """Another process's upload listed, and a run listed folder by folder, paged: the
        rows of ``s3ckpt doctor`` (:mod:`s3ckpt.tools._doctor_store`)."""
        from s3ckpt.tools._doctor_checks import Scratch
        from s3ckpt.tools._doctor_report import CheckStatus
        from s3ckpt.tools._doctor_store import LISTING_PAGE, listing_row, other_upload_row

        for name, expected, row in (
            ("ListMultipartUploads, another process's upload", "listed", other_upload_row),
            (
                f"nested-prefix listing, Delimiter=/, MaxKeys={LISTING_PAGE}",
                "each folder and object once",
                listing_row,
            ),
        ):
            check = row(Scratch(self.s3ckpt))
            ok = {CheckStatus.OK: True, CheckStatus.SKIP: None}.get(check.status, False)
            self.add(name, expected, check.detail, ok)

    def run(self) -> list[Result]:
        checks = [
            self.conditional_put,
            self.conditional_delete,
            self.checksums,
            self.multipart,
            self.abort,
            self.delete_objects,
            self.ranged_get,
            self.list_delimiter,
            self.clock,
        ]
        if self.s3ckpt is not None:
            checks += [self.races, self.doctor_probes]
        try:
            for check in checks:
                try:
                    check()
                except Exception as exc:  # a store that breaks one check still gets the others
                    self.add(check.__name__, "-", f"check failed: {exc!r}"[:120], False)
        finally:
            self.cleanup()
        return self.results


def table(results: list[Result], label: str) -> str:
    """A Markdown table of ``results``."""
    mark = {True: "yes", False: "**no**", None: "-"}
    rows = [f"| check | AWS S3 | {label} | as AWS |", "| --- | --- | --- | --- |"]
    rows += [f"| {r.name} | {r.expected} | {r.observed} | {mark[r.ok]} |" for r in results]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, run the checks, print the table (or JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoint", required=True, help="the S3 endpoint URL")
    ap.add_argument("--bucket", default=None, help="bucket to use (default: a new one)")
    ap.add_argument("--create-bucket", action="store_true", help="create --bucket first")
    ap.add_argument("--region", default="us-east-1")
    ap.add_argument("--label", default="observed", help="the store's name in the table")
    ap.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    ap.add_argument("--pairs", type=int, default=8, help="races of each conditional request")
    ap.add_argument(
        "--raw-only", action="store_true", help="only the raw boto3 checks (no s3ckpt import)"
    )
    args = ap.parse_args(argv)
    client = boto3.client(
        "s3",
        endpoint_url=args.endpoint,
        region_name=args.region,
        config=Config(
            retries={"max_attempts": 1, "mode": "standard"},
            # as s3ckpt's own client (s3ckpt/store/s3.py): the body's CRC32C, no SHA-256
            s3={"addressing_style": "path", "payload_signing_enabled": False},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
    )
    bucket = args.bucket or f"s3ckpt-cap-{uuid.uuid4().hex[:8]}"
    if args.bucket is None or args.create_bucket:
        client.create_bucket(Bucket=bucket)
    try:
        where = None if args.raw_only else _location(args, bucket)
        results = Probe(client, bucket, where, args.pairs).run()
    finally:
        if args.bucket is None:  # ours: leave nothing behind
            try:
                client.delete_bucket(Bucket=bucket)
            except ClientError as exc:
                print(f"could not delete scratch bucket {bucket}: {exc}", file=sys.stderr)
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in results], indent=2))
    else:
        print(table(results, args.label))
    return 0 if all(r.ok is not False for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
