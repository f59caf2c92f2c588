"""Which S3 operation a request is: :func:`classify` and the names it returns.

Arms, the fault proxy's ``ops=`` and its hook all speak these names. Only path-style
requests are told apart (loopback endpoints are IP addresses, which botocore always
addresses path-style), and only the operations a checkpoint store sends; everything else
is ``"Other"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["OPERATIONS", "classify"]

OPERATIONS: tuple[str, ...] = (
    "PutObject",
    "CreateMultipartUpload",
    "UploadPart",
    "CompleteMultipartUpload",
    "AbortMultipartUpload",
    "DeleteObjects",
    "DeleteObject",
    "GetObject",
    "HeadObject",
    "ListObjectsV2",
    "ListMultipartUploads",
    "Other",
)
"""The operation names :func:`classify` returns."""

# Query parameters that do not turn an object request into another operation.
_PLAIN_PARAMS = frozenset({"x-id", "versionId", "partNumber"})


def classify(method: str, target: str, headers: Mapping[str, str]) -> tuple[str, str]:
    """The S3 operation and object key of a path-style request ``/{bucket}/{key}?query``.

    Returns ``(operation, key)`` with the key URL-decoded (``""`` for bucket-level
    requests). ``operation`` is one of :data:`OPERATIONS`; anything this proxy has no
    use for telling apart (CreateBucket, HeadBucket, CopyObject, ListParts, tagging ...)
    is ``"Other"``. Virtual-hosted-style requests are not recognised (loopback
    endpoints are IP addresses, which botocore always addresses path-style).
    """
    method = method.upper()
    if target.startswith(("http://", "https://")):  # absolute-form request target
        parts = urlsplit(target)
        path, query = parts.path, parts.query
    else:
        path, _, query = target.partition("?")
    params = parse_qs(query, keep_blank_values=True)
    _bucket, _, raw_key = path.lstrip("/").partition("/")
    key = unquote(raw_key)
    names = {h.lower() for h in headers}
    extra = {p for p in params if p not in _PLAIN_PARAMS and not p.startswith("response-")}

    if not key:
        if method == "GET" and "uploads" in params:
            return "ListMultipartUploads", key
        if method == "GET" and params.get("list-type") == ["2"]:
            return "ListObjectsV2", key
        if method == "POST" and "delete" in params:
            return "DeleteObjects", key
        return "Other", key

    copy = "x-amz-copy-source" in names
    if method == "PUT":
        if "partNumber" in params and "uploadId" in params:
            return ("Other" if copy else "UploadPart"), key
        if copy or extra:
            return "Other", key
        return "PutObject", key
    if method == "POST":
        if "uploads" in params:
            return "CreateMultipartUpload", key
        if "uploadId" in params:
            return "CompleteMultipartUpload", key
        return "Other", key
    if method == "DELETE":
        if "uploadId" in params:
            return "AbortMultipartUpload", key
        return ("Other" if extra else "DeleteObject"), key
    if method == "GET":
        return ("Other" if extra else "GetObject"), key
    if method == "HEAD":
        return ("Other" if extra else "HeadObject"), key
    return "Other", key
