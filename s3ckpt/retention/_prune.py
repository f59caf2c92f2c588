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

1. every commit marker (``s3ckpt.json``) is fenced: replaced by a tombstone ``If-Match``
   its planned ETag (:mod:`s3ckpt._tombstone`) — from here on a reader sees "not
   committed", never a committed checkpoint with missing data, and a paused writer's
   conditional marker PUT fails;
2. the plain ``.metadata`` and the marker's ``metadata_key`` of those fenced;
3. every other object, in ``DeleteObjects`` requests of at most 1000 keys, then the
   prefixes' open uploads of per-save names are aborted;
4. each tombstone is deleted, or kept finished (``done``) where another save's names were
   reaped (it may be paused: the fence must outlive the pause).

Every per-key error is checked. Throttling and 5xx per-key errors are retried with
exponential back-off; other errors are reported (a checkpoint whose marker could not be
deleted keeps all its data). Nothing stops at the first failure.

Before step 1 the names of the checkpoints to delete are written into the run's lease
(the intent log, :mod:`s3ckpt.retention._intent`). A pruner killed at any point leaves a
lease that expires (or is stale at once on the same host); whoever takes it over next —
``prune`` or ``gc`` — finishes the recorded deletions first. So re-running converges to
the plan, and a kept checkpoint is never touched: its keys are never in any delete request.

Storage tiers (``RetentionOptions.tiers``, a policy file's ``[[tier]]``): after its deletions a
prune moves what each tier selects to its class (:mod:`s3ckpt.retention._transition`), under
the same lease, its transitions recorded in the same intent log (``moving``) before the first
copy; whoever takes the lease over next finishes them. A dry run lists each checkpoint to move
(one LIST each) to say what would move: classes, objects and bytes.

Every call publishes one ``"prune"`` event (:mod:`s3ckpt.metrics`): checkpoints deleted,
bytes freed, the time taken to get the lease, whether it was busy, and the requests made.

Its settings are one :class:`~s3ckpt.retention.RetentionOptions`, made concrete once at the
top (grace floor, the store's time, the policy file's step pattern) and handed down: the
policy is checked once and the step pattern compiled once per run.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from s3ckpt.errors import LeaseHeldError
from s3ckpt.metrics import instrument
from s3ckpt.retention._catalog import CheckpointInfo
from s3ckpt.retention._deleter import Deleter
from s3ckpt.retention._intent import finish_previous, planned_markers, previous_moves
from s3ckpt.retention._lease import Lease
from s3ckpt.retention._options import RetentionOptions
from s3ckpt.retention._plan import Decision, Plan, check_policy, decide
from s3ckpt.retention._policy import Policy
from s3ckpt.retention._recheck import _deep, confirm
from s3ckpt.retention._recheck import replanner as _replan
from s3ckpt.retention._results import PruneResult
from s3ckpt.retention._scan import catalogs
from s3ckpt.retention._toml import PolicyFile
from s3ckpt.retention._transition import Mover, intent_of, survey
from s3ckpt.store import Location, LocationLike
from s3ckpt.store.base import ObjectStore
from s3ckpt.uri import StoreURL

__all__ = ["prune", "prune_location"]


def prune(
    location: LocationLike,
    policy: Policy | PolicyFile,
    /,
    *,
    apply: bool = False,
    options: RetentionOptions | None = None,
) -> PruneResult:
    """Plan retention for one run and, with ``apply=True``, carry the plan out.

    Safe to call from a background thread of a training job (no global state; the lease keeps it
    from racing a cron pruner on the same run).

    Args:
        location: The run: a :class:`~s3ckpt.store.Location` or a URL.
        policy: The rules (an empty policy is refused before any request), or a
            :class:`~s3ckpt.retention.PolicyFile` (its step pattern applies unless the
            options name one).
        apply: Delete (default: dry run, which takes no lease and changes nothing).
        options: The run's settings (:class:`~s3ckpt.retention.RetentionOptions`): ``now``
            (default: the store's time, and with ``apply`` a refusal when this host's clock
            is further from it than the grace period), ``grace`` (raised to
            ``MIN_GRACE_SECONDS``, 60 s, when shorter, with a note in the result),
            ``max_delete``, ``lease_ttl``, ``include_foreign``, ``batch_size``, ``retries``,
            ``sleep``, ``on_progress`` and ``step_pattern``.

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
    source = PolicyFile.of(policy)
    check_policy(source.policy)
    return prune_location(
        Location.of(location),
        source,
        policy.describe(),
        apply=apply,
        options=options if options is not None else RetentionOptions(),
    )


def prune_location(
    location: Location,
    source: PolicyFile,
    describe: str,
    *,
    apply: bool,
    options: RetentionOptions,
) -> PruneResult:
    """:func:`prune` below its entry points: one run, its options given and its policy
    checked already (``describe`` is the
    plan's ``policy`` text)."""
    store, run = location.store, location.url
    options, notes = source.options(options).resolve(
        location, refuse=f"prune {run}" if apply else None
    )
    on_progress, now = options.on_progress, options.now
    assert now is not None  # resolved: the store's time, or the caller's

    def emit(event: str, **details: Any) -> None:
        if on_progress is not None:
            on_progress(event, details)

    if not apply:
        with instrument.operation("prune", str(run)) as recorder:
            catalog, held = _catalog(store, run, options)
            p = decide(catalog, source.policy, now, options, run, describe)
            rules = source.policy
            p = confirm(store, run, options, rules, p, _replan(rules, now, options, run, describe))
            p = _hold(p, held)
            if p.transitions:
                moves, _ = survey(store, p.transitions, _cutoff(now, options))
                p = dataclasses.replace(p, transitions=moves)
            emit("plan", delete=len(p.delete), move=len(p.transitions))
            recorder.finish(dry_run=True)
        notes += (held,) if held else ()
        return PruneResult(run=run, plan=p, applied=False, notes=notes, held=held)

    with instrument.operation("prune", str(run)) as recorder:
        return _apply(recorder, emit, location, source.policy, describe, options, now, notes)


def _catalog(
    store: ObjectStore, run: StoreURL, options: RetentionOptions
) -> tuple[list[CheckpointInfo], str | None]:
    """The run's checkpoints, and why its deletions are held back: its ``s3ckpt.check.json``
    could not be read, so whether ``s3ckpt check`` found its newest checkpoint damaged is
    unknown, and the plan would count it as the newest good one (None: nothing held)."""
    for cat in catalogs(store, run, options, shallow=options.scan == "shallow"):
        if cat.run.prefix == run.prefix:
            held = cat.check_error and (
                f"deletions held back: {cat.check_error}; what s3ckpt check found there is "
                "unknown, so the newest checkpoint kept may be damaged. Fix access to it (or "
                "delete it to forget the findings) and prune again"
            )
            return list(cat.checkpoints), held or None
    return [], None


def _hold(p: Plan, held: str | None) -> Plan:
    """``p`` with every deletion turned into a skip saying why (``held``), when held."""
    if held is None:
        return p
    decisions = tuple(
        Decision(d.checkpoint, "skip", ("held back: the run's check record is unreadable",))
        if d.action == "delete"
        else d
        for d in p.decisions
    )
    return dataclasses.replace(p, decisions=decisions)


def _cutoff(now: datetime, options: RetentionOptions) -> float:
    """The store's time minus the grace period: a save tag active after it is writing."""
    return (now - options.grace).timestamp()


def _apply(
    recorder: instrument.Recorder,
    emit: Callable[..., None],
    location: Location,
    rules: Policy,
    describe: str,
    options: RetentionOptions,
    now: datetime,
    notes: tuple[str, ...],
) -> PruneResult:
    """:func:`prune` with ``apply``, under the run's lease; finishes ``recorder``."""
    store, run = location.store, location.url
    waited = time.monotonic()
    try:
        lease = Lease(store, run, ttl=options.lease_ttl).acquire()
    except LeaseHeldError as exc:
        recorder.finish(exc, lease_busy=1, lease_wait_s=time.monotonic() - waited)
        raise
    lease_wait = time.monotonic() - waited
    emit("lease", owner=lease.owner, resumed=bool(lease.previous))
    # Until our own intent is recorded, an exception keeps the dead holder's log.
    intent: list[str] = list(lease.previous.deleting) if lease.previous else []
    moving: dict[str, dict[str, str]] = {
        k: dict(v) for k, v in (lease.previous.moving if lease.previous else {}).items()
    }
    try:
        catalog, held = _catalog(store, run, options)
        resume, carry, rest = finish_previous(lease, catalog)
        # What a shallow record does not know (the plain .metadata, other saves' names) is
        # what a finished deletion must not leave behind: list each one deeply.
        resume = [d for c in resume if (d := _deep(store, options, c) if c.shallow else c)]
        p = decide(rest, rules, now, options, run, describe)
        # Shallow: what p deletes is listed and the plan made again (_recheck).
        p = confirm(store, run, options, rules, p, _replan(rules, now, options, run, describe))
        p = _hold(p, held)
        old_moves, carry_moves = previous_moves(
            lease, rest, {c.name for c in p.delete} | {t.name for t in p.transitions}
        )
        emit("plan", delete=len(p.delete), resume=len(resume), move=len(p.transitions))
        # Listed after the plan: a save that started writing since the scan is seen here.
        moves, pending = survey(store, [*p.transitions, *old_moves], _cutoff(now, options))
        p = dataclasses.replace(p, transitions=tuple(m for m in moves if not m.resumed))
        targets = [*resume, *p.delete]
        deleter = Deleter(store, lease, options)
        deleted: tuple[str, ...] = ()
        intent = [*carry, *(c.name for c in targets)]
        moving = {**carry_moves, **intent_of([m for m in moves if m.name in pending])}
        if targets or moving:
            lease.record_intent(intent, planned_markers(targets), moving=moving)
            emit("intent", names=intent, moving=sorted(moving))
        if targets:
            deleted = deleter.delete_checkpoints(targets)
        mover = Mover(store, lease, options.on_progress)
        moved = mover.move(moves, pending) if pending else ()
        unfinished = [n for n in intent if n not in {*deleted, *deleter.changed}]
        moving = {n: m for n, m in moving.items() if n not in {*moved, *mover.changed}}
        lease.release(unfinished, moving)
        emit("done", deleted=len(deleted), failures=len(deleter.failures) + len(mover.failures))
        gone = set(deleted)
        recorder.finish(
            "DeleteFailures"
            if deleter.failures
            else "TransitionFailures"
            if mover.failures
            else None,
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
            held=held,
            failures=tuple(deleter.failures),
            delete_requests=deleter.requests,
            keys_deleted=deleter.deleted_keys,
            aborted=deleter.aborted,
            resumed_bytes=sum(c.size for c in resume),
            resumed_objects=sum(c.num_objects for c in resume),
            notes=notes
            + ((held,) if held else ())
            + deleter.changed_notes()
            + mover.changed_notes(),
            transitioned=tuple(n for n in moved if n in pending),
            resumed_moves=tuple(m.name for m in old_moves if m.name in moved and m.name in pending),
            objects_moved=mover.objects,
            bytes_moved=mover.bytes,
            transition_requests=mover.requests,
            transition_failures=tuple(mover.failures),
        )
    except BaseException as exc:
        try:
            lease.release(intent, moving)  # keep the intent log: the next pruner finishes it
        finally:
            recorder.finish(exc, lease_wait_s=lease_wait)
        raise
