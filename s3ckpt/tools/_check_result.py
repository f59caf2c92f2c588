"""What ``s3ckpt check`` found: per checkpoint (:class:`CheckpointCheck`, or
:class:`SkippedCheckpoint` with the reason), each damage as a :class:`Finding`, and the whole
check as a :class:`CheckResult` (what the CLI prints, ``--json`` and the metrics file).

Plain frozen values with ``to_dict()`` for stable JSON; the checking is in
:mod:`s3ckpt.tools._check`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from s3ckpt.retention._check_record import CheckEntry

__all__ = ["SKIP_REASONS", "CheckResult", "CheckpointCheck", "Finding", "SkippedCheckpoint"]

SKIP_REASONS = ("in_progress", "uncommitted", "foreign", "being_written", "archived", "changed")
"""Why a checkpoint is not checked (:class:`SkippedCheckpoint`)."""


@dataclass(frozen=True)
class Finding:
    """One thing wrong with a checkpoint (or, ``read_error``, one thing a check could not read).

        ``kind``: ``marker`` (the commit marker is unreadable or does not match its digest),
        ``missing_object``, ``object_size`` (differs from the marker's record), ``metadata`` (the
        committed ``.metadata`` is missing or differs), ``stale_metadata`` (the plain ``.metadata``
        copy is missing or differs), ``items`` (the item records the marker commits are missing or
    differ), ``checksum`` (an item's CRC32C), ``truncated`` (an object
        ended early while read), ``read_error``. ``object`` and ``item`` name where (the object
        relative to the checkpoint, the state-dict key); ``expected`` and ``found`` what.
    """

    kind: str
    object: str | None
    item: str | None
    expected: str | None
    found: str | None
    message: str

    @property
    def damage(self) -> bool:
        """Whether it shows damage (a read error only shows that the check is incomplete)."""
        return self.kind != "read_error"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (stable keys)."""
        return asdict(self)


@dataclass(frozen=True)
class CheckpointCheck:
    """What the check found in one committed checkpoint.

    Attributes:
        url / run / name / step / tag: Which checkpoint (``tag``: the committed save's).
        checked_at: When it was read (ISO-8601 ``Z``).
        marker_digest: The marker's ``digest``; None when the marker is unreadable.
        marker_etag: The marker's ETag in the check's listing.
        objects / items: Data objects and items the marker names.
        items_read / bytes_read: Items read back; bytes read (marker, metadata, data).
        findings: What is wrong, in a stable order.
    """

    url: str
    run: str
    name: str
    step: int | None
    tag: str | None
    checked_at: str
    marker_digest: str | None = None
    marker_etag: str | None = None
    objects: int = 0
    items: int = 0
    items_read: int = 0
    bytes_read: int = 0
    findings: tuple[Finding, ...] = ()

    @property
    def damaged(self) -> bool:
        """Any finding shows damage."""
        return any(f.damage for f in self.findings)

    @property
    def incomplete(self) -> bool:
        """Not damaged, but something could not be read (a read error): not checked in full."""
        return not self.damaged and bool(self.findings)

    @property
    def ok(self) -> bool:
        """Nothing found."""
        return not self.findings

    def entry(self) -> CheckEntry:
        """This verdict as an ``s3ckpt.check.json`` entry."""
        damage = [f.to_dict() for f in self.findings if f.damage]
        return CheckEntry.of(
            self.name, self.checked_at, self.marker_digest, self.marker_etag, self.tag, damage
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (stable keys)."""
        status = "damaged" if self.damaged else "incomplete" if self.incomplete else "ok"
        return {**asdict(self), "status": status, "findings": [asdict(f) for f in self.findings]}


@dataclass(frozen=True)
class SkippedCheckpoint:
    """A checkpoint the check did not check, and why.

    ``reason``: ``in_progress`` (a save is writing it), ``uncommitted`` (a dead save's
    leftovers), ``foreign`` (no ``s3ckpt.json``: stock DCP), ``being_written`` (committed,
    and a new save is writing into the same prefix), ``archived`` (objects in an archive
    class), ``changed`` (its marker was deleted or rewritten while it was checked).
    """

    url: str
    run: str
    name: str
    reason: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (stable keys)."""
        return asdict(self)


@dataclass(frozen=True)
class CheckResult:
    """What :func:`s3ckpt.tools.check` found under its URL.

    Attributes:
        url: The URL checked (a bucket prefix, a run or one checkpoint).
        read_data: The share of each checkpoint's item bytes read back: ``0``, ``5%``,
            ``all``.
        seed: The seed the samples were drawn with (the same seed draws the same items of
            the same checkpoint again: ``--seed``).
        checked: Every committed checkpoint checked, in catalog order.
        skipped: Every checkpoint not checked, with the reason.
        records: The ``s3ckpt.check.json`` keys written (none with ``record=False``).
        record_failures: Why a run's record could not be written (one line each).
        seconds: How long the check took.
    """

    url: str
    read_data: str
    seed: int
    checked: tuple[CheckpointCheck, ...] = ()
    skipped: tuple[SkippedCheckpoint, ...] = ()
    records: tuple[str, ...] = ()
    record_failures: tuple[str, ...] = ()
    seconds: float = 0.0

    @property
    def damaged(self) -> list[CheckpointCheck]:
        """The damaged checkpoints."""
        return [c for c in self.checked if c.damaged]

    @property
    def incomplete(self) -> list[CheckpointCheck]:
        """Checkpoints not checked in full (read errors), none of them damaged."""
        return [c for c in self.checked if c.incomplete]

    @property
    def bytes_read(self) -> int:
        """Bytes read back (markers, metadata and data)."""
        return sum(c.bytes_read for c in self.checked)

    @property
    def items_read(self) -> int:
        """Items read back and compared with their CRC32C."""
        return sum(c.items_read for c in self.checked)

    @property
    def ok(self) -> bool:
        """Nothing damaged, everything checked in full, every record written."""
        return not self.damaged and not self.incomplete and not self.record_failures

    def skipped_by_reason(self) -> dict[str, int]:
        """How many were skipped, by reason (every reason of :data:`SKIP_REASONS`)."""
        return dict.fromkeys(SKIP_REASONS, 0) | Counter(s.reason for s in self.skipped)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (stable keys): ``s3ckpt check --json``."""
        return {
            "url": self.url,
            "ok": self.ok,
            "read_data": self.read_data,
            "seed": self.seed,
            "checked": len(self.checked),
            "damaged": len(self.damaged),
            "incomplete": len(self.incomplete),
            "skipped": self.skipped_by_reason(),
            "bytes_read": self.bytes_read,
            "items_read": self.items_read,
            "seconds": self.seconds,
            "records": list(self.records),
            "record_failures": list(self.record_failures),
            "checkpoints": [c.to_dict() for c in self.checked],
            "skipped_checkpoints": [s.to_dict() for s in self.skipped],
        }
