"""What :func:`~s3ckpt.retention.prune`, :func:`~s3ckpt.retention.gc` and
:func:`~s3ckpt.retention.delete_checkpoint` report: frozen results with stable ``to_dict()``
forms (the CLI's ``--json``), and each prune's or gc's values for the metrics text file
(``run_metrics``: :class:`~s3ckpt.metrics.RunMetrics`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

from s3ckpt._time import iso_z, utc
from s3ckpt.metrics import OperationMetrics, RunMetrics
from s3ckpt.retention._catalog import CheckpointInfo, CheckpointState
from s3ckpt.retention._plan import Plan
from s3ckpt.store.base import DeleteFailure, UploadInfo
from s3ckpt.uri import StoreURL

__all__ = ["DeleteResult", "GcResult", "PruneResult", "last_event"]


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
        held: Why the plan's deletions were held back (the run's ``s3ckpt.check.json``
            could not be read), or None; a held run is not :attr:`ok`.
        transitioned: Checkpoints whose every object a tier moved is now in its class (or
            tagged, for ``method="tag"``); resumed ones included.
        resumed_moves: Of those, transitions a pruner that died left half-done.
        objects_moved: Objects copied to their tier's class (or tagged).
        bytes_moved: Their bytes.
        transition_requests: CopyObject / PutObjectTagging requests sent.
        transition_failures: Objects that could not be moved, with the store's code.
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
    held: str | None = None
    transitioned: tuple[str, ...] = ()
    resumed_moves: tuple[str, ...] = ()
    objects_moved: int = 0
    bytes_moved: int = 0
    transition_requests: int = 0
    transition_failures: tuple[DeleteFailure, ...] = ()

    @property
    def ok(self) -> bool:
        """No delete and no transition failed, and no deletion was held back."""
        return not self.failures and not self.transition_failures and self.held is None

    @property
    def targets(self) -> int:
        """Checkpoints this run set out to delete: the plan's plus the resumed ones."""
        return len(self.plan.delete) + len(self.resumed)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``s3ckpt prune --json``)."""
        return {**self.plan.to_dict(), **_json(self, "run", "plan"), "targets": self.targets}

    def run_metrics(self, events: Iterable[OperationMetrics] = ()) -> RunMetrics:
        """The run's values for the metrics text file: its checkpoints as the prune left
        them, and from its ``"prune"`` event among ``events`` the bytes freed and the
        lease wait."""
        left = [d.checkpoint for d in self.plan.decisions if d.checkpoint.name not in self.deleted]
        states = Counter(c.state.value for c in left)
        committed = [c for c in left if c.state is CheckpointState.COMMITTED and c.committed_at]
        # Newest by the store's commit time; saves within the same second of the store's
        # clock are told apart by the catalog's order (step, then name).
        latest = max(committed, key=lambda c: (c.committed_at, c.sort_key()), default=None)
        return RunMetrics(
            run=str(self.run),
            checkpoints=dict(states),
            bytes={s: sum(c.size for c in left if c.state.value == s) for s in states},
            latest_committed_at=at.timestamp() if (at := latest and latest.committed_at) else None,
            latest_committed_step=latest.step if latest is not None else None,
            deleted=len(self.deleted),
            failures=len(self.failures) + len(self.transition_failures),
            **_from_event(events, "prune", self.run),
        )


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
        damaged: Committed checkpoints whose marker cannot be read
            (:attr:`CheckpointInfo.damaged`): gc deletes nothing of theirs but dead saves'
            uploads, and reports them.
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
    damaged: tuple[CheckpointInfo, ...] = ()

    @property
    def ok(self) -> bool:
        """Nothing failed."""
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``s3ckpt gc --json``)."""
        return {
            **_json(self),
            "uploads": [
                {"key": u.key, "upload_id": u.upload_id, "initiated": iso_z(utc(u.initiated))}
                for u in self.uploads
            ],
            "abandoned": [c.to_dict() for c in self.abandoned],
            "damaged": [{"url": str(c.url), "error": c.error} for c in self.damaged],
        }

    def run_metrics(self, events: Iterable[OperationMetrics] = ()) -> RunMetrics:
        """The prefix's values for the metrics text file (its ``"gc"`` event among
        ``events`` gives the bytes freed and the lease wait)."""
        return RunMetrics(
            run=str(self.root),
            deleted=len(self.removed) + len(self.resumed),
            lease_busy=len(self.busy_runs),
            failures=len(self.failures),
            **_from_event(events, "gc", self.root),
        )


@dataclass(frozen=True)
class DeleteResult:
    """What :func:`delete_checkpoint` found and (unless a dry run) deleted.

    Attributes:
        checkpoint: The checkpoint's URL.
        run: Its run (the parent prefix), whose lease the deletion took.
        state: The checkpoint's state when it was catalogued (before any deletion).
        step: Its step (from the marker, else from the name), or None.
        applied: False for a dry run (nothing was changed, no lease was taken).
        deleted: Every key s3ckpt may delete under the prefix is gone (always False for a
            dry run).
        keys: The keys selected for deletion (a dry run: the ones that would be): the
            marker, the ``.metadata`` and what the marker commits, per-save names.
        kept: Keys under the prefix that are not deleted because s3ckpt did not write them
            (a TensorBoard file, an export), and the pin file when there is one.
        size: Bytes under the prefix, as catalogued (control objects excluded).
        failures: Keys or uploads that could not be deleted (after retries), with the
            store's code. The marker goes first: when it failed, nothing else was deleted.
        delete_requests: DeleteObjects requests sent.
        keys_deleted: Keys removed (a dead pruner's resumed checkpoints included).
        aborted: Open multipart uploads (of per-save names) aborted.
        resumed: Checkpoints a dead pruner was deleting (its lease's intent log), finished.
        notes: Adjustments made to the arguments (a grace period raised to its floor).
    """

    checkpoint: StoreURL
    run: StoreURL
    state: CheckpointState
    step: int | None
    applied: bool
    deleted: bool = False
    keys: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    size: int = 0
    failures: tuple[DeleteFailure, ...] = ()
    delete_requests: int = 0
    keys_deleted: int = 0
    aborted: int = 0
    resumed: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """No delete failed."""
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``s3ckpt rm --json``)."""
        return _json(self)


def _json(result: Any, *skip: str) -> dict[str, Any]:
    """``result``'s fields (but ``skip``) in JSON form: URLs and states as text, tuples as
    lists, failures as ``{key, code, message}``."""
    return {f.name: _plain(getattr(result, f.name)) for f in fields(result) if f.name not in skip}


def _plain(v: Any) -> Any:
    if isinstance(v, DeleteFailure):
        return {"key": v.key, "code": v.code, "message": v.message}
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    return str(v) if isinstance(v, StoreURL | CheckpointState) else v


def _from_event(events: Iterable[OperationMetrics], kind: str, url: StoreURL) -> dict[str, Any]:
    """The bytes freed and the lease wait of the last ``kind`` event of ``url`` among
    ``events`` (none: nothing, the metrics' zeros)."""
    e = last_event(events, kind, url)
    return {} if e is None else {"bytes_freed": e.bytes_freed, "lease_wait_s": e.lease_wait_s}


def last_event(
    events: Iterable[OperationMetrics], kind: str, url: StoreURL
) -> OperationMetrics | None:
    """The last ``kind`` event of ``url`` among ``events``."""
    return next((e for e in reversed(list(events)) if e.kind == kind and e.url == str(url)), None)
