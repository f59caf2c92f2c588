"""CRC32C helpers (Castagnoli), hardware-accelerated through the ``crc32c`` package."""

from __future__ import annotations

import crc32c as _impl

__all__ = ["crc32c", "format_crc", "parse_crc"]


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC32C of ``data``, continuing from ``value`` (0 to start)."""
    return int(_impl.crc32c(data, value))


def format_crc(value: int) -> str:
    """The 8-hex-digit form stored in ``s3ckpt.json``."""
    return f"{value:08x}"


def parse_crc(text: str) -> int:
    """Inverse of :func:`format_crc`."""
    return int(text, 16)
