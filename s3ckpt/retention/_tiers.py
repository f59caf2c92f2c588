"""Storage tiers: which S3 storage class a kept checkpoint should be in, chosen by policy.

A :class:`Tier` names a storage class for the checkpoints its ``rule`` selects (a rule in
the same vocabulary as a policy's ``[keep]``: ``KeepEvery(1000)``, ``KeepBest(3, "loss")``),
once ``after`` has passed since their commit. :func:`plan_tiers` gives, for every checkpoint a
plan KEEPS, the first tier (in the order given) that selects it and whose ``after`` has
passed: a :class:`Transition`. Pure: no store, no clock (``now`` is the store's time the run
judges by, as for every other rule).

Decisions taken here:

* Only committed, readable checkpoints the plan keeps are candidates; never one being written
  into (an overwrite in progress), never an uncommitted, abandoned, failed, foreign or
  damaged one, never one the plan deletes (its copies would be wasted requests).
* The rules see the same catalog as ``[keep]`` (the committed, readable checkpoints), so
  ``best = {metric = "loss", n = 3}`` means the same three in both places.
* The run's resume points never go to an archive class: its newest committed checkpoint and
  its most recently committed one (the two that deletion never touches either,
  :func:`~s3ckpt.retention._plan.newest`) skip a GLACIER or DEEP_ARCHIVE tier until a newer
  one is committed (a later tier may still take them). A job that restarts loads
  ``step="latest"`` at once, and from an archive class that load would fail until a restore
  finished, hours later. Classes that read at once (the IA classes, GLACIER_IR) take them as
  the policy says.
* A checkpoint no tier selects stays where it is: nothing moves back to STANDARD. A move
  back would be a paid copy that resets the minimum storage duration (30 days for the IA
  classes, 90 for GLACIER_IR and GLACIER, 180 for DEEP_ARCHIVE) and is charged as an early
  deletion of the class it leaves; a rule that stops selecting (``best`` when a better
  checkpoint arrives) would otherwise bounce a checkpoint between classes.
* STANDARD is not a tier's class (see above). GLACIER and DEEP_ARCHIVE are allowed, but a
  load of such a checkpoint needs ``s3ckpt restore`` first (it fails at once with
  :class:`~s3ckpt.errors.ArchivedObjectError`).
* ``method="tag"`` does not copy: it tags the objects ``s3ckpt-tier=<CLASS>`` and leaves
  the move to a bucket lifecycle rule on that tag (docs/retention.md, "The lifecycle
  alternative").

What moves and what stays (:func:`movable_keys`) is decided in
:mod:`s3ckpt.retention._transition`, which carries the transitions out.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Literal

from s3ckpt.errors import PolicyError
from s3ckpt.retention._catalog import CheckpointInfo
from s3ckpt.retention._duration import MAX_DURATION, format_duration
from s3ckpt.retention._policy import KeepPinned, Policy
from s3ckpt.store.base import ARCHIVE_CLASSES

__all__ = [
    "ARCHIVE_CLASSES",
    "STORAGE_CLASSES",
    "TIER_TAG",
    "Tier",
    "TierMethod",
    "Transition",
    "plan_tiers",
]

STORAGE_CLASSES = (
    "STANDARD_IA",
    "ONEZONE_IA",
    "INTELLIGENT_TIERING",
    "GLACIER_IR",
    "GLACIER",
    "DEEP_ARCHIVE",
)
"""The S3 storage classes a tier may name (STANDARD is where objects start: never a tier)."""

TIER_TAG = "s3ckpt-tier"
"""The object tag ``method="tag"`` sets (value: the class); a lifecycle rule on it moves."""

TierMethod = Literal["copy", "tag"]


@dataclass(frozen=True)
class Tier:
    """Keep what ``rule`` selects in ``storage_class``, once ``after`` has passed.

    Example::

        Tier(KeepEvery(1000), "GLACIER_IR", after=timedelta(days=7))
        Tier(KeepBest(3, "loss"), "STANDARD_IA")

    Attributes:
        rule: Which kept checkpoints the tier selects: any retention rule (``|`` and ``&``
            combine), evaluated over the same catalog as the policy's rules.
        storage_class: One of :data:`STORAGE_CLASSES`. ``GLACIER`` and ``DEEP_ARCHIVE``
            need a restore before a load.
        after: How long after its commit (in the store's time) a checkpoint may move;
            None: at once.
        method: ``"copy"`` (CopyObject onto itself with the new class, done by the pruner)
            or ``"tag"`` (tag the objects ``s3ckpt-tier=<CLASS>`` and let a lifecycle rule
            move them).

    Raises:
        PolicyError: An unknown class or method, a rule that is not a retention rule (or
            holds only ``pinned``), or ``after`` negative or longer than 100 years.
    """

    rule: Policy
    storage_class: str
    after: timedelta | None = None
    method: TierMethod = "copy"

    def __post_init__(self) -> None:
        if not isinstance(self.rule, Policy):
            raise PolicyError(f"Tier.rule must be a retention rule, got {self.rule!r}")
        if not [r for r in self.rule.rules() if not isinstance(r, KeepPinned)]:
            raise PolicyError(
                "Tier.rule has no rule besides pinned: name one of last, every, within, "
                "best, calendar"
            )
        if self.storage_class not in STORAGE_CLASSES:
            raise PolicyError(
                f"Tier.storage_class {self.storage_class!r} is not a storage class a tier may "
                f"name; use one of {', '.join(STORAGE_CLASSES)}"
            )
        if (after := self.after) is not None and (
            not isinstance(after, timedelta) or after < timedelta(0) or after > MAX_DURATION
        ):
            raise PolicyError(
                f"Tier.after must be a duration from 0 to {MAX_DURATION.days} days, got {after!r}"
            )
        if self.method not in ("copy", "tag"):
            raise PolicyError(f"Tier.method must be 'copy' or 'tag', got {self.method!r}")

    @property
    def archive(self) -> bool:
        """Whether a load of what this tier moves needs a restore first."""
        return self.storage_class in ARCHIVE_CLASSES

    def describe(self) -> str:
        """``every 1000 steps -> GLACIER_IR after 7d`` (``(tag)`` for the tag method)."""
        text = f"{self.rule.describe()} -> {self.storage_class}"
        if self.after:
            text += f" after {format_duration(self.after)}"
        return text + (" (tag)" if self.method == "tag" else "")

    def __str__(self) -> str:
        return self.describe()


@dataclass(frozen=True)
class Transition:
    """One checkpoint a tier moves: which, where to, why, and (once its objects were
    listed, :mod:`s3ckpt.retention._transition`) what it moves.

    Attributes:
        checkpoint: The kept checkpoint.
        tier: The tier's index in the policy (file order, 0 first).
        storage_class: The target class.
        method: ``"copy"`` or ``"tag"``.
        reasons: Why the tier selects it (the rule's reasons, and the age after ``after``).
        objects: Objects not yet in the class (None: not listed yet).
        bytes: Their bytes (None: not listed yet).
        from_classes: Their bytes by the class they are in now.
        skipped: Why it is not moved by this run (being written into, changed since the
            scan), or None.
        resumed: Finishing a move a pruner that died left half-done (its intent log).
    """

    checkpoint: CheckpointInfo
    tier: int
    storage_class: str
    method: TierMethod = "copy"
    reasons: tuple[str, ...] = ()
    objects: int | None = None
    bytes: int | None = None
    from_classes: Mapping[str, int] = field(default_factory=dict)
    skipped: str | None = None
    resumed: bool = False

    @property
    def name(self) -> str:
        """The checkpoint's name."""
        return self.checkpoint.name

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (``s3ckpt prune --json``, ``transitions``)."""
        c = self.checkpoint
        own = {f.name: getattr(self, f.name) for f in fields(self)[1:]}
        own.update(from_classes=dict(self.from_classes), reasons=list(self.reasons))
        return {"checkpoint": c.name, "url": str(c.url), "step": c.step, **own}


def plan_tiers(
    eligible: Sequence[CheckpointInfo],
    kept: Mapping[str, object],
    tiers: Sequence[Tier],
    now: datetime,
    *,
    resume: Collection[str] = (),
) -> tuple[Transition, ...]:
    """The transitions of one run's kept checkpoints, in catalog order.

    Args:
        eligible: The catalog the policy's rules saw (committed, readable; oldest first).
        kept: Names the plan keeps (anything else is never moved).
        tiers: The policy's tiers, in order: the first that selects a checkpoint and whose
            ``after`` has passed wins.
        now: The store's time the run judges by.
        resume: Names of the run's resume points (its newest and most recently committed
            checkpoints): never moved to an archive class.

    Cost: one ``select`` per tier over ``eligible``; no I/O.
    """
    picks = [t.rule.select(eligible, now) for t in tiers]
    out: list[Transition] = []
    for c in eligible:
        # Never one being written into (an overwrite in progress).
        if c.name not in kept or not c.is_committed or c.damaged or c.overwrite_in_progress:
            continue
        for i, (tier, pick) in enumerate(zip(tiers, picks, strict=True)):
            reasons = pick.get(c.name)
            late = tier.after and (c.committed_at is None or c.committed_at + tier.after > now)
            # A resume point must load without a restore: never to an archive class.
            if reasons is None or late or (tier.archive and c.name in resume):
                continue
            why = tuple(reasons)
            if tier.after and c.committed_at is not None:  # not late: ``after`` ago or more
                why += (
                    f"committed {format_duration(now - c.committed_at)} ago (after "
                    f"{format_duration(tier.after)})",
                )
            out.append(Transition(c, i, tier.storage_class, tier.method, why))
            break
    return tuple(out)
