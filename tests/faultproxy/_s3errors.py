"""The replies the fault proxy makes up itself: S3 XML error bodies and the head around them.

``slowdown``, ``internal``, ``not_implemented`` and ``denied`` answer with the status, code
and message S3 itself sends, in S3's XML error shape, so that botocore parses (and, for 503
and 500, retries) them as it would S3's own. Every made-up reply carries ``Server: FaultProxy``, a
fresh request id and a ``Content-Length`` (also in reply to ``HEAD``, which gets no body).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from email.utils import formatdate

from tests.faultproxy._http1 import Head

__all__ = ["ERRORS", "error_reply", "error_xml", "simple_reply"]

ERRORS: dict[str, tuple[int, str, str, str]] = {
    "slowdown": (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
    "internal": (
        500,
        "Internal Server Error",
        "InternalError",
        "We encountered an internal error. Please try again.",
    ),
    "not_implemented": (
        501,
        "Not Implemented",
        "NotImplemented",
        "A header you provided implies functionality that is not implemented.",
    ),
    "denied": (403, "Forbidden", "AccessDenied", "Access Denied"),
}
"""Fault kind -> ``(status, reason, S3 error code, message)`` of the error it answers with."""


def error_xml(code: str, message: str, head: Head) -> bytes:
    """S3's XML error body for the request whose head is ``head``."""
    parts = head.start.split()
    resource = parts[1].decode("latin-1") if len(parts) > 1 else "/"
    resource = resource.split("?", 1)[0]
    request_id = uuid.uuid4().hex[:16].upper()
    xml = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<Resource>{_xml_escape(resource)}</Resource>"
        f"<RequestId>{request_id}</RequestId></Error>"
    )
    return xml.encode()


def _xml_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def simple_reply(
    status: int,
    reason: str,
    body: bytes,
    *,
    close: bool,
    head_only: bool = False,
    extra: Sequence[tuple[bytes, bytes]] = (),
) -> bytes:
    """A whole made-up reply: head (``extra`` headers included) and, unless ``head_only``,
    ``body``; ``close`` adds ``Connection: close``."""
    request_id = uuid.uuid4().hex[:16].upper().encode()
    headers: list[tuple[bytes, bytes]] = [
        (b"Date", formatdate(usegmt=True).encode()),
        (b"Server", b"FaultProxy"),
        (b"x-amz-request-id", request_id),
        (b"x-amz-id-2", request_id),
        *extra,
        (b"Content-Length", str(len(body)).encode()),
    ]
    if close:
        headers.append((b"Connection", b"close"))
    head = Head(f"HTTP/1.1 {status} {reason}".encode(), headers)
    return head.serialize() + (b"" if head_only else body)


def error_reply(kind: str, request: Head, *, close: bool, head_only: bool) -> bytes:
    """The S3 error reply of fault ``kind`` (a key of :data:`ERRORS`) to ``request``."""
    status, reason, code, message = ERRORS[kind]
    return simple_reply(
        status,
        reason,
        error_xml(code, message, request),
        close=close,
        head_only=head_only,
        extra=[(b"Content-Type", b"application/xml")],
    )
