"""The intent log a dead pruner leaves in its run's lease, and finishing it.

Before its first delete a pruner records the names of the checkpoints it is about to delete,
and the ETags of the commit markers it planned to delete, in the run's lease
(:meth:`~s3ckpt.retention.Lease.record_intent`). Whoever takes that lease over next -- prune,
rm or gc -- finishes those deletions first (:func:`finish_previous`), so a pruner killed at
any point leaves nothing that the next run does not converge on. A marker is finished only
while it is still the one planned: an overwrite that committed after the dead pruner planned
(a new marker, a new ETag) goes through the normal plan like any other checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from s3ckpt._tombstone import is_tombstone
from s3ckpt.errors import S3CkptError
from s3ckpt.format import LEASE_NAME, MANIFEST_NAME
from s3ckpt.retention._catalog import CheckpointInfo, CheckpointState, RunCatalog
from s3ckpt.retention._lease import Lease, LeaseRecord
from s3ckpt.store.base import ObjectStore

__all__ = ["finish_previous", "pending_intent", "planned_markers"]


def planned_markers(targets: Sequence[CheckpointInfo]) -> dict[str, str]:
    """The intent log's ``planned``: the listed ETag of each target's commit marker."""
    return {c.name: c.marker_etag for c in targets if c.is_committed and c.marker_etag}


def _tombstoned(store: ObjectStore, c: CheckpointInfo) -> bool:
    """Whether ``c``'s marker is a tombstone (a deleter swapped it in and died: only a
    deleter ever writes one, and nothing replaces it, so finishing it deletes no commit)."""
    if not c.damaged:
        return False
    try:
        return is_tombstone(store.get(c.url.key(MANIFEST_NAME)))
    except S3CkptError:
        return False


def finish_previous(
    lease: Lease, catalog: Sequence[CheckpointInfo]
) -> tuple[list[CheckpointInfo], list[str], list[CheckpointInfo]]:
    """What a dead holder of ``lease`` was deleting (its intent log): ``(resume, carry,
    rest)``. ``resume``: checkpoints to finish now; ``carry``: names to keep in the intent
    log for a later run; ``rest``: the catalog without both.

    A name in the log whose marker is still the one the dead holder planned to delete
    (the ETag its log recorded), or a tombstone a deleter swapped in, is finished: its
    marker is deleted only while it has that ETag (:class:`~s3ckpt.retention._delete._Deleter`).
    One whose marker is another (an overwrite committed since), or present without a
    recorded ETag (a record of an older version), or that is pinned is left to the plan.
    One that shows a live save is not finished now but carried forward. Anything else
    (abandoned- or foreign-looking leftovers) is finished. Used by prune, rm and gc:
    whoever takes over the lease finishes the work.
    """
    previous: LeaseRecord | None = lease.previous
    if previous is None or not previous.deleting:
        return [], [], list(catalog)
    wanted = set(previous.deleting)
    resume: list[CheckpointInfo] = []
    carry: list[str] = []
    for c in catalog:
        if c.name not in wanted or c.pinned:
            continue
        if c.is_committed:
            etag = previous.planned.get(c.name)
            if c.marker_etag is not None and (etag == c.marker_etag or _tombstoned(lease.store, c)):
                resume.append(c)
            continue
        if c.state is CheckpointState.IN_PROGRESS:
            carry.append(c.name)
        else:
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
    if (
        rec is None
        or not rec.deleting
        or not rec.stale(now.timestamp(), last_modified=cat.lease_modified)
    ):
        return ()
    return rec.deleting
