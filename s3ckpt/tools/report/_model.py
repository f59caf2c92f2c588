"""The report's model: what the page shows, as frozen values (:class:`Report` of
:class:`RunReport`\\ s of :class:`CheckpointRow`\\ s), with the totals the page and
``s3ckpt report --json`` print.

Pure: built by :func:`~s3ckpt.tools.report.collect_report` (or by hand), read by
:func:`~s3ckpt.tools.report.render_html`; nothing here lists, plans or renders.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from s3ckpt._time import iso_z
from s3ckpt.retention import (
    DEFAULT_GRACE,
    CheckpointInfo,
    CheckpointState,
    Plan,
    format_duration,
)
from s3ckpt.store import Versions
from s3ckpt.tools.report._prices import PriceTable
from s3ckpt.uri import StoreURL

__all__ = ["STATES", "CheckpointRow", "Report", "RunReport", "storage_bytes"]

STATES: tuple[str, ...] = tuple(s.value for s in CheckpointState)
"""The ``data-state`` values: exactly ``s3ckpt ls --json``'s ``state`` strings."""


@dataclass(frozen=True)
class CheckpointRow:
    """One checkpoint on the page: the catalog's record, the plan's decision and its cost.

    Attributes:
        info: The catalog record (as ``s3ckpt ls`` lists it).
        action: ``keep`` / ``delete`` / ``skip`` from the plan; None without a policy.
        reasons: The plan's reasons (``s3ckpt prune``'s), empty without a policy.
        cost: Storage cost in USD per month.
        cost_after: USD per month once a storage tier has moved it (the plan's
            transition, its objects listed); None when no tier moves it (``cost`` stays).
        storage_class_after: The class a tier moves it to, or None.
    """

    info: CheckpointInfo
    action: str | None
    reasons: tuple[str, ...]
    cost: float
    cost_after: float | None = None
    storage_class_after: str | None = None

    @property
    def bytes_by_class(self) -> Mapping[str, int]:
        """The checkpoint's bytes by storage class (all ``STANDARD`` when unknown)."""
        return storage_bytes(self.info)

    @property
    def time(self) -> datetime | None:
        """Where the point sits on the time axis: the commit time, else (a save in progress,
        an abandoned one) the last activity."""
        return self.info.committed_at or self.info.last_activity


def storage_bytes(info: CheckpointInfo) -> Mapping[str, int]:
    """``info``'s bytes by storage class; all ``STANDARD`` when the listing named none."""
    if info.bytes_by_class or not info.size:
        return info.bytes_by_class
    return {"STANDARD": info.size}


@dataclass(frozen=True)
class RunReport:
    """One run: its checkpoints (catalog order, oldest first), the plan and the chart's metric.

    Attributes:
        run: The run prefix.
        rows: One per checkpoint.
        plan: The dry-run plan, or None without a policy.
        metric: The chart's y value: the policy's ``KeepBest`` metric, else the first metric
            a checkpoint of the run records; None when there is none (the chart shows size).
        mode: ``min`` or ``max``: which end of ``metric`` is best.
        best: The name of the best checkpoint by ``metric`` (a finite value; ties go to the
            newer one), or None.
        versions: The noncurrent versions a versioned bucket keeps (this run's are under
            its prefix), or why they were not counted; None: not asked.
    """

    run: StoreURL
    rows: tuple[CheckpointRow, ...]
    plan: Plan | None = None
    metric: str | None = None
    mode: str = "min"
    best: str | None = None
    versions: Versions | None = None

    @property
    def total_size(self) -> int:
        """Bytes of all its checkpoints."""
        return sum(r.info.size for r in self.rows)

    @property
    def num_objects(self) -> int:
        """Objects of all its checkpoints."""
        return sum(r.info.num_objects for r in self.rows)

    @property
    def bytes_freed(self) -> int:
        """Bytes the plan's deletions free (``s3ckpt prune``'s ``bytes_freed``); 0 without one."""
        return self.plan.bytes_freed if self.plan is not None else 0

    @property
    def objects_deleted(self) -> int:
        """Objects the plan's deletions remove; 0 without one."""
        return self.plan.objects_deleted if self.plan is not None else 0

    @property
    def cost(self) -> float:
        """USD per month for all its checkpoints, now."""
        return sum(r.cost for r in self.rows)

    @property
    def cost_after(self) -> float:
        """USD per month once the plan's deletions and storage-tier transitions are done."""
        return sum(
            r.cost if r.cost_after is None else r.cost_after
            for r in self.rows
            if r.action != "delete"
        )

    @property
    def bytes_to_move(self) -> int:
        """Bytes the plan's storage tiers move to another class; 0 without one."""
        return self.plan.bytes_to_move if self.plan is not None else 0

    def counts(self) -> dict[str, int]:
        """Checkpoints by state (every state, zeros included), ``damaged`` (the catalog's
        :attr:`~s3ckpt.retention.CheckpointInfo.damaged`: also counted ``committed``),
        ``pinned`` and, with a plan, by action (``keep``, ``delete``, ``skip``)."""
        out = dict.fromkeys(STATES, 0)
        for r in self.rows:
            out[r.info.state.value] += 1
        out["damaged"] = sum(1 for r in self.rows if r.info.damaged)
        out["pinned"] = sum(1 for r in self.rows if r.info.pinned)
        if self.plan is not None:
            for action in ("keep", "delete", "skip"):
                out[action] = sum(1 for r in self.rows if r.action == action)
        return out

    def bytes_by_class(self) -> dict[str, int]:
        """Bytes by storage class over all its checkpoints."""
        out: dict[str, int] = {}
        for r in self.rows:
            for cls, n in r.bytes_by_class.items():
                out[cls] = out.get(cls, 0) + n
        return out

    def summary(self) -> dict[str, object]:
        """The run's numbers (JSON-ready; the page's ``data-field`` values)."""
        doc: dict[str, object] = {
            "run": str(self.run),
            "checkpoints": len(self.rows),
            **self.counts(),
            "total_size": self.total_size,
            "num_objects": self.num_objects,
            "bytes_by_class": self.bytes_by_class(),
            "cost_month": self.cost,
            "metric": self.metric,
            "best": self.best,
            "damaged_checkpoints": [
                {"name": r.info.name, "step": r.info.step, "damage": r.info.damage}
                for r in self.rows
                if r.info.damaged
            ],
        }
        if self.versions is not None:
            doc.update(self.versions.to_dict(self.run.prefix))
        if self.plan is not None:
            doc.update(
                bytes_freed=self.bytes_freed,
                objects_deleted=self.objects_deleted,
                cost_month_after=self.cost_after,
                cost_saved=self.cost - self.cost_after,
                bytes_to_move=self.bytes_to_move,
            )
        return doc


@dataclass(frozen=True)
class Report:
    """Everything the page shows: the runs under ``root``, as of ``now``.

    Attributes:
        root: The prefix reported on (a run, or a prefix holding runs).
        runs: One per run, sorted by prefix (as ``s3ckpt ls`` lists them).
        now: The time the grace period and the policy judged against.
        policy: The policy's description, or None (no plan overlaid).
        prices: The price table the costs come from.
        title: The page's title.
        grace: The grace period the scan used.
        include_foreign: Whether the plan treated stock-DCP checkpoints as committed.
        notes: Things the reader should know (a grace raised to its floor, ...).
        versions: The noncurrent versions a versioned bucket keeps under the runs, or why
            they were not counted; None: not asked.
    """

    root: StoreURL
    runs: tuple[RunReport, ...]
    now: datetime
    policy: str | None
    prices: PriceTable
    title: str
    grace: timedelta = DEFAULT_GRACE
    include_foreign: bool = False
    notes: tuple[str, ...] = ()
    versions: Versions | None = None

    @property
    def num_checkpoints(self) -> int:
        """Checkpoints over all runs."""
        return sum(len(r.rows) for r in self.runs)

    def summary(self) -> dict[str, object]:
        """Totals over all runs (JSON-ready; the page's top ``data-field`` values)."""
        doc: dict[str, object] = {"runs": len(self.runs), "checkpoints": self.num_checkpoints}
        # Every count present, zeros included, when there is no run at all (an empty prefix).
        counts: dict[str, int] = dict.fromkeys((*STATES, "damaged", "pinned"), 0)
        if self.policy is not None:
            counts.update(dict.fromkeys(("keep", "delete", "skip"), 0))
        by_class: dict[str, int] = {}
        for r in self.runs:
            for k, v in r.counts().items():
                counts[k] = counts.get(k, 0) + v
            for k, v in r.bytes_by_class().items():
                by_class[k] = by_class.get(k, 0) + v
        doc.update(counts)
        doc.update(
            total_size=sum(r.total_size for r in self.runs),
            num_objects=sum(r.num_objects for r in self.runs),
            bytes_by_class=by_class,
            cost_month=sum(r.cost for r in self.runs),
        )
        if self.versions is not None:
            doc.update(self.versions.to_dict())
        if self.policy is not None:
            after = sum(r.cost_after for r in self.runs)
            doc.update(
                bytes_freed=sum(r.bytes_freed for r in self.runs),
                objects_deleted=sum(r.objects_deleted for r in self.runs),
                cost_month_after=after,
                cost_saved=float(doc["cost_month"]) - after,  # type: ignore[arg-type]
            )
        return doc

    def to_dict(self) -> dict[str, object]:
        """JSON-ready totals and per-run summaries (``s3ckpt report --json``; no rows)."""
        return {
            "root": str(self.root),
            "now": iso_z(self.now),
            "policy": self.policy,
            "grace": format_duration(self.grace),
            "include_foreign": self.include_foreign,
            "prices": dict(self.prices.prices),
            "prices_source": self.prices.source,
            "notes": list(self.notes),
            **self.summary(),
            "per_run": [r.summary() for r in self.runs],
        }
