"""Retention policies: small frozen rules, pure functions of (catalog, now).

Each rule answers one question: *which of these committed checkpoints do I keep, and why?*
``select(checkpoints, now)`` gets the eligible checkpoints of one run, oldest first (the
catalog's order: step, then commit time), and returns ``{name: (reason, ...)}`` for those
it keeps. A rule never reads the clock (``now`` is an argument) and never sees in-progress,
abandoned or foreign checkpoints; the invariants (newest committed, pinned, in progress)
are applied by :func:`~s3ckpt.retention.plan` on top of any rule, so no rule can break them.

Rules combine like tenacity's strategies::

    policy = KeepLast(3) | KeepEvery(10_000) | KeepBest(2, "val_loss")   # keep if any keeps
    policy = KeepWithin(timedelta(days=7)) & KeepEvery(1_000)             # keep if all keep

Every rule is *hereditary*: a checkpoint it keeps in a catalog is still kept in any
sub-catalog that contains it (deleting others never changes its mind). That is what makes
planning idempotent: prune twice and the second run deletes nothing.

Steps come from the catalog (the commit marker's, else the checkpoint's name). How names
give steps is a setting of the run, not a rule: ``RetentionOptions(step_pattern=...)``, or a
policy file's ``step_pattern`` (:class:`~s3ckpt.retention.PolicyFile`). The rule
:class:`~s3ckpt.retention.KeepCalendar` lives in :mod:`s3ckpt.retention._calendar`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from s3ckpt.errors import PolicyError
from s3ckpt.retention._catalog import CheckpointInfo
from s3ckpt.retention._duration import MAX_DURATION, format_duration

__all__ = [
    "BEST_CHOICES",
    "AllOf",
    "AnyOf",
    "KeepBest",
    "KeepEvery",
    "KeepLast",
    "KeepPinned",
    "KeepWithin",
    "Policy",
    "Selection",
    "check_int",
    "check_policy",
]

BEST_CHOICES = {"mode": ("min", "max"), "nan": ("worst", "skip"), "missing": ("skip", "worst")}
""":class:`KeepBest`'s choices (the default first)."""

Selection = dict[str, tuple[str, ...]]
"""What a rule keeps: checkpoint name -> reasons."""


class Policy:
    """Base of every retention rule; combine rules with ``|`` and ``&``."""

    def select(self, checkpoints: Sequence[CheckpointInfo], now: datetime) -> Selection:
        """The checkpoints to keep among ``checkpoints`` (oldest first), with reasons."""
        raise NotImplementedError

    def describe(self) -> str:
        """A short human description (``last 3 | best 2 by val_loss``)."""
        raise NotImplementedError

    def rules(self) -> tuple[Policy, ...]:
        """The leaf rules (for emptiness checks)."""
        return (self,)

    def __or__(self, other: Policy) -> Policy:
        return _combine(AnyOf, self, other)

    def __and__(self, other: Policy) -> Policy:
        return _combine(AllOf, self, other)

    def __str__(self) -> str:
        return self.describe()


def _combine(kind: type[_Combined], a: Policy, b: object) -> Policy:
    """``kind`` of ``a`` and ``b``, flattened (NotImplemented when ``b`` is not a Policy)."""
    if not isinstance(b, Policy):
        return NotImplemented
    return kind(tuple(q for p in (a, b) for q in (p.policies if isinstance(p, kind) else (p,))))


def check_int(value: object, what: str, minimum: int = 1) -> None:
    """Refuse (:class:`~s3ckpt.errors.PolicyError`) anything but an integer (not a bool) of
    at least ``minimum``; ``what`` names the value and what it must be."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise PolicyError(f"{what}, got {value!r}")


@dataclass(frozen=True)
class _Combined(Policy):
    policies: tuple[Policy, ...]

    def rules(self) -> tuple[Policy, ...]:
        return tuple(r for p in self.policies for r in p.rules())


@dataclass(frozen=True)
class AnyOf(_Combined):
    """Keep a checkpoint if any of ``policies`` keeps it; reasons are merged."""

    def select(self, checkpoints: Sequence[CheckpointInfo], now: datetime) -> Selection:
        out: dict[str, list[str]] = {}
        for p in self.policies:
            for name, reasons in p.select(checkpoints, now).items():
                out.setdefault(name, []).extend(reasons)
        return {k: tuple(v) for k, v in out.items()}

    def describe(self) -> str:
        return " | ".join(_paren(p, AllOf) for p in self.policies) or "(nothing)"


@dataclass(frozen=True)
class AllOf(_Combined):
    """Keep a checkpoint only if every one of ``policies`` keeps it."""

    def select(self, checkpoints: Sequence[CheckpointInfo], now: datetime) -> Selection:
        picks = [p.select(checkpoints, now) for p in self.policies]
        common = set(picks[0]).intersection(*picks[1:]) if picks else set()
        return {
            name: (" and ".join(r for pick in picks for r in pick[name]),)
            for name in (c.name for c in checkpoints)
            if name in common
        }

    def describe(self) -> str:
        return " & ".join(_paren(p, AnyOf) for p in self.policies) or "(nothing)"


def _paren(p: Policy, kind: type) -> str:
    return f"({p.describe()})" if isinstance(p, kind) else p.describe()


@dataclass(frozen=True)
class KeepLast(Policy):
    """Keep the newest ``n`` checkpoints (by step, then commit time). Reason ``last {n}``."""

    n: int

    def __post_init__(self) -> None:
        check_int(self.n, "KeepLast.n must be a positive integer")

    def select(self, checkpoints: Sequence[CheckpointInfo], now: datetime) -> Selection:
        return {c.name: (f"last {self.n}",) for c in checkpoints[-self.n :]}

    def describe(self) -> str:
        return f"last {self.n}"


@dataclass(frozen=True)
class KeepEvery(Policy):
    """For each multiple of ``steps`` (``steps``, ``2*steps``, ...), keep the checkpoint
    whose step is closest to it.

    A checkpoint belongs to its nearest multiple (halves round up); within a multiple the
    smallest distance wins and ties go to the newer checkpoint. Checkpoints nearer to step
    0 than to ``steps``, and checkpoints without a step, are not kept by this rule.
    Reason ``every {steps} steps (step {m})``.
    """

    steps: int

    def __post_init__(self) -> None:
        check_int(self.steps, "KeepEvery.steps must be a positive integer")

    def select(self, checkpoints: Sequence[CheckpointInfo], now: datetime) -> Selection:
        best: dict[int, tuple[int, CheckpointInfo]] = {}
        for c in checkpoints:
            if c.step is None:
                continue
            k = (2 * c.step + self.steps) // (2 * self.steps)
            dist = abs(c.step - k * self.steps)
            # oldest first: a later (newer) checkpoint at the same distance wins the tie
            if k >= 1 and (k not in best or dist <= best[k][0]):
                best[k] = (dist, c)
        return {
            c.name: (f"every {self.steps} steps (step {k * self.steps})",)
            for k, (_, c) in best.items()
        }

    def describe(self) -> str:
        return f"every {self.steps} steps"


@dataclass(frozen=True)
class KeepBest(Policy):
    """Keep the ``n`` best checkpoints by ``metric``.

    Args:
        n: How many to keep.
        metric: A key of the commit marker's ``metrics``.
        mode: ``"min"`` (losses) or ``"max"`` (accuracies).
        nan: ``"worst"`` ranks NaN below every number in *both* modes (a NaN loss is
            never the best one when minimising, nor a NaN accuracy when maximising; still
            kept if fewer than ``n`` are numbers); ``"skip"`` never keeps for a NaN.
        missing: ``"skip"`` never keeps a checkpoint without the metric; ``"worst"``
            ranks it with the NaNs.

    Metrics come from ``s3ckpt.json``, which stores NaN and +-infinity (as ``"NaN"``,
    ``"Infinity"``, ``"-Infinity"``). Infinities rank by value: with ``mode="min"``
    ``-inf`` is the best and ``+inf`` the worst number, with ``mode="max"`` the reverse;
    both still rank above NaN. Ties (equal values, two infinities of one sign, NaN with
    NaN) are broken deterministically: the newer checkpoint wins. Reason
    ``best {n} by {metric}`` (``... (max)`` when maximising).
    """

    n: int
    metric: str
    mode: Literal["min", "max"] = "min"
    nan: Literal["worst", "skip"] = "worst"
    missing: Literal["skip", "worst"] = "skip"

    def __post_init__(self) -> None:
        check_int(self.n, "KeepBest.n must be a positive integer")
        if not isinstance(self.metric, str) or not self.metric:
            raise PolicyError(f"KeepBest.metric must be a metric name, got {self.metric!r}")
        for key, allowed in BEST_CHOICES.items():
            if (value := getattr(self, key)) not in allowed:
                either = " or ".join(map(repr, allowed))
                raise PolicyError(f"KeepBest.{key} must be {either}, got {value!r}")

    def select(self, checkpoints: Sequence[CheckpointInfo], now: datetime) -> Selection:
        sign = 1.0 if self.mode == "min" else -1.0

        def ranked() -> Iterator[tuple[int, float, int, str]]:
            # A generator: only the n best rank tuples are alive at once.
            for i, c in enumerate(checkpoints):
                value = c.metrics.get(self.metric)
                v = math.nan if value is None else float(value)
                if not math.isnan(v):
                    yield (0, sign * v, -i, c.name)
                # NaN: worst in both directions (sign does not apply); missing: likewise
                elif (self.missing if value is None else self.nan) == "worst":
                    yield (1, 0.0, -i, c.name)

        return {name: (self.describe(),) for *_, name in heapq.nsmallest(self.n, ranked())}

    def describe(self) -> str:
        return f"best {self.n} by {self.metric}" + (" (max)" if self.mode == "max" else "")


@dataclass(frozen=True)
class KeepWithin(Policy):
    """Keep every checkpoint committed within ``duration`` of the *newest* one.

    Measured from the newest checkpoint, not from ``now`` (restic's ``--keep-within``): a
    run that stopped a month ago keeps its last week, instead of losing everything.
    Checkpoints without a commit time are ignored. Reason ``within {duration} of newest``.
    """

    duration: timedelta

    def __post_init__(self) -> None:
        if not isinstance(self.duration, timedelta) or self.duration <= timedelta(0):
            raise PolicyError(f"KeepWithin.duration must be positive, got {self.duration!r}")
        if self.duration > MAX_DURATION:  # ``newest - duration`` would overflow datetime
            raise PolicyError(f"KeepWithin.duration must be at most {MAX_DURATION.days} days")

    def select(self, checkpoints: Sequence[CheckpointInfo], now: datetime) -> Selection:
        times = [c.committed_at for c in checkpoints if c.committed_at is not None]
        if not times:
            return {}
        cutoff = max(times) - self.duration
        reason = (self.describe(),)
        return {c.name: reason for c in checkpoints if c.committed_at and c.committed_at >= cutoff}

    def describe(self) -> str:
        return f"within {format_duration(self.duration)} of newest"


@dataclass(frozen=True)
class KeepPinned(Policy):
    """Keep pinned checkpoints (``s3ckpt pin``). Pins are also an invariant of every plan,
    so this rule only makes the intent explicit. Reason ``pinned: {reason}``."""

    def select(self, checkpoints: Sequence[CheckpointInfo], now: datetime) -> Selection:
        return {c.name: (f"pinned: {c.pinned}",) for c in checkpoints if c.pinned}

    def describe(self) -> str:
        return "pinned"


def check_policy(policy: Policy) -> None:
    """Refuse an empty policy (one with no rule at all)."""
    if not isinstance(policy, Policy):
        raise PolicyError(f"not a retention policy: {policy!r}")
    if not [r for r in policy.rules() if not isinstance(r, KeepPinned)]:
        raise PolicyError(
            f"the policy {policy.describe()!r} has no keep rule: refusing to plan (it would "
            "delete all but the invariants); name at least one of last, every, best, within, "
            "calendar"
        )
