"""CRC32C helpers (Castagnoli), hardware-accelerated through the ``crc32c`` package."""

from __future__ import annotations

import crc32c as _impl

__all__ = ["crc32c", "crc32c_combine"]


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC32C of ``data``, continuing from ``value`` (0 to start)."""
    return int(_impl.crc32c(data, value))


_POLY = 0x82F63B78
# CRC32C's polynomial, bit-reflected (as the CRC is computed).


def _multmodp(a: int, b: int) -> int:
    """``a * b`` modulo the polynomial, in GF(2) (reflected bit order, as zlib's)."""
    m = 1 << 31
    p = 0
    while True:
        if a & m:
            p ^= b
            if a & (m - 1) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


_X2N = [1 << 30]  # x^(2^k) modulo the polynomial for k in 0..31, from x^1
for _ in range(31):
    _X2N.append(_multmodp(_X2N[-1], _X2N[-1]))


def _x8nmodp(n: int) -> int:
    """``x^(8n)`` modulo the polynomial: the operator that appends ``n`` zero bytes."""
    p = 1 << 31  # x^0
    k = 3
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return p


def crc32c_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC32C of ``A + B`` from ``crc1 = crc32c(A)``, ``crc2 = crc32c(B)`` and
    ``len2 = len(B)``, without reading either (zlib's ``crc32_combine``, for CRC32C's
    polynomial). What parallel reads of one item's pieces use to check the whole item:
    tens of microseconds per call, whatever the lengths."""
    if len2 < 0:
        raise ValueError(f"len2 must be >= 0, got {len2}")
    if len2 == 0:
        return crc1
    if crc1 == 0:  # shifting zero gives zero (the start of every item's fold): skip the work
        return crc2
    return _multmodp(_x8nmodp(len2), crc1) ^ crc2
