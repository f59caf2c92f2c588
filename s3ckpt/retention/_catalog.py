"""The catalog's records: one :class:`CheckpointInfo` per checkpoint prefix of a run, in a
:class:`RunCatalog`. :mod:`s3ckpt.retention._scan` builds them from a listing.

Saves and liveness. Every object and upload a save creates carries the save's 8-hex *tag*
(see :mod:`s3ckpt.format`). A tag is *live* while any of its objects (heartbeats included:
each writing rank rewrites one every ``HEARTBEAT_INTERVAL``) or open uploads is younger than
the grace period (:mod:`s3ckpt.retention._liveness`); a save uploading one large object for
hours stays live through its heartbeats. ``live_tags`` lists them; a live tag other than the
committed one is a save in progress (``live_saves``), in a committed prefix an overwrite.

States:

* ``COMMITTED`` — the commit marker is present.
* ``IN_PROGRESS`` — no marker, and a tag is live or the newest sign of activity (an
  object's mtime, or an open multipart upload's start) is younger than the grace period.
* ``FOREIGN`` — no marker but a DCP ``.metadata``, and older than the grace period: a
  checkpoint written by stock DCP or another tool. Never deleted unless asked
  (``include_foreign``), never removed by ``gc`` (which only reclaims s3ckpt's per-save
  names of dead tags in it).
* ``ABANDONED`` — no marker, no ``.metadata``, nothing live: a save that died. Only ``gc``
  removes these, and only the names s3ckpt wrote.
* ``BEING_DELETED`` — the marker key holds an unfinished tombstone
  (:mod:`s3ckpt._tombstone`): gc, prune or rm fenced the prefix and has not finished (or
  died, or had deletes refused). The next prune, gc or rm finishes it; no writer replaces
  it. Never damaged, never a live save, never planned.
* ``GONE`` — a finished tombstone and nothing of a save left: a deleted step whose fence
  stays because a reaped save may still be paused. Dropped from the catalog (not listed,
  planned or counted) until a new save of the step writes there (then ``IN_PROGRESS``, or
  ``ABANDONED`` when it died) and replaces the tombstone by its commit.

The state machine of a prefix, and the ONE conditional write on the marker key behind each
transition that ends a claim (the request that decides; everything else follows it):

======================================  ===================================================
transition                              the write
======================================  ===================================================
writing -> committed                    the writer's marker PUT ``If-None-Match: *`` (or
                                        ``If-Match`` the finished tombstone of a gone step)
committed -> committed (overwrite)      the writer's marker PUT ``If-Match`` the old ETag
writing -> failed / abandoned           none: no claim ends (the save died or said so)
abandoned -> being deleted (gc)         tombstone ``If-None-Match: *`` (``If-Match`` a
                                        finished tombstone's ETag), ``keep``: its save may
                                        be paused
committed -> being deleted (prune, rm)  tombstone ``If-Match`` the planned marker ETag
committed -> committed (gc reaps a      the marker rewritten ``If-Match`` with the reaped
dead overwrite's objects)               tags recorded (``reaped``): a new ETag
being deleted -> (nothing)              the deleter's last delete of its tombstone (no
                                        other save's names were in the prefix)
being deleted -> gone                   the tombstone rewritten ``done`` ``If-Match`` its
                                        ETag (``keep``)
gone -> writing -> committed            the new save's marker PUT ``If-Match`` the
                                        tombstone's ETag
committed <-> archived, damaged         none on the marker: storage classes; ``s3ckpt
                                        check``'s record (``check``)
======================================  ===================================================

A writer paused past any of these fails its own conditional PUT, reads the marker back and
raises :class:`s3ckpt.errors.SaveFencedError`.

A save that s3ckpt saw fail (its marker PUT kept failing, a rank's upload failed, Ctrl-C)
and that may have left objects behind records so, best effort
(``s3ckpt.failed.{tag}.{rank}``, :func:`s3ckpt._commit.record_failure`): that tag is dead
at once, not live until the grace period ends, so a prefix holding only what
failed saves left is ``ABANDONED`` straight away (:attr:`CheckpointInfo.failed`, shown as
"failed" by ``s3ckpt ls``) and gc may remove its names once the record has settled
(``FAILURE_SETTLE``, a minute). A record names one save: any other save of the prefix
keeps its own state, and a commit marker wins over every record (a marker PUT whose reply
was lost may have been applied).

Life. :attr:`CheckpointInfo.life` names the one state of a checkpoint's life
(:class:`Life`: writing, committed, damaged, failed, abandoned, being deleted, gone,
archived), decided here from what the scan read: the marker, heartbeats, failure records,
storage classes and what ``s3ckpt check`` recorded (:mod:`s3ckpt.retention._check_record`).
*Damaged* is a committed checkpoint whose marker cannot be read (``error``) or that the
run's check record found damaged, for the marker it has now (``check``). Every command reads
it from here: plans never delete nor count a damaged checkpoint, ``latest`` skips it.

Order is by step, then commit time, then name; never by the mtime of any other object (a
copied or restored bucket rewrites every mtime).

Times are the store's. ``committed_at`` is when the store took the commit, not what the
writer's clock said: a job on a node whose clock is two days fast must not make ``within``,
the calendar rules or "most recently committed" keep its older steps and delete newer ones.
It is the LastModified of the committed per-save metadata ``.metadata.{tag}``, which the
coordinator writes just before the marker and nothing rewrites afterwards (the marker itself
is rewritten in place by ``Checkpointer.attach_metrics``, which would move a checkpoint
"later" each time metrics are attached). Format-1 commits (no per-save metadata), or a
listing without that object, fall back to the marker's LastModified; a store that reports no
LastModified at all, to the writer's ``created``. The writer's ``created`` stays available
for display.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from s3ckpt._time import iso_z, utc
from s3ckpt._tombstone import Tombstone
from s3ckpt.retention._check_record import CheckEntry, CheckRecord
from s3ckpt.store.base import ARCHIVE_CLASSES, UploadInfo
from s3ckpt.uri import StoreURL

__all__ = ["DEFAULT_STORAGE_CLASS", "CheckpointInfo", "CheckpointState", "Life", "RunCatalog"]

DEFAULT_STORAGE_CLASS = "STANDARD"
"""The class an object counts in when its listing names none (S3 omits it for some
objects; file and memory stores have no classes)."""


class CheckpointState(enum.StrEnum):
    """What a checkpoint prefix is; see the module docstring."""

    COMMITTED = "committed"
    IN_PROGRESS = "in_progress"
    ABANDONED = "abandoned"
    FOREIGN = "foreign"
    BEING_DELETED = "being_deleted"
    GONE = "gone"


class Life(enum.StrEnum):
    """The one state of a checkpoint's life (:attr:`CheckpointInfo.life`): what every
    command reads. ``FOREIGN`` checkpoints (stock DCP) count as ``COMMITTED``."""

    WRITING = "writing"
    COMMITTED = "committed"
    DAMAGED = "damaged"
    FAILED = "failed"
    ABANDONED = "abandoned"
    ARCHIVED = "archived"
    BEING_DELETED = "being_deleted"
    GONE = "gone"


_NO_TIME = datetime.min.replace(tzinfo=UTC)


@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint prefix of a run, as the catalog sees it.

    Attributes:
        url: The checkpoint's prefix (``s3://bucket/run/step_000001000/``).
        name: The sub-prefix name under the run, without the slash (unique in a run).
        step: From the commit marker when there is one (and it records a step), else read
            from the name (:func:`s3ckpt._step_names.checkpoint_step`: ``step_<n>``, ``step-<n>``,
            ``epoch=<e>-step=<n>.ckpt``, ``global_step<n>``, ``checkpoint-<n>``, or the
            catalog's ``step_pattern``); None when neither gives one.
        state: See :class:`CheckpointState`.
        committed_at: When the store took the commit (UTC, the store's clock; see the
            module docstring); for ``FOREIGN`` checkpoints the ``.metadata`` object's mtime
            (the only commit time stock DCP leaves); else None. What retention orders and
            ages by.
        size: Bytes under the prefix (control objects excluded), and of the checkpoint's data
            objects in the run's shard folder (hashed prefixes, :mod:`s3ckpt.retention._scan`).
        num_objects: Objects under the prefix (control objects excluded), shards included.
        metrics: From the marker (empty without one).
        pinned: The pin's reason, or None if not pinned.
        last_activity: Newest object mtime or open-upload start under the prefix (UTC);
            used only to tell IN_PROGRESS from ABANDONED, never to order.
        error: Why the marker could not be read, when it could not: the checkpoint stays
            ``COMMITTED`` and is *damaged* (:attr:`damaged`).
        keys: Every key under the prefix (control objects and foreign files included) and the
            checkpoint's data objects in the run's shard folder. Retention deletes only the
            ones s3ckpt (or, with ``include_foreign``, DCP) wrote.
        tag: The committed save's tag (from the marker), else None.
        live_tags: Tags with an object, heartbeat or open upload younger than the grace period.
        uploads: Open multipart uploads under the prefix (and of its shards).
        committed_keys: Keys the marker commits (the marker, its metadata, its objects).
        metadata_stale: Committed with a per-save metadata, and the plain ``.metadata`` (the
            copy for stock DCP readers) is missing, of the wrong size or older than the marker.
        bytes_by_class: ``size`` split by S3 storage class (``{"STANDARD": ..., "GLACIER":
            ...}``; an object whose listing names no class counts as ``STANDARD``). Its
            values add up to ``size``; empty for records built without a listing.
        created: The marker's ``created``: the writer's wall clock when it committed (UTC).
            For display only; None without a readable marker.
        marker_etag: The commit marker's ETag in the listing: rm and prune delete the
            marker only while it still has this ETag (an overwrite that committed since
            is left alone).
        failed_at: When the store took the newest failure record of a save here that did
            not commit (UTC, the store's clock; see the module docstring); None when no
            such save recorded one. Also set beside a committed or in-progress save: an
            overwrite or an earlier attempt that failed.
        failure: What that record says went wrong (``"rank 0: TransientStoreError: ..."``);
            None with ``failed_at``.
        check: What ``s3ckpt check`` recorded as damaged about this checkpoint's current
            marker (:mod:`s3ckpt.retention._check_record`); None when the run's record names
            no damage of it (or of the marker it has now).
        shallow: Built by a shallow scan from the commit marker alone
            (:mod:`s3ckpt.retention._shallow`): ``size``, ``num_objects`` and ``keys`` are
            what the marker commits; ``committed_at`` is the marker's LastModified (never
            earlier than the commit); ``bytes_by_class`` is unknown (empty, ``null`` in
            JSON); pins, live saves, failure records and a stale ``.metadata`` are not
            seen. A prune re-checks what it would delete by listing it.
        tombstone: The tombstone at the marker key (:mod:`s3ckpt._tombstone`): a deleter
            fenced the prefix (``BEING_DELETED`` until it is done, then ``GONE``).
        reaped: Tags of saves gc reaped in this committed prefix (the marker records them):
            such a save may be paused, so deleting the checkpoint keeps its tombstone.
        dead_tags: Tags whose writer is proven gone (same host, pid gone) or that recorded
            their failure: such a save can never resume, so reaping it needs no lasting fence.
    """

    url: StoreURL
    name: str
    step: int | None
    state: CheckpointState
    committed_at: datetime | None
    size: int
    num_objects: int
    metrics: Mapping[str, float] = field(default_factory=dict)
    pinned: str | None = None
    last_activity: datetime | None = None
    error: str | None = None
    keys: tuple[str, ...] = field(default=(), repr=False, compare=False)
    tag: str | None = None
    live_tags: tuple[str, ...] = ()
    uploads: tuple[UploadInfo, ...] = field(default=(), repr=False, compare=False)
    committed_keys: frozenset[str] = field(default=frozenset(), repr=False, compare=False)
    metadata_stale: bool = False
    bytes_by_class: Mapping[str, int] = field(default_factory=dict, compare=False)
    created: datetime | None = None
    marker_etag: str | None = field(default=None, compare=False)
    failed_at: datetime | None = None
    failure: str | None = field(default=None, compare=False)
    shallow: bool = field(default=False, compare=False)
    tombstone: Tombstone | None = field(default=None, compare=False)
    reaped: tuple[str, ...] = field(default=(), compare=False)
    dead_tags: frozenset[str] = field(default=frozenset(), compare=False)
    check: CheckEntry | None = field(default=None, compare=False)

    @property
    def is_committed(self) -> bool:
        """Whether the commit marker is present."""
        return self.state is CheckpointState.COMMITTED

    @property
    def damaged(self) -> bool:
        """Committed, but its commit marker cannot be read (``error`` says why: not JSON, a
        field out of range, too large, changed after it was written...), or ``s3ckpt
        check`` found it damaged (``check``: a checksum mismatch, a missing object...).

        A damaged checkpoint is listed as its own row and never deleted by a plan: no
        policy sees it, so it never counts as the newest committed checkpoint nor toward
        keep-last-K (the newest good one is kept). ``gc`` deletes nothing in its prefix but
        dead saves' uploads; ``rm`` deletes it when asked by name; ``latest`` skips it.
        """
        return self.damage is not None

    @property
    def damage(self) -> str | None:
        """Why it is damaged (None when it is not): the marker's error, else the check's
        first problem (``s3ckpt check at <time>: <problem>``)."""
        if self.is_committed and self.error is None and self.check is not None:
            return f"s3ckpt check at {self.check.checked_at}: {self.check.reason}"
        return self.error if self.is_committed else None

    @property
    def life(self) -> Life:
        """The state of its life (:class:`Life`), decided from this record alone."""
        if self.damaged:
            return Life.DAMAGED
        if self.state is CheckpointState.IN_PROGRESS:
            return Life.WRITING
        if self.state not in (CheckpointState.COMMITTED, CheckpointState.FOREIGN):
            return Life.FAILED if self.failed else Life(self.state.value)
        if any(self.bytes_by_class.get(c) for c in ARCHIVE_CLASSES):
            return Life.ARCHIVED
        return Life.COMMITTED

    @property
    def failed(self) -> bool:
        """Abandoned, and left by a save that recorded its failure (``failed_at``): no
        marker, nothing live. ``ls`` shows it as ``failed``; gc removes it without waiting
        for the grace period."""
        return self.state is CheckpointState.ABANDONED and self.failed_at is not None

    @property
    def live_saves(self) -> int:
        """Saves in progress under the prefix: live tags other than the committed one."""
        return sum(1 for t in self.live_tags if t != self.tag)

    @property
    def overwrite_in_progress(self) -> bool:
        """Committed, and another save is writing into the same prefix."""
        # live_tags is empty for nearly every checkpoint: test it before counting.
        return bool(self.live_tags) and self.is_committed and self.live_saves > 0

    def checked(self, record: CheckRecord | str | None) -> CheckpointInfo:
        """This checkpoint with the verdict of its run's check record (``record``; a str
        or None: unreadable or none, no verdict): damaged when the record's entry for it
        found damage in the marker it has now (:meth:`CheckEntry.applies`)."""
        entry = record.damaged.get(self.name) if isinstance(record, CheckRecord) else None
        if entry is None or not self.is_committed or not entry.applies(self.marker_etag, self.tag):
            return self
        return dataclasses.replace(self, check=entry)

    def sort_key(self) -> tuple[int, int, datetime, str]:
        """(has a step, step, commit time, name): the catalog's order, oldest first.

        Commit times are timezone-aware (UTC) everywhere in s3ckpt; a missing one sorts first.
        """
        at = self.committed_at if self.committed_at is not None else _NO_TIME
        return (0 if self.step is None else 1, self.step or 0, at, self.name)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (used by ``s3ckpt ls --json``)."""
        plain = "name step size num_objects pinned error damaged damage failed failure tag"
        times = "committed_at created last_activity failed_at"
        return {
            "url": str(self.url),
            "state": self.state.value,
            "life": self.life.value,
            **{k: getattr(self, k) for k in plain.split()},
            **{k: iso_z(getattr(self, k)) for k in times.split()},
            "metrics": {k: v if math.isfinite(v) else str(v) for k, v in self.metrics.items()},
            "check": self.check.to_dict() if self.check is not None else None,
            "live_saves": self.live_saves,
            "overwrite_in_progress": self.overwrite_in_progress,
            "open_uploads": len(self.uploads),
            # A shallow record saw no listing: its classes are unknown, not STANDARD.
            "bytes_by_class": None if self.shallow else dict(self.bytes_by_class),
            "scan": "shallow" if self.shallow else "deep",
        }


@dataclass(frozen=True)
class RunCatalog:
    """The checkpoints of one run, oldest first.

    Attributes:
        lease_modified: The LastModified of the run's lease object (store time, seconds
            since the epoch) when it has one and the listing gave it: its expiry is judged
            from it (:meth:`~s3ckpt.retention.LeaseRecord.expiry`).
        check_error: Why the run's ``s3ckpt.check.json`` could not be read (a store error),
            when it could not: what a check found is then unknown (no checkpoint is marked
            damaged by it); ``ls`` and ``prune`` warn.
        stale_probes: Capability probes a lease's acquisition left beside it (its delete
            failed: :data:`~s3ckpt.format._names.LEASE_PROBE`), older than the grace period
            (store time): gc deletes them.
    """

    run: StoreURL
    checkpoints: tuple[CheckpointInfo, ...]
    has_lease: bool = False
    lease_modified: float | None = None
    check_error: str | None = None
    stale_probes: tuple[str, ...] = ()


def commit_time(saved: float | None, marker: float | None, created: float) -> datetime | None:
    """When the store took a commit (see the module docstring): the LastModified of the
    committed per-save metadata (``saved``: written just before the marker, never rewritten),
    else the marker's (rewritten in place by attach_metrics), else the writer's ``created``."""
    when = saved if saved is not None else marker
    return writer_time(created) if when is None else utc(when)


def writer_time(ts: float) -> datetime | None:
    """A writer's timestamp as a UTC datetime; None when out of datetime's range."""
    try:
        return utc(ts)
    except (OverflowError, OSError, ValueError):
        return None
