"""Garbage collection (:func:`gc`): reclaim what dead saves and dead pruners left under a
prefix, their abandoned uploads and objects.

gc deletes only names s3ckpt wrote (:func:`s3ckpt.format.owned_tag`) of saves that are
dead, aborts their open uploads, rolls a committed checkpoint's missing or stale plain
``.metadata`` forward, and finishes a dead pruner's recorded deletions
(:mod:`s3ckpt.retention._intent`). Every change to a run happens under that run's lease.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta

from s3ckpt._commit import restore_stock_metadata
from s3ckpt.errors import (
    LeaseHeldError,
    ObjectNotFoundError,
    PreconditionFailedError,
    S3CkptError,
    TransientStoreError,
)
from s3ckpt.format._manifest import Manifest
from s3ckpt.format._names import MANIFEST_NAME, METADATA_NAME
from s3ckpt.metrics import instrument
from s3ckpt.metrics.instrument import expecting
from s3ckpt.retention._catalog import CheckpointInfo, CheckpointState, RunCatalog
from s3ckpt.retention._deleter import Deleter, failure, leftover_keys, leftover_uploads, tag_of
from s3ckpt.retention._intent import Intent, finish_previous, pending_intent
from s3ckpt.retention._lease import Lease
from s3ckpt.retention._options import RetentionOptions
from s3ckpt.retention._results import GcResult
from s3ckpt.retention._scan import catalogs, read_manifest, run_catalog
from s3ckpt.store import Location
from s3ckpt.store._known import lists_uploads
from s3ckpt.store._location import LocationLike
from s3ckpt.store.base import DeleteFailure, ObjectStore, UploadInfo

__all__ = ["DEFAULT_GC_AGE", "gc"]

DEFAULT_GC_AGE = timedelta(0)
"""gc aborts an open upload of a dead save at once by default: its tag's heartbeats (older
than the grace period) already prove nobody will complete it."""
FAILURE_SETTLE = timedelta(seconds=60)
"""How old (store time) a save's failure record must be before gc removes what that save
left: a commit whose marker PUT failed may still be applied by the store for a moment after
the writer read state back and gave up; until then ``ls`` shows the save failed, and gc
skips its prefix (it says so in its result's notes)."""


@dataclass
class _Survey:
    """What gc would do in some checkpoints (one run, or everything under the root)."""

    uploads: list[UploadInfo] = field(default_factory=list)
    abandoned: list[CheckpointInfo] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)
    stale: list[CheckpointInfo] = field(default_factory=list)
    settling: list[CheckpointInfo] = field(default_factory=list)
    reap: list[CheckpointInfo] = field(default_factory=list)
    """Committed prefixes holding names of another save not proven gone (only past its grace
    period): fenced by :func:`_mark_reaped`."""

    @classmethod
    def of(cls, checkpoints: Iterable[CheckpointInfo], cutoff: float, settled: float) -> _Survey:
        out = cls()
        for c in checkpoints:
            # A failure recorded moments ago may follow a commit whose outcome the writer could
            # not learn (its marker PUT failed): such a PUT still in flight at the store could
            # land after the writer read state back. gc leaves that prefix alone until the
            # record is FAILURE_SETTLE old (store time); ``ls`` shows it failed meanwhile.
            if c.failed_at is not None and c.failed_at.timestamp() > settled:
                out.settling.append(c)
                continue
            keys = leftover_keys(c)
            ups = leftover_uploads(c, cutoff)
            out.uploads.extend(ups)
            if c.state is CheckpointState.ABANDONED and (keys or ups):
                out.abandoned.append(c)
            elif c.is_committed:
                out.leftovers.extend(keys)
                if any(tag_of(c, k) not in (None, c.tag, *c.dead_tags) for k in keys):
                    out.reap.append(c)
            else:
                # Beside a live save (or in a stock checkpoint) the prefix cannot be fenced
                # without ending that claim: only names of saves proven gone go (a failure
                # record, a vanished pid: such a writer never PUTs its marker); the rest wait.
                out.leftovers.extend(k for k in keys if tag_of(c, k) in c.dead_tags)
            # Roll forward only with no save live in the prefix: a concurrent overwrite writes
            # its own plain .metadata after its marker, which ours must never replace.
            if c.is_committed and c.metadata_stale and c.tag is not None and not c.live_tags:
                out.stale.append(c)
        return out

    @property
    def empty(self) -> bool:
        return not (self.uploads or self.abandoned or self.leftovers or self.stale)


def _restore_metadata(store: ObjectStore, c: CheckpointInfo) -> DeleteFailure | None:
    """Rewrite ``c``'s plain ``.metadata`` from the metadata its marker commits (verified
    against the marker's size and CRC32C by the helper)."""
    key = c.url.key(METADATA_NAME)
    manifest = read_manifest(store, c.url.prefix)
    if isinstance(manifest, str):
        return DeleteFailure(key, "CorruptCheckpoint", manifest)
    if not isinstance(manifest, Manifest) or manifest.tag != c.tag:
        return DeleteFailure(key, "Changed", "the commit marker changed since it was listed")
    try:
        restore_stock_metadata(store, c.url, manifest)
    except S3CkptError as exc:
        return failure(key, exc)
    return None


def _being_deleted(cat: RunCatalog) -> list[str]:
    return [c.name for c in cat.checkpoints if c.state is CheckpointState.BEING_DELETED]


def _mark_reaped(deleter: Deleter, c: CheckpointInfo) -> bool:
    """Fence a committed prefix before gc deletes another, dead save's names in it: rewrite
    its marker ``If-Match`` the listed ETag with those saves' tags recorded
    (``Manifest.reaped``). The ETag changes, so a paused overwrite's compare-and-swap fails
    and its writer finds its tag there. A lost reply is decided by reading back; False when
    the marker changed since the listing (nothing of the prefix is then deleted)."""
    store, key = deleter.store, c.url.key(MANIFEST_NAME)
    found = (tag_of(c, k) for k in leftover_keys(c))
    tags = {t for t in found if t is not None and t not in (c.tag, *c.dead_tags)}
    if tags <= set(c.reaped):
        return True  # an earlier gc recorded them (its deletes failed): fenced already
    manifest = read_manifest(store, c.url.prefix)
    if not isinstance(manifest, Manifest) or manifest.tag != c.tag or not c.marker_etag:
        return False
    marked = dataclasses.replace(manifest, reaped=tuple(sorted({*manifest.reaped, *tags})))
    deleter.requests += 1
    try:
        with expecting("precondition_failed", "not_found"):
            store.put(key, marked.to_json(), if_match=c.marker_etag)
    except (PreconditionFailedError, ObjectNotFoundError, TransientStoreError):
        again = read_manifest(store, c.url.prefix)  # our rewrite, its reply lost?
        return isinstance(again, Manifest) and again.tag == c.tag and tags <= set(again.reaped)
    return True


def gc(
    location: LocationLike,
    /,
    *,
    older_than: timedelta = DEFAULT_GC_AGE,
    apply: bool = False,
    options: RetentionOptions | None = None,
) -> GcResult:
    """Reclaim what dead saves and dead pruners left under a prefix.

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
    * capability probes a lease's acquisition left beside a run's lease
      (``s3ckpt.lease.probe-<id>``: their delete failed) older than ``grace``;
    * it rolls forward committed checkpoints whose plain ``.metadata`` (the copy for stock
      DCP readers) is missing or stale, from the metadata the marker commits;
    * it finishes a dead pruner's deletions recorded in the run's lease (its intent log).

    Pinned prefixes are never cleaned. Every change to a run happens under that run's
    lease, from a re-listing made under it.

    Args:
        location: The prefix: a :class:`~s3ckpt.store.Location` or a URL.
        older_than: An extra margin: abort uploads of dead saves only once they started
            this long ago (default 0: a dead save's uploads go at once). It never aborts an
            upload of a live save, however old.
        apply: Abort, delete and restore (default: dry run).
        options: The run's settings (:class:`~s3ckpt.retention.RetentionOptions`): ``grace``
            (a save is live while any object, heartbeat or upload of its tag is younger
            than this; raised to ``MIN_GRACE_SECONDS``, 60 s, when shorter, with a note),
            ``now``, ``lease_ttl``, ``batch_size``, ``retries``, ``sleep``, ``on_progress``.

    Publishes one ``"gc"`` event (:mod:`s3ckpt.metrics`): saves removed, bytes freed,
    lease waits and busy runs, requests.

    Request cost: one scan of ``location`` (see :func:`~s3ckpt.retention.scan`) and one GET per
    run holding a lease; with ``apply``, per run with work a lease, a re-listing,
    ``ceil(keys / batch_size)`` DeleteObjects requests, one AbortMultipartUpload per upload
    and a GET + PUT (plus the marker's GET) per restored ``.metadata``.
    """
    options = options if options is not None else RetentionOptions()
    location = Location.of(location)
    with instrument.operation("gc", str(location.url)) as recorder:
        store, root = location.store, location.url
        options, notes = options.resolve(location, refuse="gc" if apply else None)
        now = options.now
        assert now is not None  # resolved: the store's time, or the caller's
        cutoff = (now - older_than).timestamp()
        settled = (now - FAILURE_SETTLE).timestamp()
        found_runs = catalogs(store, root, options)
        if not lists_uploads(store):
            notes += (
                "the store does not implement ListMultipartUploads: gc cannot see open "
                "multipart uploads and aborted none (let a lifecycle rule abort incomplete ones)",
            )
        found = _Survey.of((c for cat in found_runs for c in cat.checkpoints), cutoff, settled)
        notes += tuple(
            f"{c.url}: a save failed there "
            f"{max(0, round(now.timestamp() - c.failed_at.timestamp()))} s ago; gc leaves it "
            f"until the failure is {int(FAILURE_SETTLE.total_seconds())} s old"
            for c in found.settling
            if c.failed_at is not None
        )
        owed = {  # per run: what a dead pruner left (its intent log, unfinished tombstones)
            cat.run.prefix: dict.fromkeys([*pending_intent(store, cat, now), *_being_deleted(cat)])
            for cat in found_runs
        }
        pending = tuple(str(cat.run.child(n)) for cat in found_runs for n in owed[cat.run.prefix])
        found_in = GcResult(
            root=root,
            applied=False,
            uploads=tuple(found.uploads),
            abandoned=tuple(found.abandoned),
            leftovers=(*found.leftovers, *(k for cat in found_runs for k in cat.stale_probes)),
            stale_metadata=tuple(str(c.url) for c in found.stale),
            resumed=pending,
            notes=notes,
            damaged=tuple(c for cat in found_runs for c in cat.checkpoints if c.damaged),
        )
        if not apply:
            recorder.finish(dry_run=True)
            return found_in

        deleter = Deleter(store, None, options, by="gc")
        done_in: dict[str, list[str]] = {
            k: [] for k in ("removed", "skipped", "busy_runs", "restored", "resumed")
        }
        removed, skipped, busy, restored, resumed = done_in.values()
        leftovers_deleted = 0
        lease_wait = 0.0
        for cat in found_runs:
            mine = _Survey.of(cat.checkpoints, cutoff, settled)
            if mine.empty and not owed[cat.run.prefix] and not cat.stale_probes:
                continue
            waited = time.monotonic()
            try:
                lease = Lease(store, cat.run, ttl=options.lease_ttl, operation="gc").acquire()
            except LeaseHeldError:
                busy.append(str(cat.run))
                skipped.extend(str(c.url) for c in mine.abandoned)
                continue
            finally:
                lease_wait += time.monotonic() - waited
            deleter.lease = lease
            with Intent(lease) as intent:
                fresh = run_catalog(store, cat.run, options)
                resume, carry, rest = finish_previous(lease, fresh.checkpoints if fresh else [])
                intent.record(resume, carry)
                done = deleter.delete_checkpoints(resume)  # none: no request
                resumed.extend(str(c.url) for c in resume if c.name in done)
                under = (c for c in rest if c.url.prefix.startswith(root.prefix))
                work = _Survey.of(under, cutoff, settled)
                # Fence first: a tombstone on each abandoned prefix, the reaped tags recorded in
                # each committed marker; a prefix whose fence failed keeps its names.
                unfenced = {k for c in work.reap if not _mark_reaped(deleter, c) for k in c.keys}
                keys = [k for k in work.leftovers if k not in unfenced]
                keys += fresh.stale_probes if fresh is not None else ()
                bad = deleter.delete(keys, "leftovers")
                leftovers_deleted += sum(1 for k in keys if k not in bad)
                cleared = deleter.delete_checkpoints(work.abandoned, leftover_keys, lambda c: [])
                bad_ups = deleter.abort(work.uploads)
                for c in work.abandoned:
                    ok_ups = not any(u.upload_id in bad_ups for u in work.uploads if u in c.uploads)
                    if c.name in cleared and ok_ups:
                        removed.append(str(c.url))
                for c in work.stale:
                    lease.renew_if_due()
                    if (failed := _restore_metadata(store, c)) is None:
                        restored.append(str(c.url))
                    else:
                        deleter.failures.append(failed)
                intent.finished([*done, *deleter.changed])
        gone = set(removed)
        recorder.finish(
            "DeleteFailures" if deleter.failures else None,
            ok=not deleter.failures and not busy,
            deleted=len(removed) + len(resumed),
            bytes_freed=sum(c.size for c in found.abandoned if str(c.url) in gone),
            lease_wait_s=lease_wait,
            lease_busy=len(busy),
        )
        return dataclasses.replace(
            found_in,
            applied=True,
            **{k: tuple(v) for k, v in done_in.items()},  # type: ignore[arg-type]
            **deleter.counts(),
            leftovers_deleted=leftovers_deleted,
            notes=notes + deleter.changed_notes(),
        )
