"""The intent log a dead pruner leaves in its run's lease, and finishing it.

Before its first delete a pruner records the names of the checkpoints it is about to delete,
and the ETags of the commit markers it planned to delete, in the run's lease
(:meth:`~s3ckpt.retention.Lease.record_intent`). Whoever takes that lease over next -- prune,
rm or gc -- finishes those deletions first (:func:`finish_previous`), so a pruner killed at
any point leaves nothing that the next run does not converge on. A marker is finished only
while it is still the one planned: an overwrite that committed after the dead pruner planned
(a new marker, a new ETag) goes through the normal plan like any other checkpoint.

The same log records the storage-class transitions under way (``moving``,
:mod:`s3ckpt.retention._transition`): :func:`previous_moves` gives the next holder those to
finish, for checkpoints still committed with the marker recorded.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from s3ckpt.errors import S3CkptError
from s3ckpt.format._names import LEASE_NAME
from s3ckpt.retention._catalog import CheckpointInfo, CheckpointState, RunCatalog
from s3ckpt.retention._lease import Lease, LeaseRecord
from s3ckpt.retention._tiers import STORAGE_CLASSES, Transition
from s3ckpt.store.base import ObjectStore

__all__ = ["RESUMED_MOVE", "Intent", "finish_previous", "pending_intent", "previous_moves"]

Moving = dict[str, dict[str, str]]
"""The transitions under way, by checkpoint name (the lease's ``moving`` record)."""


@dataclass
class Intent(AbstractContextManager["Intent"]):
    """The run's intent log while its lease is held: the checkpoints this holder is deleting
    (``names``) and moving (``moving``). Until :meth:`record` they are the dead holder's
    log; as a context manager it releases the lease on the way out, keeping in the log
    whatever did not finish (everything, on an exception: the next holder finishes it)."""

    lease: Lease
    names: list[str] = field(init=False)
    moving: Moving = field(init=False)

    def __post_init__(self) -> None:
        prev = self.lease.previous
        self.names = list(prev.deleting) if prev else []
        self.moving = {k: dict(v) for k, v in prev.moving.items()} if prev else {}

    def record(
        self, targets: Sequence[CheckpointInfo], carry: Sequence[str], moving: Moving | None = None
    ) -> None:
        """The intent from here on: the names to delete (``targets``, and ``carry`` for a
        later run) and the transitions (``moving``; None: the log's as it is); written into
        the lease, with each planned marker's listed ETag, before the first change (when
        there is anything to delete or move)."""
        self.names = [*carry, *(c.name for c in targets)]
        self.moving = self.moving if moving is None else moving
        planned = {c.name: c.marker_etag for c in targets if c.is_committed and c.marker_etag}
        if targets or self.moving:
            self.lease.record_intent(self.names, planned, moving=self.moving)

    def finished(self, names: Iterable[str], moved: Iterable[str] = ()) -> None:
        """Drop from the log what is finished (or left to the next plan)."""
        gone, done = set(names), set(moved)
        self.names = [n for n in self.names if n not in gone]
        self.moving = {n: m for n, m in self.moving.items() if n not in done}

    def __exit__(self, *exc: Any) -> None:
        self.lease.release(self.names, self.moving)


def finish_previous(
    lease: Lease | None, catalog: Sequence[CheckpointInfo]
) -> tuple[list[CheckpointInfo], list[str], list[CheckpointInfo]]:
    """What a dead holder of ``lease`` was deleting (its intent log): ``(resume, carry,
    rest)``. ``resume``: checkpoints to finish now; ``carry``: names to keep in the intent
    log for a later run; ``rest``: the catalog without both. No ``lease`` (a dry run):
    nothing to finish.

    Every checkpoint being deleted (an unfinished tombstone: a deleter fenced it and died,
    or had deletes refused) is finished, whether the log names it or not. A name in the log
    whose marker is still the one the dead holder planned to delete (the ETag its log
    recorded) is finished too: its marker is fenced only while it has that ETag
    (:meth:`~s3ckpt.retention._deleter.Deleter.fence`). One whose marker is another (an
    overwrite committed since), or present without a recorded ETag (a record of an older
    version), or that is pinned is left to the plan. One that shows a live save is not
    finished now but carried forward. Anything else (abandoned- or foreign-looking leftovers
    of an older version's deletion) is finished. Used by prune, rm and gc: whoever takes
    over the lease finishes the work.
    """
    if lease is None:
        return [], [], list(catalog)
    previous = lease.previous
    wanted, planned = (set(previous.deleting), previous.planned) if previous else (set(), {})
    resume: list[CheckpointInfo] = []
    carry: list[str] = []
    for c in catalog:
        if c.state is CheckpointState.BEING_DELETED:
            resume.append(c)
        elif c.name not in wanted or c.pinned:
            continue
        elif c.is_committed:
            if c.marker_etag is not None and planned.get(c.name) == c.marker_etag:
                resume.append(c)
        elif c.state is CheckpointState.IN_PROGRESS:
            carry.append(c.name)
        elif c.tombstone is None:
            resume.append(c)
    names = {c.name for c in resume} | set(carry)
    return resume, carry, [c for c in catalog if c.name not in names]


def pending_intent(store: ObjectStore, cat: RunCatalog, now: datetime) -> tuple[str, ...]:
    """Names in the intent log of a run's dead (stale) pruner, without taking its lease.

    ``now`` is the store's time: the lease's expiry is judged from its LastModified in the
    listing (:attr:`RunCatalog.lease_modified`)."""
    if not cat.has_lease:
        return ()
    try:
        rec = LeaseRecord.from_json(store.get(cat.run.key(LEASE_NAME)))
    except S3CkptError:
        return ()
    if rec is None or not rec.stale(now.timestamp(), last_modified=cat.lease_modified):
        return ()
    return rec.deleting


RESUMED_MOVE = "finishing a transition a pruner that died left half-done (its intent log)"


def previous_moves(
    lease: Lease | None, catalog: Sequence[CheckpointInfo], skip: Collection[str]
) -> tuple[list[Transition], Moving]:
    """The storage-class transitions a dead holder of ``lease`` recorded (``moving``):
    ``(resume, carry)``. ``resume``: transitions to finish now (the checkpoint is still the
    committed one recorded, by its marker's ETag, and not being written into); ``carry``:
    records to keep in the log for a later run (a save is writing into it now). ``skip``:
    names this run deletes or moves anyway (its own plan wins); a checkpoint that is gone,
    damaged or re-committed since is dropped: the plan decides it afresh. No ``lease`` (a
    dry run): nothing.
    """
    previous = lease.previous if lease is not None else None
    by_name = {c.name: c for c in catalog}
    resume: list[Transition] = []
    carry: Moving = {}
    for name, rec in (previous.moving if previous is not None else {}).items():
        c = by_name.get(name)
        if name in skip or c is None or not c.is_committed or c.damaged:
            continue
        if rec.get("marker") and c.marker_etag and rec["marker"] != c.marker_etag:
            continue
        cls, method = rec.get("class", ""), rec.get("method", "copy")
        if cls not in STORAGE_CLASSES or method not in ("copy", "tag"):
            continue  # not a record this version understands
        if c.overwrite_in_progress:
            carry[name] = dict(rec)
            continue
        resume.append(Transition(c, -1, cls, method, (RESUMED_MOVE,), resumed=True))  # type: ignore[arg-type]
    return resume, carry
