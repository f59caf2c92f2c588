"""What an S3 reply must carry before :class:`~s3ckpt.store.s3.S3Store` believes it.

A reply can be cut short: a connection that closes inside the header block leaves
botocore with a status line, a few headers and no body, which it parses into a
successful, empty response (no ``ETag``, no ``Contents``, an empty ``Body``). Taken at
its word, that is a part without an ETag (a bare ``KeyError``), an empty listing, a
zero-length object or a batch delete that "deleted everything". Every field the store
reads is therefore checked here, inside the attempt: a missing or malformed one raises
:class:`IncompleteReplyError`, a :class:`~s3ckpt.errors.TransientStoreError` that the
store's retry policy retries like a reset (:func:`s3ckpt.store._errors.is_transient`).
The retry then decides by reading state back, exactly as after a lost reply: a
conditional PUT meets its own 412 and the commit reads the marker back, a repeated
CompleteMultipartUpload meets ``NoSuchUpload`` and reads the object back, a repeated
CreateMultipartUpload aborts the orphan it may have left.

A reply that echoes a CRC32C other than the one sent (``x-amz-checksum-crc32c``) means
the bytes the store got are not the bytes sent: :class:`WireChecksumError`, retried the
same way. A reply that echoes nothing proves nothing either way (see docs/dcp.md,
"Checksums on the wire").

This module imports no botocore: it reads the plain dicts botocore returns.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from s3ckpt import _crc
from s3ckpt.errors import TransientStoreError
from s3ckpt.store.base import ObjectInfo

__all__ = [
    "IncompleteReplyError",
    "WireChecksumError",
    "check_body",
    "check_complete",
    "check_create",
    "check_deleted",
    "check_head",
    "check_list_page",
    "check_uploads_page",
    "check_written",
    "composite_crc32c",
    "listed_object",
]

V = TypeVar("V")


class IncompleteReplyError(TransientStoreError):
    """A reply lacked a field s3ckpt reads, or carried a malformed one: it was cut short
    (or garbled) on the way. Retried; if every attempt's reply is cut, the endpoint or a
    proxy in front of it is truncating replies."""


class WireChecksumError(TransientStoreError):
    """The store echoed a CRC32C other than the one sent: the bytes it received differ
    from the bytes sent. Retried."""


class _Where:
    """The request a check is about, and the field checks that raise its error."""

    def __init__(self, operation: str, bucket: str, key: str | None) -> None:
        self.operation, self.bucket, self.key = operation, bucket, key

    def fail(self, what: str) -> IncompleteReplyError:
        return IncompleteReplyError(
            f"{self.operation}: the reply was cut short or malformed ({what}); retried as a "
            "transport error. If it persists, something between this host and the store "
            "(a proxy, a load balancer) is truncating replies",
            bucket=self.bucket,
            key=self.key,
            operation=self.operation,
            code="IncompleteReply",
        )

    def field(self, obj: Mapping[str, Any], name: str, kind: type[V], where: str = "") -> V:
        """``obj[name]`` when it is a ``kind`` (a non-empty text, an integer >= 0, a time)."""
        value = obj.get(name)
        negative = isinstance(value, int) and value < 0
        if not isinstance(value, kind) or isinstance(value, bool) or value == "" or negative:
            raise self.fail(f"no {name}{where}")
        return value

    def entries(self, resp: Mapping[str, Any], name: str) -> list[Mapping[str, Any]]:
        if (value := resp.get(name)) is None:
            return []
        if not isinstance(value, list) or not all(isinstance(e, Mapping) for e in value):
            raise self.fail(f"malformed {name}")
        return value

    def echo(self, resp: Mapping[str, Any], sent: str | None) -> None:
        """A CRC32C echoed by the store must be the one sent (nothing echoed: unknown)."""
        echoed = resp.get("ChecksumCRC32C")
        if sent is not None and echoed is not None and echoed != sent:
            raise WireChecksumError(
                f"{self.operation}: the store computed CRC32C {echoed} over the bytes it "
                f"received, but {sent} was sent: the body was corrupted in transit; retried",
                bucket=self.bucket,
                key=self.key,
                operation=self.operation,
                code="ChecksumMismatch",
            )


def composite_crc32c(part_checksums: Sequence[str]) -> str | None:
    """S3's checksum of a multipart object (``COMPOSITE``): the CRC32C of the parts'
    binary CRC32Cs, in part order, base64, then ``-{parts}``. ``None`` when a part's
    checksum is missing or not base64."""
    try:
        digests = [base64.b64decode(text, validate=True) for text in part_checksums]
    except (ValueError, TypeError):
        return None
    if not digests or any(len(d) != 4 for d in digests):
        return None
    crc = base64.b64encode(_crc.crc32c(b"".join(digests)).to_bytes(4, "big")).decode("ascii")
    return f"{crc}-{len(part_checksums)}"


def check_written(
    resp: Mapping[str, Any], *, operation: str, bucket: str, key: str, sent_crc32c: str | None
) -> str:
    """A PutObject or UploadPart reply: its ETag (and the CRC32C echo, when one came)."""
    w = _Where(operation, bucket, key)
    etag = w.field(resp, "ETag", str)
    w.echo(resp, sent_crc32c)
    return etag


def check_create(resp: Mapping[str, Any], *, bucket: str, key: str) -> str:
    """A CreateMultipartUpload reply: its UploadId."""
    return _Where("create_multipart", bucket, key).field(resp, "UploadId", str)


def check_complete(
    resp: Mapping[str, Any], *, bucket: str, key: str, part_checksums: Sequence[str] | None
) -> str:
    """A CompleteMultipartUpload reply: its ETag; a composite CRC32C echo (``...-N``)
    must be the one the parts' checksums make."""
    w = _Where("complete_multipart", bucket, key)
    etag = w.field(resp, "ETag", str)
    echoed = resp.get("ChecksumCRC32C")
    if part_checksums and isinstance(echoed, str) and "-" in echoed:
        w.echo(resp, composite_crc32c(part_checksums))
    return etag


def check_head(resp: Mapping[str, Any], *, bucket: str, key: str) -> None:
    """A HeadObject reply: ContentLength, LastModified and ETag."""
    w = _Where("head", bucket, key)
    for name, kind in (("ContentLength", int), ("LastModified", dt.datetime), ("ETag", str)):
        w.field(resp, name, kind)


def check_body(resp: Mapping[str, Any], *, bucket: str, key: str) -> None:
    """A GetObject reply: a Body and its ContentLength (botocore's body then fails a
    read that ends short of it)."""
    w = _Where("get", bucket, key)
    if resp.get("Body") is None:
        raise w.fail("no Body")
    w.field(resp, "ContentLength", int)


def _check_page(w: _Where, resp: Mapping[str, Any], token: str) -> None:
    """IsTruncated, and the ``token`` to go on with when it is true."""
    truncated = resp.get("IsTruncated")
    if not isinstance(truncated, bool):
        raise w.fail("no IsTruncated")
    if truncated:
        w.field(resp, token, str, " on a truncated page" if token.startswith("NextC") else "")


def check_list_page(resp: Mapping[str, Any], *, bucket: str, prefix: str) -> None:
    """A ListObjectsV2 page, by what a page can prove: IsTruncated, and the token to go on
    with when it is true; each object's Key, Size and LastModified; each common prefix's
    Prefix; KeyCount (when sent) a count of what the page holds.

    KeyCount counts objects and common prefixes on S3, but only objects on some stores
    (s3rver with a delimiter), so either count is accepted. A reply cut inside its headers
    lacks IsTruncated; one cut inside its body does not parse; a truncated page without a
    token cannot be followed: each is caught. A short last page is not: a page may hold
    fewer entries than MaxKeys with IsTruncated false, so nothing tells it from a complete
    one (nor may a store be held to a count it does not keep)."""
    w = _Where("list_objects_v2", bucket, prefix)
    _check_page(w, resp, "NextContinuationToken")
    contents = w.entries(resp, "Contents")
    for obj in contents:
        name = w.field(obj, "Key", str, " in Contents")
        w.field(obj, "Size", int, f" for {name}")
        w.field(obj, "LastModified", dt.datetime, f" for {name}")
    prefixes = w.entries(resp, "CommonPrefixes")
    for cp in prefixes:
        w.field(cp, "Prefix", str, " in CommonPrefixes")
    if "KeyCount" in resp:
        count = w.field(resp, "KeyCount", int)
        if count not in (len(contents) + len(prefixes), len(contents)):
            raise w.fail(
                f"KeyCount {count}, but {len(contents)} objects and {len(prefixes)} prefixes"
            )


def listed_object(obj: Mapping[str, Any]) -> ObjectInfo:
    """One ``Contents`` entry of a ListObjectsV2 page (checked by :func:`check_list_page`)."""
    lm = obj.get("LastModified")
    stamp = lm.timestamp() if lm is not None else None
    return ObjectInfo(
        obj["Key"], int(obj.get("Size", 0)), obj.get("ETag"), stamp, obj.get("StorageClass")
    )


def check_uploads_page(resp: Mapping[str, Any], *, bucket: str, prefix: str) -> None:
    """A ListMultipartUploads page: IsTruncated (and the markers to go on with), each
    upload's Key and UploadId."""
    w = _Where("list_multipart_uploads", bucket, prefix)
    _check_page(w, resp, "NextKeyMarker")
    for up in w.entries(resp, "Uploads"):
        name = w.field(up, "Key", str, " in Uploads")
        w.field(up, "UploadId", str, f" for {name}")


def check_deleted(resp: Mapping[str, Any], *, bucket: str, keys: Iterable[str]) -> None:
    """A DeleteObjects reply (not quiet): every key asked for is in Deleted or Errors."""
    keys = list(keys)
    w = _Where("delete", bucket, keys[0] if keys else None)
    answered = {e.get("Key") for n in ("Deleted", "Errors") for e in w.entries(resp, n)}
    if missing := [k for k in keys if k not in answered]:
        raise w.fail(f"{len(missing)} of {len(keys)} keys neither Deleted nor in Errors")
