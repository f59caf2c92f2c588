"""A retention run's settings as one value: :class:`RetentionOptions`.

:func:`~s3ckpt.retention.prune`, :func:`~s3ckpt.retention.prune_runs`,
:func:`~s3ckpt.retention.gc`, :func:`~s3ckpt.retention.delete_checkpoint`, the catalog
(:func:`~s3ckpt.retention.scan`, :func:`~s3ckpt.retention.list_checkpoints`), the report and
the CLI take one of these. It is frozen and
validated at construction: a bad step pattern, batch size or delete limit is refused before
any request, and the step pattern is compiled here, once per run, and handed down compiled.

Below the entry points only the options value is passed, made concrete for the run by
:meth:`RetentionOptions.resolve` (the grace period's floor, the store's time).
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from s3ckpt._step_names import StepMatcher, compile_step_pattern
from s3ckpt.errors import ConfigError, PolicyError
from s3ckpt.retention._duration import format_duration
from s3ckpt.retention._lease import DEFAULT_LEASE_TTL
from s3ckpt.retention._liveness import DEFAULT_GRACE, MIN_GRACE, judge_time
from s3ckpt.retention._policy import check_int
from s3ckpt.retention._tiers import Tier
from s3ckpt.store.base import MAX_DELETE_BATCH

if TYPE_CHECKING:
    from s3ckpt.store import Location

__all__ = ["ProgressCallback", "RetentionOptions", "settle"]

ProgressCallback = Callable[[str, dict[str, Any]], None]
"""``on_progress(event, details)``: ``lease``, ``plan``, ``intent``, ``delete`` (after each
request: ``phase``, ``keys``), ``transition`` (after each object moved: ``checkpoint``,
``key``, ``storage_class``, ``bytes``), ``done``. For logs and for the crash tests."""

StepPatternLike = str | re.Pattern[str] | StepMatcher
"""A step pattern as callers give it; :class:`RetentionOptions` holds it compiled."""


@dataclass(frozen=True)
class RetentionOptions:
    """How a retention run judges and deletes (every field has a safe default).

    Attributes:
        grace: A save (a tag) is in progress while any of its objects, heartbeats or open
            uploads is younger than this (prune, gc and rm raise it to 60 s when shorter,
            with a note).
        now: The time policies and the grace period judge against (default: the store's
            time; when deleting, a refusal when this host's clock is further from it than
            the grace period). Must be timezone-aware.
        step_pattern: How checkpoint names give their steps: a regular expression with one
            capture group (a string is compiled here, once), or None for the built-in name
            forms (:func:`s3ckpt._step_names.checkpoint_step`). A step recorded in a commit
            marker always wins.
        include_foreign: Treat stock-DCP checkpoints (no marker) as committed; only their
            DCP names (``.metadata``, ``__{r}_{i}.distcp``) are deleted.
        max_delete: Delete at most this many checkpoints per run, the oldest first (None:
            no limit).
        lease_ttl: How long the run's lease lasts without renewal.
        batch_size: Keys per DeleteObjects request (1..1000).
        retries: Rounds of retries for throttled / 5xx per-key errors.
        sleep: Back-off sleep (tests pass a no-op).
        on_progress: Called with ``(event, details)`` as a run goes.
        scan: How a catalog is read: ``"deep"`` lists every key (exact: pins, live saves,
            storage classes); ``"shallow"`` walks folders with delimited listings and reads
            each commit marker instead of listing the checkpoint
            (:mod:`s3ckpt.retention._shallow`; a prune re-checks what it deletes deeply).
            gc and rm always list deeply.
        tiers: Storage tiers for what the policy keeps (:class:`~s3ckpt.retention.Tier`,
            first match wins); given here they win over a policy file's ``[[tier]]``
            tables. Empty: nothing changes class.

    Raises:
        ConfigError: A step pattern that is not a regular expression with one capture group,
            a batch size outside 1..1000 or negative retries. (A lease lifetime that is not
            positive is refused when a lease is taken: a dry run takes none.)
        ValueError: A ``now`` without a timezone.
        PolicyError: ``max_delete`` that is not an integer >= 0.
    """

    grace: timedelta = DEFAULT_GRACE
    now: datetime | None = None
    step_pattern: StepPatternLike | None = None
    include_foreign: bool = False
    max_delete: int | None = None
    lease_ttl: timedelta = DEFAULT_LEASE_TTL
    batch_size: int = MAX_DELETE_BATCH
    retries: int = 5
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)
    on_progress: ProgressCallback | None = field(default=None, repr=False)
    tiers: tuple[Tier, ...] = ()
    scan: str = "deep"

    def __post_init__(self) -> None:
        if self.scan not in ("deep", "shallow"):
            raise ConfigError(f"scan must be 'deep' or 'shallow', got {self.scan!r}")
        settle(self)
        if not 1 <= self.batch_size <= MAX_DELETE_BATCH:
            raise ConfigError(f"batch_size must be 1..{MAX_DELETE_BATCH}, got {self.batch_size}")
        if self.max_delete is not None:
            check_int(self.max_delete, "max_delete must be an integer >= 0", 0)
        if self.retries < 0:
            raise ConfigError(f"retries must be >= 0, got {self.retries}")
        if self.now is not None and self.now.tzinfo is None:
            raise ValueError("now must be timezone-aware (e.g. datetime.now(timezone.utc))")

    def progress(self, event: str, **details: Any) -> None:
        """Tell ``on_progress`` (when set) of ``event`` and its ``details``."""
        if self.on_progress is not None:
            self.on_progress(event, details)

    def replace(self, **changes: Any) -> RetentionOptions:
        """A copy with ``changes`` (validated again; a compiled pattern is not recompiled)."""
        return dataclasses.replace(self, **changes) if changes else self

    def resolve(
        self, location: Location, *, refuse: str | None = None
    ) -> tuple[RetentionOptions, tuple[str, ...]]:
        """These options made concrete for a run at ``location``, and notes for its result.

        The grace period is raised to :data:`~s3ckpt.retention.MIN_GRACE` when shorter (with
        a note), and ``now``, when not given, becomes the store's time (one request): this
        host's clock further from it than the grace period raises
        :class:`~s3ckpt.errors.ClockSkewError` when ``refuse`` names the action about to
        delete (``"gc"``, ``"prune s3://..."``), and is a note otherwise.
        """
        grace = max(self.grace, MIN_GRACE)
        notes: tuple[str, ...] = ()
        if grace > self.grace:
            notes = (
                f"grace {format_duration(max(self.grace, timedelta(0)))} is below the floor "
                f"of {format_duration(MIN_GRACE)} (four missed heartbeats); used "
                f"{format_duration(MIN_GRACE)}, so no setting can delete a running save",
            )
        now, skew = judge_time(location.store, location.url, self.now, grace, refuse=refuse)
        return self.replace(grace=grace, now=now), notes + skew


def settle(settings: Any) -> None:
    """Check a frozen dataclass's ``tiers`` (a tuple of :class:`~s3ckpt.retention.Tier`) and
    compile its ``step_pattern`` (:func:`~s3ckpt._step_names.compile_step_pattern`, cached:
    a compiled pattern handed on is the same object), in place."""
    object.__setattr__(settings, "tiers", tuple(settings.tiers))
    for t in settings.tiers:
        if not isinstance(t, Tier):
            raise PolicyError(f"tiers must hold s3ckpt.retention.Tier values, got {t!r}")
    if settings.step_pattern is not None:
        object.__setattr__(settings, "step_pattern", compile_step_pattern(settings.step_pattern))
