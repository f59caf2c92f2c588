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

Two halves, as restic's ``PlanPrune`` / ``PrunePlan.Execute``: :func:`plan_prune` decides
everything first, a :class:`PrunePlan` (what to delete and why, what a dead holder left to
finish, what moves; a dry run prints its plan), then :meth:`PrunePlan.execute` carries it out
as a sequence of named steps, each a conditional write or delete with its intent recorded
first: record the intent, fence every marker with a tombstone, delete the objects, finish
or lift each fence, move the tiers' objects, clear what finished from the intent log.

Pruning every run under a prefix (``s3ckpt prune PATH``), :func:`prune_runs`:

The runs share one time, the store's, read once before any run: when applying, a host whose
clock is further from it than the grace period is refused there
(:class:`~s3ckpt.errors.ClockSkewError`), before anything is deleted; otherwise that is a
note. The runs are then pruned one at a time, as the caller iterates, so a caller can show
each run's result as it finishes. A run whose lease another pruner holds is skipped (its
outcome says so, nothing of it changed) and the others are still pruned; any other error
stops the walk.

Each run publishes its own ``"prune"`` event (:mod:`s3ckpt.metrics`), which its outcome
carries for the metrics text file (:meth:`RunOutcome.run_metrics`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

from s3ckpt.errors import LeaseHeldError
from s3ckpt.metrics import OperationMetrics, RunMetrics, capture, instrument
from s3ckpt.retention._catalog import CheckpointInfo
from s3ckpt.retention._deleter import Deleter
from s3ckpt.retention._intent import Intent, finish_previous, previous_moves
from s3ckpt.retention._lease import Lease
from s3ckpt.retention._liveness import MIN_GRACE, judge_time
from s3ckpt.retention._options import RetentionOptions
from s3ckpt.retention._plan import Plan, decide, hold
from s3ckpt.retention._policy import Policy
from s3ckpt.retention._recheck import confirm, deep
from s3ckpt.retention._results import PruneResult, last_event
from s3ckpt.retention._scan import list_runs, run_catalog
from s3ckpt.retention._tiers import Transition
from s3ckpt.retention._toml import PolicyFile
from s3ckpt.retention._transition import Mover, Pending, intent_of, survey
from s3ckpt.store import Location
from s3ckpt.store._location import LocationLike
from s3ckpt.store.base import ObjectStore
from s3ckpt.uri import StoreURL

__all__ = [
    "PrunePlan",
    "PruneRuns",
    "RunOutcome",
    "plan_prune",
    "prune",
    "prune_runs",
]


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
    source = PolicyFile.of(policy)  # checked: an empty policy is refused before any request
    location = Location.of(location)
    store, run = location.store, location.url
    refuse = f"prune {run}" if apply else None
    options, notes = source.options(options).resolve(location, refuse=refuse)
    with instrument.operation("prune", str(run)) as recorder:
        if not apply:
            pp = plan_prune(store, run, source, options)
            recorder.finish(dry_run=True)
            notes += (pp.held,) if pp.held else ()
            return PruneResult(run=run, plan=pp.plan, applied=False, notes=notes, held=pp.held)
        waited = time.monotonic()
        try:
            lease = Lease(store, run, ttl=options.lease_ttl).acquire()
        except LeaseHeldError as exc:
            recorder.finish(exc, lease_busy=1, lease_wait_s=time.monotonic() - waited)
            raise
        lease_wait = time.monotonic() - waited
        try:
            with Intent(lease) as intent:
                options.progress("lease", owner=lease.owner, resumed=bool(lease.previous))
                pp = plan_prune(store, run, source, options, lease)
                deleter, mover, deleted, moved = pp.execute(store, intent, options)
        except BaseException as exc:
            recorder.finish(exc, lease_wait_s=lease_wait)
            raise
        failures = len(deleter.failures) + len(mover.failures)
        options.progress("done", deleted=len(deleted), failures=failures)
        gone = set(deleted)
        recorder.finish(
            "DeleteFailures" if deleter.failures else "TransitionFailures" if failures else None,
            deleted=len(deleted),
            bytes_freed=sum(c.size for c in pp.targets if c.name in gone),
            lease_wait_s=lease_wait,
        )
    resume, resumed_moves = pp.resume, {m.name for m in pp.moves if m.resumed}
    held = (pp.held,) if pp.held else ()
    return PruneResult(
        run=run,
        plan=pp.plan,
        applied=True,
        deleted=deleted,
        resumed=tuple(c.name for c in resume),
        held=pp.held,
        **deleter.counts(),
        resumed_bytes=sum(c.size for c in resume),
        resumed_objects=sum(c.num_objects for c in resume),
        notes=notes + held + deleter.changed_notes() + mover.changed_notes(),
        transitioned=tuple(n for n in moved if n in pp.pending),
        resumed_moves=tuple(n for n in moved if n in pp.pending and n in resumed_moves),
        objects_moved=mover.objects,
        bytes_moved=mover.bytes,
        transition_requests=mover.requests,
        transition_failures=tuple(mover.failures),
    )


@dataclass(frozen=True)
class PrunePlan:
    """Everything one prune does, decided before any change.

    Attributes:
        plan: The policy's plan (its transitions listed afresh).
        held: Why its deletions are held back (the run's check record is unreadable).
        resume: Checkpoints a dead holder of the lease was deleting: finished first.
        carry: Names of its intent log kept for a later run (a save writes there now).
        moves: The transitions to carry out (planned and resumed), as listed now.
        pending: Per checkpoint name, the objects still to move.
        moving: The transitions' intent record (carried and pending).
    """

    plan: Plan
    held: str | None = None
    resume: tuple[CheckpointInfo, ...] = ()
    carry: tuple[str, ...] = ()
    moves: tuple[Transition, ...] = ()
    pending: Pending = dataclasses.field(default_factory=dict)
    moving: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)

    @property
    def targets(self) -> list[CheckpointInfo]:
        """What the execution deletes: the resumed checkpoints, then the plan's."""
        return [*self.resume, *self.plan.delete]

    def execute(
        self, store: ObjectStore, intent: Intent, options: RetentionOptions
    ) -> tuple[Deleter, Mover, tuple[str, ...], tuple[str, ...]]:
        """Carry the plan out under ``intent``'s lease, step by step (see the module
        docstring); the deleter and mover (their counts and failures), the names deleted and
        the names moved."""
        deleter = Deleter(store, intent.lease, options)
        mover = Mover(store, intent.lease, options)
        targets = self.targets
        # 1. the intent, before the first change
        intent.record(targets, self.carry, self.moving)
        if targets or self.moving:
            options.progress("intent", names=intent.names, moving=sorted(self.moving))
        # 2-4. fence each marker, delete the objects, finish or lift each fence
        deleted = deleter.delete_checkpoints(targets) if targets else ()
        # 5. the tiers' moves
        moved = mover.move(self.moves, self.pending) if self.pending else ()
        # 6. what finished (or changed under us: left to the next plan) leaves the log
        intent.finished([*deleted, *deleter.changed], [*moved, *mover.changed])
        return deleter, mover, deleted, moved


def plan_prune(
    store: ObjectStore,
    run: StoreURL,
    source: PolicyFile,
    options: RetentionOptions,
    lease: Lease | None = None,
) -> PrunePlan:
    """Decide one prune of ``run`` (``options`` resolved): the catalog, what a dead holder
    of ``lease`` left (None: a dry run, nothing resumed), the policy's plan (a shallow one
    confirmed deeply), deletions held back when the check record cannot be read, and the
    transitions listed afresh. Sends no write."""
    now = options.now
    assert now is not None  # resolved: the store's time, or the caller's
    cat = run_catalog(store, run, options, shallow=options.scan == "shallow")
    catalog = list(cat.checkpoints) if cat is not None else []
    held = (
        cat is not None
        and cat.check_error
        and (
            f"deletions held back: {cat.check_error}; what s3ckpt check found there is "
            "unknown, so the newest checkpoint kept may be damaged. Fix access to it (or "
            "delete it to forget the findings) and prune again"
        )
    )
    resume, carry, catalog = finish_previous(lease, catalog)
    # What a shallow record does not know (the plain .metadata, other saves' names) is what
    # a finished deletion must not leave behind: list each one deeply.
    resume = [d for c in resume if (d := deep(store, options, c) if c.shallow else c)]
    rules = source.policy
    p = decide(catalog, rules, now, options, run, source.describe())
    p = confirm(store, run, options, rules, p)  # shallow: what p deletes, listed deeply
    if held:
        p = hold(p, ("held back: the run's check record is unreadable",))
    extra = {"resume": len(resume)} if lease is not None else {}
    options.progress("plan", delete=len(p.delete), **extra, move=len(p.transitions))
    planned = {c.name for c in p.delete} | {t.name for t in p.transitions}
    old_moves, carry_moves = previous_moves(lease, catalog, planned)
    # Listed after the plan: a save that started writing since the scan is seen here.
    moves, pending = survey(store, [*p.transitions, *old_moves], (now - options.grace).timestamp())
    p = dataclasses.replace(p, transitions=tuple(m for m in moves if not m.resumed))
    moving = {**carry_moves, **intent_of([m for m in moves if m.name in pending])}
    return PrunePlan(p, held or None, tuple(resume), tuple(carry), moves, pending, moving)


@dataclass(frozen=True)
class RunOutcome:
    """What :func:`prune_runs` did in one run.

    Attributes:
        run: The run.
        result: The run's :class:`~s3ckpt.retention.PruneResult` (None when skipped).
        busy: Why the run was skipped: another pruner held its lease (nothing changed).
        event: The run's ``"prune"`` event (bytes freed, the lease wait), when published.
    """

    run: StoreURL
    result: PruneResult | None = None
    busy: LeaseHeldError | None = None
    event: OperationMetrics | None = None

    def run_metrics(self) -> RunMetrics:
        """The run's values for the metrics text file (a skipped run: its busy lease)."""
        if self.result is None:
            return RunMetrics(run=str(self.run), lease_busy=1)
        return self.result.run_metrics(() if self.event is None else (self.event,))


@dataclass(frozen=True)
class PruneRuns:
    """The runs under a prefix, pruned one at a time as they are iterated
    (:func:`prune_runs` makes one; the prefix is scanned when :attr:`runs` is first read).

    Attributes:
        root: The prefix.
        notes: About the whole walk: this host's clock far from the store's (a dry run).
        apply: Delete (False: every run is a dry run).
        options: The settings every run gets (``now`` set: the walk's one time).
        source: The policy every run is pruned with, as a
            :class:`~s3ckpt.retention.PolicyFile`, checked.
    """

    root: Location
    notes: tuple[str, ...]
    apply: bool
    options: RetentionOptions
    source: PolicyFile

    @cached_property
    def runs(self) -> tuple[StoreURL, ...]:
        """The runs under :attr:`root` (itself included when it is a run), in order: one
        scan of the prefix, made once."""
        return tuple(list_runs(self.root, options=self.options))

    def __iter__(self) -> Iterator[RunOutcome]:
        """Prune each run in turn, yielding its outcome once it is done."""
        for run in self.runs:
            try:
                with capture() as events:
                    result = prune(
                        self.root.at(run), self.source, apply=self.apply, options=self.options
                    )
            except LeaseHeldError as exc:
                yield RunOutcome(run, busy=exc)
                continue
            yield RunOutcome(run, result, event=last_event(events, "prune", run))


def prune_runs(
    location: LocationLike,
    policy: Policy | PolicyFile,
    /,
    *,
    apply: bool = False,
    options: RetentionOptions | None = None,
) -> PruneRuns:
    """:func:`~s3ckpt.retention.prune` for every run under a prefix (the prefix itself
    included when it is a run), one run at a time as the result is iterated::

        runs = prune_runs("s3://bucket/runs/", PolicyFile.load("pretraining"), apply=True)
        for outcome in runs:
            print(outcome.run, outcome.busy or outcome.result.deleted)

    Arguments as :func:`~s3ckpt.retention.prune`'s; every run is judged at one time, the
    options' ``now`` or the store's time read here once.

    Raises:
        PolicyError: The policy is empty (before any request).
        ClockSkewError: With ``apply`` and no ``now``: this host's clock is further from
            the store's than the grace period; nothing deleted.
        ConfigError: A bad step pattern (before any request).

    Request cost: without ``now`` one LIST of one key for the store's time here; a scan of
    the prefix (:func:`~s3ckpt.retention.scan`) when the runs are first read; then, as it
    is iterated, one :func:`~s3ckpt.retention.prune` per run.
    """
    options = options if options is not None else RetentionOptions()
    location = Location.of(location)
    source = PolicyFile.of(policy)  # checked once for every run, before any request
    root = location.url
    refuse = f"prune {root}" if apply else None
    # The skew limit is the grace period every run uses, after its floor; each run raises
    # its own grace (with its own note) as prune does.
    now, notes = judge_time(
        location.store, root, options.now, max(options.grace, MIN_GRACE), refuse=refuse
    )
    return PruneRuns(location, notes, apply, options.replace(now=now), source)
