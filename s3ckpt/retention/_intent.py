"""The intent log a dead pruner leaves in its run's lease, and finishing it.

Before its first delete a pruner records the names of the checkpoints it is about to delete
in the run's lease (:meth:`~s3ckpt.retention.Lease.record_intent`). Whoever takes that lease
over next -- prune or gc -- finishes those deletions first (:func:`finish_previous`), so a
pruner killed at any point leaves nothing that the next run does not converge on.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from s3ckpt.errors import S3CkptError
from s3ckpt.format import LEASE_NAME
from s3ckpt.retention._catalog import CheckpointInfo, CheckpointState, RunCatalog
from s3ckpt.retention._lease import Lease, LeaseRecord
from s3ckpt.store.base import ObjectStore

__all__ = ["finish_previous", "pending_intent"]


def finish_previous(
    lease: Lease, catalog: Sequence[CheckpointInfo]
) -> tuple[list[CheckpointInfo], list[str], list[CheckpointInfo]]:
    """What a dead holder of ``lease`` was deleting (its intent log): ``(resume, carry,
    rest)``. ``resume``: checkpoints to finish now; ``carry``: names to keep in the intent
    log for a later run; ``rest``: the catalog without both.

    A name in the log that is committed again (its marker survived, or a new save
    committed) or pinned is left to the plan. One that shows a live save is not finished
    now but carried forward. Anything else (abandoned- or foreign-looking leftovers) is
    finished. Used by both prune and gc: whoever takes over the lease finishes the work.
    """
    previous: LeaseRecord | None = lease.previous
    if previous is None or not previous.deleting:
        return [], [], list(catalog)
    wanted = set(previous.deleting)
    resume: list[CheckpointInfo] = []
    carry: list[str] = []
    for c in catalog:
        if c.name not in wanted or c.pinned or c.is_committed:
            continue
        if c.state is CheckpointState.IN_PROGRESS:
            carry.append(c.name)
        else:
            resume.append(c)
    names = {c.name for c in resume} | set(carry)
    return resume, carry, [c for c in catalog if c.name not in names]


def pending_intent(store: ObjectStore, cat: RunCatalog, now: datetime) -> tuple[str, ...]:
    """Names in the intent log of a run's dead (stale) pruner, without taking its lease."""
    if not cat.has_lease:
        return ()
    try:
        rec = LeaseRecord.from_json(store.get(cat.run.key(LEASE_NAME)))
    except S3CkptError:
        return ()
    if rec is None or not rec.deleting or not rec.stale(now.timestamp()):
        return ()
    return rec.deleting
