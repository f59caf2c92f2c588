"""The pruner's lease on a run: ``{run}/s3ckpt.lease``, taken with conditional puts.

Why a lease object and not a lock service: the only thing every pruner shares is the
bucket, and S3's conditional writes make a compare-and-swap out of one object:

* **acquire** — ``PUT`` with ``If-None-Match: *``. If the object exists, read it (HEAD for
  the ETag and LastModified, then GET); if it is *released*, *expired*, or *stale* (held by
  a process of this same boot of this host that no longer exists, or whose pid another
  process now holds — restic's rule for stale locks, with the boot id and the process's
  start time as proof, never the hostname alone), replace it with
  ``PUT If-Match: <that ETag>``. Exactly one of any number of
  racing pruners wins each step; the others get :class:`~s3ckpt.errors.LeaseHeldError`.
* **renew** — ``PUT If-Match: <our ETag>`` with a later expiry, before each delete request
  once half the TTL has passed. A 412 means another pruner took the lease after ours
  expired: we stop at once (:class:`~s3ckpt.errors.LeaseLostError`).
* **release** — ``PUT If-Match: <our ETag>`` of a body marked ``released``. The object
  stays (an unconditional DELETE could remove a lease another pruner has just taken).

The body is also the pruner's *intent log*: before the first delete it records the names
of the checkpoints the plan deletes (``deleting``) and the ETag of each commit marker it
planned to delete (``planned``). A pruner that takes over a lease whose holder died reads
that log and finishes those deletions first, so a crash at any point converges to the plan
even though the dead pruner had already removed some commit markers. It finishes a marker
only while it still has the planned ETag (:func:`~s3ckpt.retention._intent.finish_previous`):
an overwrite that committed after the dead pruner planned is left to the normal plan, as is
every present marker of a record from an older version (which recorded no ETags).

Expiry never compares two hosts' clocks: a lease is expired when its object's LastModified
(the store's time of the holder's last write, refreshed by every renewal) plus the TTL the
holder recorded is at or before the store's time now (:func:`~s3ckpt.store._clock.store_time`,
the ``Date`` of one response). The body's ``acquired`` / ``expires`` are the holder's wall
clock, kept for display and for older readers. The holder times its renewals by its own
monotonic clock from just before each write, which can only renew early.

Lost replies: S3 may apply a conditional PUT whose reply never arrives (a reset or timeout).
The store then retries it and gets 412 from *our own* write, or gives up with a transient
error. Both are resolved by reading the lease back (HEAD + GET): if its body is exactly the
record we tried to write -- it names our owner id and our timestamps, so no one else can
have written it -- the write succeeded and the HEAD's ETag is ours.

The pruner writes exactly one key per run: ``{run}/s3ckpt.lease`` (PutObject, with
If-None-Match / If-Match), and reads it (GetObject, HeadObject).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from s3ckpt._commit import identity, process_gone
from s3ckpt._time import iso_z_seconds
from s3ckpt._tombstone import read_object
from s3ckpt.errors import (
    LeaseHeldError,
    LeaseLostError,
    ObjectNotFoundError,
    PreconditionFailedError,
    S3CkptError,
    TransientStoreError,
)
from s3ckpt.format._names import LEASE_NAME
from s3ckpt.metrics.instrument import expecting
from s3ckpt.store._capabilities import require_conditional_writes
from s3ckpt.store._clock import store_time
from s3ckpt.store.base import ObjectStore
from s3ckpt.store.retry import cleanup
from s3ckpt.uri import StoreURL

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_LEASE_TTL", "Lease", "LeaseRecord"]

Moves = Mapping[str, Mapping[str, str]]
"""A lease's ``moving`` record: the storage-class transitions under way, by checkpoint."""

DEFAULT_LEASE_TTL = timedelta(minutes=5)
LEASE_FORMAT = "s3ckpt.lease"
_TYPES: dict[str, Callable[[Any], Any]] = {
    **dict.fromkeys(("owner", "host", "pidns", "operation", "boot"), str),
    **dict.fromkeys(("acquired", "expires", "ttl"), float),
    **{"pid": int, "start": int, "released": bool},
}
"""The lease body's scalar fields and their types (a value of another type is converted)."""


@dataclass(frozen=True)
class LeaseRecord:
    """The lease object's body.

    ``acquired`` and ``expires`` are the holder's wall clock (display; readers of older
    versions compare ``expires``); expiry is judged by :meth:`expiry` in the store's time.
    ``boot`` and ``start`` (boot id, process start in clock ticks) prove the holder's
    process gone (:func:`s3ckpt._commit.process_gone`); records of older versions have
    neither, and ``ttl`` None. ``planned`` maps names in ``deleting`` to the ETag of the
    commit marker planned for deletion (absent: no marker was planned, or an older record).
    ``moving`` maps checkpoints whose storage-class transition was under way to ``{"class",
    "method", "marker"}`` (:mod:`s3ckpt.retention._transition`; older records have none).
    """

    owner: str
    host: str
    pid: int
    pidns: str
    acquired: float
    expires: float
    released: bool = False
    deleting: tuple[str, ...] = ()
    operation: str = "prune"
    boot: str = ""
    start: int | None = None
    ttl: float | None = None
    planned: Mapping[str, str] = field(default_factory=dict, hash=False)
    moving: Moves = field(default_factory=dict, hash=False)

    def to_json(self) -> bytes:
        doc = {"format": LEASE_FORMAT, "version": 1, **dataclasses.asdict(self)}
        return json.dumps(doc, separators=(",", ":")).encode("utf-8")

    @classmethod
    def from_json(cls, raw: bytes) -> LeaseRecord | None:
        """Parse; ``None`` when the body is not a lease this version understands."""
        try:
            doc = json.loads(raw.decode("utf-8"))
            if not isinstance(doc, dict) or doc.get("format") != LEASE_FORMAT:
                return None
            kw: dict[str, Any] = {"host": "", "pid": 0, "pidns": "", "acquired": 0.0}
            kw |= {k: t(doc[k]) for k, t in _TYPES.items() if doc.get(k) is not None}
            return cls(
                **kw,
                deleting=tuple(str(x) for x in doc.get("deleting") or ()),
                planned={str(k): str(v) for k, v in (doc.get("planned") or {}).items()},
                moving={
                    str(k): {str(a): str(b) for a, b in v.items()}
                    for k, v in (doc.get("moving") or {}).items()
                },
            )
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError):
            return None

    def expiry(self, last_modified: float | None, ttl: timedelta = DEFAULT_LEASE_TTL) -> float:
        """When the lease expires, in the store's time: the object's ``last_modified`` plus
        the TTL its holder recorded (``ttl`` for records of older versions, which recorded
        none). Without a LastModified, the holder's own ``expires``."""
        if last_modified is None:
            return self.expires
        return last_modified + (self.ttl if self.ttl is not None else ttl.total_seconds())

    def stale(
        self, now: float, *, last_modified: float | None = None, ttl: timedelta = DEFAULT_LEASE_TTL
    ) -> bool:
        """Released, expired at ``now`` (the store's time; see :meth:`expiry`), or held by a
        process provably gone (:func:`s3ckpt._commit.process_gone`)."""
        if self.released or self.expiry(last_modified, ttl) <= now:
            return True
        return process_gone(self.host, self.pidns, self.pid, self.boot, self.start)


@dataclass
class Lease:
    """A lease on one run: :meth:`acquire`, then :meth:`release` (the run's
    :class:`~s3ckpt.retention._intent.Intent` does, on the way out); the pruner calls
    :meth:`renew_if_due` before every delete request.

    Args:
        clock: Times renewals (seconds; only differences count). Default: the monotonic
            clock, which NTP steps do not move.
        store_clock: The store's time now (seconds since the epoch), to judge whether
            another holder's lease expired. Default: :func:`~s3ckpt.store._clock.store_time`
            (one request on S3, and only when the lease is found taken).

    Attributes:
        previous: The record this lease replaced (a dead pruner's, with its intent log),
            or None when the lease was free.
    """

    store: ObjectStore
    run: StoreURL
    ttl: timedelta = DEFAULT_LEASE_TTL
    operation: str = "prune"
    clock: Callable[[], float] = time.monotonic
    store_clock: Callable[[], float] | None = None
    owner: str = field(
        default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
    )
    previous: LeaseRecord | None = field(default=None, init=False)
    _etag: str | None = field(default=None, init=False, repr=False)
    _record: LeaseRecord | None = field(default=None, init=False, repr=False)
    _sent: float = field(default=0.0, init=False, repr=False)
    """``clock()`` just before the write our current ETag came from (renewal timing)."""

    @property
    def key(self) -> str:
        """The lease object's key."""
        return self.run.key(LEASE_NAME)

    @property
    def held(self) -> bool:
        """Whether we hold it (as far as we know)."""
        return self._etag is not None

    def _new_record(
        self,
        deleting: Sequence[str] = (),
        released: bool = False,
        planned: Mapping[str, str] | None = None,
        moving: Moves | None = None,
    ) -> LeaseRecord:
        self._sent = self.clock()
        now = time.time()  # display only: expiry is judged in the store's time
        # The planned marker ETags of ``deleting``: ``planned``, else what our record and the
        # previous holder's recorded (a carried or unfinished name keeps its ETag).
        known = {k: v for r in (self.previous, self._record) if r for k, v in r.planned.items()}
        known |= planned or {}
        return LeaseRecord(
            owner=self.owner,
            **dataclasses.asdict(identity()),
            acquired=self._record.acquired if self._record else now,
            expires=0.0 if released else now + self.ttl.total_seconds(),
            released=released,
            deleting=tuple(deleting),
            operation=self.operation,
            ttl=self.ttl.total_seconds(),
            planned={n: known[n] for n in deleting if n in known},
            moving=dict(self._record.moving if self._record else {}) if moving is None else moving,
        )

    def _put(self, record: LeaseRecord, etag: str | None) -> bool:
        """PUT ``record`` ``If-Match`` ``etag`` (None: ``If-None-Match: *``); whether it is
        ours now. A 412 (but to ``If-None-Match``, which :meth:`acquire` reads on) or a
        give-up is decided by reading back (a lost reply of our own write); a give-up that
        is not ours raises."""
        try:
            with expecting("precondition_failed"):
                self._etag = self.store.put(
                    self.key, record.to_json(), if_match=etag, if_none_match=etag is None
                )
        except ObjectNotFoundError:
            return False
        except (PreconditionFailedError, TransientStoreError) as exc:
            lost = etag is not None or isinstance(exc, TransientStoreError)  # ours, maybe
            found = read_object(self.store, self.key) if lost else None
            if found is None or found[1] != record.to_json() or found[0].etag is None:
                if isinstance(exc, TransientStoreError):
                    raise
                return False
            self._etag = found[0].etag
        self._record = record
        return True

    def acquire(self) -> Lease:
        """Take the lease or raise :class:`~s3ckpt.errors.LeaseHeldError`.

        Request cost: one PUT when the lease is free; HEAD + GET + PUT to take over a
        released, expired or stale one (plus HEAD + GET when a PUT's reply was lost).
        """
        if self.ttl <= timedelta(0):
            raise ValueError("lease ttl must be positive")
        require_conditional_writes(  # once per process: refuse on a store ignoring them
            self.store,
            self.key,
            what=f"the lease on {self.run}",
            body=self._new_record(released=True).to_json(),
            probe_delete=True,
            beside=True,  # never on the shared lease another pruner may hold right now
        )
        for _ in range(3):
            # 412: the last pruner's released lease is there (the usual case), or our own
            # write whose reply was lost (read back, and ours): read on.
            record = self._new_record()
            if self._put(record, None):
                return self
            found = read_object(self.store, self.key)
            if found is None:
                continue  # released and removed meanwhile: try the fresh put again
            info, raw = found
            if raw == record.to_json() and info.etag is not None:
                # Our put was applied and its reply lost; the retry met our own lease.
                self._etag, self._record = info.etag, record
                return self
            current = LeaseRecord.from_json(raw)
            clock = self.store_clock
            now = clock() if clock else store_time(self.store, self.run.prefix).store.timestamp()
            if current is None:
                # Not a lease we understand: it expires one TTL after it was written.
                when = info.last_modified
                if when is None or when + self.ttl.total_seconds() > now:
                    raise self._held(None, None)
            elif not current.stale(now, last_modified=info.last_modified, ttl=self.ttl):
                raise self._held(current.owner, current.expiry(info.last_modified, self.ttl))
            if not self._put(record, info.etag):
                raise self._held(None, None)
            if current is not None and (current.deleting or current.moving or not current.released):
                self.previous = current
            return self
        raise self._held(None, None)

    def _held(self, holder: str | None, expires: float | None) -> LeaseHeldError:
        until = f" until {iso_z_seconds(expires)}" if expires is not None else ""
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
        if not self._put(record, self._etag):
            self._etag = None
            raise LeaseLostError(
                f"lost the lease on {self.run}: it expired and another pruner took it over; "
                "stopped before the next delete (raise lease_ttl if runs are slow)",
                bucket=self.run.bucket or None,
                key=self.key,
            )

    def record_intent(
        self,
        deleting: Sequence[str],
        planned: Mapping[str, str] | None = None,
        moving: Moves | None = None,
    ) -> None:
        """Write the names about to be deleted into the lease (the intent log); renews.

        Args:
            deleting: The checkpoints' names.
            planned: The ETag of each commit marker planned for deletion, by name (a
                finishing pruner deletes a marker only while it still has it). Names
                without one keep what the log already recorded for them.
            moving: The storage-class transitions about to run (None: as recorded).
        """
        self._swap(self._new_record(deleting, planned=planned, moving=moving))

    def renew_if_due(self) -> None:
        """Renew when less than half the TTL is left; raise LeaseLostError if taken."""
        # Measured from before our last write was sent: its LastModified (from which the
        # store's time judges expiry) is later, so this can only renew early. Never taken (no
        # record): :meth:`_swap` raises LeaseLostError.
        if self._record is None or self.clock() - self._sent >= self.ttl.total_seconds() / 2:
            self._swap(self._new_record(self._record.deleting if self._record else ()))

    def release(self, deleting: Sequence[str] = (), moving: Moves | None = None) -> None:
        """Mark the lease released (conditional; a lease already lost is left alone).

        Its requests share one short budget (:func:`~s3ckpt.store.retry.cleanup`); a store
        that cannot be reached leaves the lease to expire by itself, logged as a WARNING
        naming the time.

        Args:
            deleting: Checkpoints whose deletion did not finish (per-key failures, an
                exception): kept in the released lease so the next pruner finishes them.
            moving: Transitions that did not finish, kept likewise (None: none).
        """
        if self._etag is None:
            return
        expires = self._record.expires if self._record is not None else None
        try:
            with cleanup():  # a short budget: a store that went silent is not waited for again
                self._swap(self._new_record(deleting, released=True, moving=moving or {}))
        except LeaseLostError:
            pass
        except S3CkptError as exc:  # never masks the error that ends the pass
            log.warning(
                "s3ckpt: could not release the lease on %s (%s); it expires by itself%s, "
                "and the next %s finishes what its intent log names",
                self.run,
                exc,
                f" at {iso_z_seconds(expires)}" if expires else " after its TTL",
                self.operation,
            )
        self._etag = None
