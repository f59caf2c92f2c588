"""The doctor's rows and report: :class:`Check`, :class:`CheckStatus`, :class:`DoctorReport`
(see :mod:`s3ckpt.tools._doctor`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

__all__ = ["Check", "CheckStatus", "DoctorReport", "fail", "ok", "skip", "warn"]


class CheckStatus(str, Enum):
    """How one check came out."""

    OK = "ok"
    #: The store will not keep checkpoints safe as configured (the CLI exits 1).
    FAIL = "fail"
    #: Works, with a cost or a caveat the meaning explains.
    WARN = "warn"
    #: Not checked here; the detail says why.
    SKIP = "skip"


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
        return {**asdict(self), "status": self.status.value}


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


def ok(name: str, detail: str) -> Check:
    """An ``ok`` row."""
    return Check(name, CheckStatus.OK, detail)


def skip(name: str, detail: str) -> Check:
    """A ``skip`` row (``detail`` says why)."""
    return Check(name, CheckStatus.SKIP, detail)


def warn(name: str, detail: str, meaning: str) -> Check:
    """A ``warn`` row."""
    return Check(name, CheckStatus.WARN, detail, meaning)


def fail(name: str, detail: str, meaning: str) -> Check:
    """A ``fail`` row."""
    return Check(name, CheckStatus.FAIL, detail, meaning)
