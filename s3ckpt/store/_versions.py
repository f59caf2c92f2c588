"""Versioned buckets: what a delete leaves behind.

On a bucket with versioning Enabled (or Suspended, which keeps the versions made before),
DeleteObject writes a delete marker and the object's bytes stay, billed, as a *noncurrent
version* until a lifecycle rule expires them (terraform/main.tf
``expire-noncurrent-versions``) or someone deletes the version. ``ls``, ``prune`` and
``report`` show those bytes so that "deleted 3 of 3 (24.1 MiB)" does not read as 24.1 MiB
freed. Decisions:

* **Off the core protocol.** :class:`VersionedStore` is its own small protocol, checked
  with ``isinstance``; :class:`VersionRequests` is mixed into
  :class:`~s3ckpt.store.s3.S3Store` and its requests are the store's own, through
  ``S3Store._call`` (retried, counted, limited and mapped like every other). Memory and
  fsspec stores are not ``VersionedStore`` s.
* **One GetBucketVersioning per bucket and process** (cached like the capabilities, by
  endpoint and bucket); ListObjectVersions and one GetBucketLifecycleConfiguration (the
  rule's days, cached the same way) only where the status is Enabled or Suspended.
* **s3ckpt deletes no versions.** prune reports them and relies on the lifecycle rule, so
  the pruner role needs no ``s3:DeleteObjectVersion`` (docs/operations.md, "Versioned
  buckets").
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import astuple, dataclass
from functools import partial
from typing import Any, Literal, Protocol, runtime_checkable

from s3ckpt._units import format_bytes, plural
from s3ckpt.errors import AccessDeniedError, StoreError, UnsupportedOperationError
from s3ckpt.store._cache import ProcessCache
from s3ckpt.store.base import ObjectStore, S3Requests, if_found

__all__ = [
    "Noncurrent",
    "VersionRequests",
    "VersionedStore",
    "Versions",
    "bucket_versioning",
    "clear_versioning_cache",
    "noncurrent_versions",
]

Status = Literal["Enabled", "Suspended"]


@dataclass(frozen=True)
class Noncurrent:
    """What a prefix holds besides its current objects on a versioned bucket.

    Attributes:
        versions: Noncurrent object versions.
        bytes: Their bytes (billed until they expire or are deleted).
        delete_markers: Delete markers (no bytes; a lifecycle rule removes them once alone).
    """

    versions: int = 0
    bytes: int = 0
    delete_markers: int = 0

    def __add__(self, other: Noncurrent) -> Noncurrent:
        return Noncurrent(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))


@runtime_checkable
class VersionedStore(Protocol):
    """A store whose bucket may keep object versions (S3)."""

    def versioning_status(self) -> Status | None:
        """The bucket's versioning: ``"Enabled"``, ``"Suspended"``, or ``None`` (never
        enabled). One request per (endpoint, bucket) and process."""
        ...

    def list_noncurrent(self, prefix: str) -> Iterator[tuple[str, int | None]]:
        """``(key, size)`` of each noncurrent version under ``prefix``; size ``None`` for a
        delete marker (current or not)."""
        ...

    def noncurrent_expiry_days(self, prefix: str) -> int | None:
        """The fewest days after which an enabled lifecycle rule that covers all of
        ``prefix`` expires noncurrent versions; ``None`` where no rule does. One request per
        (endpoint, bucket) and process."""
        ...


#: (endpoint, bucket) -> (status,): the status in a tuple, so that None is a value.
_STATUS: ProcessCache[tuple[str, str], tuple[Status | None]] = ProcessCache(256)
#: (endpoint, bucket) -> (prefix, NoncurrentDays) of each enabled rule that expires noncurrent
#: versions of every object under its prefix.
_RULES: ProcessCache[tuple[str, str], tuple[tuple[str, int], ...]] = ProcessCache(256)


def clear_versioning_cache() -> None:
    """Forget every bucket's versioning status and rules (tests; a bucket changed in place)."""
    _STATUS.clear()
    _RULES.clear()


def _expiry_rules(config: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    """``(prefix, days)`` of the enabled rules of a lifecycle configuration that expire
    noncurrent versions; a rule filtered by tags or size does not cover every object."""
    out = []
    for rule in config.get("Rules", []) or []:
        days = (rule.get("NoncurrentVersionExpiration") or {}).get("NoncurrentDays")
        filt = rule.get("Filter") or {"Prefix": rule.get("Prefix", "")}  # or the old form
        # (a filter with a tag, an object size, an And of them: not every object)
        if rule.get("Status") == "Enabled" and days and not set(filt) - {"Prefix"}:
            out.append((filt.get("Prefix", "") or "", int(days)))
    return tuple(out)


class VersionRequests:
    """The two version requests of :class:`~s3ckpt.store.s3.S3Store` (mixed in)."""

    def versioning_status(self: S3Requests) -> Status | None:
        """See :meth:`VersionedStore.versioning_status`."""

        def fetch() -> tuple[Status | None]:
            get = partial(self.client.get_bucket_versioning, Bucket=self.bucket)
            resp = self._call("get_bucket_versioning", None, get)
            status = resp.get("Status")
            return ("Enabled" if status == "Enabled" else "Suspended" if status else None,)

        return _STATUS.get((self.endpoint_url or "", self.bucket), fetch)[0]

    def list_noncurrent(self: S3Requests, prefix: str) -> Iterator[tuple[str, int | None]]:
        """See :meth:`VersionedStore.list_noncurrent` (ListObjectVersions, paged)."""
        for resp in self._paginate("list_object_versions", prefix):
            for v in resp.get("Versions", []) or []:
                if not v.get("IsLatest"):
                    yield v["Key"], int(v.get("Size") or 0)
            for m in resp.get("DeleteMarkers", []) or []:
                yield m["Key"], None

    def noncurrent_expiry_days(self: S3Requests, prefix: str) -> int | None:
        """See :meth:`VersionedStore.noncurrent_expiry_days` (GetBucketLifecycleConfiguration;
        ``NoSuchLifecycleConfiguration`` is no rule)."""

        def fetch() -> tuple[tuple[str, int], ...]:
            get = partial(self.client.get_bucket_lifecycle_configuration, Bucket=self.bucket)
            # 404 NoSuchLifecycleConfiguration: no rule
            config = if_found(partial(self._call, "get_bucket_lifecycle_configuration", None, get))
            return () if config is None else _expiry_rules(config)

        rules = _RULES.get((self.endpoint_url or "", self.bucket), fetch)
        return min((d for p, d in rules if prefix.startswith(p)), default=None)


def bucket_versioning(store: ObjectStore) -> Status | None:
    """``store``'s bucket versioning: ``"Enabled"``, ``"Suspended"``, or ``None`` where it
    was never enabled or the store keeps no versions (memory, file, fsspec: check
    ``isinstance(store, VersionedStore)`` to tell these apart). Cached per (endpoint, bucket)
    and process.

    Raises:
        AccessDeniedError: the role lacks ``s3:GetBucketVersioning``.
        StoreError: any other failure of the request.
    """
    return store.versioning_status() if isinstance(store, VersionedStore) else None


@dataclass(frozen=True)
class Versions:
    """Noncurrent versions under some prefixes, or why they could not be counted.

    Attributes:
        status: ``"Enabled"``, ``"Suspended"``, ``"off"`` (never enabled), ``"none"`` (a
            memory or file store: no versions, deletes free the bytes), ``"unsupported"``
            (another fsspec store, or a store that answers 501: not counted) or
            ``"unknown"`` (a request was refused: ``reason`` says why).
        by_prefix: Each prefix asked about and its :class:`Noncurrent` (zeros where the
            bucket keeps none); empty where they could not be counted.
        expire_days: The days after which a lifecycle rule expires noncurrent versions under
            every prefix (the longest of them); None where a prefix has no such rule or the
            rules could not be read (``expire_note`` says which).
        reason: Why they could not be counted (``status`` unsupported or unknown), else "".
        expire_note: Why ``expire_days`` is None on a versioned bucket, else "".
    """

    status: str
    by_prefix: dict[str, Noncurrent]
    expire_days: int | None = None
    reason: str = ""
    expire_note: str = ""

    @property
    def counted(self) -> bool:
        """Whether ``by_prefix`` holds the counts (else ``reason`` says why not)."""
        return self.status in ("Enabled", "Suspended", "off")

    @property
    def versioned(self) -> bool:
        """Versioning is (or was) on: deletes leave noncurrent versions."""
        return self.status in ("Enabled", "Suspended")

    def of(self, prefix: str) -> Noncurrent | None:
        """The counts under ``prefix`` (None where they could not be counted)."""
        return self.by_prefix.get(prefix) if self.counted else None

    def total(self) -> Noncurrent | None:
        """The counts under every prefix together (None where they could not be counted)."""
        return sum(self.by_prefix.values(), Noncurrent()) if self.counted else None

    def to_dict(self, prefix: str | None = None) -> dict[str, Any]:
        """JSON fields (``ls``, ``prune`` and ``report --json``) for ``prefix``, or for
        every prefix together: ``versioning``, ``noncurrent_versions``,
        ``noncurrent_bytes``, ``delete_markers`` (null where not counted),
        ``noncurrent_expiration_days`` and ``versions_note`` (why not counted, or why no
        expiry is known; else "")."""
        n = self.total() if prefix is None else self.of(prefix)
        return {
            "versioning": self.status,
            "noncurrent_versions": None if n is None else n.versions,
            "noncurrent_bytes": None if n is None else n.bytes,
            "delete_markers": None if n is None else n.delete_markers,
            "noncurrent_expiration_days": self.expire_days,
            "versions_note": self.reason or self.expire_note,
        }

    def sentence(self, prefix: str | None = None) -> str:
        """What stays behind, for people: "" where nothing does (versioning off, or no
        noncurrent bytes); else the bytes and when they go, or why they were not counted."""
        if self.status == "none":  # memory, file: nothing stays behind
            return ""
        if not self.counted:
            return f"noncurrent versions not counted: {self.reason}"
        n = self.total() if prefix is None else self.of(prefix)
        if not self.versioned or n is None or not (n.versions or n.delete_markers):
            return ""
        if self.expire_days is not None:
            until = f"until the lifecycle rule expires them ({plural(self.expire_days, 'day')})"
        else:
            until = f"until deleted ({self.expire_note})"
        return (
            f"the bucket is versioned ({self.status}): {format_bytes(n.bytes)} stays as "
            f"{plural(n.versions, 'noncurrent version')} {until}; see docs/operations.md, "
            '"Versioned buckets"'
        )


def noncurrent_versions(store: ObjectStore, prefixes: Sequence[str]) -> Versions:
    """The noncurrent versions and delete markers under each of ``prefixes`` (one paged
    ListObjectVersions per prefix, only where the bucket's versioning is Enabled or
    Suspended; a prefix inside another is counted in both) and the lifecycle rule's days.

    Never raises for a refused or unsupported request: the answer says it could not count
    (``status`` "unknown" or "unsupported", ``reason``), as ``ls``, ``prune`` and
    ``report`` print it.
    """
    if not isinstance(store, VersionedStore):
        scheme = getattr(store, "url_scheme", None) or "this"
        if scheme in ("memory", "file"):
            reason = f"{scheme}:// stores keep no object versions: deletes free their bytes"
            return Versions("none", {}, reason=reason)
        reason = f"s3ckpt does not count object versions on {scheme}:// stores"
        return Versions("unsupported", {}, reason=reason)
    try:
        status = store.versioning_status()
        if status is None:
            return Versions("off", {p: Noncurrent() for p in prefixes})
        out: dict[str, Noncurrent] = {}
        for prefix in dict.fromkeys(prefixes):
            sizes = [n for _key, n in store.list_noncurrent(prefix)]
            kept = [n for n in sizes if n is not None]  # None: a delete marker
            out[prefix] = Noncurrent(len(kept), sum(kept), len(sizes) - len(kept))
    except StoreError as exc:
        unsupported = isinstance(exc, UnsupportedOperationError)  # 501: it keeps no versions
        return Versions("unsupported" if unsupported else "unknown", {}, reason=_why(exc))
    try:
        days = [store.noncurrent_expiry_days(p) for p in out]
    except StoreError as exc:
        return Versions(status, out, reason="", expire_note=f"lifecycle rules: {_why(exc)}")
    if not days or None in days:
        return Versions(status, out, expire_note="no lifecycle rule expires noncurrent versions")
    return Versions(status, out, expire_days=max(d for d in days if d is not None))


def _why(exc: StoreError) -> str:
    if isinstance(exc, AccessDeniedError):
        action = {
            "get_bucket_versioning": "s3:GetBucketVersioning",
            "list_object_versions": "s3:ListBucketVersions",
            "get_bucket_lifecycle_configuration": "s3:GetLifecycleConfiguration",
        }.get(exc.operation or "", "the permission")
        return f"permission denied: the role needs {action} (docs/operations.md)"
    if isinstance(exc, UnsupportedOperationError):
        return f"the store does not implement {exc.operation}"
    return f"{exc.operation or 'the request'} failed: {exc.message}"
