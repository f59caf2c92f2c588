"""The in-memory object store and S3's semantics for it (no HTTP here).

Data is never copied after it has been received: an object is a :class:`Blob`, a list of
memoryviews over the request bodies it was uploaded in (one for PutObject, one per part for
a multipart upload), so CompleteMultipartUpload and CopyObject are metadata operations and
a ranged GET slices memoryviews (O(range), never O(object)).

Keys of a bucket are kept in a sorted list beside the dict, so listings bisect to their
start and skip whole common prefixes by bisection: a page costs O(page + log n) however
many keys the bucket holds. Inserting a key that is not the largest costs a list insert
(a memmove, ~50 microseconds at a million keys).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import itertools
import os
import time
from bisect import bisect_left, bisect_right, insort
from collections.abc import Sequence
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any

from . import _checksums
from ._errors import S3Error
from ._options import Options

__all__ = [
    "Blob",
    "Bucket",
    "Checksum",
    "ListPage",
    "Obj",
    "Part",
    "Store",
    "Upload",
    "etag_matches",
    "successor",
]

MAX_PART_NUMBER = 10_000
_upload_seq = itertools.count(1)


def successor(prefix: str) -> str | None:
    """The smallest string greater than every string that starts with ``prefix`` (None: no
    such string, i.e. ``prefix`` is empty or all U+10FFFF)."""
    while prefix:
        last = ord(prefix[-1])
        if last < 0x10FFFF:
            return prefix[:-1] + chr(last + 1)
        prefix = prefix[:-1]
    return None


def etag_matches(condition: str, etag: str) -> bool:
    """If-Match / If-None-Match against an ETag: ``*``, or any listed ETag (quotes ignored)."""
    bare = etag.strip('"')
    return any(c.strip() == "*" or c.strip().strip('"') == bare for c in condition.split(","))


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(t))


class Blob:
    """Immutable bytes made of one or more memoryview segments."""

    __slots__ = ("segments", "size", "starts")

    def __init__(self, segments: Sequence[memoryview]) -> None:
        self.segments = [s for s in segments if len(s)] or [memoryview(b"")]
        self.starts: list[int] = []
        n = 0
        for s in self.segments:
            self.starts.append(n)
            n += len(s)
        self.size = n

    def slices(self, start: int, stop: int) -> list[memoryview]:
        """Memoryviews of bytes ``[start, stop)`` (no copy)."""
        if start >= stop:
            return []
        if len(self.segments) == 1:
            return [self.segments[0][start:stop]]
        out = []
        i = bisect_right(self.starts, start) - 1
        while i < len(self.segments) and self.starts[i] < stop:
            seg, base = self.segments[i], self.starts[i]
            out.append(seg[max(0, start - base) : min(len(seg), stop - base)])
            i += 1
        return out


@dataclass(frozen=True)
class Checksum:
    """An object's or part's checksum: algorithm, base64 value, type, parts (COMPOSITE)."""

    algorithm: str
    value: str
    type: str = "FULL_OBJECT"
    parts: int = 0

    @property
    def qualified(self) -> str:
        """The value as S3 returns it (``<b64>-<N>`` for a COMPOSITE checksum)."""
        return f"{self.value}-{self.parts}" if self.type == "COMPOSITE" else self.value

    def raw(self) -> bytes:
        """The raw digest."""
        return base64.b64decode(self.value)


class Obj:
    """One stored object."""

    __slots__ = (
        "_http_date",
        "_iso_date",
        "blob",
        "checksum",
        "content_type",
        "etag",
        "headers",
        "key",
        "mtime",
        "part_sizes",
        "storage_class",
        "upload_id",
    )

    def __init__(
        self,
        key: str,
        blob: Blob,
        etag: str,
        *,
        headers: tuple[tuple[str, str], ...] = (),
        content_type: str = "binary/octet-stream",
        checksum: Checksum | None = None,
        storage_class: str = "STANDARD",
        part_sizes: list[int] | None = None,
        upload_id: str | None = None,
        mtime: float | None = None,
    ) -> None:
        self.key = key
        self.blob = blob
        self.etag = etag
        self.headers = headers
        self.content_type = content_type
        self.checksum = checksum
        self.storage_class = storage_class
        self.part_sizes = part_sizes
        self.upload_id = upload_id
        self.mtime = time.time() if mtime is None else mtime
        self._http_date: str | None = None
        self._iso_date: str | None = None

    @property
    def size(self) -> int:
        """Bytes in the object."""
        return self.blob.size

    @property
    def last_modified(self) -> str:
        """The Last-Modified header value (whole seconds, as HTTP dates are)."""
        if self._http_date is None:
            self._http_date = formatdate(self.mtime, usegmt=True)
        return self._http_date

    @property
    def last_modified_iso(self) -> str:
        """LastModified as listings write it."""
        if self._iso_date is None:
            self._iso_date = _iso(self.mtime)
        return self._iso_date


@dataclass
class Part:
    """One uploaded part of a multipart upload."""

    number: int
    data: memoryview
    etag: str
    mtime: float
    checksum: Checksum | None = None

    @property
    def size(self) -> int:
        """Bytes in the part."""
        return len(self.data)


@dataclass
class Upload:
    """A multipart upload in progress."""

    upload_id: str
    key: str
    initiated: float
    headers: tuple[tuple[str, str], ...] = ()
    content_type: str = "binary/octet-stream"
    storage_class: str = "STANDARD"
    checksum_algorithm: str | None = None
    checksum_type: str | None = None
    parts: dict[int, Part] = field(default_factory=dict)


@dataclass
class Bucket:
    """A bucket: objects by key, keys sorted, uploads by id and sorted by (key, id)."""

    name: str
    created: float
    objects: dict[str, Obj] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)
    uploads: dict[str, Upload] = field(default_factory=dict)
    upload_index: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class ListPage:
    """One page of a listing: objects or uploads and common prefixes, in key order."""

    entries: list[Any]
    """:class:`Obj` / :class:`Upload` items and ``str`` common prefixes, interleaved in order."""
    truncated: bool

    @property
    def last(self) -> Any:
        """The last entry (None when empty)."""
        return self.entries[-1] if self.entries else None


class Store:
    """All buckets, and every S3 operation as a method that raises :class:`S3Error`."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.buckets: dict[str, Bucket] = {}
        self.objects = 0
        self.bytes = 0

    # -- helpers -------------------------------------------------------------------------------

    def new_etag(self, buffers: Sequence[Any]) -> str:
        """A quoted ETag for a body: MD5 with ``md5_etags``, else 128 random bits."""
        if self.options.md5_etags:
            h = hashlib.md5()
            for b in buffers:
                h.update(b)
            return f'"{h.hexdigest()}"'
        return f'"{os.urandom(16).hex()}"'

    def bucket(self, name: str) -> Bucket:
        """The bucket, or NoSuchBucket."""
        b = self.buckets.get(name)
        if b is None:
            raise S3Error.no_such_bucket(name)
        return b

    def _set(self, b: Bucket, obj: Obj) -> None:
        old = b.objects.get(obj.key)
        if old is None:
            keys = b.keys
            if not keys or obj.key > keys[-1]:
                keys.append(obj.key)
            else:
                insort(keys, obj.key)
            self.objects += 1
        else:
            self.bytes -= old.size
        b.objects[obj.key] = obj
        self.bytes += obj.size

    def _remove(self, b: Bucket, key: str) -> bool:
        obj = b.objects.pop(key, None)
        if obj is None:
            return False
        i = bisect_left(b.keys, key)
        del b.keys[i]
        self.objects -= 1
        self.bytes -= obj.size
        return True

    @staticmethod
    def check_write(b: Bucket, key: str, if_match: str | None, if_none_match: str | None) -> None:
        """Conditional writes as moto 5.2 answers them: If-None-Match ``*`` on an existing key
        -> 412; If-Match on a missing key -> 404 NoSuchKey (no Key element), on another ETag
        -> 412. Other If-None-Match values are ignored."""
        obj = b.objects.get(key)
        if if_none_match is not None and if_none_match.strip() == "*" and obj is not None:
            raise S3Error.precondition_failed("If-None-Match")
        if if_match is not None:
            if obj is None:
                raise S3Error.no_such_key(None)
            if not etag_matches(if_match, obj.etag):
                raise S3Error.precondition_failed("If-Match")

    # -- buckets -------------------------------------------------------------------------------

    def create_bucket(self, name: str) -> None:
        """Create a bucket (an existing one is fine, as in us-east-1 and moto)."""
        if not _valid_bucket_name(name):
            raise S3Error(
                400, "InvalidBucketName", "The specified bucket is not valid.", BucketName=name
            )
        if name not in self.buckets:
            self.buckets[name] = Bucket(name, time.time())

    def delete_bucket(self, name: str) -> None:
        """Delete an empty bucket (409 BucketNotEmpty otherwise)."""
        b = self.bucket(name)
        if b.objects or b.uploads:
            raise S3Error(
                409,
                "BucketNotEmpty",
                "The bucket you tried to delete is not empty",
                BucketName=name,
            )
        del self.buckets[name]

    def clear(self) -> None:
        """Drop every bucket and object."""
        self.buckets.clear()
        self.objects = 0
        self.bytes = 0

    # -- objects -------------------------------------------------------------------------------

    def put(
        self, bucket: str, obj: Obj, if_match: str | None = None, if_none_match: str | None = None
    ) -> Obj:
        """Store ``obj`` under ``obj.key`` (after the conditions hold)."""
        b = self.bucket(bucket)
        self.check_write(b, obj.key, if_match, if_none_match)
        self._set(b, obj)
        return obj

    def get(self, bucket: str, key: str) -> Obj:
        """The object, or NoSuchKey."""
        obj = self.bucket(bucket).objects.get(key)
        if obj is None:
            raise S3Error.no_such_key(key)
        return obj

    def delete(self, bucket: str, key: str, if_match: str | None = None) -> None:
        """Delete a key (a missing key is fine, unless If-Match is given)."""
        b = self.bucket(bucket)
        if if_match is not None:
            obj = b.objects.get(key)
            if obj is None:
                raise S3Error.no_such_key(key)
            if not etag_matches(if_match, obj.etag):
                raise S3Error.precondition_failed("If-Match")
        self._remove(b, key)

    def delete_many(self, bucket: str, keys: Sequence[str]) -> None:
        """DeleteObjects: every key is reported deleted, present or not."""
        b = self.bucket(bucket)
        if len(keys) <= 16:
            for key in keys:
                self._remove(b, key)
            return
        # One pass over the sorted keys instead of one list deletion (a memmove) per key.
        gone = set()
        for key in keys:
            obj = b.objects.pop(key, None)
            if obj is not None:
                gone.add(key)
                self.objects -= 1
                self.bytes -= obj.size
        if gone:
            b.keys = [k for k in b.keys if k not in gone]

    def list(
        self,
        bucket: str,
        prefix: str,
        delimiter: str,
        max_keys: int,
        after_key: str | None = None,
        after_prefix: str | None = None,
    ) -> ListPage:
        """Up to ``max_keys`` objects and common prefixes under ``prefix``, in key order,
        strictly after ``after_key`` and after every key under ``after_prefix``."""
        keys = self.bucket(bucket).keys
        objects = self.bucket(bucket).objects
        lo = bisect_left(keys, prefix)
        if after_key is not None:
            lo = max(lo, bisect_right(keys, after_key))
        if after_prefix is not None:
            nxt = successor(after_prefix)
            lo = max(lo, len(keys) if nxt is None else bisect_left(keys, nxt))
        end_str = successor(prefix)
        hi = len(keys) if end_str is None else bisect_left(keys, end_str, lo)
        out: list[Any] = []
        i, plen = lo, len(prefix)
        while i < hi:
            if len(out) >= max_keys:
                return ListPage(out, True)
            key = keys[i]
            if delimiter:
                j = key.find(delimiter, plen)
                if j >= 0:
                    cp = key[: j + len(delimiter)]
                    out.append(cp)
                    nxt = successor(cp)
                    i = hi if nxt is None else bisect_left(keys, nxt, i + 1, hi)
                    continue
            out.append(objects[key])
            i += 1
        return ListPage(out, False)

    def copy(
        self, bucket: str, obj: Obj, if_match: str | None = None, if_none_match: str | None = None
    ) -> Obj:
        """Store a copy (``obj`` already shares its source's blob)."""
        return self.put(bucket, obj, if_match, if_none_match)

    # -- multipart -----------------------------------------------------------------------------

    def create_upload(self, bucket: str, upload: Upload) -> Upload:
        """Register a new multipart upload (its id is assigned here)."""
        b = self.bucket(bucket)
        # Ids sort by creation, so the (key, id) index lists a key's uploads oldest first.
        upload.upload_id = f"{next(_upload_seq):010x}{os.urandom(12).hex()}"
        b.uploads[upload.upload_id] = upload
        insort(b.upload_index, (upload.key, upload.upload_id))
        return upload

    def upload(self, bucket: str, key: str, upload_id: str) -> Upload:
        """The upload of ``key`` with this id, or NoSuchUpload."""
        up = self.bucket(bucket).uploads.get(upload_id)
        if up is None or up.key != key:
            raise S3Error.no_such_upload(upload_id)
        return up

    @staticmethod
    def check_part_number(value: str) -> int:
        """A partNumber query value (1..10000), or InvalidArgument."""
        try:
            n = int(value)
        except ValueError:
            n = 0
        if not 1 <= n <= MAX_PART_NUMBER:
            raise S3Error.invalid_argument(
                "Part number must be an integer between 1 and 10000, inclusive", "partNumber", value
            )
        return n

    def put_part(self, bucket: str, key: str, upload_id: str, part: Part) -> Part:
        """Store (or replace) one part."""
        up = self.upload(bucket, key, upload_id)
        algo = up.checksum_algorithm
        if algo is not None:
            if part.checksum is None:
                raw = _checksums.compute(algo, [part.data]) if _checksums.verifiable(algo) else None
                if raw is not None:
                    part.checksum = Checksum(algo, _checksums.b64(raw))
            elif part.checksum.algorithm != algo:
                raise S3Error.invalid_request(
                    "Checksum Type mismatch occurred, expected checksum Type: "
                    f"{algo.lower()}, actual checksum Type: {part.checksum.algorithm.lower()}"
                )
        up.parts[part.number] = part
        return part

    def abort_upload(self, bucket: str, key: str, upload_id: str) -> None:
        """Drop an upload and its parts."""
        b = self.bucket(bucket)
        self.upload(bucket, key, upload_id)
        del b.uploads[upload_id]
        i = bisect_left(b.upload_index, (key, upload_id))
        del b.upload_index[i]

    def complete_upload(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        listed: Sequence[tuple[int, str, dict[str, str]]],
        if_match: str | None = None,
        if_none_match: str | None = None,
    ) -> Obj:
        """Assemble the listed parts ``(number, etag, {algorithm: b64 checksum})``.

        Checks, in S3's order: the parts are strictly ascending (InvalidPartOrder), each was
        uploaded with that ETag (InvalidPart), and every part but the last is at least
        ``min_part_size`` (EntityTooSmall). A repeated Complete of an upload that produced
        the current object answers that object again (as moto does).
        """
        b = self.bucket(bucket)
        up = b.uploads.get(upload_id)
        if up is None or up.key != key:
            done = b.objects.get(key)
            if done is not None and done.upload_id == upload_id:
                return done
            raise S3Error.no_such_upload(upload_id)
        if not listed:
            raise S3Error.malformed_xml()
        self.check_write(b, key, if_match, if_none_match)
        parts: list[Part] = []
        prev = 0
        minimum = self.options.min_part_size
        for number, etag, sums in listed:
            if number <= prev:
                raise S3Error.invalid_part_order(upload_id)
            part = up.parts.get(number)
            if part is None or part.etag.strip('"') != etag.strip('"'):
                raise S3Error.invalid_part(upload_id, number, etag)
            if (
                part.checksum is not None
                and sums.get(part.checksum.algorithm, part.checksum.value) != part.checksum.value
            ):
                raise S3Error.invalid_part(upload_id, number, etag)
            if parts and parts[-1].size < minimum:
                last = parts[-1]
                raise S3Error.entity_too_small(last.size, minimum, last.number, last.etag)
            parts.append(part)
            prev = number
        md5s = b"".join(_etag_digest(p.etag) for p in parts)
        etag = f'"{hashlib.md5(md5s).hexdigest()}-{len(parts)}"'
        blob = Blob([p.data for p in parts])
        checksum = None
        algo = up.checksum_algorithm
        if algo is not None:
            ctype = up.checksum_type or ("FULL_OBJECT" if algo == "CRC64NVME" else "COMPOSITE")
            if ctype == "COMPOSITE" and all(p.checksum is not None for p in parts):
                raw = _checksums.composite(algo, [p.checksum.raw() for p in parts if p.checksum])
                checksum = Checksum(algo, _checksums.b64(raw), "COMPOSITE", len(parts))
            elif ctype == "FULL_OBJECT" and _checksums.verifiable(algo):
                raw = _checksums.compute(algo, blob.segments)
                checksum = Checksum(algo, _checksums.b64(raw), "FULL_OBJECT")
        obj = Obj(
            key,
            blob,
            etag,
            headers=up.headers,
            content_type=up.content_type,
            checksum=checksum,
            storage_class=up.storage_class,
            part_sizes=[p.size for p in parts],
            upload_id=upload_id,
        )
        self._set(b, obj)
        del b.uploads[upload_id]
        del b.upload_index[bisect_left(b.upload_index, (key, upload_id))]
        return obj

    def list_uploads(
        self,
        bucket: str,
        prefix: str,
        delimiter: str,
        max_uploads: int,
        key_marker: str,
        upload_id_marker: str,
    ) -> ListPage:
        """Uploads (oldest first within a key) and common prefixes after the markers."""
        b = self.bucket(bucket)
        index = b.upload_index
        lo = bisect_left(index, (prefix, ""))
        if key_marker:
            if upload_id_marker:
                start = bisect_right(index, (key_marker, upload_id_marker))
            elif delimiter and key_marker.endswith(delimiter):
                nxt = successor(key_marker)
                start = len(index) if nxt is None else bisect_left(index, (nxt, ""))
            else:
                start = bisect_left(index, (key_marker + "\0", ""))
            lo = max(lo, start)
        out: list[Any] = []
        i, plen = lo, len(prefix)
        while i < len(index):
            key, uid = index[i]
            if not key.startswith(prefix):
                break
            if len(out) >= max_uploads:
                return ListPage(out, True)
            if delimiter:
                j = key.find(delimiter, plen)
                if j >= 0:
                    cp = key[: j + len(delimiter)]
                    out.append(cp)
                    nxt = successor(cp)
                    i = len(index) if nxt is None else bisect_left(index, (nxt, ""), i + 1)
                    continue
            out.append(b.uploads[uid])
            i += 1
        return ListPage(out, False)


def _etag_digest(etag: str) -> bytes:
    bare = etag.strip('"').split("-", 1)[0]
    try:
        return binascii.unhexlify(bare)
    except (binascii.Error, ValueError):
        return hashlib.md5(bare.encode()).digest()


def _valid_bucket_name(name: str) -> bool:
    if not 3 <= len(name) <= 63:
        return False
    if not (name[0].isalnum() and name[-1].isalnum()):
        return False
    return all(c.islower() or c.isdigit() or c in ".-" for c in name) and name.isascii()
