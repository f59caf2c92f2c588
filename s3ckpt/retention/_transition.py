"""Carrying storage-tier transitions out: list what a checkpoint has left to move, then move it.

:func:`~s3ckpt.retention._tiers.plan_tiers` says which kept checkpoint goes to which class;
this module asks the store. Decisions:

* **What moves.** The objects the commit marker commits (the data objects, in the run's
  shard folder too for hashed prefixes) and the plain ``.metadata`` (:func:`movable_keys`),
  so a load of a GLACIER / DEEP_ARCHIVE checkpoint fails at its first read, of
  ``.metadata``. What stays: the commit marker ``s3ckpt.json`` and every ``s3ckpt.*``
  control object (pins, heartbeats, failure records), so ``ls``, prune, gc and the report
  never need a restore; and the committed per-save ``.metadata.{tag}``, whose LastModified
  is the checkpoint's commit time (:mod:`s3ckpt.retention._catalog`): a copy onto itself
  would move the commit "later" and change what ``within``, the calendar, ``after`` and
  "most recently committed" decide. Foreign files under the prefix are never touched.
* **Fresh listing.** Each checkpoint to move is listed again (:func:`survey`: one LIST per
  folder holding its objects, 16 checkpoints at a time), with storage classes. Objects in
  the class already are not touched, so a converged run sends no copy. Objects in an
  archive class (GLACIER, DEEP_ARCHIVE) are never copied: that needs a restore. A
  checkpoint whose marker changed or vanished since the scan, or into which a save started
  writing (an object of another save tag younger than the grace period), is skipped.
* **Each object**: ``set_storage_class(key, class, etag=listed, size=listed)`` (CopyObject
  onto itself, only while the object is the one listed), or, for ``method="tag"``,
  ``put_object_tags(key, {"s3ckpt-tier": class})``; :data:`COPY_WORKERS` at a time, the
  lease renewed before each. A 404/412 (the object changed since the listing) skips the
  rest of its checkpoint; other errors are failures, counted, and the run goes on.
* **Crash safety.** Before the first copy the run records the transitions in its lease
  (``moving``, beside the deletions' intent log). A run killed half-way leaves some objects
  moved; whoever takes the lease next finishes the recorded transitions first (unless the
  checkpoint is now deleted, re-committed or being written), and any plan sees the
  remaining objects still in their old class anyway. Copying an object twice is harmless.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import timedelta

from s3ckpt.errors import ObjectNotFoundError, PreconditionFailedError, StoreError
from s3ckpt.format._names import MANIFEST_NAME, METADATA_NAME, owned_tag
from s3ckpt.metrics.instrument import in_context
from s3ckpt.retention._catalog import DEFAULT_STORAGE_CLASS, CheckpointInfo
from s3ckpt.retention._check_record import read_each
from s3ckpt.retention._deleter import failure
from s3ckpt.retention._lease import Lease
from s3ckpt.retention._options import RetentionOptions
from s3ckpt.retention._plan import Plan
from s3ckpt.retention._tiers import ARCHIVE_CLASSES, TIER_TAG, Transition
from s3ckpt.store.base import DeleteFailure, ObjectInfo, ObjectStore, archive_store

__all__ = ["COPY_WORKERS", "Mover", "intent_of", "movable_keys", "survey", "survey_plan"]

COPY_WORKERS = 16
"""Objects copied (or tagged) at once: a CopyObject is a server-side copy, so the bound is
the store's request rate, not this host's bandwidth."""

Pending = dict[str, list[ObjectInfo]]
"""Per checkpoint name: the listed objects still to move."""


def movable_keys(c: CheckpointInfo) -> frozenset[str]:
    """The keys of ``c`` a tier moves (see the module docstring): the committed keys but the
    marker and the per-save ``.metadata.{tag}``, plus the plain ``.metadata``."""
    stays = ("s3ckpt.", METADATA_NAME + ".")
    moves = (k for k in c.committed_keys if not k.rpartition("/")[2].startswith(stays))
    return frozenset({c.url.key(METADATA_NAME), *moves})


def survey(
    store: ObjectStore, transitions: Sequence[Transition], cutoff: float
) -> tuple[tuple[Transition, ...], Pending]:
    """List each transition's checkpoint afresh: the transitions with ``objects``,
    ``bytes``, ``from_classes`` (and ``skipped`` where it must not move now), and the
    objects still to move per checkpoint name.

    ``cutoff``: the store's time minus the grace period (seconds since the epoch); an
    object of another save tag newer than it means a save is writing into the checkpoint.

    Request cost: one LIST (per 1000 keys) per folder holding the checkpoint's objects
    (its prefix; for hashed prefixes also each shard folder), 16 checkpoints at a time.
    """
    done = read_each(lambda t: _survey_one(store, t, cutoff), transitions)
    pending = {t.name: objs for t, objs in done if t.skipped is None and objs}
    return tuple(t for t, _ in done), pending


def _survey_one(
    store: ObjectStore, t: Transition, cutoff: float
) -> tuple[Transition, list[ObjectInfo]]:
    c = t.checkpoint
    movable = movable_keys(c)
    folders = sorted({c.url.prefix} | {k.rpartition("/")[0] + "/" for k in movable})
    listed: dict[str, ObjectInfo] = {}
    for folder in folders:
        for o in store.list(folder):
            listed.setdefault(o.key, o)
    marker = listed.get(c.url.key(MANIFEST_NAME))
    why: str | None = None
    if marker is None:
        why = "its commit marker is gone since the scan (deleted or being deleted)"
    elif c.marker_etag is not None and marker.etag is not None and marker.etag != c.marker_etag:
        why = "its commit marker changed since the scan (an overwrite committed)"
    elif (writing := _writing_tag(c, listed.values(), cutoff)) is not None:
        why = f"a save (tag {writing}) started writing into it"
    if why is not None:
        return replace(t, skipped=f"not moved: {why}", objects=0, bytes=0), []
    todo = [
        o
        for k, o in sorted(listed.items())
        if k in movable
        and (o.storage_class or DEFAULT_STORAGE_CLASS) not in (t.storage_class, *ARCHIVE_CLASSES)
    ]
    classes: Counter[str] = Counter()
    for o in todo:
        classes[o.storage_class or DEFAULT_STORAGE_CLASS] += o.size
    return replace(t, objects=len(todo), bytes=classes.total(), from_classes=dict(classes)), todo


def _writing_tag(c: CheckpointInfo, objects: Iterable[ObjectInfo], cutoff: float) -> str | None:
    """The tag of a save other than the committed one with an object younger than
    ``cutoff`` under the checkpoint's prefix (a heartbeat, a data object, its metadata)."""
    prefix = c.url.prefix
    young = (
        owned_tag(o.key[len(prefix) :])
        for o in objects
        if o.key.startswith(prefix) and o.last_modified is not None and o.last_modified > cutoff
    )
    return next((t for t in young if t is not None and t != c.tag), None)


def intent_of(transitions: Sequence[Transition]) -> dict[str, dict[str, str]]:
    """The lease's ``moving`` record of ``transitions`` (name -> class, method, marker)."""
    return {
        t.name: {
            "class": t.storage_class,
            "method": t.method,
            "marker": t.checkpoint.marker_etag or "",
        }
        for t in transitions
    }


@dataclass
class Mover:
    """Moves the listed objects of transitions: copies (or tags) :data:`COPY_WORKERS` at a
    time, renewing the lease before each request, and counts what it did.

    Attributes:
        store: The store.
        lease: The run's lease (None: no lease, as in tests).
        options: The run's ``on_progress``, called with ``("transition", {checkpoint, key,
            storage_class, bytes})`` after each object moved.
        requests: Copy or tagging requests sent (S3Store's retries not counted).
        objects: Objects moved (or tagged).
        bytes: Their bytes.
        failures: Objects that could not be moved, with the store's code.
        changed: Checkpoints an object of which changed since the listing (skipped).
    """

    store: ObjectStore
    lease: Lease | None = None
    options: RetentionOptions = field(default_factory=RetentionOptions)
    requests: int = 0
    objects: int = 0
    bytes: int = 0
    failures: list[DeleteFailure] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def move(
        self, transitions: Sequence[Transition], pending: Mapping[str, list[ObjectInfo]]
    ) -> tuple[str, ...]:
        """Move every object in ``pending`` of ``transitions`` (those not skipped); return
        the names whose every object is now in its class (or tagged)."""
        work = [(t, o) for t in transitions if t.skipped is None for o in pending.get(t.name, ())]
        stop = threading.Event()  # a worker raised: start no further request

        def run(item: tuple[Transition, ObjectInfo]) -> bool:
            try:
                return not stop.is_set() and self._one(*item)
            except BaseException:
                stop.set()
                raise

        # The first error is raised once the pool has let the others finish (or skip).
        with ThreadPoolExecutor(max_workers=COPY_WORKERS) as pool:
            oks = list(pool.map(in_context(run), work))
        bad = {t.name for (t, _), ok in zip(work, oks, strict=True) if not ok}
        return tuple(t.name for t in transitions if t.skipped is None and t.name not in bad)

    def _one(self, t: Transition, o: ObjectInfo) -> bool:
        with self._lock:
            if t.name in self.changed:
                return False
            if self.lease is not None:
                self.lease.renew_if_due()
            self.requests += 1
        try:
            store = archive_store(self.store, o.key, "set_storage_class")
            if t.method == "tag":
                store.put_object_tags(o.key, {TIER_TAG: t.storage_class})
            else:
                store.set_storage_class(o.key, t.storage_class, etag=o.etag, size=o.size)
        except (PreconditionFailedError, ObjectNotFoundError):
            with self._lock:
                if t.name not in self.changed:
                    self.changed.append(t.name)
            return False
        except StoreError as exc:
            with self._lock:
                self.failures.append(failure(o.key, exc))
            return False
        with self._lock:
            self.objects += 1
            self.bytes += o.size
        self.options.progress(
            "transition", checkpoint=t.name, key=o.key, storage_class=t.storage_class, bytes=o.size
        )
        return True

    def changed_notes(self) -> tuple[str, ...]:
        """One note per checkpoint skipped because an object changed after the listing."""
        return tuple(
            f"{name}: an object changed after it was listed (an overwrite?): its transition "
            "stopped; the next run plans it again"
            for name in self.changed
        )


def survey_plan(store: ObjectStore, plan: Plan, grace: timedelta) -> Plan:
    """``plan`` with its transitions listed (:func:`survey`): what each would move, by
    class, in objects and bytes. ``grace``: the run's grace period (a save tag active
    within it of ``plan.now`` is writing). For the report and dry runs; a prune does this
    itself.

    Request cost: as :func:`survey`, nothing without transitions.
    """
    moves, _ = survey(store, plan.transitions, (plan.now - grace).timestamp())
    return replace(plan, transitions=moves)
