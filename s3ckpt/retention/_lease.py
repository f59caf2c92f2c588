"""The pruner's lease on a run: ``{run}/s3ckpt.lease``, taken with conditional puts.

Why a lease object and not a lock service: the only thing every pruner shares is the
bucket, and S3's conditional writes make a compare-and-swap out of one object:

* **acquire** — ``PUT`` with ``If-None-Match: *``. If the object exists, read it (HEAD for
  the ETag, then GET); if it is *released*, *expired*, or *stale* (held by a process of
  this same host and PID namespace that no longer exists — restic's rule for stale
  locks), replace it with ``PUT If-Match: <that ETag>``. Exactly one of any number of
  racing pruners wins each step; the others get :class:`~s3ckpt.errors.LeaseHeldError`.
* **renew** — ``PUT If-Match: <our ETag>`` with a later expiry, before each delete request
  once half the TTL has passed. A 412 means another pruner took the lease after ours
  expired: we stop at once (:class:`~s3ckpt.errors.LeaseLostError`).
* **release** — ``PUT If-Match: <our ETag>`` of a body marked ``released``. The object
  stays (an unconditional DELETE could remove a lease another pruner has just taken).

The body is also the pruner's *intent log*: before the first delete it records the names
of the checkpoints the plan deletes (``deleting``). A pruner that takes over a lease whose
holder died reads that list and finishes those deletions first, so a crash at any point
converges to the plan even though the dead pruner had already removed some commit markers.

Expiry compares this machine's clock with the holder's: keep the TTL far above any clock
skew (NTP keeps it under a second; the default TTL is 5 minutes).

Lost replies: S3 may apply a conditional PUT whose reply never arrives (a reset or timeout).
The store then retries it and gets 412 from *our own* write, or gives up with a transient
error. Both are resolved by reading the lease back (HEAD + GET): if its body is exactly the
record we tried to write -- it names our owner id and our timestamps, so no one else can
have written it -- the write succeeded and the HEAD's ETag is ours.

The pruner writes exactly one key per run: ``{run}/s3ckpt.lease`` (PutObject, with
If-None-Match / If-Match), and reads it (GetObject, HeadObject).
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from s3ckpt._commit import pid_namespace, process_gone
from s3ckpt._time import iso_z_seconds
from s3ckpt.errors import (
    LeaseHeldError,
    LeaseLostError,
    ObjectNotFoundError,
    PreconditionFailedError,
    TransientStoreError,
)
from s3ckpt.format import LEASE_NAME
from s3ckpt.store.base import ObjectStore
from s3ckpt.uri import StoreURL

__all__ = ["DEFAULT_LEASE_TTL", "Lease", "LeaseRecord"]

DEFAULT_LEASE_TTL = timedelta(minutes=5)
LEASE_FORMAT = "s3ckpt.lease"


@dataclass(frozen=True)
class LeaseRecord:
    """The lease object's body."""

    owner: str
    host: str
    pid: int
    pidns: str
    acquired: float
    expires: float
    released: bool = False
    deleting: tuple[str, ...] = ()
    operation: str = "prune"

    def to_json(self) -> bytes:
        doc = {
            "format": LEASE_FORMAT,
            "version": 1,
            "owner": self.owner,
            "host": self.host,
            "pid": self.pid,
            "pidns": self.pidns,
            "operation": self.operation,
            "acquired": self.acquired,
            "expires": self.expires,
            "released": self.released,
            "deleting": list(self.deleting),
        }
        return json.dumps(doc, separators=(",", ":")).encode("utf-8")

    @classmethod
    def from_json(cls, raw: bytes) -> LeaseRecord | None:
        """Parse; ``None`` when the body is not a lease this version understands."""
        try:
            doc = json.loads(raw.decode("utf-8"))
            if not isinstance(doc, dict) or doc.get("format") != LEASE_FORMAT:
                return None
            return cls(
                owner=str(doc["owner"]),
                host=str(doc.get("host", "")),
                pid=int(doc.get("pid", 0)),
                pidns=str(doc.get("pidns", "")),
                acquired=float(doc.get("acquired", 0.0)),
                expires=float(doc["expires"]),
                released=bool(doc.get("released", False)),
                deleting=tuple(str(x) for x in doc.get("deleting") or ()),
                operation=str(doc.get("operation", "prune")),
            )
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError):
            return None

    def stale(self, now: float) -> bool:
        """Released, expired, or held by a dead process on this host and PID namespace."""
        if self.released or self.expires <= now:
            return True
        return process_gone(self.host, self.pidns, self.pid)


@dataclass
class Lease:
    """A lease on one run. Use as a context manager or call :meth:`acquire` /
    :meth:`release`; the pruner calls :meth:`renew_if_due` before every delete request.

    Attributes:
        previous: The record this lease replaced (a dead pruner's, with its intent log),
            or None when the lease was free.
    """

    store: ObjectStore
    run: StoreURL
    ttl: timedelta = DEFAULT_LEASE_TTL
    operation: str = "prune"
    clock: Callable[[], float] = time.time
    owner: str = field(
        default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
    )
    previous: LeaseRecord | None = field(default=None, init=False)
    _etag: str | None = field(default=None, init=False, repr=False)
    _record: LeaseRecord | None = field(default=None, init=False, repr=False)

    @property
    def key(self) -> str:
        """The lease object's key."""
        return self.run.key(LEASE_NAME)

    @property
    def held(self) -> bool:
        """Whether we hold it (as far as we know)."""
        return self._etag is not None

    def _new_record(self, deleting: Sequence[str] = (), released: bool = False) -> LeaseRecord:
        now = self.clock()
        acquired = self._record.acquired if self._record else now
        return LeaseRecord(
            owner=self.owner,
            host=socket.gethostname(),
            pid=os.getpid(),
            pidns=pid_namespace(),
            acquired=acquired,
            expires=0.0 if released else now + self.ttl.total_seconds(),
            released=released,
            deleting=tuple(deleting),
            operation=self.operation,
        )

    def _written(self, record: LeaseRecord) -> str | None:
        """The lease's ETag if its body is exactly ``record``, else None.

        How a conditional write whose reply was lost is recognised as ours. HEAD comes
        before GET: our write finished before this is called and only we write this body,
        so a GET that returns it proves the earlier HEAD saw it too.
        """
        info = self.store.head(self.key)
        if info is None:
            return None
        try:
            raw = self.store.get(self.key)
        except ObjectNotFoundError:
            return None
        return info.etag if raw == record.to_json() else None

    def acquire(self) -> Lease:
        """Take the lease or raise :class:`~s3ckpt.errors.LeaseHeldError`.

        Request cost: one PUT when the lease is free; HEAD + GET + PUT to take over a
        released, expired or stale one (plus HEAD + GET when a PUT's reply was lost).
        """
        if self.ttl <= timedelta(0):
            raise ValueError("lease ttl must be positive")
        for _ in range(3):
            record = self._new_record()
            try:
                self._etag = self.store.put(self.key, record.to_json(), if_none_match=True)
                self._record = record
                return self
            except PreconditionFailedError:
                pass  # taken -- or our own write, whose reply was lost: read below
            except TransientStoreError:
                etag = self._written(record)
                if etag is None:
                    raise
                self._etag, self._record = etag, record
                return self
            info = self.store.head(self.key)
            if info is None:
                continue  # released and removed meanwhile: try the fresh put again
            try:
                raw = self.store.get(self.key)
            except ObjectNotFoundError:
                continue
            if raw == record.to_json() and info.etag is not None:
                # Our put was applied and its reply lost; the retry met our own lease.
                self._etag, self._record = info.etag, record
                return self
            current = LeaseRecord.from_json(raw)
            now = self.clock()
            if current is None:
                # Not a lease we understand: it expires one TTL after it was written.
                age_ok = info.last_modified is not None and (
                    info.last_modified + self.ttl.total_seconds() <= now
                )
                if not age_ok:
                    raise self._held(None, None)
            elif not current.stale(now):
                raise self._held(current.owner, current.expires)
            try:
                self._etag = self.store.put(self.key, record.to_json(), if_match=info.etag)
            except ObjectNotFoundError:
                raise self._held(None, None) from None
            except (PreconditionFailedError, TransientStoreError) as exc:
                etag = self._written(record)  # a lost reply of our takeover?
                if etag is None:
                    if isinstance(exc, TransientStoreError):
                        raise
                    raise self._held(None, None) from None
                self._etag = etag
            self._record = record
            if current is not None and (current.deleting or not current.released):
                self.previous = current
            return self
        raise self._held(None, None)

    def _held(self, holder: str | None, expires: float | None) -> LeaseHeldError:
        until = ""
        if expires is not None:
            until = f" until {iso_z_seconds(expires)}"
        who = f" by {holder}" if holder else ""
        return LeaseHeldError(
            f"another pruner holds the lease on {self.run}{who}{until}; try again later",
            bucket=self.run.bucket or None,
            key=self.key,
            holder=holder,
            expires=expires,
        )

    def _swap(self, record: LeaseRecord) -> None:
        if self._etag is None:
            raise LeaseLostError(
                f"not holding the lease on {self.run}", bucket=self.run.bucket, key=self.key
            )
        try:
            self._etag = self.store.put(self.key, record.to_json(), if_match=self._etag)
        except (PreconditionFailedError, ObjectNotFoundError, TransientStoreError) as exc:
            # A 412 (or a give-up) may hide our own write whose reply was lost.
            etag = None if isinstance(exc, ObjectNotFoundError) else self._written(record)
            if etag is not None:
                self._etag, self._record = etag, record
                return
            if isinstance(exc, TransientStoreError):
                raise
            self._etag = None
            raise LeaseLostError(
                f"lost the lease on {self.run}: it expired and another pruner took it over; "
                "stopped before the next delete (raise lease_ttl if runs are slow)",
                bucket=self.run.bucket or None,
                key=self.key,
            ) from None
        self._record = record

    def record_intent(self, deleting: Sequence[str]) -> None:
        """Write the names about to be deleted into the lease (the intent log); renews."""
        self._swap(self._new_record(deleting))

    def renew_if_due(self) -> None:
        """Renew when less than half the TTL is left; raise LeaseLostError if taken."""
        rec = self._record
        if rec is None:
            raise LeaseLostError(f"not holding the lease on {self.run}", key=self.key)
        if rec.expires - self.clock() < self.ttl.total_seconds() / 2:
            self._swap(self._new_record(rec.deleting))

    def release(self, deleting: Sequence[str] = ()) -> None:
        """Mark the lease released (conditional; a lease already lost is left alone).

        Args:
            deleting: Checkpoints whose deletion did not finish (per-key failures, an
                exception): kept in the released lease so the next pruner finishes them.
        """
        if self._etag is None:
            return
        try:
            self._swap(self._new_record(deleting, released=True))
        except LeaseLostError:
            pass
        self._etag = None

    def __enter__(self) -> Lease:
        return self.acquire() if not self.held else self

    def __exit__(self, *exc: object) -> None:
        # On an exception keep the intent log: the deletions it names may be half done.
        rec = self._record
        self.release(rec.deleting if rec is not None and exc[0] is not None else ())
