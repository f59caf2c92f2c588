"""Cataloguing: which checkpoints the runs under a prefix hold, from one paged listing.

Layout (:mod:`s3ckpt.format`): a *run* is a prefix, and every checkpoint is an immediate
sub-prefix of it (``{run}/step_000001000/``). Besides checkpoints a run holds *control
objects*, which are never checkpoints and never deleted by retention:

* ``{run}/s3ckpt.latest.json`` — the Checkpointer's pointer to the latest checkpoint;
* ``{run}/s3ckpt.lease`` — the pruner's lease (:mod:`s3ckpt.retention._lease`);
* ``{run}/s3ckpt.check.json`` — what ``s3ckpt check`` found (:mod:`s3ckpt.retention._check_record`);
* ``{ckpt}/s3ckpt.pin.json`` — a pin on one checkpoint (``s3ckpt pin``).

A sub-prefix counts as a checkpoint when it holds (as an object or as an open multipart
upload) a commit marker (``s3ckpt.json``), a DCP ``.metadata``, a ``*.distcp`` data object,
one of s3ckpt's per-save names (:func:`s3ckpt.format.owned_tag`: ``.metadata.{tag}``,
heartbeats ``s3ckpt.alive.{tag}.{rank}``) or a pin. Its name alone never makes it one: a
``step_<digits>/`` folder holding only foreign files (TensorBoard events, a safetensors
export) is not retention's business, and neither is any other folder under a run
(``tensorboard/``, ``logs/``); they are never listed, planned or deleted.

Hashed-prefix saves (:class:`s3ckpt.format.HashedPrefixes`) put their data objects in the
run's shard folder: a key ``{run}/s3ckpt-shards/{h}/{name}/__{r}_{i}.{tag}.shard`` belongs
to the checkpoint ``{run}/{name}/`` (:func:`s3ckpt.format.shard_owner`) and counts there as
one of its own per-save names: in its size and object count, its keys, its save tags'
activity and, as an upload, its open uploads. Such a key declares its checkpoint even when
nothing is stored under ``{run}/{name}/`` yet (a save killed before its ``.metadata``).
Nothing else in a shard folder belongs to any checkpoint, and ``s3ckpt-shards/`` and its
sub-folders are never runs or checkpoints. A scan of a root inside a checkpoint prefix does
not see the run's shard folder: its sizes leave the shards out, and nothing there is
deleted (a scan of the run or above sees them).

A checkpoint's step is the one its commit marker records (``step``; the catalog reads every
marker anyway), else the one its name gives (:func:`s3ckpt._step_names.checkpoint_step`: the
Checkpointer's ``step_000001000`` and the frameworks' ``step-4``, ``epoch=0-step=4.ckpt``,
``global_step4``, ``checkpoint-4``; or, with ``step_pattern``, the run's own naming).

States and liveness: :mod:`s3ckpt.retention._catalog`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping

from s3ckpt._step_names import checkpoint_step
from s3ckpt._time import utc
from s3ckpt._tombstone import Tombstone, read_head
from s3ckpt.errors import ObjectNotFoundError, StoreError
from s3ckpt.format._manifest import MAX_MANIFEST_BYTES, Manifest
from s3ckpt.format._names import MANIFEST_NAME, METADATA_NAME, PIN_NAME
from s3ckpt.metrics.instrument import expecting
from s3ckpt.retention._catalog import (
    CheckpointInfo,
    CheckpointState,
    RunCatalog,
    commit_time,
    writer_time,
)
from s3ckpt.retention._check_record import CheckRecord, read_check_records, read_each
from s3ckpt.retention._listing import Group, group_listing
from s3ckpt.retention._liveness import dead_saves, failure_reasons, judge_time, newest_failure
from s3ckpt.retention._options import RetentionOptions, StepPatternLike
from s3ckpt.retention._shallow import Marker, committed_keys, find_runs, parse_marker, probe, walk
from s3ckpt.store import Location
from s3ckpt.store._known import list_open_uploads
from s3ckpt.store._location import LocationLike
from s3ckpt.store.base import ObjectInfo, ObjectStore
from s3ckpt.uri import StoreURL, split_prefix

__all__ = [
    "catalogs",
    "list_checkpoints",
    "list_runs",
    "probe_checkpoint",
    "read_manifest",
    "run_catalog",
    "scan",
]


def scan(
    location: LocationLike,
    /,
    *,
    options: RetentionOptions | None = None,
    include_uploads: bool = True,
) -> list[RunCatalog]:
    """Every run under the location (itself included when it is a run), with its
    checkpoints, from one paged listing.

    Open uploads count as activity (of their tag) and declare checkpoints too: a save that
    has only started multipart uploads lists as in progress.

    Args:
        location: The prefix: a :class:`~s3ckpt.store.Location` or a URL.
        options: The run's settings; the scan reads ``grace``, ``now`` (default: the
            store's time, :func:`~s3ckpt.store._clock.store_time`; the grace period is
            judged against it) and ``step_pattern`` (reads steps from checkpoint names the
            built-in forms do not; a step recorded in a commit marker wins over any name).
        include_uploads: List open multipart uploads too.

    Raises:
        ConfigError: A bad step pattern, before any request.

    Request cost: ``ceil(objects / 1000)`` LIST requests for everything under the prefix,
    ``ceil(open uploads / 1000)`` LIST-uploads requests (``include_uploads``), and one GET
    per commit marker, per pin and per prefix with a failed save (its failure record; 16
    in parallel); without ``now``, one LIST of one key on S3 for the store's time.
    Nothing is HEADed.
    """
    options = options if options is not None else RetentionOptions()
    location = Location.of(location)
    return catalogs(
        location.store,
        location.url,
        options,
        include_uploads=include_uploads,
        shallow=options.scan == "shallow",
    )


def catalogs(
    store: ObjectStore,
    root: StoreURL,
    options: RetentionOptions,
    *,
    include_uploads: bool = True,
    shallow: bool = False,
    check_record: bool = True,
) -> list[RunCatalog]:
    """:func:`scan` below its entry point (``options.step_pattern`` compiled already).

    ``shallow``: walk folders and read markers instead of listing every key
    (:mod:`s3ckpt.retention._shallow`); gc and rm never ask for it. ``check_record``: read
    each run's ``s3ckpt.check.json`` (:meth:`CheckpointInfo.checked`; one GET per run)."""
    grace, pattern = options.grace, options.step_pattern
    now, _ = judge_time(store, root, options.now, grace, refuse=None)
    known: dict[str, Marker] = {}
    if shallow:
        objects, known = walk(store, root, pattern)
        # The marker stands for its checkpoint in the grouping (its group, its tag's
        # activity, uploads under it); what it commits is filled in by _shallow_info.
        objects += [m.info for m in known.values()]
    else:
        objects = list(store.list(root.prefix))
    # None: the store has no ListMultipartUploads (one warning); heartbeats and mtimes
    # still tell liveness.
    uploads = (list_open_uploads(store, root.prefix) or []) if include_uploads else []
    groups, runs_with_lease, probes = group_listing(root, objects, uploads)

    cutoff = (now - grace).timestamp()
    for g in groups.values():
        g.dead.update(g.failed)  # a save that recorded its failure is dead at once
    live_looking = {
        (d, tag): keys
        for d, g in groups.items()
        for tag, keys in g.heartbeats.items()
        if g.tags.get(tag, 0.0) > cutoff and tag not in g.dead
    }
    for d, tag in dead_saves(store, live_looking):
        groups[d].dead.add(tag)
    manifests, reasons = _read_controls(store, groups, known)
    failed = {
        d: newest_failure(g.failed, m.tag if isinstance(m := manifests.get(d), Manifest) else None)
        for d, g in groups.items()
    }
    why = failure_reasons(store, {d: f[0] for d, f in failed.items() if f is not None})

    by_run: dict[str, list[CheckpointInfo]] = {}
    for d, g in groups.items():
        run = split_prefix(d)[0]
        info = _info(root, run, d, g, manifests.get(d), reasons.get(d), cutoff, pattern)
        if d in known:
            info = _shallow_info(info, d, known[d])
        if (f := failed[d]) is not None:  # the newest failed save here (never the committed one)
            info = dataclasses.replace(info, failed_at=utc(f[1]), failure=why[d])
        if info.state is not CheckpointState.GONE:  # a finished fence: never listed
            by_run.setdefault(run, []).append(info)
    for run_prefix in [*runs_with_lease, *probes]:
        if run_prefix.startswith(root.prefix):
            by_run.setdefault(run_prefix, [])
    runs = [r for r, ckpts in by_run.items() if any(c.is_committed for c in ckpts)]
    records = read_check_records(store, root, runs) if check_record else {}
    return [
        RunCatalog(
            StoreURL(root.scheme, root.bucket, r),
            tuple(
                sorted((c.checked(records.get(r)) for c in by_run[r]), key=CheckpointInfo.sort_key)
            ),
            has_lease=r in runs_with_lease,
            lease_modified=runs_with_lease.get(r),
            stale_probes=tuple(
                o.key for o in probes.get(r, ()) if (o.last_modified or cutoff) < cutoff
            ),
            check_error=rec if isinstance(rec := records.get(r), str) else None,
        )
        for r in sorted(by_run)
    ]


def _read_controls(
    store: ObjectStore, groups: Mapping[str, Group], known: Mapping[str, Marker]
) -> tuple[dict[str, Manifest | Tombstone | str], dict[str, str]]:
    """The commit markers (or why each cannot be read; ``known``: read already) and the
    pins' reasons, by prefix."""
    sizes = {d: g.marker.size for d, g in groups.items() if g.marker and d not in known}
    pins = [d for d, g in groups.items() if g.pin]
    read = read_each(lambda d: read_manifest(store, d, size=sizes[d]), list(sizes))
    manifests = {d: m.manifest for d, m in known.items()} | dict(zip(sizes, read, strict=True))
    reasons = zip(pins, read_each(lambda d: _read_pin(store, d), pins), strict=True)
    return manifests, {d: r for d, r in reasons if r is not None}


def read_manifest(
    store: ObjectStore, prefix: str, *, size: int | None = None
) -> Manifest | Tombstone | str:
    """The commit marker under ``prefix``, the tombstone there (:mod:`s3ckpt._tombstone`),
    or why it cannot be read (a damaged marker: anything :meth:`Manifest.from_json`
    refuses, or more than :data:`~s3ckpt.format.MAX_MANIFEST_BYTES`).

    ``size`` is the marker's size from a listing: a marker larger than the limit is not
    read at all, and no more than ``size`` bytes are read of one (one ranged GET), however
    large the object has become since. Without it the whole object is read (one GET).
    """
    key = prefix + MANIFEST_NAME
    raw = None
    if size is None or size <= MAX_MANIFEST_BYTES:
        try:
            with expecting("not_found"):  # deleted since the listing (a prune, an rm): a race
                raw = store.get(key) if size is None else read_head(store, key, size)
        except ObjectNotFoundError:
            return "commit marker vanished while listing"
    return parse_marker(key, raw, len(raw) if raw is not None else size or 0)


def _read_pin(store: ObjectStore, prefix: str) -> str | None:
    try:
        with expecting("not_found"):  # unpinned since the listing: a race
            raw = store.get(prefix + PIN_NAME)
    except StoreError:
        return None
    try:
        doc = json.loads(raw.decode("utf-8"))
        reason = str(doc.get("reason") or "").strip()
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        reason = ""
    # A pin that cannot be read still pins: failing safe means keeping the checkpoint.
    return reason or "(unreadable pin)"


def _info(
    root: StoreURL,
    run: str,
    d: str,
    g: Group,
    manifest: Manifest | Tombstone | str | None,
    pin: str | None,
    cutoff: float,
    pattern: StepPatternLike | None,
) -> CheckpointInfo:
    """The record of prefix ``d``; its state as the catalog's module docs define it."""
    name = d[len(run) : -1]
    tomb = manifest if isinstance(manifest, Tombstone) else None
    # The saves a tombstone covers are never live: its deletion finishes them (a writer of
    # one that resumes meets the tombstone at its commit).
    gone = g.dead | tomb.tags if tomb is not None else g.dead
    live = tuple(sorted(t for t, when in g.tags.items() if when > cutoff and t not in gone))
    State = CheckpointState
    extra: dict[str, object] = {"step": checkpoint_step(name, pattern)}
    if tomb is not None:  # BEING_DELETED until done; then a new save's state, or GONE
        extra["tombstone"] = tomb
        state = State.IN_PROGRESS if live else State.ABANDONED if g.tags else State.GONE
        state = state if tomb.done else State.BEING_DELETED
    elif g.marker is not None:
        state = State.COMMITTED
        if isinstance(manifest, Manifest):
            extra.update(
                step=manifest.step if manifest.step is not None else extra["step"],
                committed_at=commit_time(
                    g.saved_metadata.get(manifest.metadata_key),
                    g.marker.last_modified,
                    manifest.created,
                ),
                created=writer_time(manifest.created),
                metrics=dict(manifest.metrics),
                tag=manifest.tag,
                committed_keys=frozenset([d + MANIFEST_NAME, *dict(committed_keys(d, manifest))]),
                metadata_stale=_metadata_stale(g.metadata, g.marker.last_modified, manifest),
                reaped=manifest.reaped,
            )
        else:
            extra["error"] = manifest if isinstance(manifest, str) else "commit marker unreadable"
    # Activity of a save proven dead does not count; anything untagged still does.
    elif live or (g.untagged is not None and g.untagged > cutoff):
        state = State.IN_PROGRESS
    elif g.metadata is not None:
        state, extra["committed_at"] = State.FOREIGN, utc(g.metadata.last_modified)
    else:
        state = State.ABANDONED
    return CheckpointInfo(
        url=StoreURL(root.scheme, root.bucket, d),
        name=name,
        state=state,
        committed_at=extra.pop("committed_at", None),  # type: ignore[arg-type]
        size=g.size,
        bytes_by_class=g.by_class,
        num_objects=g.count,
        pinned=pin,
        last_activity=utc(g.newest),
        keys=tuple(g.keys),
        live_tags=live,
        uploads=tuple(g.uploads),
        marker_etag=g.marker.etag if g.marker is not None else None,
        dead_tags=frozenset(g.dead),
        **extra,  # type: ignore[arg-type]
    )


def _shallow_info(info: CheckpointInfo, d: str, marker: Marker) -> CheckpointInfo:
    """A committed checkpoint the walk did not list: its size, objects and keys are what
    the marker commits; the rest stays unknown (:attr:`CheckpointInfo.shallow`)."""
    m = marker.manifest
    keys = dict(committed_keys(d, m)) if isinstance(m, Manifest) else {}
    keys[d + MANIFEST_NAME] = marker.info.size
    return dataclasses.replace(
        info,
        size=sum(keys.values()),
        num_objects=len(keys),
        keys=tuple(sorted(keys)),
        bytes_by_class={},
        metadata_stale=False,
        shallow=True,
    )


def _metadata_stale(plain: ObjectInfo | None, committed: float | None, manifest: Manifest) -> bool:
    """Whether the plain ``.metadata`` copy (``plain``, as listed) needs rewriting, the
    marker listed with LastModified ``committed`` (a cheap signal from the listing; the
    rewrite verifies the source against the marker)."""
    if manifest.metadata_key == METADATA_NAME:
        return False  # the plain .metadata is itself the committed one
    if plain is None or plain.size != manifest.metadata_size:
        return True
    at = plain.last_modified
    return committed is not None and at is not None and at < committed


def list_checkpoints(
    location: LocationLike, /, *, options: RetentionOptions | None = None
) -> list[CheckpointInfo]:
    """The checkpoints directly under a run, oldest first (by step, then commit time).

    Args:
        location: The run: a :class:`~s3ckpt.store.Location` or a URL.
        options: The run's settings: ``grace`` (how long after its last activity, an
            object, a heartbeat or an upload's start, a save is still in progress), ``now``
            (the time to judge ``grace`` against; default: the store's time) and
            ``step_pattern`` (reads a step from names the built-in forms do not read, see
            :func:`s3ckpt._step_names.checkpoint_step`; the marker's step still wins).

    Request cost: ``ceil(objects under run / 1000)`` LIST requests, one LIST of open
    multipart uploads per 1000 uploads, and one GET per committed checkpoint (its marker)
    and per pin, 16 at a time.
    """
    options = options if options is not None else RetentionOptions()
    location = Location.of(location)
    cat = run_catalog(location.store, location.url, options, shallow=options.scan == "shallow")
    return list(cat.checkpoints) if cat is not None else []


def run_catalog(
    store: ObjectStore, run: StoreURL, options: RetentionOptions, *, shallow: bool = False
) -> RunCatalog | None:
    """The catalog of ``run`` itself from a scan of it (``shallow``: see :func:`catalogs`);
    None when it holds nothing."""
    cats = catalogs(store, run, options, shallow=shallow)
    return next((cat for cat in cats if cat.run.prefix == run.prefix), None)


def probe_checkpoint(
    store: ObjectStore, run: StoreURL, name: str, record: CheckRecord | None
) -> CheckpointInfo | None:
    """One committed checkpoint judged without listing its run (what
    ``Checkpointer.latest()`` and ``load(step="latest")`` read for each candidate step): the
    checkpoint ``name`` of ``run`` as a shallow catalog records it, from a one-checkpoint
    "listing" made of its commit marker, damaged when its marker cannot be read or
    ``record`` (the run's ``s3ckpt.check.json``) found it damaged; None when it has no
    commit marker.

    Request cost: one GET (the marker).
    """
    prefix = run.child(name).prefix
    marker = probe(store, prefix)
    if marker is None:
        return None
    group = Group(marker=marker.info)
    group.touch(marker.info.last_modified)
    info = _info(run, run.prefix, prefix, group, marker.manifest, None, 0.0, None)
    return _shallow_info(info, prefix, marker).checked(record)


def list_runs(
    location: LocationLike, /, *, options: RetentionOptions | None = None
) -> list[StoreURL]:
    """The runs (prefixes holding checkpoints or a lease) under the location, itself
    included. Arguments as :func:`scan`'s.

    Same request cost as :func:`scan` over the location.
    """
    options = options if options is not None else RetentionOptions()
    store, root = (location := Location.of(location)).store, location.url
    if options.scan == "shallow":
        runs = find_runs(store, root, options.step_pattern)
        return [StoreURL(root.scheme, root.bucket, p) for p in runs]
    return [cat.run for cat in catalogs(store, root, options)]
