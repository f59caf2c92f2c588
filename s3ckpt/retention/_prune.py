"""Pruning: carry a retention plan out, crash-safely.

What retention deletes: only names it can prove s3ckpt (or, with ``include_foreign``,
stock DCP) wrote — the commit marker, the plain ``.metadata``, the objects the marker
lists and the per-save names of :func:`s3ckpt.format.owned_tag` (``__{r}_{i}.{tag}.distcp``,
``.metadata.{tag}``, ``s3ckpt.alive.{tag}.{rank}``; with hashed prefixes the data objects
``{run}/s3ckpt-shards/{h}/{ckpt}/__{r}_{i}.{tag}.shard``), plus open uploads of per-save names.
Anything else under a checkpoint prefix (TensorBoard events, a safetensors export) stays.
Nothing of a *live* save (a tag with an object, heartbeat or upload younger than the grace
period) is ever deleted or aborted, except the committed save's own objects by a prune.

Deletion order (per checkpoint, and batched across the checkpoints of a run):

1. every commit marker (``s3ckpt.json``) — from here on a reader sees "not committed",
   never a committed checkpoint with missing data;
2. the plain ``.metadata`` and the marker's ``metadata_key`` of those whose marker is gone;
3. every other object, in ``DeleteObjects`` requests of at most 1000 keys, then the
   prefixes' open uploads of per-save names are aborted.

Every per-key error is checked. Throttling and 5xx per-key errors are retried with
exponential back-off; other errors are reported (a checkpoint whose marker could not be
deleted keeps all its data). Nothing stops at the first failure.

Before step 1 the names of the checkpoints to delete are written into the run's lease
(the intent log, :mod:`s3ckpt.retention._intent`). A pruner killed at any point leaves a
lease that expires (or is stale at once on the same host); whoever takes it over next —
``prune`` or ``gc`` — finishes the recorded deletions first. So re-running converges to
the plan, and a kept checkpoint is never touched: its keys are never in any delete request.

Every call publishes one ``"prune"`` event (:mod:`s3ckpt.metrics`): checkpoints deleted,
bytes freed, the time taken to get the lease, whether it was busy, and the requests made.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from s3ckpt.errors import ConfigError, LeaseHeldError
from s3ckpt.format import compile_step_pattern
from s3ckpt.metrics import instrument
from s3ckpt.retention._delete import ProgressCallback, _Deleter
from s3ckpt.retention._intent import finish_previous, planned_markers
from s3ckpt.retention._lease import DEFAULT_LEASE_TTL, Lease
from s3ckpt.retention._liveness import DEFAULT_GRACE, effective_grace, judge_time
from s3ckpt.retention._plan import check_policy, plan
from s3ckpt.retention._policy import Policy
from s3ckpt.retention._results import PruneResult
from s3ckpt.retention._scan import list_checkpoints
from s3ckpt.store.base import MAX_DELETE_BATCH, ObjectStore
from s3ckpt.uri import StoreURL

__all__ = ["check_batch_size", "prune"]


def check_batch_size(batch_size: int) -> None:
    """Refuse a DeleteObjects batch size outside ``1..MAX_DELETE_BATCH``."""
    if not 1 <= batch_size <= MAX_DELETE_BATCH:
        raise ConfigError(f"batch_size must be 1..{MAX_DELETE_BATCH}, got {batch_size}")


def prune(
    store: ObjectStore,
    run: StoreURL,
    policy: Policy,
    *,
    apply: bool = False,
    now: datetime | None = None,
    max_delete: int | None = None,
    grace: timedelta = DEFAULT_GRACE,
    lease_ttl: timedelta = DEFAULT_LEASE_TTL,
    include_foreign: bool = False,
    batch_size: int = MAX_DELETE_BATCH,
    retries: int = 5,
    sleep: Callable[[float], None] = time.sleep,
    on_progress: ProgressCallback | None = None,
    step_pattern: str | None = None,
) -> PruneResult:
    """Plan retention for one run and, with ``apply=True``, carry the plan out.

    Safe to call from a background thread of a training job (no global state; the lease
    keeps it from racing a cron pruner on the same run).

    Args:
        store: The store.
        run: The run prefix.
        policy: The rules; an empty one is refused before any request.
        apply: Delete (default: dry run, which takes no lease and changes nothing).
        now: The time policies and the grace period judge against (default: the store's
            time, and with ``apply`` a refusal when this host's clock is further from it
            than the grace period).
        max_delete: Delete at most this many checkpoints in this run.
        grace: A save (a tag) is in progress while any of its objects, heartbeats or open
            uploads is younger than this. Raised to ``MIN_GRACE_SECONDS`` (60 s) when
            shorter, with a note in the result.
        lease_ttl: How long the lease lasts without renewal.
        include_foreign: Treat stock-DCP checkpoints (no marker) as committed; only their
            DCP names (``.metadata``, ``__{r}_{i}.distcp``) are deleted.
        batch_size: Keys per DeleteObjects request (at most 1000).
        retries: Rounds of retries for throttled / 5xx per-key errors.
        sleep: Back-off sleep (tests pass a no-op).
        on_progress: See :data:`ProgressCallback`.
        step_pattern: How the run's checkpoint names give their steps (a regular expression
            with one capture group; see :func:`s3ckpt.format.checkpoint_step`). Default: the
            policy's own (:attr:`Policy.step_pattern`, a policy file's ``step_pattern``), else
            the built-in name forms. A step recorded in a commit marker always wins.

    Raises:
        LeaseHeldError: Another pruner holds the run's lease (nothing was changed).
        LeaseLostError: Our lease was taken over mid-way; we stopped before the next delete.
        PolicyError: The policy is empty or a value is out of range.
        ConfigError: ``step_pattern`` is not a regular expression with one capture group.
        ClockSkewError: With ``apply`` and no ``now``: this host's clock is further from
            the store's than the grace period; nothing deleted.

    Request cost: the listing of :func:`list_checkpoints`; with ``apply``, 1-3 lease
    requests plus one per renewal, then ``ceil(keys / batch_size)`` DeleteObjects requests
    in each of the three phases (plus retries), and one AbortMultipartUpload per open upload
    of a deleted checkpoint.
    """
    check_policy(policy)
    check_batch_size(batch_size)
    pattern = step_pattern if step_pattern is not None else policy.step_pattern
    if pattern is not None:
        compile_step_pattern(pattern)  # a bad one is refused before any request
    grace, notes = effective_grace(grace)
    now, skew = judge_time(store, run, now, grace, refuse=f"prune {run}" if apply else None)
    notes += skew

    def emit(event: str, **details: Any) -> None:
        if on_progress is not None:
            on_progress(event, details)

    if not apply:
        with instrument.operation("prune", str(run)) as recorder:
            catalog = list_checkpoints(store, run, grace=grace, now=now, step_pattern=pattern)
            p = plan(
                catalog,
                policy,
                now,
                max_delete=max_delete,
                include_foreign=include_foreign,
                run=run,
            )
            emit("plan", delete=len(p.delete))
            recorder.finish(dry_run=True)
        return PruneResult(run=run, plan=p, applied=False, notes=notes)

    with instrument.operation("prune", str(run)) as recorder:
        return _apply(
            recorder,
            emit,
            store,
            run,
            policy,
            now=now,
            max_delete=max_delete,
            grace=grace,
            lease_ttl=lease_ttl,
            include_foreign=include_foreign,
            batch_size=batch_size,
            retries=retries,
            sleep=sleep,
            on_progress=on_progress,
            pattern=pattern,
            notes=notes,
        )


def _apply(
    recorder: instrument.Recorder,
    emit: Callable[..., None],
    store: ObjectStore,
    run: StoreURL,
    policy: Policy,
    *,
    now: datetime,
    max_delete: int | None,
    grace: timedelta,
    lease_ttl: timedelta,
    include_foreign: bool,
    batch_size: int,
    retries: int,
    sleep: Callable[[float], None],
    on_progress: ProgressCallback | None,
    pattern: str | None,
    notes: tuple[str, ...],
) -> PruneResult:
    """:func:`prune` with ``apply``, under the run's lease; finishes ``recorder``."""
    waited = time.monotonic()
    try:
        lease = Lease(store, run, ttl=lease_ttl).acquire()
    except LeaseHeldError as exc:
        recorder.finish(exc, lease_busy=1, lease_wait_s=time.monotonic() - waited)
        raise
    lease_wait = time.monotonic() - waited
    emit("lease", owner=lease.owner, resumed=bool(lease.previous))
    # Until our own intent is recorded, an exception keeps the dead holder's log.
    intent: list[str] = list(lease.previous.deleting) if lease.previous else []
    try:
        catalog = list_checkpoints(store, run, grace=grace, now=now, step_pattern=pattern)
        resume, carry, rest = finish_previous(lease, catalog)
        p = plan(rest, policy, now, max_delete=max_delete, include_foreign=include_foreign, run=run)
        emit("plan", delete=len(p.delete), resume=len(resume))
        targets = [*resume, *p.delete]
        deleter = _Deleter(store, lease, batch_size, retries, sleep, on_progress)
        deleted: tuple[str, ...] = ()
        intent = [*carry, *(c.name for c in targets)]
        if targets:
            lease.record_intent(intent, planned_markers(targets))
            emit("intent", names=intent)
            deleted = deleter.delete_checkpoints(targets)
        unfinished = [n for n in intent if n not in {*deleted, *deleter.changed}]
        lease.release(unfinished)
        emit("done", deleted=len(deleted), failures=len(deleter.failures))
        gone = set(deleted)
        recorder.finish(
            "DeleteFailures" if deleter.failures else None,
            deleted=len(deleted),
            bytes_freed=sum(c.size for c in targets if c.name in gone),
            lease_wait_s=lease_wait,
        )
        return PruneResult(
            run=run,
            plan=p,
            applied=True,
            deleted=deleted,
            resumed=tuple(c.name for c in resume),
            failures=tuple(deleter.failures),
            delete_requests=deleter.requests,
            keys_deleted=deleter.deleted_keys,
            aborted=deleter.aborted,
            resumed_bytes=sum(c.size for c in resume),
            resumed_objects=sum(c.num_objects for c in resume),
            notes=notes + deleter.changed_notes(),
        )
    except BaseException as exc:
        try:
            lease.release(intent)  # keep the intent log: the next pruner finishes it
        finally:
            recorder.finish(exc, lease_wait_s=lease_wait)
        raise
