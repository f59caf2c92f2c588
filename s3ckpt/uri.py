"""Checkpoint URLs: ``s3://bucket/prefix`` and other fsspec URLs."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from s3ckpt.errors import InvalidURLError

__all__ = [
    "MAX_KEY_BYTES",
    "MAX_PREFIX_BYTES",
    "RESERVED_KEY_BYTES",
    "StoreURL",
    "as_url",
    "check_url_text",
    "parse_location",
    "parse_url",
    "split_prefix",
]

# S3 bucket naming rules (general purpose buckets): 3-63 chars, lowercase letters, digits,
# dots and hyphens, starting and ending with a letter or digit.
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")

MAX_KEY_BYTES = 1024
"""S3's limit on a key: 1,024 bytes of UTF-8 (GCS and Azure have the same order)."""
RESERVED_KEY_BYTES = 96
"""What s3ckpt may append to the prefix of a URL it is given: a checkpoint's folder under a
run (``step_{step:09d}/``, up to 24 bytes), and under a checkpoint the longest name it
writes: ``__{rank}_{i}.{tag}.distcp``, ``s3ckpt.alive.{tag}.{rank}``, ``.metadata.{tag}``, or
for hashed prefixes ``s3ckpt-shards/{h}/`` plus ``__{rank}_{i}.{tag}.shard`` (some 50 bytes
for ten-digit ranks). Refusing a longer prefix up front means a save never fails half way
on S3's ``KeyTooLongError``."""
MAX_PREFIX_BYTES = MAX_KEY_BYTES - RESERVED_KEY_BYTES
"""The longest key prefix (UTF-8 bytes) a URL may name: 928."""

# C0 controls, DEL and C1 controls. urlsplit silently drops \t, \n and \r (``run/a\nb``
# would save under ``run/ab``), and a key holding any of them cannot be deleted through
# DeleteObjects' XML body, so none is accepted anywhere in a URL.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class StoreURL:
    """A parsed location: ``scheme://bucket/prefix``.

    Attributes:
        scheme: ``s3`` for S3 and S3-compatible stores, else an fsspec protocol.
        bucket: The bucket (or container / top folder for other schemes).
        prefix: The key prefix without leading slash, ending in ``/`` unless empty.
    """

    scheme: str
    bucket: str
    prefix: str

    def key(self, name: str) -> str:
        """Key of ``name`` under this prefix."""
        return f"{self.prefix}{name}"

    def child(self, name: str) -> StoreURL:
        """The URL of a sub-prefix ``name`` under this one."""
        return StoreURL(self.scheme, self.bucket, _norm_prefix(self.prefix + name))

    @property
    def name(self) -> str:
        """The last segment of the prefix (``""`` at the bucket's root): a checkpoint's name
        in its run. ``url.parent.child(url.name) == url``."""
        return split_prefix(self.prefix)[1]

    @property
    def parent(self) -> StoreURL:
        """The URL of the prefix one level up (the root stays the root): a checkpoint's run."""
        return StoreURL(self.scheme, self.bucket, split_prefix(self.prefix)[0])

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}"


def split_prefix(prefix: str) -> tuple[str, str]:
    """A key prefix's parent prefix and last segment, one trailing ``/`` dropped:
    ``a/b/c/`` -> (``a/b/``, ``c``); ``c/`` -> (``""``, ``c``); ``""`` -> (``""``, ``""``)."""
    head, sep, name = prefix.removesuffix("/").rpartition("/")
    return head + sep, name


def _norm_prefix(prefix: str) -> str:
    prefix = prefix.lstrip("/")
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


def check_url_text(url: str) -> None:
    """Refuse a URL or path holding a control character (C0 ``\\x00``-``\\x1f``, DEL, C1
    ``\\x80``-``\\x9f``) or text that is not valid Unicode (a lone surrogate).

    Raises:
        InvalidURLError: naming the character (its escape and code point) and its position.
    """
    if (m := _CONTROL.search(url)) is not None:
        ch = m.group()
        raise InvalidURLError(
            f"checkpoint URL {url!r} has the control character {ch!r} (U+{ord(ch):04X}) at "
            f"position {m.start()}: control characters are refused in URLs and keys (URL "
            "parsing would drop some silently, and S3 cannot delete keys holding others)"
        )
    try:
        url.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidURLError(
            f"checkpoint URL {url!r} is not valid Unicode: {url[exc.start]!r} at position "
            f"{exc.start} ({exc.reason})"
        ) from None


def parse_url(url: str) -> StoreURL:
    """Parse ``s3://bucket/prefix`` (or ``gs://``, ``memory://`` ...) into a :class:`StoreURL`.

    Control characters are refused (:func:`check_url_text`), and so is a key prefix longer
    than :data:`MAX_PREFIX_BYTES` (928 bytes of UTF-8: S3's 1,024 less what s3ckpt appends,
    :data:`RESERVED_KEY_BYTES`) on any store but local files.

    Raises:
        InvalidURLError: naming the URL, what is wrong and where, and what a valid one
            looks like.
    """
    url = str(url)
    check_url_text(url)  # before urlsplit, which drops \t, \n and \r without a word
    text = url.strip()
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    scheme = "s3" if scheme in ("s3a", "s3n") else scheme
    if not scheme or "://" not in text:
        raise InvalidURLError(
            f"not a checkpoint URL: {url!r}; expected s3://BUCKET/PREFIX "
            "(or another fsspec URL such as gs://, file://, memory://)"
        )
    if parts.query or parts.fragment:
        raise InvalidURLError(
            f"checkpoint URL {url!r} has a query or fragment; expected s3://BUCKET/PREFIX"
        )
    if scheme in ("http", "https"):
        raise InvalidURLError(
            f"{url!r} is a web address, not a checkpoint location: for S3 or an "
            "S3-compatible store write s3://BUCKET/PREFIX and give the endpoint with "
            "--endpoint-url / S3Config.endpoint_url / AWS_ENDPOINT_URL"
        )
    if scheme not in ("s3", "file", "memory"):
        from fsspec.registry import known_implementations, registry  # installed or installable

        if scheme not in known_implementations and scheme not in registry:
            raise InvalidURLError(
                f"unsupported URL scheme {scheme!r} in {url!r}: expected s3://BUCKET/PREFIX, "
                "a local path, or a URL of an fsspec file system (gs://, az://, file://, ...)"
            )
    if scheme == "file":
        # file:///abs/path -> bucket "" is not allowed by S3 rules; keep the path whole.
        return StoreURL("file", "", _norm_prefix(parts.path))
    if not (bucket := parts.netloc):
        raise InvalidURLError(f"checkpoint URL {url!r} has no bucket; expected s3://BUCKET/PREFIX")
    if scheme == "s3" and not _BUCKET_RE.match(bucket):
        raise InvalidURLError(
            f"invalid S3 bucket name {bucket!r} in {url!r}: 3-63 characters of lowercase "
            "letters, digits, '.' and '-', starting and ending with a letter or digit"
        )
    prefix = _norm_prefix(parts.path)
    # "s3://b//run": the key would start with "/", which stripping would silently change.
    if "//" in prefix or parts.path.startswith("//"):
        raise InvalidURLError(f"checkpoint URL {url!r} has an empty path segment ('//')")
    if (size := len(prefix.encode("utf-8"))) > MAX_PREFIX_BYTES:
        raise InvalidURLError(
            f"checkpoint URL {url[:60]!r}... names a key prefix of {size} bytes (UTF-8); S3 "
            f"keys hold at most {MAX_KEY_BYTES} bytes and s3ckpt appends up to "
            f"{RESERVED_KEY_BYTES} to a prefix (checkpoint folders and object names), so a "
            f"prefix may have at most {MAX_PREFIX_BYTES}: shorten it by {size - MAX_PREFIX_BYTES}"
        )
    return StoreURL(scheme, bucket, prefix)


def as_url(location: str | os.PathLike[str]) -> str:
    """``location`` as a URL: URLs pass through, local paths become ``file://`` URLs.

    Raises:
        InvalidURLError: ``location`` holds a control character (:func:`check_url_text`).
    """
    text = os.fspath(location)
    check_url_text(text)  # before the path is resolved (a NUL would be a ValueError there)
    return text if "://" in text else "file://" + str(Path(text).expanduser().resolve())


def parse_location(location: str | os.PathLike[str] | StoreURL) -> StoreURL:
    """A URL, a local path or a parsed :class:`StoreURL` as a :class:`StoreURL`.

    Raises:
        InvalidURLError: as :func:`parse_url`.
    """
    return location if isinstance(location, StoreURL) else parse_url(as_url(location))
