"""Calendar buckets with restic ``forget`` semantics: :class:`KeepCalendar`.

One rule of the policy algebra (:mod:`s3ckpt.retention._policy`), kept in its own module for
its period arithmetic: the hour, day, ISO week, month or year holding a commit time, the
first instant of that period, and its label in a reason (``daily (2025-03-14)``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from s3ckpt.errors import PolicyError
from s3ckpt.retention._catalog import CheckpointInfo
from s3ckpt.retention._policy import Policy, Selection, check_int

__all__ = ["KeepCalendar"]

_LABELS = {
    "hourly": "%Y-%m-%dT%H",
    "daily": "%Y-%m-%d",
    "weekly": "%G-W%V",  # ISO weeks
    "monthly": "%Y-%m",
    "yearly": "%Y",
}
_CAL_FIELDS = tuple(_LABELS)


def _commit_time(c: CheckpointInfo) -> datetime:
    assert c.committed_at is not None
    return c.committed_at


def _period_start(kind: str, t: datetime) -> datetime:
    """The first instant of the period holding ``t`` (in ``t``'s own time zone)."""
    if kind == "hourly":
        return t.replace(minute=0, second=0, microsecond=0)
    day = t.replace(hour=0, minute=0, second=0, microsecond=0)
    if kind == "weekly":
        return day - timedelta(days=t.weekday())  # ISO weeks start on Monday
    return {"daily": day, "monthly": day.replace(day=1)}.get(kind) or day.replace(month=1, day=1)


@dataclass(frozen=True)
class KeepCalendar(Policy):
    """Calendar buckets with restic ``forget`` semantics.

    For each bucket kind with a count ``n``: walk the checkpoints newest first (by commit
    time) and keep the newest checkpoint of each hour / day / ISO week / month / year, until
    ``n`` such periods have a kept checkpoint. Periods with no checkpoint do not count
    (``daily=7`` is "the last 7 days that have checkpoints"). ``-1`` means unlimited.
    Periods are in UTC. Reason e.g. ``daily (2025-03-14)``.
    """

    hourly: int = 0
    daily: int = 0
    weekly: int = 0
    monthly: int = 0
    yearly: int = 0

    def __post_init__(self) -> None:
        for f in _CAL_FIELDS:
            check_int(
                getattr(self, f), f"KeepCalendar.{f} must be an integer >= 0 (or -1: unlimited)", -1
            )
        if not any(getattr(self, f) for f in _CAL_FIELDS):
            raise PolicyError(
                "KeepCalendar needs at least one of hourly, daily, weekly, monthly, yearly"
            )

    def select(self, checkpoints: Sequence[CheckpointInfo], now: datetime) -> Selection:
        # Oldest first by commit time; the sort is stable, so among equal times the later
        # in the catalog (the newer) comes last and is the one a period keeps. No key
        # tuples: at 100,000 checkpoints allocating them costs more than the walk.
        timed = sorted((c for c in checkpoints if c.committed_at), key=_commit_time)
        out: dict[str, list[str]] = {}
        for kind in _CAL_FIELDS:
            left = getattr(self, kind)
            j = len(timed) - 1
            while left != 0 and j >= 0:
                c = timed[j]
                t = _commit_time(c)
                out.setdefault(c.name, []).append(f"{kind} ({t.strftime(_LABELS[kind])})")
                left -= 1
                # Jump to the newest checkpoint before this period began: O(periods * log n)
                # instead of a step through every checkpoint of the period.
                j = bisect_left(timed, _period_start(kind, t), 0, j, key=_commit_time) - 1
        return {k: tuple(v) for k, v in out.items()}

    def describe(self) -> str:
        parts = [f"{f}={getattr(self, f)}" for f in _CAL_FIELDS if getattr(self, f)]
        return "calendar " + " ".join(parts)
