"""Deleting one checkpoint on request: :func:`delete_checkpoint` (``s3ckpt rm``).

Frameworks that manage their own checkpoints delete them one at a time (Lightning's
``save_top_k`` calls ``remove_checkpoint(path)``), and people do by hand. A recursive delete
of the prefix (s3fs ``rm -r``) would race a pruner, leave a committed-looking checkpoint with
missing data when it dies half-way, and take files s3ckpt never wrote. This is prune with a
plan of one checkpoint, under the same rules:

1. The checkpoint is found in its run's catalog (the run is its parent prefix); a prefix that
   is not a checkpoint there is refused (:class:`~s3ckpt.errors.CheckpointNotFoundError`, or
   :class:`~s3ckpt.errors.ConfigError` for a run).
2. Refused, with nothing written or deleted (:class:`~s3ckpt.errors.DeleteRefusedError`):
   a pinned checkpoint; a save in progress (no marker, activity within the grace period) or
   an overwrite in progress; a dead save's leftovers (``gc``'s business); a foreign (stock
   DCP) checkpoint unless ``include_foreign``; and the run's newest committed checkpoint
   (by step, and the most recently committed one) unless ``allow_newest``. These are checked
   once from a listing without the lease (so a refusal writes nothing, not even a lease) and
   again from a listing made under the lease (decide by reading state back). A checkpoint
   whose deletion began and did not finish (a failed or killed rm or prune: its marker is
   gone, its name is in the run's lease) is not refused: it is finished.
3. Under the run's lease (:mod:`s3ckpt.retention._lease`): finish a dead pruner's recorded
   deletions (like prune and gc), record the intent (the checkpoint's name) in the lease,
   delete the commit marker first, then the ``.metadata`` and what the marker commits, then
   the other per-save names, and abort the prefix's open uploads of per-save names
   (:class:`~s3ckpt.retention._deleter.Deleter`). A crash at any point leaves the name in
   the lease's intent log, and the next pruner finishes it.

Only names s3ckpt (or, with ``include_foreign``, stock DCP) wrote are deleted; anything else
under the prefix stays and is reported (:attr:`DeleteResult.kept`).

The run's ``latest`` pointer (``s3ckpt.latest.json``) is left as it is, even when it names
the deleted checkpoint: it is a hint that the Checkpointer checks against the commit marker
(one HEAD) before trusting it, and falls back to a listing when the marker is gone
(:class:`s3ckpt.checkpointer._latest.LatestPointer`). Rewriting it here could race a
Checkpointer writing a newer one, since the pointer is written without a condition.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from s3ckpt.errors import CheckpointNotFoundError, ConfigError, DeleteRefusedError
from s3ckpt.format._names import MANIFEST_NAME, METADATA_NAME
from s3ckpt.retention._catalog import CheckpointInfo, CheckpointState, RunCatalog
from s3ckpt.retention._deleter import Deleter, checkpoint_keys
from s3ckpt.retention._duration import format_duration
from s3ckpt.retention._intent import Intent, finish_previous, pending_intent
from s3ckpt.retention._lease import Lease
from s3ckpt.retention._options import RetentionOptions
from s3ckpt.retention._plan import newest
from s3ckpt.retention._results import DeleteResult
from s3ckpt.retention._scan import catalogs
from s3ckpt.store import Location
from s3ckpt.store._location import LocationLike
from s3ckpt.uri import StoreURL

__all__ = ["delete_checkpoint"]


def delete_checkpoint(
    location: LocationLike,
    /,
    *,
    allow_newest: bool = False,
    dry_run: bool = False,
    options: RetentionOptions | None = None,
) -> DeleteResult:
    """Delete one checkpoint safely: under its run's lease, commit marker first, only the
    names s3ckpt wrote; refuse what could lose a checkpoint (see the module docs).

    Args:
        location: The checkpoint's prefix (``s3://bucket/runs/a/step-4/``; its run is the
            parent prefix): a :class:`~s3ckpt.store.Location` or a URL.
        allow_newest: Delete the run's newest committed checkpoint (by step) or its most
            recently committed one too; by default they are refused, since a resume loads
            them.
        dry_run: Only find the checkpoint and check it may be deleted: the result lists the
            keys that would go (no lease, nothing written).
        options: The run's settings (:class:`~s3ckpt.retention.RetentionOptions`):
            ``include_foreign`` (delete a stock-DCP checkpoint, a ``.metadata`` but no s3ckpt
            marker: only its DCP names, ``.metadata`` and ``__{r}_{i}.distcp``), ``grace``
            (a save is in progress while any of its objects, heartbeats or open uploads is
            younger than this; raised to ``MIN_GRACE_SECONDS`` when shorter, with a note),
            ``lease_ttl``, ``retries``, ``sleep``, ``now`` (the time the grace period is
            judged against; default: the store's time, and without ``dry_run`` a refusal
            when this host's clock is further from it than the grace period),
            ``step_pattern`` (for telling which checkpoint is newest), ``batch_size`` and
            ``on_progress`` (``lease``, ``intent``, ``delete``, ``done``).

    Returns:
        What was found and deleted. A per-key failure does not raise: it is in
        ``failures``, ``deleted`` is False, and the name stays in the lease's intent log
        for the next pruner.

    Raises:
        DeleteRefusedError: Pinned, in progress, a dead save's leftovers, foreign without
            ``include_foreign``, or the newest without ``allow_newest``; nothing deleted.
        CheckpointNotFoundError: No checkpoint at ``location`` in its run's catalog.
        ConfigError: ``location`` is a run (or the bucket's root), or ``step_pattern``
            is not a regular expression with one capture group.
        LeaseHeldError: Another pruner holds the run's lease (nothing was changed).
        LeaseLostError: The lease was taken over mid-way; stopped before the next delete.
        ClockSkewError: This host's clock is further from the store's than the grace
            period (not with ``dry_run`` or an explicit ``now``); nothing deleted.

    Request cost: the catalog of the run (:func:`~s3ckpt.retention.list_checkpoints`: LISTs
    of the run, one GET per committed checkpoint's marker); without ``dry_run`` a second
    catalog under the lease, 3-4 lease PUTs (plus HEAD + GET to take over a released one),
    and one DeleteObjects request per phase (marker, metadata, the rest).
    """
    location = Location.of(location)
    store, checkpoint = location.store, location.url
    if not checkpoint.prefix:
        raise ConfigError(
            f"{checkpoint} is the root of the bucket, not a checkpoint: name one checkpoint "
            "(s3ckpt ls URL lists them)"
        )
    name, run = checkpoint.name, checkpoint.parent
    refuse = None if dry_run else f"delete {checkpoint}"
    options, notes = (options or RetentionOptions()).resolve(location.parent, refuse=refuse)
    assert options.now is not None  # resolved: the store's time, or the caller's

    def catalog(again: bool) -> RunCatalog:
        return _run_catalog(catalogs(store, run, options), checkpoint, again)

    # Refuse from a listing without the lease first: a refusal writes nothing at all. A
    # checkpoint whose deletion a pruner (or an earlier rm) began and did not finish has no
    # marker any more; it is in that pruner's intent log, and finished under the lease.
    first = catalog(again=False)
    target = seen = next(c for c in first.checkpoints if c.name == name)
    if target.is_committed or name not in pending_intent(store, first, options.now):
        _check(target, first.checkpoints, allow_newest, options)
    if dry_run:
        return _result(target, run, applied=False, notes=notes)

    lease = Lease(store, run, ttl=options.lease_ttl, operation="rm").acquire()
    options.progress("lease", owner=lease.owner, resumed=bool(lease.previous))
    with Intent(lease) as intent:
        # Decide again from what is there now, under the lease.
        resume, carry, rest = finish_previous(lease, catalog(again=True).checkpoints)
        if name in carry:
            raise _refused(
                checkpoint,
                "in_progress",
                "a pruner that died was deleting it, and a save is writing into it again; "
                "try again once that save commits or dies",
            )
        found = [c for c in resume if c.name == name]
        if found:  # already being deleted (by a pruner that died): finish it
            target, targets = found[0], list(resume)
        else:
            target = _same_as_seen(next(c for c in rest if c.name == name), seen, checkpoint)
            _check(target, rest, allow_newest, options)
            targets = [*resume, target]
        intent.record(targets, carry)
        options.progress("intent", names=intent.names)
        deleter = Deleter(store, lease, options, by="rm")
        done = deleter.delete_checkpoints(targets)
        intent.finished([*done, *deleter.changed])
    notes += deleter.changed_notes()
    options.progress("done", deleted=len(done), failures=len(deleter.failures))
    if allow_newest and newest(rest, options.include_foreign).get(name):
        notes += (
            "it was the run's newest checkpoint: a `latest` pointer naming it is a stale hint "
            "now, which the Checkpointer checks against the commit marker and replaces by a "
            "listing",
        )
    did = {**deleter.counts(), "resumed": tuple(c.name for c in resume)}
    return _result(target, run, applied=True, deleted=name in done, notes=notes, **did)


def _run_catalog(cats: Sequence[RunCatalog], checkpoint: StoreURL, again: bool) -> RunCatalog:
    """The catalog of the checkpoint's run (its parent) from a scan of it, holding the
    checkpoint; a checkpoint URL that names a run or a folder of runs is refused here (the
    scan of its parent sees those too). ``again``: the scan under the lease, after one that
    found the checkpoint."""
    run, name = checkpoint.parent, checkpoint.name
    by_run = {cat.run.prefix: cat for cat in cats}
    own = by_run.get(run.prefix)
    if own is not None and any(c.name == name for c in own.checkpoints):
        return own
    if again:  # another pruner (or gc) deleted it before we took the lease
        raise _missing(
            checkpoint,
            f"no checkpoint at {checkpoint} any more: it was deleted while this took the "
            f"lease of {run}; nothing was deleted",
        )
    inner = by_run.get(checkpoint.prefix)
    if inner is not None and inner.checkpoints:
        names = [c.name for c in inner.checkpoints]
        some = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        raise ConfigError(
            f"{checkpoint} is a run holding checkpoints ({some}), not a checkpoint: delete one "
            f"of them, e.g. {inner.checkpoints[0].url}; nothing was deleted"
        )
    why = (
        "it holds runs, not a checkpoint (s3ckpt ls URL lists them)"
        if any(p.startswith(checkpoint.prefix) for p in by_run)
        else f"nothing a checkpoint holds ({MANIFEST_NAME}, {METADATA_NAME}, *.distcp) is stored "
        f"directly under it; `s3ckpt ls {run}` lists the run's checkpoints"
    )
    raise _missing(checkpoint, f"no checkpoint at {checkpoint}: {why}; nothing was deleted")


def _missing(checkpoint: StoreURL, message: str) -> CheckpointNotFoundError:
    return CheckpointNotFoundError(message, bucket=checkpoint.bucket, key=checkpoint.prefix)


def _check(
    c: CheckpointInfo, catalog: Sequence[CheckpointInfo], allow_newest: bool, o: RetentionOptions
) -> None:
    """Raise :class:`DeleteRefusedError` when deleting ``c`` could lose a checkpoint (``o``:
    the run's settings: ``include_foreign`` and the grace period)."""
    why = None if allow_newest else newest(catalog, o.include_foreign).get(c.name)
    refusals = (
        (c.pinned, "pinned", f"it is pinned ({c.pinned}); unpin it first (s3ckpt unpin {c.url})"),
        (
            c.state is CheckpointState.IN_PROGRESS,
            "in_progress",
            "a save is still writing it (no commit marker, and activity within the grace "
            f"period of {format_duration(o.grace)}); wait until it commits, or until it is dead "
            "and gc removes it",
        ),
        (
            c.overwrite_in_progress,
            "in_progress",
            "a live save is overwriting it (it commits by a compare-and-swap on this marker); "
            "try again once that save has committed",
        ),
        (
            c.state is CheckpointState.ABANDONED,
            "abandoned",
            "it is what a dead save left (no commit marker, no .metadata), which s3ckpt gc "
            "removes (only the names s3ckpt wrote)",
        ),
        (
            c.state is CheckpointState.FOREIGN and not o.include_foreign,
            "foreign",
            "it has a DCP .metadata but no s3ckpt commit marker (a stock DCP checkpoint or "
            "another tool's); pass include_foreign=True (s3ckpt rm --include-foreign) to "
            "delete its DCP files (.metadata, __R_I.distcp)",
        ),
        (
            why is not None,
            "newest",
            f"it is the run's {why} checkpoint, the one a resume loads; pass "
            "allow_newest=True (s3ckpt rm --allow-newest) to delete it anyway",
        ),
    )
    for refused, reason, text in refusals:
        if refused:
            raise _refused(c.url, reason, text)


def _same_as_seen(now: CheckpointInfo, seen: CheckpointInfo, url: StoreURL) -> CheckpointInfo:
    """The checkpoint to delete: only the version rm first listed. One committed since
    (an uncommitted prefix whose save committed) is refused; one overwritten since keeps
    the first marker's ETag, so its conditional delete answers 412 and the overwrite
    stays (reported as changed)."""
    if now.marker_etag == seen.marker_etag:
        return now
    if seen.marker_etag is None:
        raise _refused(
            url,
            "changed",
            "a save committed it after rm listed it; run rm again to delete what is there now",
        )
    return replace(now, marker_etag=seen.marker_etag)


def _refused(url: StoreURL, reason: str, why: str) -> DeleteRefusedError:
    # The message starts with the URL: no location suffix repeating it.
    return DeleteRefusedError(
        f"refusing to delete {url}: {why}; nothing was deleted", reason=reason
    )


def _result(c: CheckpointInfo, run: StoreURL, **done: Any) -> DeleteResult:
    """What rm found (and did) about ``c``; ``done``: the other fields (what it did)."""
    keys = checkpoint_keys(c)
    return DeleteResult(
        checkpoint=c.url,
        run=run,
        state=c.state,
        step=c.step,
        keys=tuple(keys),
        kept=tuple(k for k in c.keys if k not in set(keys)),
        size=c.size,
        **done,
    )
