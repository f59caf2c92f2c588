"""Times as s3ckpt writes and reads them: timezone-aware, UTC, ISO-8601 with a ``Z``.

A leaf module (standard library only): the retention engine, its JSON reports, pins,
leases and the CLI all format times here, so every ``...Z`` string has one spelling.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import overload

__all__ = ["aware_now", "iso_z", "iso_z_seconds", "parse_iso", "utc"]


@overload
def utc(ts: float) -> datetime: ...
@overload
def utc(ts: None) -> None: ...
def utc(ts: float | None) -> datetime | None:
    """A POSIX timestamp as a UTC datetime (None stays None)."""
    return None if ts is None else datetime.fromtimestamp(ts, tz=UTC)


@overload
def iso_z(value: datetime) -> str: ...
@overload
def iso_z(value: None) -> None: ...
def iso_z(value: datetime | None) -> str | None:
    """ISO-8601 with ``Z`` for UTC: ``2025-03-01T12:00:00.250000Z`` (None stays None).

    Microseconds appear when there are any; another offset is kept as written
    (``+02:00``).
    """
    return None if value is None else value.isoformat().replace("+00:00", "Z")


def iso_z_seconds(ts: float) -> str:
    """A POSIX timestamp to the whole second, in UTC: ``2025-03-01T12:00:00Z``.

    Any time :func:`time.gmtime` takes, far beyond :class:`datetime`'s year 9999 (a lease
    may name any expiry).
    """
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def parse_iso(text: str) -> datetime:
    """Parse an ISO-8601 time (``Z`` accepted); a time without an offset is taken as UTC.

    Raises:
        ValueError: ``text`` is not an ISO-8601 time.
    """
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def aware_now(now: datetime | None, message: str = "now must be timezone-aware") -> datetime:
    """``now``, or the clock's time in UTC when it is None.

    Raises:
        ValueError: ``now`` has no timezone (``message``).
    """
    if now is None:
        return datetime.now(UTC)
    if now.tzinfo is None:
        raise ValueError(message)
    return now
