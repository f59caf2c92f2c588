"""Acting on plans: crash-safe pruning, garbage collection, pins.

What retention deletes: only names it can prove s3ckpt (or, with ``include_foreign``,
stock DCP) wrote — the commit marker, the plain ``.metadata``, the objects the marker
lists and the per-save names of :func:`s3ckpt.format.owned_tag` (``__{r}_{i}.{tag}.distcp``,
``.metadata.{tag}``, ``s3ckpt.alive.{tag}.{rank}``), plus open uploads of per-save names.
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
(the intent log, :mod:`s3ckpt.retention._lease`). A pruner killed at any point leaves a
lease that expires (or is stale at once on the same host); whoever takes it over next —
``prune`` or ``gc`` — finishes the recorded deletions first (:func:`_finish_previous`). So
re-running converges to the plan, and a kept checkpoint is never touched: its keys are
never in any delete request.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from s3ckpt.errors import (
    CheckpointNotFoundError,
    ConfigError,
    LeaseHeldError,
    S3CkptError,
    StoreError,
)
from s3ckpt.format import HEARTBEAT_PREFIX, MANIFEST_NAME, METADATA_NAME, owned_tag
from s3ckpt.retention._catalog import (
    DEFAULT_GRACE,
    LEASE_NAME,
    PIN_NAME,
    CheckpointInfo,
    CheckpointState,
    RunCatalog,
    _read_manifest,
    effective_grace,
    list_checkpoints,
    scan,
)
from s3ckpt.retention._lease import DEFAULT_LEASE_TTL, Lease, LeaseRecord
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

DEFAULT_GC_AGE = timedelta(0)
"""gc aborts an open upload of a dead save at once by default: its tag's heartbeats (older
than the grace period) already prove nobody will complete it."""

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
_DCP_DATA = re.compile(r"__\d+_\d+\.distcp")
"""Stock DCP data names (``FileSystemWriter``); deleted only with ``include_foreign``."""


@dataclass(frozen=True)
class PruneResult:
    """What :func:`prune` planned and did for one run.

    Attributes:
        run: The run.
        plan: The plan (with reasons for every decision).
        applied: False for a dry run.
        deleted: Names of checkpoints whose every deletable key was deleted (planned and
            resumed ones).
        resumed: Names finished on behalf of a pruner that died mid-way (already in
            ``deleted`` when they completed).
        failures: Keys that could not be deleted (after retries), with the store's code.
        delete_requests: DeleteObjects requests sent.
        keys_deleted: Keys removed (control objects included).
        aborted: Open multipart uploads (of per-save names) aborted in deleted checkpoints.
        resumed_bytes: Bytes under the resumed checkpoints (on top of ``plan.bytes_freed``).
        resumed_objects: Objects under the resumed checkpoints.
        notes: Adjustments made to the arguments (a grace period raised to its floor).
    """

    run: StoreURL
    plan: Plan
    applied: bool
    deleted: tuple[str, ...] = ()
    resumed: tuple[str, ...] = ()
    failures: tuple[DeleteFailure, ...] = ()
    delete_requests: int = 0
    keys_deleted: int = 0
    aborted: int = 0
    resumed_bytes: int = 0
    resumed_objects: int = 0
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """No delete failed."""
        return not self.failures

    @property
    def targets(self) -> int:
        """Checkpoints this run set out to delete: the plan's plus the resumed ones."""
        return len(self.plan.delete) + len(self.resumed)

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
            "aborted": self.aborted,
            "targets": self.targets,
            "resumed_bytes": self.resumed_bytes,
            "resumed_objects": self.resumed_objects,
            "notes": list(self.notes),
        }


# -- what may be deleted -----------------------------------------------------------------------
def _direct_name(c: CheckpointInfo, key: str) -> str | None:
    """``key``'s name relative to the checkpoint prefix when it lies directly under it."""
    prefix = c.url.prefix
    if not key.startswith(prefix):
        return None
    name = key[len(prefix) :]
    return name if name and "/" not in name else None


def _other_live(c: CheckpointInfo) -> set[str]:
    return {t for t in c.live_tags if t != c.tag}


def checkpoint_keys(c: CheckpointInfo) -> list[str]:
    """The keys deleting checkpoint ``c`` removes: the marker, the plain ``.metadata``, what
    the marker commits, and every per-save name of a tag that is not live (a save in
    progress in the same prefix, an overwrite, is left alone); for an uncommitted
    checkpoint also stock DCP data names. Never a file s3ckpt or DCP did not write."""
    live = _other_live(c)
    out: list[str] = []
    for k in c.keys:
        n = _direct_name(c, k)
        if n is None:
            continue
        if k in c.committed_keys or n in (MANIFEST_NAME, METADATA_NAME):
            out.append(k)
            continue
        t = owned_tag(n)
        if t is not None:
            if t not in live:
                out.append(k)
        elif not c.is_committed and _DCP_DATA.fullmatch(n):
            out.append(k)
    return out


def checkpoint_uploads(c: CheckpointInfo) -> list[UploadInfo]:
    """Open uploads of per-save names of tags that are not live (other than committed)."""
    live = _other_live(c)
    out = []
    for u in c.uploads:
        n = _direct_name(c, u.key)
        t = owned_tag(n) if n is not None else None
        if t is not None and t not in live:
            out.append(u)
    return out


def leftover_keys(c: CheckpointInfo) -> list[str]:
    """What gc may delete under ``c``: per-save names of dead tags, never what a readable
    marker commits; in a committed prefix also the committed save's heartbeats. Nothing in
    a pinned prefix, nothing in a committed one whose marker cannot be read."""
    if c.pinned or (c.is_committed and c.tag is None):
        return []
    live = set(c.live_tags)
    out: list[str] = []
    for k in c.keys:
        n = _direct_name(c, k)
        t = owned_tag(n) if n is not None else None
        if t is None or k in c.committed_keys:
            continue
        assert n is not None
        if t not in live or (t == c.tag and n.startswith(HEARTBEAT_PREFIX)):
            out.append(k)
    return out


def leftover_uploads(c: CheckpointInfo, cutoff: float) -> list[UploadInfo]:
    """Open uploads of per-save names whose tag is dead and that started before ``cutoff``
    (a dead tag's upload can never become committed data). None in a pinned prefix."""
    if c.pinned:
        return []
    live = set(c.live_tags)
    out = []
    for u in c.uploads:
        n = _direct_name(c, u.key)
        t = owned_tag(n) if n is not None else None
        if t is not None and t not in live and u.initiated is not None and u.initiated < cutoff:
            out.append(u)
    return out


def _is_first_metadata(c: CheckpointInfo, key: str) -> bool:
    """The plain ``.metadata`` or the committed metadata (deleted right after the marker)."""
    n = _direct_name(c, key)
    if n == METADATA_NAME:
        return True
    return n is not None and n.startswith(METADATA_NAME + ".") and key in c.committed_keys


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
    aborted: int = 0
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

    def abort(self, uploads: Sequence[UploadInfo]) -> set[str]:
        """Abort ``uploads``; return the upload ids that could not be aborted."""
        bad: set[str] = set()
        for u in uploads:
            if self.lease is not None:
                self.lease.renew_if_due()
            try:
                self.store.abort_multipart(u.key, u.upload_id)
                self.aborted += 1
            except StoreError as exc:
                bad.add(u.upload_id)
                self.failures.append(DeleteFailure(u.key, exc.code or type(exc).__name__, str(exc)))
        return bad

    def delete_checkpoints(self, targets: Sequence[CheckpointInfo]) -> tuple[str, ...]:
        """Marker first, then the plain and committed ``.metadata``, then the rest and the
        uploads; return the names fully deleted (every key s3ckpt may delete is gone)."""
        keys = {c.name: checkpoint_keys(c) for c in targets}
        markers = {c.name: c.url.key(MANIFEST_NAME) for c in targets}
        present = [markers[c.name] for c in targets if markers[c.name] in keys[c.name]]
        bad = self.delete(present, "marker")
        alive = [c for c in targets if markers[c.name] not in bad]
        metas = [k for c in alive for k in keys[c.name] if _is_first_metadata(c, k)]
        bad |= self.delete(metas, "metadata")
        first = set(present) | set(metas)
        data = [k for c in alive for k in keys[c.name] if k not in first]
        bad |= self.delete(data, "data")
        ups = {c.name: checkpoint_uploads(c) for c in alive}
        bad_ups = self.abort([u for c in alive for u in ups[c.name]])
        return tuple(
            c.name
            for c in alive
            if not any(k in bad for k in keys[c.name])
            and not any(u.upload_id in bad_ups for u in ups[c.name])
        )


def _finish_previous(
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

    Raises:
        LeaseHeldError: Another pruner holds the run's lease (nothing was changed).
        LeaseLostError: Our lease was taken over mid-way; we stopped before the next delete.
        PolicyError: The policy is empty or a value is out of range.

    Request cost: the listing of :func:`list_checkpoints`; with ``apply``, 1-3 lease
    requests plus one per renewal, then ``ceil(keys / batch_size)`` DeleteObjects requests
    in each of the three phases (plus retries), and one AbortMultipartUpload per open upload
    of a deleted checkpoint.
    """
    check_policy(policy)
    _check_batch(batch_size)
    now = _now(now)
    grace, note = effective_grace(grace)
    notes = (note,) if note else ()

    def emit(event: str, **details: Any) -> None:
        if on_progress is not None:
            on_progress(event, details)

    if not apply:
        catalog = list_checkpoints(store, run, grace=grace, now=now)
        p = plan(
            catalog, policy, now, max_delete=max_delete, include_foreign=include_foreign, run=run
        )
        emit("plan", delete=len(p.delete))
        return PruneResult(run=run, plan=p, applied=False, notes=notes)

    lease = Lease(store, run, ttl=lease_ttl).acquire()
    emit("lease", owner=lease.owner, resumed=bool(lease.previous))
    # Until our own intent is recorded, an exception keeps the dead holder's log.
    intent: list[str] = list(lease.previous.deleting) if lease.previous else []
    try:
        catalog = list_checkpoints(store, run, grace=grace, now=now)
        resume, carry, rest = _finish_previous(lease, catalog)
        p = plan(rest, policy, now, max_delete=max_delete, include_foreign=include_foreign, run=run)
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
            aborted=deleter.aborted,
            resumed_bytes=sum(c.size for c in resume),
            resumed_objects=sum(c.num_objects for c in resume),
            notes=notes,
        )
    except BaseException:
        lease.release(intent)  # keep the intent log: the next pruner finishes it
        raise


@dataclass(frozen=True)
class GcResult:
    """What :func:`gc` found under a prefix and (with ``apply``) removed.

    Attributes:
        uploads: Open uploads of per-save names whose save (tag) is dead, started before
            ``older_than`` (aborted with ``apply``; never an upload of a live tag).
        abandoned: Uncommitted prefixes with no live save holding s3ckpt's leftovers
            (removed with ``apply``: only the names s3ckpt wrote).
        removed: URLs of the abandoned prefixes whose leftovers were all removed.
        aborted: Uploads aborted.
        busy_runs: Runs skipped because another pruner held their lease.
        failures: Keys or uploads that could not be removed, metadata not restored.
        leftovers: Keys of dead saves inside committed or in-progress prefixes (an
            overwrite or a re-save killed part-way, a committed save's heartbeats).
        leftovers_deleted: How many of them were deleted.
        skipped: URLs of abandoned prefixes not removed because their run was busy.
        stale_metadata: Committed checkpoints whose plain ``.metadata`` is missing or stale.
        restored: Of those, the ones whose ``.metadata`` was rewritten from the marker's.
        resumed: Checkpoints a dead pruner was deleting (its lease's intent log), finished.
        keys_deleted: Keys removed in all.
        notes: Adjustments made to the arguments (a grace period raised to its floor).
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
    leftovers: tuple[str, ...] = ()
    leftovers_deleted: int = 0
    skipped: tuple[str, ...] = ()
    stale_metadata: tuple[str, ...] = ()
    restored: tuple[str, ...] = ()
    resumed: tuple[str, ...] = ()
    keys_deleted: int = 0
    notes: tuple[str, ...] = ()

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
            "leftovers": list(self.leftovers),
            "leftovers_deleted": self.leftovers_deleted,
            "skipped": list(self.skipped),
            "stale_metadata": list(self.stale_metadata),
            "restored": list(self.restored),
            "resumed": list(self.resumed),
            "keys_deleted": self.keys_deleted,
            "notes": list(self.notes),
        }


def _iso_ts(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat().replace("+00:00", "Z")


@dataclass
class _Survey:
    """What gc would do in some checkpoints (one run, or everything under the root)."""

    uploads: list[UploadInfo] = field(default_factory=list)
    abandoned: list[CheckpointInfo] = field(default_factory=list)
    abandoned_keys: dict[str, list[str]] = field(default_factory=dict)
    leftovers: list[str] = field(default_factory=list)
    stale: list[CheckpointInfo] = field(default_factory=list)

    def add(self, c: CheckpointInfo, cutoff: float) -> None:
        keys = leftover_keys(c)
        ups = leftover_uploads(c, cutoff)
        self.uploads.extend(ups)
        if c.state is CheckpointState.ABANDONED and (keys or ups):
            self.abandoned.append(c)
            self.abandoned_keys[c.name] = keys
        else:
            self.leftovers.extend(keys)
        # Roll forward only with no save live in the prefix: a concurrent overwrite writes
        # its own plain .metadata after its marker, which ours must never replace.
        if c.is_committed and c.metadata_stale and c.tag is not None and not c.live_tags:
            self.stale.append(c)

    @property
    def empty(self) -> bool:
        return not (self.uploads or self.abandoned or self.leftovers or self.stale)


def _survey(checkpoints: Iterable[CheckpointInfo], cutoff: float) -> _Survey:
    out = _Survey()
    for c in checkpoints:
        out.add(c, cutoff)
    return out


def _pending_intent(store: ObjectStore, cat: RunCatalog, now: datetime) -> tuple[str, ...]:
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


def _restore_metadata(store: ObjectStore, c: CheckpointInfo) -> DeleteFailure | None:
    """Rewrite ``c``'s plain ``.metadata`` from the metadata its marker commits (verified
    against the marker's size and CRC32C by the helper)."""
    key = c.url.key(METADATA_NAME)
    manifest = _read_manifest(store, c.url.prefix)
    if isinstance(manifest, str):
        return DeleteFailure(key, "CorruptCheckpoint", manifest)
    if manifest.tag != c.tag:
        return DeleteFailure(key, "Changed", "the commit marker changed since it was listed")
    try:
        from s3ckpt._commit import restore_stock_metadata
    except ImportError as exc:  # the helper ships with the commit protocol
        return DeleteFailure(key, "Unsupported", f"cannot restore .metadata: {exc}")
    try:
        restore_stock_metadata(store, c.url, manifest)
    except S3CkptError as exc:
        return DeleteFailure(key, getattr(exc, "code", None) or type(exc).__name__, str(exc))
    return None


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
    """Reclaim what dead saves and dead pruners left under ``root``.

    A dry run by default, like :func:`prune`. gc deletes only names s3ckpt wrote (see
    :func:`s3ckpt.format.owned_tag`) of saves that are dead — no object, heartbeat or open
    upload of their tag younger than ``grace``:

    * open uploads of per-save names of dead tags started before ``older_than`` (also those
      whose id nobody knows: a create whose reply was lost);
    * killed saves in uncommitted prefixes (their per-save names; a plain ``.metadata``,
      stock ``__0_0.distcp`` or foreign files are never deleted);
    * leftovers in committed prefixes: per-save names of other, dead tags (a killed
      overwrite, a replaced save whose deletion was interrupted) and the committed save's
      heartbeats — never what the marker commits;
    * it rolls forward committed checkpoints whose plain ``.metadata`` (the copy for stock
      DCP readers) is missing or stale, from the metadata the marker commits;
    * it finishes a dead pruner's deletions recorded in the run's lease (its intent log).

    Pinned prefixes are never cleaned. Every change to a run happens under that run's
    lease, from a re-listing made under it.

    Args:
        older_than: An extra margin: abort uploads of dead saves only once they started
            this long ago (default 0: a dead save's uploads go at once). It never aborts an
            upload of a live save, however old.
        grace: A save is live while any object, heartbeat or upload of its tag is younger
            than this; raised to ``MIN_GRACE_SECONDS`` (60 s) when shorter, with a note.

    Request cost: one scan of ``root`` (see :func:`~s3ckpt.retention.scan`) and one GET per
    run holding a lease; with ``apply``, per run with work a lease, a re-listing,
    ``ceil(keys / batch_size)`` DeleteObjects requests, one AbortMultipartUpload per upload
    and a GET + PUT (plus the marker's GET) per restored ``.metadata``.
    """
    _check_batch(batch_size)
    now = _now(now)
    grace, note = effective_grace(grace)
    notes = (note,) if note else ()
    cutoff = (now - older_than).timestamp()
    catalogs = scan(store, root, grace=grace, now=now)
    found = _survey((c for cat in catalogs for c in cat.checkpoints), cutoff)
    intents = {cat.run.prefix: _pending_intent(store, cat, now) for cat in catalogs}
    pending = tuple(str(cat.run.child(n)) for cat in catalogs for n in intents[cat.run.prefix])
    if not apply:
        return GcResult(
            root=root,
            applied=False,
            uploads=tuple(found.uploads),
            abandoned=tuple(found.abandoned),
            leftovers=tuple(found.leftovers),
            stale_metadata=tuple(str(c.url) for c in found.stale),
            resumed=pending,
            notes=notes,
        )

    deleter = _Deleter(store, None, batch_size, retries, sleep, None)
    removed: list[str] = []
    skipped: list[str] = []
    busy: list[str] = []
    restored: list[str] = []
    resumed: list[str] = []
    leftovers_deleted = 0
    for cat in catalogs:
        mine = _survey(cat.checkpoints, cutoff)
        if mine.empty and not intents[cat.run.prefix]:
            continue
        try:
            lease = Lease(store, cat.run, ttl=lease_ttl, operation="gc").acquire()
        except LeaseHeldError:
            busy.append(str(cat.run))
            skipped.extend(str(c.url) for c in mine.abandoned)
            continue
        deleter.lease = lease
        intent: list[str] = list(lease.previous.deleting) if lease.previous else []
        try:
            fresh = list_checkpoints(store, cat.run, grace=grace, now=now)
            resume, carry, rest = _finish_previous(lease, fresh)
            done: tuple[str, ...] = ()
            intent = [*carry, *(c.name for c in resume)]
            if resume:
                lease.record_intent(intent)
                done = deleter.delete_checkpoints(resume)
                resumed.extend(str(c.url) for c in resume if c.name in done)
            work = _survey((c for c in rest if c.url.prefix.startswith(root.prefix)), cutoff)
            keys = [k for ks in work.abandoned_keys.values() for k in ks] + work.leftovers
            bad = deleter.delete(keys, "leftovers")
            leftovers_deleted += sum(1 for k in work.leftovers if k not in bad)
            bad_ups = deleter.abort(work.uploads)
            for c in work.abandoned:
                ok_keys = not any(k in bad for k in work.abandoned_keys[c.name])
                ok_ups = not any(u.upload_id in bad_ups for u in work.uploads if u in c.uploads)
                if ok_keys and ok_ups:
                    removed.append(str(c.url))
            for c in work.stale:
                lease.renew_if_due()
                failure = _restore_metadata(store, c)
                if failure is None:
                    restored.append(str(c.url))
                else:
                    deleter.failures.append(failure)
            intent = [n for n in intent if n not in set(done)]
        except BaseException:
            lease.release(intent)  # keep the intent log: the next pruner finishes it
            raise
        lease.release(intent)
    return GcResult(
        root=root,
        applied=True,
        uploads=tuple(found.uploads),
        abandoned=tuple(found.abandoned),
        removed=tuple(removed),
        aborted=deleter.aborted,
        busy_runs=tuple(busy),
        failures=tuple(deleter.failures),
        delete_requests=deleter.requests,
        leftovers=tuple(found.leftovers),
        leftovers_deleted=leftovers_deleted,
        skipped=tuple(skipped),
        stale_metadata=tuple(str(c.url) for c in found.stale),
        restored=tuple(restored),
        resumed=tuple(resumed),
        keys_deleted=deleter.deleted_keys,
        notes=notes,
    )


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
