"""Collecting the report's numbers: one scan of a prefix and, with a policy, each run's
dry-run plan (:func:`collect_report`).

A pure dry run, like ``s3ckpt prune`` without ``--apply``: no lease is taken and nothing is
written or deleted. The run's settings are one :class:`~s3ckpt.retention.RetentionOptions`
(its step pattern compiled once, there).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from s3ckpt._time import aware_now
from s3ckpt.retention import (
    MIN_GRACE,
    CheckpointInfo,
    KeepBest,
    Policy,
    PolicyFile,
    RetentionOptions,
    Transition,
    check_policy,
    format_duration,
    plan,
    scan,
    survey_plan,
)
from s3ckpt.store import Location, LocationLike, noncurrent_versions, skew_note, store_time
from s3ckpt.tools.report._model import CheckpointRow, Report, RunReport, storage_bytes
from s3ckpt.tools.report._prices import PriceTable

__all__ = ["collect_report"]


_MAX_IS_BETTER = re.compile(
    r"acc|accuracy|auc|f1|bleu|rouge|reward|score|precision|recall|map|iou|psnr|ssim",
    re.IGNORECASE,
)


def _best_rule(policy: Policy | None) -> KeepBest | None:
    if policy is None:
        return None
    for rule in policy.rules():
        if isinstance(rule, KeepBest):
            return rule
    return None


def _chart_metric(ckpts: Sequence[CheckpointInfo], rule: KeepBest | None) -> tuple[str | None, str]:
    """The run's chart metric and its better end: the policy's KeepBest, else the first
    metric recorded (``max`` when its name reads like a score: acc, f1, reward, ...)."""
    if rule is not None:
        return rule.metric, rule.mode
    for c in ckpts:
        for name in c.metrics:
            return name, "max" if _MAX_IS_BETTER.search(name) else "min"
    return None, "min"


def _best(ckpts: Sequence[CheckpointInfo], metric: str | None, mode: str) -> str | None:
    """The best finite value of ``metric`` (ties: the newer checkpoint, as KeepBest)."""
    if metric is None:
        return None
    best: tuple[float, str] | None = None
    sign = 1.0 if mode == "min" else -1.0
    for c in ckpts:
        v = c.metrics.get(metric)
        if v is None or not math.isfinite(v):
            continue
        if best is None or sign * v <= best[0]:
            best = (sign * v, c.name)
    return best[1] if best else None


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
    notes: list[str] = []
    now, grace = opts.now, opts.grace
    if now is None:
        # The store's time, as prune judges by; a host clock far off it is only a note.
        t = store_time(where, url.prefix)
        now = t.store
        skew = skew_note(t, max(grace, MIN_GRACE))
        if skew is not None:
            notes.append(f"{skew}; fix this host's clock (NTP)")
    now = aware_now(now, "now must be timezone-aware (e.g. datetime.now(timezone.utc))")
    prices = prices or PriceTable()
    if source is not None and grace < MIN_GRACE:
        notes.append(
            f"grace {format_duration(grace)} raised to {format_duration(MIN_GRACE)}, as prune does"
        )
        grace = MIN_GRACE
    opts = opts.replace(now=now, grace=grace)
    rule = _best_rule(None if source is None else source.policy)
    runs = []
    catalogs = list(scan(here, options=opts))
    versions = noncurrent_versions(where, [cat.run.prefix for cat in catalogs])
    for cat in catalogs:
        p = (
            None
            if source is None
            else plan(cat.checkpoints, source, now, options=opts, run=cat.run)
        )
        if p is not None and p.transitions:  # list what the tiers would move (a LIST each)
            p = survey_plan(where, p, grace)
        decisions = {d.checkpoint.name: d for d in p.decisions} if p is not None else {}
        moves = {t.name: t for t in p.transitions if t.skipped is None} if p is not None else {}
        rows = []
        for c in cat.checkpoints:
            d = decisions.get(c.name)
            move = moves.get(c.name)
            rows.append(
                CheckpointRow(
                    info=c,
                    action=d.action if d is not None else None,
                    reasons=d.reasons if d is not None else (),
                    cost=prices.monthly_cost(storage_bytes(c), str(c.url)),
                    cost_after=(
                        None if move is None else prices.monthly_cost(_moved(c, move), str(c.url))
                    ),
                    storage_class_after=None if move is None else move.storage_class,
                )
            )
        metric, mode = _chart_metric(cat.checkpoints, rule)
        runs.append(
            RunReport(
                run=cat.run,
                rows=tuple(rows),
                plan=p,
                metric=metric,
                mode=mode,
                best=_best(cat.checkpoints, metric, mode),
                versions=versions,
            )
        )
    return Report(
        root=url,
        runs=tuple(runs),
        now=now,
        policy=None if source is None else source.describe(),
        prices=prices,
        title=title or f"s3ckpt report: {url}",
        grace=grace,
        include_foreign=opts.include_foreign,
        notes=tuple(notes),
        versions=versions,
    )


def _moved(c: CheckpointInfo, t: Transition) -> dict[str, int]:
    """``c``'s bytes by class once transition ``t`` is done (a tag-method tier too: the
    lifecycle rule it relies on moves the same objects)."""
    out = dict(storage_bytes(c))
    for cls, n in t.from_classes.items():
        out[cls] = max(out.get(cls, 0) - n, 0)
    out[t.storage_class] = out.get(t.storage_class, 0) + (t.bytes or 0)
    return out
