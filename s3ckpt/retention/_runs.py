"""Pruning every run under a prefix (``s3ckpt prune PATH``): :func:`prune_runs`.

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

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

from s3ckpt.errors import LeaseHeldError
from s3ckpt.metrics import OperationMetrics, RunMetrics, capture
from s3ckpt.retention._liveness import MIN_GRACE, judge_time
from s3ckpt.retention._options import RetentionOptions
from s3ckpt.retention._plan import check_policy
from s3ckpt.retention._policy import Policy
from s3ckpt.retention._prune import prune_location
from s3ckpt.retention._results import PruneResult
from s3ckpt.retention._scan import run_urls
from s3ckpt.retention._toml import PolicyFile
from s3ckpt.store import Location, LocationLike
from s3ckpt.uri import StoreURL

__all__ = ["PruneRuns", "RunOutcome", "prune_runs"]


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
        policy: The policy every run is pruned with.
        apply: Delete (False: every run is a dry run).
        options: The settings every run gets (``now`` set: the walk's one time).
        source: ``policy`` as a :class:`~s3ckpt.retention.PolicyFile`, checked.
    """

    root: Location
    notes: tuple[str, ...]
    policy: Policy | PolicyFile
    apply: bool
    options: RetentionOptions
    source: PolicyFile

    @cached_property
    def runs(self) -> tuple[StoreURL, ...]:
        """The runs under :attr:`root` (itself included when it is a run), in order: one
        scan of the prefix, made once."""
        return run_urls(self.root.store, self.root.url, self.options)

    def __iter__(self) -> Iterator[RunOutcome]:
        """Prune each run in turn, yielding its outcome once it is done."""
        for run in self.runs:
            try:
                with capture() as events:
                    result = prune_location(
                        self.root.at(run),
                        self.source,
                        self.policy.describe(),
                        apply=self.apply,
                        options=self.options,
                    )
            except LeaseHeldError as exc:
                yield RunOutcome(run, busy=exc)
                continue
            mine = [e for e in events if e.kind == "prune" and e.url == str(run)]
            yield RunOutcome(run, result, event=mine[-1] if mine else None)


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
    source = PolicyFile.of(policy)
    check_policy(source.policy)  # once for every run, before any request
    root = location.url
    # The skew limit is the grace period every run uses, after its floor; each run raises
    # its own grace (with its own note) as prune does.
    now, notes = judge_time(
        location.store,
        root,
        options.now,
        max(options.grace, MIN_GRACE),
        refuse=f"prune {root}" if apply else None,
    )
    return PruneRuns(location, notes, policy, apply, options.replace(now=now), source)
