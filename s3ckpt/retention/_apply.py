"""Acting on plans: crash-safe pruning, garbage collection, pins.

Deletion order (per checkpoint, and batched across the checkpoints of a run):

1. every commit marker (``s3ckpt.json``) — from here on a reader sees "not committed",
   never a committed checkpoint with missing data;
2. every ``.metadata`` of those whose marker is gone;
3. every other object, in ``DeleteObjects`` requests of at most 1000 keys.

Every per-key error is checked. Throttling and 5xx per-key errors are retried with
exponential back-off; other errors are reported (a checkpoint whose marker could not be
deleted keeps all its data). Nothing stops at the first failure.

Before step 1 the names of the checkpoints to delete are written into the run's lease
(the intent log, :mod:`s3ckpt.retention._lease`). A pruner killed at any point leaves a
lease that expires (or is stale at once on the same host); the next pruner takes it over,
finishes the recorded deletions, then plans afresh. So re-running converges to the plan,
and a kept checkpoint is never touched: its keys are never in any delete request.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from s3ckpt.errors import CheckpointNotFoundError, ConfigError, LeaseHeldError, StoreError
from s3ckpt.format import MANIFEST_NAME, METADATA_NAME
from s3ckpt.retention._catalog import (
    DEFAULT_GRACE,
    PIN_NAME,
    CheckpointInfo,
    CheckpointState,
    list_checkpoints,
    scan,
)
from s3ckpt.retention._lease import DEFAULT_LEASE_TTL, Lease
from s3ckpt.retention._plan import Plan, check_policy, plan
from s3ckpt.retention._policy import Policy
from s3ckpt.store.base import MAX_DELETE_BATCH, DeleteFailure, ObjectStore, UploadInfo
from s3ckpt.uri import StoreURL

__all__ = [
    "GcResult",
    "ProgressCallback",
    "PruneResult",
    "gc",
    "pin",
    "prune",
    "unpin",
]

ProgressCallback = Callable[[str, dict[str, Any]], None]
"""``on_progress(event, details)``: ``lease``, ``plan``, ``intent``, ``delete`` (after each
request: ``phase``, ``keys``), ``done``. For logs and for the crash tests."""

DEFAULT_GC_AGE = timedelta(days=1)

_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "ServiceUnavailable",
        "InternalError",
        "RequestTimeout",
        "500",
        "502",
        "503",
        "504",
    }
)


@dataclass(frozen=True)
class PruneResult:
    """What :func:`prune` planned and did for one run.

    Attributes:
        run: The run.
        plan: The plan (with reasons for every decision).
        applied: False for a dry run.
        deleted: Names of checkpoints whose every key was deleted.
        resumed: Names finished on behalf of a pruner that died mid-way (already in
            ``deleted`` when they completed).
        failures: Keys that could not be deleted (after retries), with the store's code.
        delete_requests: DeleteObjects requests sent.
        keys_deleted: Keys removed (control objects included).
    """

    run: StoreURL
    plan: Plan
    applied: bool
    deleted: tuple[str, ...] = ()
    resumed: tuple[str, ...] = ()
    failures: tuple[DeleteFailure, ...] = ()
    delete_requests: int = 0
    keys_deleted: int = 0

    @property
    def ok(self) -> bool:
        """No delete failed."""
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``s3ckpt prune --json``)."""
        return {
            **self.plan.to_dict(),
            "applied": self.applied,
            "deleted": list(self.deleted),
            "resumed": list(self.resumed),
            "failures": [
                {"key": f.key, "code": f.code, "message": f.message} for f in self.failures
            ],
            "delete_requests": self.delete_requests,
            "keys_deleted": self.keys_deleted,
        }


@dataclass
class _Deleter:
    """Batched deletes with per-key checks, retries of transient per-key errors, lease
    renewal before every request, and a request counter."""

    store: ObjectStore
    lease: Lease | None
    batch_size: int
    retries: int
    sleep: Callable[[float], None]
    on_progress: ProgressCallback | None
    requests: int = 0
    deleted_keys: int = 0
    failures: list[DeleteFailure] = field(default_factory=list)

    def delete(self, keys: Sequence[str], phase: str) -> set[str]:
        """Delete ``keys``; return the keys that failed for good."""
        pending = list(keys)
        failed: dict[str, DeleteFailure] = {}
        for attempt in range(self.retries + 1):
            if not pending:
                break
            if attempt:
                self.sleep(min(0.05 * 2**attempt, 5.0))
            retry: list[str] = []
            for i in range(0, len(pending), self.batch_size):
                chunk = pending[i : i + self.batch_size]
                if self.lease is not None:
                    self.lease.renew_if_due()
                try:
                    errs = self.store.delete(chunk)
                except StoreError as exc:  # the whole request failed (after S3Store retries)
                    errs = [
                        DeleteFailure(k, exc.code or type(exc).__name__, str(exc)) for k in chunk
                    ]
                self.requests += 1
                bad = {e.key for e in errs}
                self.deleted_keys += sum(1 for k in chunk if k not in bad)
                for e in errs:
                    failed[e.key] = e
                    if e.code in _TRANSIENT_CODES:
                        retry.append(e.key)
                for k in chunk:
                    if k not in bad:
                        failed.pop(k, None)
                if self.on_progress is not None:
                    self.on_progress("delete", {"phase": phase, "keys": len(chunk)})
            pending = retry
        self.failures.extend(failed.values())
        return set(failed)

    def delete_checkpoints(self, targets: Sequence[CheckpointInfo]) -> tuple[str, ...]:
        """Marker first, then ``.metadata``, then data; return names fully deleted."""
        markers = {c.name: c.url.key(MANIFEST_NAME) for c in targets}
        present = [markers[c.name] for c in targets if markers[c.name] in set(c.keys)]
        bad = self.delete(present, "marker")
        alive = [c for c in targets if markers[c.name] not in bad]
        metas = [c.url.key(METADATA_NAME) for c in alive if c.url.key(METADATA_NAME) in c.keys]
        bad |= self.delete(metas, "metadata")
        first = {c.url.key(MANIFEST_NAME) for c in alive} | {
            c.url.key(METADATA_NAME) for c in alive
        }
        data = [k for c in alive for k in c.keys if k not in first]
        bad |= self.delete(data, "data")
        return tuple(c.name for c in alive if not any(k in bad for k in c.keys))


def _now(now: datetime | None) -> datetime:
    if now is None:
        return datetime.now(timezone.utc)
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    return now


def _check_batch(batch_size: int) -> None:
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
) -> PruneResult:
    """Plan retention for one run and, with ``apply=True``, carry the plan out.

    Safe to call from a background thread of a training job (no global state; the lease
    keeps it from racing a cron pruner on the same run).

    Args:
        store: The store.
        run: The run prefix.
        policy: The rules; an empty one is refused before any request.
        apply: Delete (default: dry run, which takes no lease and changes nothing).
        now: The time policies and the grace period judge against (default: the clock).
        max_delete: Delete at most this many checkpoints in this run.
        grace: See :func:`~s3ckpt.retention.list_checkpoints`.
        lease_ttl: How long the lease lasts without renewal.
        include_foreign: Treat stock-DCP checkpoints (no marker) as committed.
        batch_size: Keys per DeleteObjects request (at most 1000).
        retries: Rounds of retries for throttled / 5xx per-key errors.
        sleep: Back-off sleep (tests pass a no-op).
        on_progress: See :data:`ProgressCallback`.

    Raises:
        LeaseHeldError: Another pruner holds the run's lease (nothing was changed).
        LeaseLostError: Our lease was taken over mid-way; we stopped before the next delete.
        PolicyError: The policy is empty or a value is out of range.

    Request cost: the listing of :func:`list_checkpoints`; with ``apply``, 1-3 lease
    requests plus one per renewal, then ``ceil(keys / batch_size)`` DeleteObjects requests
    in each of the three phases (plus retries).
    """
    check_policy(policy)
    _check_batch(batch_size)
    now = _now(now)

    def emit(event: str, **details: Any) -> None:
        if on_progress is not None:
            on_progress(event, details)

    if not apply:
        catalog = list_checkpoints(store, run, grace=grace, now=now)
        p = plan(
            catalog, policy, now, max_delete=max_delete, include_foreign=include_foreign, run=run
        )
        emit("plan", delete=len(p.delete))
        return PruneResult(run=run, plan=p, applied=False)

    lease = Lease(store, run, ttl=lease_ttl).acquire()
    emit("lease", owner=lease.owner, resumed=bool(lease.previous))
    intent: list[str] = []
    try:
        catalog = list_checkpoints(store, run, grace=grace, now=now)
        resume: list[CheckpointInfo] = []
        carry: list[str] = []
        if lease.previous is not None and lease.previous.deleting:
            wanted = set(lease.previous.deleting)
            for c in catalog:
                # A name a dead pruner was deleting. Committed again (its marker survived)
                # or pinned: the plan decides afresh. In progress (recent activity, e.g. it
                # was saved minutes ago): not now, but the name stays in the intent log.
                # Otherwise (abandoned / foreign-looking leftovers): finish it.
                if c.name not in wanted or c.pinned or c.is_committed:
                    continue
                if c.state is CheckpointState.IN_PROGRESS:
                    carry.append(c.name)
                else:
                    resume.append(c)
            names = {c.name for c in resume} | set(carry)
            catalog = [c for c in catalog if c.name not in names]
        p = plan(
            catalog, policy, now, max_delete=max_delete, include_foreign=include_foreign, run=run
        )
        emit("plan", delete=len(p.delete), resume=len(resume))
        targets = [*resume, *p.delete]
        deleter = _Deleter(store, lease, batch_size, retries, sleep, on_progress)
        deleted: tuple[str, ...] = ()
        intent = [*carry, *(c.name for c in targets)]
        if targets:
            lease.record_intent(intent)
            emit("intent", names=intent)
            deleted = deleter.delete_checkpoints(targets)
        unfinished = [n for n in intent if n not in set(deleted)]
        lease.release(unfinished)
        emit("done", deleted=len(deleted), failures=len(deleter.failures))
        return PruneResult(
            run=run,
            plan=p,
            applied=True,
            deleted=deleted,
            resumed=tuple(c.name for c in resume),
            failures=tuple(deleter.failures),
            delete_requests=deleter.requests,
            keys_deleted=deleter.deleted_keys,
        )
    except BaseException:
        lease.release(intent)  # keep the intent log: the next pruner finishes it
        raise


@dataclass(frozen=True)
class GcResult:
    """What :func:`gc` found under a prefix and (with ``apply``) removed.

    Attributes:
        uploads: Open multipart uploads older than ``older_than`` (aborted with ``apply``).
        abandoned: Abandoned checkpoint prefixes (removed with ``apply``).
        busy_runs: Runs skipped because another pruner held their lease.
        failures: Keys or uploads that could not be removed.
    """

    root: StoreURL
    applied: bool
    uploads: tuple[UploadInfo, ...] = ()
    abandoned: tuple[CheckpointInfo, ...] = ()
    removed: tuple[str, ...] = ()
    aborted: int = 0
    busy_runs: tuple[str, ...] = ()
    failures: tuple[DeleteFailure, ...] = ()
    delete_requests: int = 0

    @property
    def ok(self) -> bool:
        """Nothing failed."""
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``s3ckpt gc --json``)."""
        return {
            "root": str(self.root),
            "applied": self.applied,
            "uploads": [
                {
                    "key": u.key,
                    "upload_id": u.upload_id,
                    "initiated": _iso_ts(u.initiated),
                }
                for u in self.uploads
            ],
            "abandoned": [c.to_dict() for c in self.abandoned],
            "removed": list(self.removed),
            "aborted": self.aborted,
            "busy_runs": list(self.busy_runs),
            "failures": [
                {"key": f.key, "code": f.code, "message": f.message} for f in self.failures
            ],
            "delete_requests": self.delete_requests,
        }


def _iso_ts(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def gc(
    store: ObjectStore,
    root: StoreURL,
    *,
    older_than: timedelta = DEFAULT_GC_AGE,
    grace: timedelta = DEFAULT_GRACE,
    apply: bool = False,
    now: datetime | None = None,
    lease_ttl: timedelta = DEFAULT_LEASE_TTL,
    batch_size: int = MAX_DELETE_BATCH,
    retries: int = 5,
    sleep: Callable[[float], None] = time.sleep,
) -> GcResult:
    """Abort stale multipart uploads and remove abandoned prefixes under ``root``.

    A dry run by default, like :func:`prune`. Never touches committed, in-progress,
    foreign or pinned prefixes: an uncommitted prefix with any activity (an object or an
    open upload) within ``grace`` is in progress, and its uploads are not aborted either,
    however old. Abandoned prefixes of a run are
    re-listed under that run's lease before they are deleted.

    Args:
        older_than: Abort multipart uploads started longer ago than this.
        grace: Abandoned means no commit marker and no activity for this long.

    Request cost: one scan of ``root`` (see :func:`~s3ckpt.retention.scan`); with
    ``apply``, one AbortMultipartUpload per stale upload, and per run with abandoned
    prefixes a lease, a re-listing and ``ceil(keys / batch_size)`` DeleteObjects requests.
    """
    _check_batch(batch_size)
    now = _now(now)
    cutoff = (now - older_than).timestamp()
    catalogs = scan(store, root, grace=grace, now=now)
    live = {
        c.url.prefix
        for cat in catalogs
        for c in cat.checkpoints
        if c.state is CheckpointState.IN_PROGRESS or c.pinned
    }
    # Uploads of a save in progress (or of a pinned prefix) are never aborted, however old.
    uploads = tuple(
        u
        for u in store.list_multipart_uploads(root.prefix)
        if u.initiated is not None and u.initiated < cutoff and not _under(u.key, live)
    )
    abandoned = tuple(
        c
        for cat in catalogs
        for c in cat.checkpoints
        if c.state is CheckpointState.ABANDONED and not c.pinned
    )
    if not apply:
        return GcResult(root=root, applied=False, uploads=uploads, abandoned=abandoned)

    failures: list[DeleteFailure] = []
    aborted = 0
    for u in uploads:
        try:
            store.abort_multipart(u.key, u.upload_id)
            aborted += 1
        except StoreError as exc:
            failures.append(DeleteFailure(u.key, exc.code or type(exc).__name__, str(exc)))
    removed: list[str] = []
    busy: list[str] = []
    requests = 0
    runs = {c.url.prefix[: -len(c.name) - 1] for c in abandoned}
    for cat in catalogs:
        if cat.run.prefix not in runs:
            continue
        try:
            lease = Lease(store, cat.run, ttl=lease_ttl, operation="gc").acquire()
        except LeaseHeldError:
            busy.append(str(cat.run))
            continue
        try:
            fresh = [
                c
                for c in list_checkpoints(store, cat.run, grace=grace, now=now)
                if c.state is CheckpointState.ABANDONED and not c.pinned
            ]
            deleter = _Deleter(store, lease, batch_size, retries, sleep, None)
            bad = deleter.delete([k for c in fresh for k in c.keys], "abandoned")
            removed.extend(str(c.url) for c in fresh if not any(k in bad for k in c.keys))
            failures.extend(deleter.failures)
            requests += deleter.requests
        finally:
            lease.release()
    return GcResult(
        root=root,
        applied=True,
        uploads=uploads,
        abandoned=abandoned,
        removed=tuple(removed),
        aborted=aborted,
        busy_runs=tuple(busy),
        failures=tuple(failures),
        delete_requests=requests,
    )


def _under(key: str, prefixes: set[str]) -> bool:
    head = key
    while "/" in head:
        head = head.rpartition("/")[0]
        if head + "/" in prefixes:
            return True
    return False


def pin(
    store: ObjectStore,
    checkpoint: StoreURL,
    reason: str,
    *,
    by: str | None = None,
    now: datetime | None = None,
) -> None:
    """Pin a checkpoint: ``{checkpoint}/s3ckpt.pin.json`` with the reason. A pinned
    checkpoint is never deleted by prune or gc. Pinning again replaces the reason.

    Raises:
        CheckpointNotFoundError: Nothing is stored under ``checkpoint``.
        ConfigError: The reason is empty.

    Request cost: one LIST (of at most 1000 keys, the first page) and one PUT.
    """
    reason = (reason or "").strip()
    if not reason:
        raise ConfigError("a pin needs a reason (--reason TEXT), e.g. 'release v1.2'")
    if not _exists(store, checkpoint):
        raise CheckpointNotFoundError(
            f"no checkpoint at {checkpoint}: nothing is stored under that prefix",
            bucket=checkpoint.bucket or None,
            key=checkpoint.prefix,
        )
    doc = {
        "reason": reason,
        "pinned_at": _now(now).isoformat().replace("+00:00", "Z"),
        "by": by or socket.gethostname(),
    }
    store.put(checkpoint.key(PIN_NAME), json.dumps(doc).encode("utf-8"))


def unpin(store: ObjectStore, checkpoint: StoreURL) -> bool:
    """Remove a checkpoint's pin; return whether there was one.

    Request cost: one HEAD and, if pinned, one DeleteObjects.
    """
    key = checkpoint.key(PIN_NAME)
    if store.head(key) is None:
        return False
    failures = store.delete([key])
    if failures:
        f = failures[0]
        raise StoreError(
            f"could not remove the pin: {f.code}: {f.message}",
            bucket=checkpoint.bucket or None,
            key=key,
            operation="delete",
            code=f.code,
        )
    return True


def _exists(store: ObjectStore, prefix: StoreURL) -> bool:
    for _ in store.list(prefix.prefix):
        return True
    return False


def names(checkpoints: Iterable[CheckpointInfo]) -> list[str]:
    """Names of ``checkpoints`` (helper for callers and tests)."""
    return [c.name for c in checkpoints]
