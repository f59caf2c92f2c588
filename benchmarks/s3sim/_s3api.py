"""S3's REST API over the store: routing, request headers and XML in, headers and XML out.

:func:`route` names the operation from the request head alone (so that the server can
throttle before a body is read); :func:`handle` runs it once the body is in. Behaviour
follows moto 5.2 where moto and S3 agree and S3 where moto is plainly wrong; README.md lists
every difference.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import time
from collections.abc import Callable
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote, unquote
from xml.etree import ElementTree

from . import _checksums
from ._errors import S3Error
from ._http import Request, Response
from ._options import MIB
from ._shaping import READ, WRITE
from ._store import Blob, Checksum, Obj, Part, Store, Upload, etag_matches

__all__ = ["error_response", "handle", "partition_path", "route"]

NS = "http://s3.amazonaws.com/doc/2006-03-01/"
XML_HEAD = '<?xml version="1.0" encoding="UTF-8"?>\n'
XML_TYPE = ("Content-Type", "application/xml")
OWNER_ID = "75aa57f09aa0c8caeab4f8c24e99d10f8e7faeebf76c078efc7c6caea54ba06a"  # moto's
OWNER = f"<Owner><ID>{OWNER_ID}</ID><DisplayName>webfile</DisplayName></Owner>"
INITIATOR = f"<Initiator><ID>{OWNER_ID}</ID><DisplayName>webfile</DisplayName></Initiator>"

#: Sub-resources s3sim does not implement: asking for one is 501 NotImplemented, never a
#: silent GetObject/PutObject of the key.
_UNSUPPORTED = frozenset(
    [
        "accelerate",
        "acl",
        "analytics",
        "attributes",
        "cors",
        "encryption",
        "intelligent-tiering",
        "inventory",
        "legal-hold",
        "lifecycle",
        "logging",
        "metadataTable",
        "metrics",
        "notification",
        "object-lock",
        "ownershipControls",
        "policy",
        "policyStatus",
        "publicAccessBlock",
        "replication",
        "requestPayment",
        "restore",
        "retention",
        "select",
        "tagging",
        "torrent",
        "versions",
        "website",
    ]
)
_ECHO = (
    "content-disposition",
    "content-language",
    "cache-control",
    "expires",
    "x-amz-server-side-encryption",
    "x-amz-server-side-encryption-aws-kms-key-id",
    "x-amz-server-side-encryption-bucket-key-enabled",
    "x-amz-server-side-encryption-customer-algorithm",
    "x-amz-server-side-encryption-customer-key-md5",
    "x-amz-website-redirect-location",
)
_SSE = tuple(h for h in _ECHO if h.startswith("x-amz-server-side"))

# -- routing -------------------------------------------------------------------------------


def route(req: Request) -> None:
    """Set ``req.op`` (the S3 operation name), ``req.kind`` (:data:`READ`, :data:`WRITE` or
    ``""`` for bucket administration, never throttled), ``req.bucket`` and ``req.key``."""
    bucket, _, key = req.path[1:].partition("/")
    req.bucket, req.key = bucket, key
    m, q = req.method, req.query
    # Versions do not exist here; "null" is the version of every object of an unversioned
    # bucket, so asking for it is fine.
    unsupported = not _UNSUPPORTED.isdisjoint(q) or q.get("versionId", "null") != "null"
    op = "NotImplemented"
    if not bucket:
        op = "ListBuckets" if m == "GET" else op
    elif not key:
        if m == "GET":
            if "uploads" in q:
                op = "ListMultipartUploads"
            elif "location" in q:
                op = "GetBucketLocation"
            elif "versioning" in q:
                op = "GetBucketVersioning"
            elif not unsupported:
                op = "ListObjectsV2" if q.get("list-type") == "2" else "ListObjects"
        elif m == "PUT" and not q:
            op = "CreateBucket"
        elif m == "HEAD":
            op = "HeadBucket"
        elif m == "DELETE" and not q:
            op = "DeleteBucket"
        elif m == "POST" and "delete" in q:
            op = "DeleteObjects"
    elif unsupported:
        pass
    elif m == "GET":
        op = "ListParts" if "uploadId" in q else "GetObject"
    elif m == "HEAD":
        op = "HeadObject"
    elif m == "PUT":
        copy = "x-amz-copy-source" in req.headers
        if "uploadId" in q or "partNumber" in q:
            op = "UploadPartCopy" if copy else "UploadPart"
        else:
            op = "CopyObject" if copy else "PutObject"
    elif m == "DELETE":
        op = "AbortMultipartUpload" if "uploadId" in q else "DeleteObject"
    elif m == "POST":
        if "uploads" in q:
            op = "CreateMultipartUpload"
        elif "uploadId" in q:
            op = "CompleteMultipartUpload"
    req.op = op
    if op in _BUCKET_ADMIN or op == "NotImplemented":
        req.kind = ""
    else:
        req.kind = READ if m in ("GET", "HEAD") else WRITE


_BUCKET_ADMIN = frozenset(
    {
        "ListBuckets",
        "CreateBucket",
        "HeadBucket",
        "DeleteBucket",
        "GetBucketLocation",
        "GetBucketVersioning",
    }
)


def partition_path(req: Request) -> str:
    """``"<bucket>/<key>"`` the request is throttled on: the key, a listing's prefix, or the
    bucket's root for DeleteObjects (its keys are only known once its body is read)."""
    if req.key:
        return f"{req.bucket}/{req.key}"
    if req.op in ("ListObjectsV2", "ListObjects", "ListMultipartUploads"):
        return f"{req.bucket}/{req.query.get('prefix', '')}"
    return f"{req.bucket}/"


def handle(store: Store, req: Request) -> Response:
    """Run ``req.op``; S3 errors become S3 error responses."""
    try:
        fn = _HANDLERS.get(req.op)
        if fn is None:
            raise S3Error.not_implemented(f"{req.method} {req.target.split('?')[0]}")
        return fn(store, req)
    except S3Error as err:
        return error_response(err, req)


def error_response(err: S3Error, req: Request) -> Response:
    """The S3 XML error (no body for a HEAD)."""
    if req.method == "HEAD":
        return Response(err.status, [XML_TYPE], no_body=True, length=0)
    extra = "".join(f"<{k}>{_x(v)}</{k}>" for k, v in err.extra.items())
    body = (
        f"{XML_HEAD}<Error><Code>{err.code}</Code><Message>{_x(err.message)}</Message>{extra}"
        f"<RequestId>{req.request_id}</RequestId><HostId>s3sim</HostId></Error>"
    ).encode()
    return Response(err.status, [XML_TYPE], [body])


# -- helpers -------------------------------------------------------------------------------


def _x(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _xml(body: str) -> Response:
    return Response(200, [XML_TYPE], [(XML_HEAD + body).encode()])


def _enc(value: str, url: bool) -> str:
    return quote(value, safe="/") if url else _x(value)


def _int_arg(req: Request, name: str, default: int, cap: int | None = None) -> int:
    raw = req.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise S3Error.invalid_argument(
            f"Provided {name} not an integer or within integer range", name, raw
        )
    return min(value, cap) if cap is not None else value


def _echo_headers(h: dict[str, str]) -> tuple[tuple[str, str], ...]:
    out = [(k, h[k]) for k in _ECHO if k in h]
    enc = ", ".join(
        t.strip()
        for t in h.get("content-encoding", "").split(",")
        if t.strip() and t.strip() != "aws-chunked"
    )
    if enc:
        out.append(("Content-Encoding", enc))
    out.extend((k, v) for k, v in h.items() if k.startswith("x-amz-meta-"))
    return tuple(out)


def _sse_headers(stored: tuple[tuple[str, str], ...]) -> list[tuple[str, str]]:
    return [(k, v) for k, v in stored if k in _SSE]


def _body_checksum(store: Store, req: Request, body: Any) -> Checksum | None:
    """The body's x-amz-checksum-* (header or aws-chunked trailer), verified per options."""
    h, t = req.headers, req.trailers
    found = []
    for algo in _checksums.ALGORITHMS:
        name = f"x-amz-checksum-{algo.lower()}"
        value = h.get(name) or t.get(name)
        if value:
            found.append((algo, name, value))
    mode = store.options.checksums
    md5 = h.get("content-md5")
    if md5 and mode != "off" and (mode == "all" or len(body) <= MIB):
        try:
            want = base64.b64decode(md5, validate=True)
        except (binascii.Error, ValueError):
            want = b""
        if len(want) != 16:
            raise S3Error(400, "InvalidDigest", "The Content-MD5 you specified was invalid.")
        if hashlib.md5(body).digest() != want:
            raise S3Error.bad_digest("MD5")
    if not found:
        return None
    if len(found) > 1:
        raise S3Error.invalid_request(
            "Expecting a single x-amz-checksum- header. Multiple checksum Types are not allowed."
        )
    algo, name, value = found[0]
    raw = _checksums.decode(algo, value)
    if raw is None:
        raise S3Error.invalid_request(f"Value for {name} header is invalid.")
    verify = mode == "all" or (mode == "fast" and algo in _checksums.FAST)
    if verify and _checksums.verifiable(algo) and _checksums.compute(algo, [body]) != raw:
        raise S3Error.bad_digest(algo)
    return Checksum(algo, value.strip())


def _ck_xml(c: Checksum | None, *, qualified: bool = False) -> str:
    """``<ChecksumALGO>value</ChecksumALGO>`` (with ``<ChecksumType>`` when qualified)."""
    if c is None:
        return ""
    tag = f"Checksum{c.algorithm}"
    if qualified:
        return f"<{tag}>{c.qualified}</{tag}><ChecksumType>{c.type}</ChecksumType>"
    return f"<{tag}>{c.value}</{tag}>"


def _checksum_headers(req: Request, c: Checksum | None) -> list[tuple[str, str]]:
    """The checksum echoed by an upload's response: as moto, only when the SDK named the
    algorithm (``x-amz-sdk-checksum-algorithm``; botocore always does when it computes one)."""
    if c is None or "x-amz-sdk-checksum-algorithm" not in req.headers:
        return []
    return [(f"x-amz-checksum-{c.algorithm.lower()}", c.value)]


def _check_read(req: Request, obj: Obj) -> Response | None:
    """If-Match / If-Unmodified-Since (412) and If-None-Match / If-Modified-Since (304)."""
    h = req.headers
    im, inm = h.get("if-match"), h.get("if-none-match")
    if im is not None and not etag_matches(im, obj.etag):
        raise S3Error.precondition_failed("If-Match")
    ius = _http_time(h.get("if-unmodified-since"))
    if im is None and ius is not None and int(obj.mtime) > ius:
        raise S3Error.precondition_failed("If-Unmodified-Since")
    ims = _http_time(h.get("if-modified-since"))
    if (inm is not None and etag_matches(inm, obj.etag)) or (
        inm is None and ims is not None and int(obj.mtime) <= ims
    ):
        return Response(
            304, [("ETag", obj.etag), ("Last-Modified", obj.last_modified)], no_body=True, length=0
        )
    return None


def _http_time(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None


def _parse_range(spec: str, size: int) -> tuple[int, int] | None:
    """``(first, last)`` of a Range header, None to answer the whole object (moto 5.2's rules:
    several ranges or an unparsable one are ignored; a first byte past the end or
    ``bytes=-0`` is InvalidRange; a reversed range is ignored). A unit other than ``bytes``
    is ignored (moto reads it as bytes)."""
    unit, sep, rspec = spec.partition("=")
    if not sep or unit.strip().lower() != "bytes" or "," in rspec:
        return None
    a, sep, b = rspec.partition("-")
    try:
        first = int(a) if a else None
        end = int(b) if b else None
    except ValueError:
        return None
    if not sep:
        return None
    last = size - 1
    if (first is None and end == 0) or (first is not None and first > last):
        raise S3Error.invalid_range(size, spec)
    if first is not None:
        end = last if end is None else min(end, last)
    elif end is not None:
        first, end = size - min(end, size), last
    else:
        return None
    if first > min(end, last):
        return None
    return first, end


# -- objects -------------------------------------------------------------------------------


def _get_object(store: Store, req: Request) -> Response:
    obj = store.get(req.bucket, req.key)
    not_modified = _check_read(req, obj)
    if not_modified is not None:
        return not_modified
    size = obj.size
    headers = [
        ("ETag", obj.etag),
        ("Last-Modified", obj.last_modified),
        ("Content-Type", obj.content_type),
        ("Accept-Ranges", "bytes"),
        *obj.headers,
    ]
    if obj.storage_class != "STANDARD":
        headers.append(("x-amz-storage-class", obj.storage_class))
    status, first, last = 200, 0, size - 1
    part = req.query.get("partNumber")
    spec = req.headers.get("range")
    if part is not None:
        n = Store.check_part_number(part)
        sizes = obj.part_sizes or [size]
        if n > len(sizes):
            raise S3Error(416, "InvalidPartNumber", "The requested partnumber is not satisfiable")
        if obj.part_sizes:
            first = sum(sizes[: n - 1])
            last = first + sizes[n - 1] - 1
            status = 206
            headers.append(("Content-Range", f"bytes {first}-{last}/{size}"))
            headers.append(("x-amz-mp-parts-count", str(len(sizes))))
    elif spec:
        if req.method == "HEAD":
            try:
                rng = _parse_range(spec, size)
            except S3Error:
                return Response(416, [XML_TYPE], no_body=True, length=0)
        else:
            rng = _parse_range(spec, size)
        if rng is not None:
            first, last = rng
            status = 206
            headers.append(("Content-Range", f"bytes {first}-{last}/{size}"))
    whole = first == 0 and last == size - 1
    c = obj.checksum
    if c is not None and whole and req.headers.get("x-amz-checksum-mode", "").upper() == "ENABLED":
        headers.append((f"x-amz-checksum-{c.algorithm.lower()}", c.qualified))
        if c.type == "COMPOSITE":
            headers.append(("x-amz-checksum-type", c.type))
    length = max(0, last - first + 1)
    if req.method == "HEAD":
        return Response(status, headers, no_body=True, length=length)
    return Response(status, headers, obj.blob.slices(first, last + 1))


def _put_object(store: Store, req: Request) -> Response:
    h = req.headers
    body = req.body
    checksum = _body_checksum(store, req, body)
    echo = _echo_headers(h)
    obj = Obj(
        req.key,
        Blob([memoryview(body)]),
        store.new_etag([body]),
        headers=echo,
        content_type=h.get("content-type") or "binary/octet-stream",
        checksum=checksum,
        storage_class=h.get("x-amz-storage-class", "STANDARD"),
    )
    store.put(req.bucket, obj, h.get("if-match"), h.get("if-none-match"))
    return Response(
        200, [("ETag", obj.etag), *_checksum_headers(req, checksum), *_sse_headers(echo)]
    )


def _delete_object(store: Store, req: Request) -> Response:
    store.delete(req.bucket, req.key, req.headers.get("if-match"))
    return Response(204)


def _delete_objects(store: Store, req: Request) -> Response:
    root = _parse_xml(req.body)
    keys, quiet = [], False
    for el in root:
        tag = _tag(el)
        if tag == "Object":
            key = _child_text(el, "Key")
            if key is None:
                raise S3Error.malformed_xml()
            keys.append(key)
        elif tag == "Quiet":
            quiet = (el.text or "").strip().lower() == "true"
    if not keys or len(keys) > 1000:
        raise S3Error.malformed_xml()
    store.delete_many(req.bucket, keys)
    deleted = "" if quiet else "".join(f"<Deleted><Key>{_x(k)}</Key></Deleted>" for k in keys)
    return _xml(f'<DeleteResult xmlns="{NS}">{deleted}</DeleteResult>')


def _copy_source(req: Request) -> tuple[str, str]:
    src = unquote(req.headers["x-amz-copy-source"].split("?versionId=", 1)[0]).lstrip("/")
    bucket, _, key = src.partition("/")
    if not bucket or not key:
        raise S3Error.invalid_argument(
            "Copy Source must mention the source bucket and key: sourcebucket/sourcekey",
            "x-amz-copy-source",
            src,
        )
    return bucket, key


def _copy_object(store: Store, req: Request) -> Response:
    h = req.headers
    sb, sk = _copy_source(req)
    store.bucket(req.bucket)
    src = store.get(sb, sk)
    replace = h.get("x-amz-metadata-directive", "COPY").upper() == "REPLACE"
    if (
        (sb, sk) == (req.bucket, req.key)
        and not replace
        and "x-amz-storage-class" not in h
        and not any(k in h for k in _SSE)
    ):
        raise S3Error.invalid_request(
            "This copy request is illegal because it is trying to copy an object to itself "
            "without changing the object's metadata, storage class, website redirect location "
            "or encryption attributes."
        )
    if replace:
        echo, ctype = _echo_headers(h), h.get("content-type") or "binary/octet-stream"
    else:
        echo, ctype = src.headers, src.content_type
    checksum = src.checksum
    algo = h.get("x-amz-checksum-algorithm", "").upper()
    if algo in _checksums.ALGORITHMS and _checksums.verifiable(algo):
        checksum = Checksum(algo, _checksums.b64(_checksums.compute(algo, src.blob.segments)))
    etag = src.etag if src.part_sizes is None else store.new_etag(src.blob.segments)
    obj = Obj(
        req.key,
        src.blob,
        etag,
        headers=echo,
        content_type=ctype,
        checksum=checksum if checksum is None or checksum.type != "COMPOSITE" else None,
        storage_class=h.get(
            "x-amz-storage-class", src.storage_class if not replace else "STANDARD"
        ),
    )
    store.copy(req.bucket, obj, h.get("if-match"), h.get("if-none-match"))
    ck = _ck_xml(obj.checksum)
    return _xml(
        f'<CopyObjectResult xmlns="{NS}"><ETag>{_x(obj.etag)}</ETag>'
        f"<LastModified>{obj.last_modified_iso}</LastModified>{ck}</CopyObjectResult>"
    )


# -- multipart -----------------------------------------------------------------------------


def _create_upload(store: Store, req: Request) -> Response:
    h = req.headers
    algo = h.get("x-amz-checksum-algorithm", "").upper() or None
    if algo is not None and algo not in _checksums.ALGORITHMS:
        raise S3Error.invalid_request(
            "Checksum algorithm provided is unsupported. Please try again with any of the "
            "valid types: [CRC32, CRC32C, CRC64NVME, SHA1, SHA256]"
        )
    ctype = h.get("x-amz-checksum-type", "").upper() or None
    if ctype is not None and ctype not in ("COMPOSITE", "FULL_OBJECT"):
        raise S3Error.invalid_request("Value for x-amz-checksum-type header is invalid.")
    echo = _echo_headers(h)
    up = store.create_upload(
        req.bucket,
        Upload(
            "",
            req.key,
            time.time(),
            headers=echo,
            content_type=h.get("content-type") or "binary/octet-stream",
            storage_class=h.get("x-amz-storage-class", "STANDARD"),
            checksum_algorithm=algo,
            checksum_type=ctype,
        ),
    )
    resp = _xml(
        f'<InitiateMultipartUploadResult xmlns="{NS}"><Bucket>{_x(req.bucket)}</Bucket>'
        f"<Key>{_x(req.key)}</Key><UploadId>{up.upload_id}</UploadId>"
        "</InitiateMultipartUploadResult>"
    )
    if algo is not None:
        resp.headers.append(("x-amz-checksum-algorithm", algo))
    if ctype is not None:
        resp.headers.append(("x-amz-checksum-type", ctype))
    resp.headers.extend(_sse_headers(echo))
    return resp


def _upload_part(store: Store, req: Request) -> Response:
    n = Store.check_part_number(req.query.get("partNumber", ""))
    up = store.upload(req.bucket, req.key, req.query.get("uploadId", ""))
    body = req.body
    checksum = _body_checksum(store, req, body)
    part = Part(n, memoryview(body), store.new_etag([body]), time.time(), checksum)
    store.put_part(req.bucket, req.key, up.upload_id, part)
    return Response(
        200,
        [("ETag", part.etag), *_checksum_headers(req, part.checksum), *_sse_headers(up.headers)],
    )


def _upload_part_copy(store: Store, req: Request) -> Response:
    n = Store.check_part_number(req.query.get("partNumber", ""))
    up = store.upload(req.bucket, req.key, req.query.get("uploadId", ""))
    src = store.get(*_copy_source(req))
    first, last = 0, src.size - 1
    spec = req.headers.get("x-amz-copy-source-range")
    if spec:
        rng = _parse_range(spec, src.size)
        if rng is None:
            raise S3Error.invalid_argument(
                "The x-amz-copy-source-range value must be of the form bytes=first-last where "
                "first and last are the zero-based offsets of the first and last bytes to copy",
                "x-amz-copy-source-range",
                spec,
            )
        first, last = rng
    pieces = src.blob.slices(first, last + 1)
    data = pieces[0] if len(pieces) == 1 else memoryview(b"".join(pieces))
    part = Part(n, data, store.new_etag([data]), time.time())
    store.put_part(req.bucket, req.key, up.upload_id, part)
    return _xml(
        f'<CopyPartResult xmlns="{NS}"><ETag>{_x(part.etag)}</ETag>'
        f"<LastModified>{_iso(part.mtime)}</LastModified></CopyPartResult>"
    )


def _complete_upload(store: Store, req: Request) -> Response:
    root = _parse_xml(req.body)
    listed: list[tuple[int, str, dict[str, str]]] = []
    for el in root:
        if _tag(el) != "Part":
            continue
        number, etag, sums = _child_text(el, "PartNumber"), _child_text(el, "ETag"), {}
        for child in el:
            tag = _tag(child)
            if tag.startswith("Checksum") and tag[8:] in _checksums.ALGORITHMS:
                sums[tag[8:]] = (child.text or "").strip()
        try:
            listed.append((int(number or ""), etag or "", sums))
        except ValueError:
            raise S3Error.malformed_xml() from None
    h = req.headers
    uid = req.query.get("uploadId", "")
    obj = store.complete_upload(
        req.bucket, req.key, uid, listed, h.get("if-match"), h.get("if-none-match")
    )
    ck = _ck_xml(obj.checksum, qualified=True)
    resp = _xml(
        f'<CompleteMultipartUploadResult xmlns="{NS}">'
        f"<Location>http://{_x(req.bucket)}.s3.amazonaws.com/{_x(req.key)}</Location>"
        f"<Bucket>{_x(req.bucket)}</Bucket><Key>{_x(req.key)}</Key><ETag>{_x(obj.etag)}</ETag>{ck}"
        "</CompleteMultipartUploadResult>"
    )
    resp.headers.extend(_sse_headers(obj.headers))
    return resp


def _abort_upload(store: Store, req: Request) -> Response:
    store.abort_upload(req.bucket, req.key, req.query.get("uploadId", ""))
    return Response(204)


def _list_parts(store: Store, req: Request) -> Response:
    up = store.upload(req.bucket, req.key, req.query.get("uploadId", ""))
    marker = _int_arg(req, "part-number-marker", 0)
    max_parts = _int_arg(req, "max-parts", 1000, 1000)
    numbers = sorted(n for n in up.parts if n > marker)
    page, truncated = numbers[:max_parts], len(numbers) > max_parts
    items = []
    for n in page:
        p = up.parts[n]
        ck = _ck_xml(p.checksum)
        items.append(
            f"<Part><PartNumber>{n}</PartNumber><LastModified>{_iso(p.mtime)}</LastModified>"
            f"<ETag>{_x(p.etag)}</ETag><Size>{p.size}</Size>{ck}</Part>"
        )
    nxt = f"<NextPartNumberMarker>{page[-1]}</NextPartNumberMarker>" if page else ""
    algo = (
        f"<ChecksumAlgorithm>{up.checksum_algorithm}</ChecksumAlgorithm>"
        if up.checksum_algorithm
        else ""
    )
    return _xml(
        f'<ListPartsResult xmlns="{NS}"><Bucket>{_x(req.bucket)}</Bucket><Key>{_x(req.key)}</Key>'
        f"<UploadId>{up.upload_id}</UploadId>{INITIATOR}{OWNER}<StorageClass>{up.storage_class}"
        f"</StorageClass><PartNumberMarker>{marker}</PartNumberMarker>{nxt}"
        f"<MaxParts>{max_parts}</MaxParts><IsTruncated>{_bool(truncated)}</IsTruncated>"
        f"{''.join(items)}{algo}</ListPartsResult>"
    )


def _list_uploads(store: Store, req: Request) -> Response:
    q = req.query
    url = q.get("encoding-type") == "url"
    prefix, delim = q.get("prefix", ""), q.get("delimiter", "")
    km, uim = q.get("key-marker", ""), q.get("upload-id-marker", "")
    max_uploads = _int_arg(req, "max-uploads", 1000, 1000)
    page = store.list_uploads(req.bucket, prefix, delim, max_uploads, km, uim)
    items = []
    for e in page.entries:
        if isinstance(e, str):
            items.append(f"<CommonPrefixes><Prefix>{_enc(e, url)}</Prefix></CommonPrefixes>")
            continue
        algo = (
            f"<ChecksumAlgorithm>{e.checksum_algorithm}</ChecksumAlgorithm>"
            if e.checksum_algorithm
            else ""
        )
        items.append(
            f"<Upload><Key>{_enc(e.key, url)}</Key><UploadId>{e.upload_id}</UploadId>{INITIATOR}"
            f"{OWNER}<StorageClass>{e.storage_class}</StorageClass><Initiated>{_iso(e.initiated)}"
            f"</Initiated>{algo}</Upload>"
        )
    nxt = ""
    if page.truncated:
        last = page.last
        if isinstance(last, str):
            key_marker, id_marker = last, ""
        else:
            key_marker, id_marker = last.key, last.upload_id
        nxt = (
            f"<NextKeyMarker>{_enc(key_marker, url)}</NextKeyMarker>"
            f"<NextUploadIdMarker>{id_marker}</NextUploadIdMarker>"
        )
    extra = f"<Prefix>{_enc(prefix, url)}</Prefix>" if prefix else ""
    extra += f"<Delimiter>{_enc(delim, url)}</Delimiter>" if delim else ""
    extra += "<EncodingType>url</EncodingType>" if url else ""
    return _xml(
        f'<ListMultipartUploadsResult xmlns="{NS}"><Bucket>{_x(req.bucket)}</Bucket>'
        f"<KeyMarker>{_enc(km, url)}</KeyMarker><UploadIdMarker>{_x(uim)}</UploadIdMarker>{nxt}"
        f"{extra}<MaxUploads>{max_uploads}</MaxUploads><IsTruncated>{_bool(page.truncated)}"
        f"</IsTruncated>{''.join(items)}</ListMultipartUploadsResult>"
    )


# -- listings and buckets ------------------------------------------------------------------


def _contents(obj: Obj, url: bool, owner: bool) -> str:
    algo = (
        f"<ChecksumAlgorithm>{obj.checksum.algorithm}</ChecksumAlgorithm>" if obj.checksum else ""
    )
    return (
        f"<Contents><Key>{_enc(obj.key, url)}</Key><LastModified>{obj.last_modified_iso}"
        f"</LastModified><ETag>{_x(obj.etag)}</ETag>{algo}<Size>{obj.size}</Size>"
        f"<StorageClass>{obj.storage_class}</StorageClass>{OWNER if owner else ''}</Contents>"
    )


def _entries(entries: list[Any], url: bool, owner: bool) -> str:
    return "".join(
        f"<CommonPrefixes><Prefix>{_enc(e, url)}</Prefix></CommonPrefixes>"
        if isinstance(e, str)
        else _contents(e, url, owner)
        for e in entries
    )


def _token(entry: Any) -> str:
    raw = ("P" + entry) if isinstance(entry, str) else ("K" + entry.key)
    return base64.urlsafe_b64encode(raw.encode()).decode()


def _list_v2(store: Store, req: Request) -> Response:
    q = req.query
    url = q.get("encoding-type") == "url"
    prefix, delim = q.get("prefix", ""), q.get("delimiter", "")
    max_keys = _int_arg(req, "max-keys", 1000, 1000)
    start_after, token = q.get("start-after"), q.get("continuation-token")
    after_key, after_prefix = start_after or None, None
    if token is not None:
        try:
            raw = base64.urlsafe_b64decode(token.encode()).decode()
        except (binascii.Error, ValueError):
            raw = ""
        if raw[:1] not in ("K", "P"):
            raise S3Error.invalid_argument(
                "The continuation token provided is incorrect", "continuation-token", token
            )
        # A continuation token supersedes start-after (not echoed either, as in moto).
        start_after = None
        if raw[0] == "K":
            after_key = raw[1:]
        else:
            after_key, after_prefix = None, raw[1:]
    store.bucket(req.bucket)
    page = store.list(req.bucket, prefix, delim, max_keys, after_key, after_prefix)
    if max_keys == 0:
        page.truncated = False
    parts = [
        f'<ListBucketResult xmlns="{NS}"><Name>{_x(req.bucket)}</Name>'
        f"<Prefix>{_enc(prefix, url)}</Prefix>"
    ]
    if start_after is not None:
        parts.append(f"<StartAfter>{_enc(start_after, url)}</StartAfter>")
    if token is not None:
        parts.append(f"<ContinuationToken>{_x(token)}</ContinuationToken>")
    if page.truncated:
        parts.append(f"<NextContinuationToken>{_token(page.last)}</NextContinuationToken>")
    parts.append(f"<KeyCount>{len(page.entries)}</KeyCount><MaxKeys>{max_keys}</MaxKeys>")
    if delim:
        parts.append(f"<Delimiter>{_enc(delim, url)}</Delimiter>")
    if url:
        parts.append("<EncodingType>url</EncodingType>")
    parts.append(f"<IsTruncated>{_bool(page.truncated)}</IsTruncated>")
    parts.append(_entries(page.entries, url, q.get("fetch-owner") == "true"))
    parts.append("</ListBucketResult>")
    return _xml("".join(parts))


def _list_v1(store: Store, req: Request) -> Response:
    q = req.query
    url = q.get("encoding-type") == "url"
    prefix, delim, marker = q.get("prefix", ""), q.get("delimiter", ""), q.get("marker", "")
    max_keys = _int_arg(req, "max-keys", 1000, 1000)
    store.bucket(req.bucket)
    after_prefix = (
        marker if delim and marker.endswith(delim) and marker.startswith(prefix) else None
    )
    page = store.list(req.bucket, prefix, delim, max_keys, marker or None, after_prefix)
    if max_keys == 0:
        page.truncated = False
    nxt = ""
    if page.truncated and delim:
        last = page.last
        nxt = f"<NextMarker>{_enc(last if isinstance(last, str) else last.key, url)}</NextMarker>"
    return _xml(
        f'<ListBucketResult xmlns="{NS}"><Name>{_x(req.bucket)}</Name><Prefix>{_enc(prefix, url)}'
        f"</Prefix><Marker>{_enc(marker, url)}</Marker>{nxt}<MaxKeys>{max_keys}</MaxKeys>"
        + (f"<Delimiter>{_enc(delim, url)}</Delimiter>" if delim else "")
        + ("<EncodingType>url</EncodingType>" if url else "")
        + f"<IsTruncated>{_bool(page.truncated)}</IsTruncated>"
        + _entries(page.entries, url, True)
        + "</ListBucketResult>"
    )


def _list_buckets(store: Store, req: Request) -> Response:
    items = "".join(
        f"<Bucket><Name>{_x(b.name)}</Name><CreationDate>{_iso(b.created)}</CreationDate></Bucket>"
        for b in sorted(store.buckets.values(), key=lambda b: b.name)
    )
    return _xml(
        f'<ListAllMyBucketsResult xmlns="{NS}"><Buckets>{items}</Buckets>{OWNER}'
        "</ListAllMyBucketsResult>"
    )


def _create_bucket(store: Store, req: Request) -> Response:
    store.create_bucket(req.bucket)
    return Response(200, [("Location", f"/{req.bucket}")])


def _head_bucket(store: Store, req: Request) -> Response:
    store.bucket(req.bucket)
    return Response(200, [("x-amz-bucket-region", "us-east-1")], no_body=True, length=0)


def _delete_bucket(store: Store, req: Request) -> Response:
    store.delete_bucket(req.bucket)
    return Response(204)


def _bucket_location(store: Store, req: Request) -> Response:
    store.bucket(req.bucket)
    return _xml(f'<LocationConstraint xmlns="{NS}"></LocationConstraint>')


def _bucket_versioning(store: Store, req: Request) -> Response:
    store.bucket(req.bucket)
    return _xml(f'<VersioningConfiguration xmlns="{NS}"/>')


# -- XML in --------------------------------------------------------------------------------


def _parse_xml(body: Any) -> ElementTree.Element:
    try:
        return ElementTree.fromstring(bytes(body))
    except ElementTree.ParseError:
        raise S3Error.malformed_xml() from None


def _tag(el: ElementTree.Element) -> str:
    return el.tag.rsplit("}", 1)[-1]


def _child_text(el: ElementTree.Element, name: str) -> str | None:
    for child in el:
        if _tag(child) == name:
            return child.text or ""
    return None


def _bool(v: bool) -> str:
    return "true" if v else "false"


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(t))


_HANDLERS: dict[str, Callable[[Store, Request], Response]] = {
    "GetObject": _get_object,
    "HeadObject": _get_object,
    "PutObject": _put_object,
    "DeleteObject": _delete_object,
    "DeleteObjects": _delete_objects,
    "CopyObject": _copy_object,
    "CreateMultipartUpload": _create_upload,
    "UploadPart": _upload_part,
    "UploadPartCopy": _upload_part_copy,
    "CompleteMultipartUpload": _complete_upload,
    "AbortMultipartUpload": _abort_upload,
    "ListParts": _list_parts,
    "ListMultipartUploads": _list_uploads,
    "ListObjectsV2": _list_v2,
    "ListObjects": _list_v1,
    "ListBuckets": _list_buckets,
    "CreateBucket": _create_bucket,
    "HeadBucket": _head_bucket,
    "DeleteBucket": _delete_bucket,
    "GetBucketLocation": _bucket_location,
    "GetBucketVersioning": _bucket_versioning,
}
