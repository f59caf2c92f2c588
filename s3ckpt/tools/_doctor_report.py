"""The doctor's rows and report: :class:`Check`, :class:`CheckStatus`, :class:`DoctorReport`
(see :mod:`s3ckpt.tools._doctor`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

__all__ = ["Check", "CheckStatus", "DoctorReport"]


class CheckStatus(str, Enum):
    """How one check came out."""

    OK = "ok"
    FAIL = "fail"
    """The store will not keep checkpoints safe as configured (the CLI exits 1)."""
    WARN = "warn"
    """Works, with a cost or a caveat the meaning explains."""
    SKIP = "skip"
    """Not checked here; the detail says why."""


@dataclass(frozen=True)
class Check:
    """One row of the doctor's table.

    Attributes:
        name: What was checked (``conditional create``, ``permission put`` ...).
        status: How it came out.
        detail: What was found, one line.
        meaning: For ``fail`` and ``warn``: what it means for the checkpoints and what to
            do; ``""`` otherwise.
    """

    name: str
    status: CheckStatus
    detail: str
    meaning: str = ""

    def to_dict(self) -> dict[str, str]:
        """``{"name", "status", "detail", "meaning"}``."""
        return {
            "name": self.name,
            "status": self.status.value,
            "detail": self.detail,
            "meaning": self.meaning,
        }


@dataclass(frozen=True)
class DoctorReport:
    """Every check of one :func:`run_doctor` run.

    Attributes:
        url: The location checked.
        scratch: The scratch prefix the checks wrote under (removed at the end).
        checks: The rows, in the order they ran.
        left_behind: What cleanup could not remove (keys, and ``upload KEY ID`` for open
            multipart uploads); empty when it removed everything.
    """

    url: str
    scratch: str
    checks: tuple[Check, ...]
    left_behind: tuple[str, ...] = field(default=())

    @property
    def failed(self) -> tuple[Check, ...]:
        """The checks that failed."""
        return tuple(c for c in self.checks if c.status is CheckStatus.FAIL)

    @property
    def ok(self) -> bool:
        """No check failed (warnings and skips allowed)."""
        return not self.failed

    @property
    def verdict(self) -> str:
        """``ok`` or ``fail``."""
        return "ok" if self.ok else "fail"

    def to_dict(self) -> dict[str, Any]:
        """Stable JSON: ``url``, ``scratch``, ``verdict``, ``checks``, ``left_behind``."""
        return {
            "url": self.url,
            "scratch": self.scratch,
            "verdict": self.verdict,
            "failed": [c.name for c in self.failed],
            "checks": [c.to_dict() for c in self.checks],
            "left_behind": list(self.left_behind),
        }
