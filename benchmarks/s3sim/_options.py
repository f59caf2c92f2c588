"""Server options that are not shaping: validation strictness, ETags, stats detail."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = ["MIB", "Options"]

MIB = 1024 * 1024


@dataclass(frozen=True)
class Options:
    """What the server checks and computes (all settable at runtime, like :class:`Shaping`)."""

    min_part_size: int = 5 * MIB
    """CompleteMultipartUpload answers EntityTooSmall when a part other than the last is
    smaller (S3 and moto: 5 MiB; moto reads it from ``S3_UPLOAD_PART_MIN_SIZE``)."""
    md5_etags: bool = False
    """ETags are the MD5 of the body, as S3's for unencrypted single-part objects. Off: a
    unique 32-hex-digit value instead, because MD5 costs ~1.7 s of server CPU per GiB here
    (0.6 GB/s) and none of the clients checks it. Multipart ETags are ``"<md5 of the part
    ETags>-<N>"`` either way."""
    checksums: str = "fast"
    """Which ``x-amz-checksum-*`` values (header or aws-chunked trailer) are verified (400
    BadDigest on mismatch): ``fast`` CRC32C and CRC64NVME, ``all`` also CRC32/SHA-1/SHA-256
    and Content-MD5, ``off`` none. Unverified values are stored and returned as sent."""
    prefix_depth: int = 2
    """Stats count requests per first ``prefix_depth`` segments of ``bucket/key``."""
    log_requests: bool = False
    """Print one line per request (method, target, status, headers) to stderr: debugging."""

    def __post_init__(self) -> None:
        if self.min_part_size < 0:
            raise ValueError("min_part_size must be >= 0")
        if self.checksums not in ("fast", "all", "off"):
            raise ValueError("checksums must be 'fast', 'all' or 'off'")
        if self.prefix_depth < 1:
            raise ValueError("prefix_depth must be >= 1")

    def to_json(self) -> dict[str, Any]:
        """Field name to value."""
        return dataclasses.asdict(self)

    @classmethod
    def names(cls) -> frozenset[str]:
        """The field names (the control API's option knobs)."""
        return frozenset(f.name for f in dataclasses.fields(cls))
