"""The report's model: what the page shows, as frozen values (:class:`Report` of
:class:`RunReport`\\ s of :class:`CheckpointRow`\\ s), with the totals the page and
``s3ckpt report --json`` print.

Built by :func:`collect_report` (or by hand), read by
:func:`~s3ckpt.tools._report.render_html`.

Collecting the report's numbers: one scan of a prefix and, with a policy, each run's
dry-run plan (:func:`collect_report`).

A pure dry run, like ``s3ckpt prune`` without ``--apply``: no lease is taken and nothing is
written or deleted. The run's settings are one :class:`~s3ckpt.retention.RetentionOptions`
(its step pattern compiled once, there).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from s3ckpt._time import iso_z
from s3ckpt.retention import (
    CheckpointInfo,
    KeepBest,
    Policy,
    PolicyFile,
    RetentionOptions,
    plan,
    survey_plan,
)
from s3ckpt.retention._catalog import CheckpointState
from s3ckpt.retention._duration import format_duration
from s3ckpt.retention._liveness import DEFAULT_GRACE, MIN_GRACE, judge_time
from s3ckpt.retention._plan import Plan, check_policy
from s3ckpt.retention._scan import scan
from s3ckpt.retention._tiers import Transition
from s3ckpt.store import Location
from s3ckpt.store._location import LocationLike
from s3ckpt.store._versions import Versions, noncurrent_versions
from s3ckpt.tools._report._prices import PriceTable
from s3ckpt.uri import StoreURL

__all__ = ["STATES", "CheckpointRow", "Report", "RunReport", "collect_report", "storage_bytes"]

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
    return info.bytes_by_class if info.bytes_by_class or not info.size else {"STANDARD": info.size}


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
        kept = [r for r in self.rows if r.action != "delete"]
        return sum(r.cost if r.cost_after is None else r.cost_after for r in kept)

    @property
    def bytes_to_move(self) -> int:
        """Bytes the plan's storage tiers move to another class; 0 without one."""
        return self.plan.bytes_to_move if self.plan is not None else 0

    def counts(self) -> dict[str, int]:
        """Checkpoints by state (every state, zeros included), ``damaged`` (the catalog's
        :attr:`~s3ckpt.retention.CheckpointInfo.damaged`: also counted ``committed``),
        ``pinned`` and, with a plan, by action (``keep``, ``delete``, ``skip``)."""
        out = dict.fromkeys(STATES, 0) | Counter(r.info.state.value for r in self.rows)
        out["damaged"] = sum(1 for r in self.rows if r.info.damaged)
        out["pinned"] = sum(1 for r in self.rows if r.info.pinned)
        actions = ("keep", "delete", "skip") if self.plan is not None else ()
        out |= {a: sum(1 for r in self.rows if r.action == a) for a in actions}
        return out

    def bytes_by_class(self) -> dict[str, int]:
        """Bytes by storage class over all its checkpoints."""
        out: Counter[str] = Counter()
        for r in self.rows:
            out.update(r.bytes_by_class)
        return dict(out)

    def summary(self) -> dict[str, object]:
        """The run's numbers (JSON-ready; the page's ``data-field`` values)."""
        doc: dict[str, object] = {
            "run": str(self.run),
            "checkpoints": len(self.rows),
            **self.counts(),
            "total_size": sum(r.info.size for r in self.rows),
            "num_objects": sum(r.info.num_objects for r in self.rows),
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
            doc |= {"bytes_freed": self.bytes_freed, "objects_deleted": self.objects_deleted}
            doc |= {"cost_month_after": self.cost_after, "cost_saved": self.cost - self.cost_after}
            doc["bytes_to_move"] = self.bytes_to_move
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

    def summary(self) -> dict[str, object]:
        """Totals over all runs (JSON-ready; the page's top ``data-field`` values): the
        runs' :meth:`RunReport.summary` numbers summed, every count present (zeros
        included) even when there is no run at all (an empty prefix)."""
        plan = self.policy is not None
        counts = (*STATES, "damaged", "pinned", *(("keep", "delete", "skip") if plan else ()))
        summed = ("checkpoints", *counts, "total_size", "num_objects", "cost_month")
        by_class: Counter[str] = Counter()
        doc: dict[str, Any] = {"runs": len(self.runs), **dict.fromkeys(summed[:-1], 0)}
        doc |= {"bytes_by_class": by_class, "cost_month": 0}
        if self.versions is not None:
            doc.update(self.versions.to_dict())
        if plan:
            summed += ("bytes_freed", "objects_deleted", "cost_month_after")
            doc.update(dict.fromkeys(summed[-3:], 0))
        for run in self.runs:
            s: dict[str, Any] = {"cost_month_after": run.cost_after, **run.summary()}
            by_class.update(s["bytes_by_class"])
            for k in summed:
                doc[k] += s.get(k, 0)  # (a run without a plan: no plan numbers)
        doc["bytes_by_class"] = dict(by_class)
        if plan:
            doc["cost_saved"] = doc["cost_month"] - doc["cost_month_after"]
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


# -- collecting ---------------------------------------------------------------------------------
_MAX_IS_BETTER = re.compile(
    r"acc|accuracy|auc|f1|bleu|rouge|reward|score|precision|recall|map|iou|psnr|ssim", re.IGNORECASE
)


def _chart_metric(ckpts: Sequence[CheckpointInfo], rule: KeepBest | None) -> tuple[str | None, str]:
    """The run's chart metric and its better end: the policy's KeepBest, else the first
    metric recorded (``max`` when its name reads like a score: acc, f1, reward, ...)."""
    if rule is not None:
        return rule.metric, rule.mode
    name = next((name for c in ckpts for name in c.metrics), None)
    return name, "max" if name is not None and _MAX_IS_BETTER.search(name) else "min"


def _best(ckpts: Sequence[CheckpointInfo], metric: str | None, mode: str) -> str | None:
    """The best finite value of ``metric`` (ties: the newer checkpoint, as KeepBest)."""
    values = [
        (v if mode == "min" else -v, -i, c.name)
        for i, c in enumerate(ckpts)
        if metric is not None and (v := c.metrics.get(metric)) is not None and math.isfinite(v)
    ]
    return min(values)[2] if values else None


def collect_report(
    location: LocationLike,
    /,
    *,
    policy: Policy | PolicyFile | None = None,
    options: RetentionOptions | None = None,
    prices: PriceTable | None = None,
    title: str | None = None,
) -> Report:
    """The numbers of the page: a scan of ``root`` and, with a policy, each run's plan.

    A pure dry run: no lease is taken and nothing is written or deleted. The options mean
    what they mean for ``s3ckpt prune`` (and without a policy, for ``s3ckpt ls``).

    Args:
        location: A :class:`~s3ckpt.store.Location` (or a URL) of a run or a prefix
            holding runs.
        policy: Overlay this policy's plan (keep / delete / skip with reasons): a
            :class:`~s3ckpt.retention.Policy`, or a :class:`~s3ckpt.retention.PolicyFile`
            (its ``step_pattern`` applies unless ``options`` names one).
        options: The run's settings; the report reads ``now`` (default: the store's time;
            this host's clock further from it than the grace period is a note), ``grace``
            (with a policy raised to :data:`~s3ckpt.retention.MIN_GRACE` when shorter, as
            prune does), ``step_pattern`` (default: the policy file's), ``include_foreign``
            and ``max_delete`` (per run, as ``prune --max-delete``).
        prices: Storage prices (default: :data:`DEFAULT_PRICES`).
        title: The page's title (default: ``s3ckpt report: ROOT``).

    Raises:
        PolicyError: The policy is empty.
        ConfigError: A bad ``step_pattern``, or a storage class the price table lacks.

    Request cost: that of :func:`~s3ckpt.retention.scan` over ``root`` (one LIST per 1000
    objects, one GET per commit marker and pin), without ``now`` one LIST of one key for
    the store's time, and on S3 one GetBucketVersioning (cached per bucket and process);
    on a versioned bucket one ListObjectVersions per 1000 versions of each run and one
    GetBucketLifecycleConfiguration (:func:`~s3ckpt.store.noncurrent_versions`).
    """
    opts = options if options is not None else RetentionOptions()
    here = Location.of(location)
    where, url = here.store, here.url
    source = None if policy is None else PolicyFile.of(policy)
    if source is not None:
        check_policy(source.policy)  # an empty policy: refused before any request
        opts = source.options(opts)  # the file's step pattern, unless the run names one
    # The store's time unless given, as prune judges by; a host clock far off it is a note.
    now, skew = judge_time(where, url, opts.now, max(opts.grace, MIN_GRACE), refuse=None)
    notes, grace = list(skew), opts.grace
    prices = prices or PriceTable()
    if source is not None and grace < MIN_GRACE:
        notes.append(
            f"grace {format_duration(grace)} raised to {format_duration(MIN_GRACE)}, as prune does"
        )
        grace = MIN_GRACE
    opts = opts.replace(now=now, grace=grace)
    rules = () if source is None else source.policy.rules()
    rule = next((r for r in rules if isinstance(r, KeepBest)), None)
    runs = []
    catalogs = list(scan(here, options=opts))
    versions = noncurrent_versions(where, [cat.run.prefix for cat in catalogs])
    for cat in catalogs:
        p = plan(cat.checkpoints, source, now, options=opts, run=cat.run) if source else None
        if p is not None and p.transitions:  # list what the tiers would move (a LIST each)
            p = survey_plan(where, p, grace)
        decisions = {d.checkpoint.name: d for d in p.decisions} if p is not None else {}
        moves = {t.name: t for t in p.transitions if t.skipped is None} if p is not None else {}
        rows = []
        for c in cat.checkpoints:
            d, move, cost = decisions.get(c.name), moves.get(c.name), prices.monthly_cost
            action, reasons = (None, ()) if d is None else (d.action, d.reasons)
            row = CheckpointRow(c, action, reasons, cost(storage_bytes(c), str(c.url)))
            if move is not None:
                after = cost(_moved(c, move), str(c.url))
                row = replace(row, cost_after=after, storage_class_after=move.storage_class)
            rows.append(row)
        metric, mode = _chart_metric(cat.checkpoints, rule)
        best = _best(cat.checkpoints, metric, mode)
        runs.append(RunReport(cat.run, tuple(rows), p, metric, mode, best, versions))
    described = None if source is None else source.describe()
    title = title or f"s3ckpt report: {url}"
    report = Report(url, tuple(runs), now, described, prices, title, grace, opts.include_foreign)
    return replace(report, notes=tuple(notes), versions=versions)


def _moved(c: CheckpointInfo, t: Transition) -> dict[str, int]:
    """``c``'s bytes by class once transition ``t`` is done (a tag-method tier too: the
    lifecycle rule it relies on moves the same objects)."""
    out = dict(storage_bytes(c))
    for cls, n in t.from_classes.items():
        out[cls] = max(out.get(cls, 0) - n, 0)
    out[t.storage_class] = out.get(t.storage_class, 0) + (t.bytes or 0)
    return out
