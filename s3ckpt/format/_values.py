"""Checks on the values a commit marker carries: anyone with write access to the bucket
chooses them, so every number is bounded, every name is one plain path segment, and every
error message is cut short (a hostile marker must not make an error line megabytes long).

A value that fails raises ``ValueError`` or ``TypeError``; :class:`~s3ckpt.format.Manifest`
turns them into a :class:`~s3ckpt.errors.CorruptCheckpointError` naming the marker.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = [
    "MAX_CREATED",
    "MAX_INT",
    "SEGMENT",
    "as_str",
    "check_name",
    "created_time",
    "nonneg",
    "short",
]

MAX_CREATED = 32503680000.0
"""3000-01-01T00:00:00Z: a marker's ``created`` must lie from the epoch to this."""
MAX_INT = 2**63 - 1
"""The largest size, offset, rank, step or version a marker may record (S3's own limits are
far below; a larger number is a hostile or corrupt marker, not a checkpoint)."""
SEGMENT = re.compile(r"[^/\\\x00]+")
"""One path segment: no ``/``, ``\\`` or NUL."""


def short(value: Any, limit: int = 200) -> str:
    """``repr(value)`` (for an exception, its message) cut to ``limit`` characters: a hostile
    marker must not make an error line megabytes long."""
    text = str(value) if isinstance(value, BaseException) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def as_str(value: Any) -> str:
    """``value`` if it is a string, else a ``TypeError``."""
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def nonneg(value: Any) -> int:
    """``value`` if it is an integer from 0 to :data:`MAX_INT` (never a bool), else a
    ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INT:
        raise ValueError(f"expected an integer from 0 to 2**63-1, got {short(value)}")
    return value


def created_time(value: Any) -> float:
    """A commit time: a number of seconds since the epoch that a datetime can hold."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"created must be a number, got {type(value).__name__}")
    if not 0 <= value < MAX_CREATED:  # NaN fails this too
        raise ValueError(
            f"created {short(value)} is not a time from 1970 to 3000 (seconds since the epoch)"
        )
    return float(value)


def check_name(value: Any, what: str) -> str:
    """A name relative to the checkpoint prefix: one path segment, never ``.``/``..``."""
    name = as_str(value)
    if not SEGMENT.fullmatch(name) or name in (".", ".."):
        raise ValueError(f"{what} {name!r} is not a plain name inside the checkpoint prefix")
    return name
