"""``s3ckpt report``: one self-contained HTML page about the checkpoints under a prefix.

The page shows, per run, every checkpoint on a step (or commit-time) axis with its state, the
metric curve with the best checkpoint marked, sizes, the storage cost per month and, with a
policy, what the plan keeps or deletes and why (on hover and in a table). It is rendered on
the server (here): every number is in the DOM before any script runs, and the small inline
script only filters, sorts, toggles the axis and links a hovered point to its table row. No
network, no server, no library: one file that opens from disk. ``docs/report.md`` documents
the DOM attributes the page promises (a stable contract, read by tests and scripts).

Pipeline, all pure but the listing::

    scan(store, root)            one paged listing, like ``s3ckpt ls``
    plan(run, policy, now)       per run, like ``s3ckpt prune`` (a dry run: no lease, no delete)
    PriceTable.monthly_cost      bytes per storage class -> USD per month
    render_html(Report)          the page

Needs no torch (the retention cron image can run it).
"""

from __future__ import annotations

import base64
import hashlib
import html
import math
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import MappingProxyType

from s3ckpt._time import aware_now, iso_z
from s3ckpt._units import format_bytes, plural
from s3ckpt._version import __version__
from s3ckpt.errors import ConfigError
from s3ckpt.retention import (
    DEFAULT_GRACE,
    MIN_GRACE,
    CheckpointInfo,
    CheckpointState,
    KeepBest,
    Plan,
    Policy,
    check_policy,
    format_duration,
    plan,
    scan,
)
from s3ckpt.store import skew_note, store_time
from s3ckpt.store.base import ObjectStore
from s3ckpt.uri import StoreURL, parse_location

__all__ = [
    "DEFAULT_PRICES",
    "GIB",
    "STATES",
    "CheckpointRow",
    "PriceTable",
    "Report",
    "RunReport",
    "build_report",
    "collect_report",
    "format_usd",
    "parse_price",
    "render_html",
]

GIB = 2**30
"""Bytes in the "GB" of S3's bills: storage is billed per GB-month with GB = 2^30 bytes."""

DEFAULT_PRICES: Mapping[str, float] = MappingProxyType(
    {
        "STANDARD": 0.023,
        "INTELLIGENT_TIERING": 0.023,
        "STANDARD_IA": 0.0125,
        "ONEZONE_IA": 0.01,
        "GLACIER_IR": 0.004,
        "GLACIER": 0.0036,
        "DEEP_ARCHIVE": 0.00099,
        "REDUCED_REDUNDANCY": 0.024,
        "EXPRESS_ONEZONE": 0.11,
    }
)
"""USD per GB-month (GB = 2^30 bytes) by S3 storage class: AWS's list prices for us-east-1,
first tier (the first 50 TB a month), from the Amazon S3 pricing page as of 2025-06.
``INTELLIGENT_TIERING`` is its frequent-access tier (objects that cool down cost less, and a
monitoring fee per object is not counted); ``GLACIER`` is Glacier Flexible Retrieval.

The estimate is bytes times price: minimum billable sizes and durations (128 KiB and 30 days
for the IA classes, 90 / 180 days for the Glacier ones), the Glacier classes' 40 KiB of
overhead per object, requests and transfer are not counted. Other regions, tiers or
negotiated prices: pass your own (:class:`PriceTable`, ``--prices`` / ``--price``)."""

PRICES_SOURCE = "AWS S3 list prices, us-east-1, first tier, as of 2025-06"

STATES: tuple[str, ...] = tuple(s.value for s in CheckpointState)
"""The ``data-state`` values: exactly ``s3ckpt ls --json``'s ``state`` strings."""

_CLASS_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")


# -- prices --------------------------------------------------------------------------------------
def _check_price(storage_class: str, value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: the price of {storage_class} must be a number, got {value!r}")
    price = float(value)
    if not math.isfinite(price) or price < 0:
        raise ConfigError(f"{where}: the price of {storage_class} must be >= 0, got {value!r}")
    return price


def _check_class(name: object, where: str) -> str:
    if not isinstance(name, str) or not _CLASS_NAME.match(name.strip().upper()):
        raise ConfigError(
            f"{where}: {name!r} is not a storage class name (e.g. STANDARD, STANDARD_IA, GLACIER)"
        )
    return name.strip().upper()


@dataclass(frozen=True)
class PriceTable:
    """Storage prices in USD per GB-month (GB = 2^30 bytes, as AWS bills) by storage class.

    Attributes:
        prices: Storage class -> USD per GB-month. Class names are upper case, as S3
            lists them (``STANDARD``, ``STANDARD_IA``, ``GLACIER_IR``, ...).
        source: Where the prices come from (shown on the page).

    The default is :data:`DEFAULT_PRICES`. ``PriceTable().with_prices({"STANDARD": 0.021})``
    overrides some classes and keeps the rest; :meth:`load` reads a TOML file.
    """

    prices: Mapping[str, float] = field(default_factory=lambda: DEFAULT_PRICES)
    source: str = PRICES_SOURCE

    def __post_init__(self) -> None:
        checked = {}
        for name, value in self.prices.items():
            cls = _check_class(name, "price table")
            checked[cls] = _check_price(cls, value, "price table")
        object.__setattr__(self, "prices", MappingProxyType(checked))

    def price(self, storage_class: str, where: str = "") -> float:
        """USD per GB-month of ``storage_class``.

        Raises:
            ConfigError: The table has no price for it; the message names the class and
                how to add one.
        """
        try:
            return self.prices[storage_class]
        except KeyError:
            at = f" ({where})" if where else ""
            raise ConfigError(
                f"no price for storage class {storage_class!r}{at}: add one with "
                f"--price {storage_class}=USD_PER_GB_MONTH, or a line "
                f'"{storage_class} = ..." under [prices] in the --prices file '
                f"(known: {', '.join(sorted(self.prices))})"
            ) from None

    def monthly_cost(self, bytes_by_class: Mapping[str, int], where: str = "") -> float:
        """USD per month for ``bytes_by_class`` (storage class -> bytes)."""
        return sum(n / GIB * self.price(cls, where) for cls, n in bytes_by_class.items() if n)

    def with_prices(self, prices: Mapping[str, float], source: str | None = None) -> PriceTable:
        """This table with ``prices`` added or replaced (other classes keep their price)."""
        merged = dict(self.prices)
        for name, value in prices.items():
            merged[_check_class(name, "price")] = _check_price(name, value, "price")
        return PriceTable(merged, source if source is not None else f"{self.source}, overridden")

    @classmethod
    def load(cls, path: str | Path, base: PriceTable | None = None) -> PriceTable:
        """``base`` (default: :data:`DEFAULT_PRICES`) with the prices of a TOML file.

        The file holds ``CLASS = USD`` lines, under a ``[prices]`` table or at the top
        level, and optionally ``source = "..."``::

            source = "our EDP rates, eu-west-1, 2025"
            [prices]
            STANDARD = 0.021
            GLACIER_IR = 0.0036

        Raises:
            ConfigError: The file cannot be read, is not TOML, or a price is not a number
                >= 0.
        """
        p = Path(path)
        try:
            doc = tomllib.loads(p.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"{p}: cannot read the price file: {exc.strerror or exc}") from exc
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{p}: not a TOML price file: {exc}") from exc
        source = doc.pop("source", None)
        if source is not None and not isinstance(source, str):
            raise ConfigError(f"{p}: source must be a string, got {source!r}")
        table = doc.pop("prices", None)
        if table is None:
            table = doc
        elif doc:
            raise ConfigError(
                f"{p}: unexpected keys beside [prices]: {', '.join(sorted(doc))} "
                "(put every CLASS = USD line under [prices])"
            )
        if not isinstance(table, dict):
            raise ConfigError(f"{p}: [prices] must be a table of CLASS = USD_PER_GB_MONTH")
        prices = {}
        for name, value in table.items():
            cls_name = _check_class(name, str(p))
            prices[cls_name] = _check_price(cls_name, value, str(p))
        return (base or cls()).with_prices(prices, source or f"{p}")


def parse_price(text: str) -> tuple[str, float]:
    """``"STANDARD_IA=0.0125"`` -> ``("STANDARD_IA", 0.0125)`` (``--price``).

    Raises:
        ConfigError: Not ``CLASS=USD`` with a number >= 0.
    """
    name, sep, value = text.partition("=")
    if not sep:
        raise ConfigError(f"expected CLASS=USD_PER_GB_MONTH (e.g. STANDARD=0.023), got {text!r}")
    cls = _check_class(name, "--price")
    try:
        price = float(value)
    except ValueError:
        raise ConfigError(f"--price {text}: {value!r} is not a number") from None
    return cls, _check_price(cls, price, "--price")


# -- the model -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckpointRow:
    """One checkpoint on the page: the catalog's record, the plan's decision and its cost.

    Attributes:
        info: The catalog record (as ``s3ckpt ls`` lists it).
        action: ``keep`` / ``delete`` / ``skip`` from the plan; None without a policy.
        reasons: The plan's reasons (``s3ckpt prune``'s), empty without a policy.
        cost: Storage cost in USD per month.
    """

    info: CheckpointInfo
    action: str | None
    reasons: tuple[str, ...]
    cost: float

    @property
    def bytes_by_class(self) -> Mapping[str, int]:
        """The checkpoint's bytes by storage class (all ``STANDARD`` when unknown)."""
        return _by_class(self.info)

    @property
    def time(self) -> datetime | None:
        """Where the point sits on the time axis: the commit time, else (a save in progress,
        an abandoned one) the last activity."""
        return self.info.committed_at or self.info.last_activity


def _by_class(info: CheckpointInfo) -> Mapping[str, int]:
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
    """

    run: StoreURL
    rows: tuple[CheckpointRow, ...]
    plan: Plan | None = None
    metric: str | None = None
    mode: str = "min"
    best: str | None = None

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
        """USD per month once the plan's deletions are done."""
        return sum(r.cost for r in self.rows if r.action != "delete")

    def counts(self) -> dict[str, int]:
        """Checkpoints by state (every state, zeros included), ``pinned`` and, with a plan,
        by action (``keep``, ``delete``, ``skip``)."""
        out = dict.fromkeys(STATES, 0)
        for r in self.rows:
            out[r.info.state.value] += 1
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
        }
        if self.plan is not None:
            doc.update(
                bytes_freed=self.bytes_freed,
                objects_deleted=self.objects_deleted,
                cost_month_after=self.cost_after,
                cost_saved=self.cost - self.cost_after,
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

    @property
    def num_checkpoints(self) -> int:
        """Checkpoints over all runs."""
        return sum(len(r.rows) for r in self.runs)

    def summary(self) -> dict[str, object]:
        """Totals over all runs (JSON-ready; the page's top ``data-field`` values)."""
        doc: dict[str, object] = {"runs": len(self.runs), "checkpoints": self.num_checkpoints}
        # Every count present, zeros included, when there is no run at all (an empty prefix).
        counts: dict[str, int] = dict.fromkeys((*STATES, "pinned"), 0)
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


# -- collecting ----------------------------------------------------------------------------------
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
    store: ObjectStore,
    root: StoreURL | str,
    *,
    policy: Policy | None = None,
    now: datetime | None = None,
    grace: timedelta = DEFAULT_GRACE,
    prices: PriceTable | None = None,
    step_pattern: str | None = None,
    include_foreign: bool = False,
    max_delete: int | None = None,
    title: str | None = None,
) -> Report:
    """The numbers of the page: a scan of ``root`` and, with a policy, each run's plan.

    A pure dry run: no lease is taken and nothing is written or deleted. The options mean
    what they mean for ``s3ckpt prune`` (and without a policy, for ``s3ckpt ls``).

    Args:
        store: The store holding ``root``.
        root: A run, or a prefix holding runs.
        policy: Overlay this policy's plan (keep / delete / skip with reasons).
        now: The time the grace period and the policy judge against (default: the store's
            time; this host's clock further from it than the grace period is a note).
        grace: How long after its last activity a save is in progress. With a policy it
            is raised to :data:`~s3ckpt.retention.MIN_GRACE` when shorter, as prune does.
        prices: Storage prices (default: :data:`DEFAULT_PRICES`).
        step_pattern: Reads steps from checkpoint names (default: the policy's).
        include_foreign: Let the plan treat stock-DCP checkpoints as committed.
        max_delete: Cap the plan's deletions per run, as ``prune --max-delete``.
        title: The page's title (default: ``s3ckpt report: ROOT``).

    Raises:
        PolicyError: The policy is empty.
        ConfigError: A bad ``step_pattern``, or a storage class the price table lacks.

    Request cost: that of :func:`~s3ckpt.retention.scan` over ``root`` (one LIST per 1000
    objects, one GET per commit marker and pin), and without ``now`` one LIST of one key
    for the store's time.
    """
    url = root if isinstance(root, StoreURL) else parse_location(root)
    notes: list[str] = []
    if now is None:
        # The store's time, as prune judges by; a host clock far off it is only a note.
        t = store_time(store, url.prefix)
        now = t.store
        skew = skew_note(t, max(grace, MIN_GRACE))
        if skew is not None:
            notes.append(f"{skew}; fix this host's clock (NTP)")
    now = aware_now(now, "now must be timezone-aware (e.g. datetime.now(timezone.utc))")
    prices = prices or PriceTable()
    if policy is not None:
        check_policy(policy)
        if step_pattern is None:
            step_pattern = policy.step_pattern
        if grace < MIN_GRACE:
            notes.append(
                f"grace {format_duration(grace)} raised to {format_duration(MIN_GRACE)}, "
                "as prune does"
            )
            grace = MIN_GRACE
    rule = _best_rule(policy)
    runs = []
    for cat in scan(store, url, grace=grace, now=now, step_pattern=step_pattern):
        p = None
        if policy is not None:
            p = plan(
                cat.checkpoints,
                policy,
                now,
                max_delete=max_delete,
                include_foreign=include_foreign,
                run=cat.run,
            )
        decisions = {d.checkpoint.name: d for d in p.decisions} if p is not None else {}
        rows = []
        for c in cat.checkpoints:
            d = decisions.get(c.name)
            rows.append(
                CheckpointRow(
                    info=c,
                    action=d.action if d is not None else None,
                    reasons=d.reasons if d is not None else (),
                    cost=prices.monthly_cost(_by_class(c), str(c.url)),
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
            )
        )
    return Report(
        root=url,
        runs=tuple(runs),
        now=now,
        policy=policy.describe() if policy is not None else None,
        prices=prices,
        title=title or f"s3ckpt report: {url}",
        grace=grace,
        include_foreign=include_foreign,
        notes=tuple(notes),
    )


def build_report(
    store: ObjectStore,
    root: StoreURL | str,
    *,
    policy: Policy | None = None,
    now: datetime | None = None,
    grace: timedelta = DEFAULT_GRACE,
    prices: PriceTable | None = None,
    step_pattern: str | None = None,
    include_foreign: bool = False,
    max_delete: int | None = None,
    title: str | None = None,
) -> str:
    """The report page of ``root`` as one self-contained HTML document.

    :func:`collect_report` then :func:`render_html`; the arguments are
    :func:`collect_report`'s. Example::

        from s3ckpt.retention import load_policy
        from s3ckpt.store import open_store
        from s3ckpt.tools import build_report

        store, root = open_store("s3://bucket/runs/")
        page = build_report(store, root, policy=load_policy("pretraining"))
        Path("report.html").write_text(page, encoding="utf-8")
    """
    return render_html(
        collect_report(
            store,
            root,
            policy=policy,
            now=now,
            grace=grace,
            prices=prices,
            step_pattern=step_pattern,
            include_foreign=include_foreign,
            max_delete=max_delete,
            title=title,
        )
    )


# -- rendering -----------------------------------------------------------------------------------
def _e(value: object) -> str:
    """Escaped for HTML text and double-quoted attributes (bucket data is untrusted)."""
    return html.escape(str(value), quote=True)


def _num(v: float) -> str:
    """A float for a data attribute: ``repr`` when finite, else what ``parseFloat`` reads."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return repr(float(v))


def format_usd(v: float) -> str:
    """``v`` US dollars as the report shows them: ``$1,234.56``, and ``<$0.01`` for a
    positive amount that rounds to zero cents (never a misleading ``$0.00``)."""
    if 0 < abs(v) < 0.005:
        return "<$0.01"
    return f"${v:,.2f}"


def _metric_text(v: float) -> str:
    return f"{v:.6g}" if math.isfinite(v) else str(v)


def _when(t: datetime | None) -> str:
    return "" if t is None else t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


# Chart geometry (viewBox units).
_W, _H = 960, 290
_L, _R, _T = 70, 20, 24  # margins: left (y labels), right, top (best label)
_PLOT_B = 214  # bottom of the plot area
_LANE = 236  # the lane of points without a value
_AXIS = 254  # the x axis line
_XR = (_L + 8, _W - _R - 8)
_ANCHOR_LO, _ANCHOR_HI = 240, 720


def _nice_ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    out = []
    v = first
    while v <= hi + step * 1e-9:
        out.append(round(v, 12))
        v += step
    return out


_TIME_STEPS = [
    60,
    300,
    900,
    1800,
    3600,
    3 * 3600,
    6 * 3600,
    12 * 3600,
    86400,
    2 * 86400,
    7 * 86400,
    14 * 86400,
    30 * 86400,
    91 * 86400,
    365 * 86400,
]


def _time_ticks(lo: float, hi: float, n: int = 6) -> tuple[list[float], str]:
    span = max(hi - lo, 1.0)
    step = next((s for s in _TIME_STEPS if span / s <= n), _TIME_STEPS[-1])
    fmt = "%Y-%m-%d" if step >= 86400 else "%m-%d %H:%M"
    first = math.ceil(lo / step) * step
    ticks: list[float] = []
    v = first
    while v <= hi:
        ticks.append(v)
        v += step
    return ticks, fmt


def _step_axis(steps: Sequence[float]) -> tuple[float, float, list[float]]:
    """The step axis: its range and its ticks.

    Steps are whole numbers, so are the ticks. One step (or several saves of the same
    step) sits in the middle of a range of at least one step either side (5 % of the step
    for big ones), which starts at 0 at the lowest when no step is negative: a run whose
    only checkpoint is step 0 gets an axis from 0 to 1, never negative step labels.
    """
    if not steps:
        return 0.0, 1.0, []
    lo, hi = min(steps), max(steps)
    if hi <= lo:
        pad = max(1.0, float(math.ceil(abs(lo) * 0.05)))
        lo, hi = (max(lo - pad, 0.0) if lo >= 0 else lo - pad), hi + pad
    return lo, hi, [t for t in _nice_ticks(lo, hi, 8) if t == math.floor(t)]


def _time_range(times: Sequence[float]) -> tuple[float, float]:
    """The commit-time axis' range: one commit time (or all equal) is centred in an hour."""
    if not times:
        return 0.0, 1.0
    lo, hi = min(times), max(times)
    return (lo - 1800.0, hi + 1800.0) if hi <= lo else (lo, hi)


class _Scale:
    def __init__(self, lo: float, hi: float, out_lo: float, out_hi: float) -> None:
        if hi <= lo:
            pad = abs(lo) * 0.05 or 1.0
            lo, hi = lo - pad, hi + pad
        self.lo, self.hi, self.out_lo, self.out_hi = lo, hi, out_lo, out_hi

    def __call__(self, v: float) -> float:
        return self.out_lo + (v - self.lo) / (self.hi - self.lo) * (self.out_hi - self.out_lo)


def _fmt_tick(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e6 or a < 1e-3:
        return f"{v:.3g}"
    return f"{v:,.6g}" if a >= 1000 else f"{v:.6g}"


def _y_value(r: CheckpointRow, metric: str | None) -> float | None:
    if metric is None:
        return float(r.info.size)
    v = r.info.metrics.get(metric)
    return float(v) if v is not None and math.isfinite(v) else None


def _title(r: CheckpointRow, metric: str | None) -> str:
    c = r.info
    lines = [f"{c.name} · step {'-' if c.step is None else c.step}"]
    state = c.state.value
    if c.damaged:  # committed, its marker unreadable: never deleted by a plan
        state += f" · damaged: {c.error}"
    if c.pinned:
        state += f" · pinned: {c.pinned}"
    lines.append(state)
    lines.append(
        f"{format_bytes(c.size)} ({c.size} B) · {plural(c.num_objects, 'object')} · "
        f"{format_usd(r.cost)}/mo"
    )
    if metric is not None and metric in c.metrics:
        lines.append(f"{metric} = {_metric_text(c.metrics[metric])}")
    if r.action is not None:
        lines.append(f"{r.action}: {'; '.join(r.reasons)}")
    return "\n".join(lines)


def _chart(rr: RunReport, rid: str) -> str:
    """The run's inline SVG: points at step positions (``cx``), with the time positions in
    ``data-xt`` for the script's axis toggle."""
    rows = rr.rows
    steps = [float(r.info.step) for r in rows if r.info.step is not None]
    times = [r.time.timestamp() for r in rows if r.time is not None]
    ys = [y for y in (_y_value(r, rr.metric) for r in rows) if y is not None]
    step_lo, step_hi, step_ticks = _step_axis(steps)
    sx = _Scale(step_lo, step_hi, *_XR)
    st = _Scale(*_time_range(times), *_XR)
    ylo, yhi = min(ys, default=0.0), max(ys, default=1.0)
    ticks_y = _nice_ticks(ylo, yhi, 5)
    if len(ticks_y) > 1:
        ylo, yhi = min(ylo, ticks_y[0]), max(yhi, ticks_y[-1])
    sy = _Scale(ylo, yhi, _PLOT_B, _T + 6)
    n = len(rows)
    radius = 4.0 if n <= 300 else 3.0 if n <= 3000 else 2.2
    out: list[str] = []
    ylabel = rr.metric if rr.metric is not None else "size (bytes)"
    out.append(
        f'<svg class="chart" viewBox="0 0 {_W} {_H}" role="img" '
        f'aria-label="{_e(ylabel)} by step for {_e(rr.run)}">'
    )
    # Grid and y axis.
    out.append('<g class="grid">')
    for t in ticks_y:
        y = sy(t)
        out.append(
            f'<line x1="{_L}" x2="{_W - _R}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="yt" x="{_L - 6}" y="{y + 4:.1f}">'
            f"{_e(format_bytes(t) if rr.metric is None else _fmt_tick(t))}</text>"
        )
    out.append("</g>")
    out.append(
        f'<text class="ylabel" x="{_L - 6}" y="{_T - 8}">{_e(ylabel)}'
        f"{'' if rr.metric is None else f' ({rr.mode} is best)'}</text>"
        f'<text class="lane" x="{_L - 6}" y="{_LANE + 4}">no value</text>'
        f'<line class="laneline" x1="{_L}" x2="{_W - _R}" y1="{_LANE}" y2="{_LANE}"/>'
        f'<line class="axis" x1="{_L}" x2="{_W - _R}" y1="{_AXIS}" y2="{_AXIS}"/>'
    )
    # x axes: both drawn, CSS shows the one the section's data-x names.
    out.append('<g class="ax ax-step">')
    for t in step_ticks:
        x = sx(t)
        if _XR[0] - 1 <= x <= _XR[1] + 1:
            out.append(
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{_AXIS}" y2="{_AXIS + 5}"/>'
                f'<text x="{x:.1f}" y="{_AXIS + 18}">{_e(_fmt_tick(t))}</text>'
            )
    out.append(f'<text class="xlabel" x="{_W - _R}" y="{_H - 4}">step</text></g>')
    out.append('<g class="ax ax-time">')
    tt, fmt = _time_ticks(st.lo, st.hi) if times else ([], "")
    for t in tt:
        x = st(t)
        if _XR[0] - 1 <= x <= _XR[1] + 1:
            label = datetime.fromtimestamp(t, UTC).strftime(fmt)
            out.append(
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{_AXIS}" y2="{_AXIS + 5}"/>'
                f'<text x="{x:.1f}" y="{_AXIS + 18}">{_e(label)}</text>'
            )
    out.append(f'<text class="xlabel" x="{_W - _R}" y="{_H - 4}">commit time (UTC)</text></g>')

    xs: list[str] = []
    xt: list[str] = []
    yv: list[float | None] = []
    for r in rows:
        xs.append("" if r.info.step is None else f"{sx(float(r.info.step)):.1f}")
        xt.append("" if r.time is None else f"{st(r.time.timestamp()):.1f}")
        yv.append(_y_value(r, rr.metric))

    # The metric curve: committed (and foreign) points with a value, in x order.
    curve = [
        i
        for i, r in enumerate(rows)
        if yv[i] is not None
        and r.info.state in (CheckpointState.COMMITTED, CheckpointState.FOREIGN)
    ]
    if len(curve) > 1:
        ps = " ".join(f"{xs[i]},{sy(yv[i] or 0.0):.1f}" for i in curve if xs[i])
        by_t = sorted((i for i in curve if xt[i]), key=lambda i: float(xt[i]))
        pt = " ".join(f"{xt[i]},{sy(yv[i] or 0.0):.1f}" for i in by_t)
        out.append(f'<polyline class="curve" points="{ps}" data-ps="{ps}" data-pt="{pt}"/>')

    out.append('<g class="pts">')
    for i, r in enumerate(rows):
        c = r.info
        y = _LANE if yv[i] is None else sy(yv[i] or 0.0)
        cls = f"pt s-{c.state.value}" + (f" a-{r.action}" if r.action else "")
        if c.pinned:
            cls += " pinned"
        hide = ' style="display:none"' if not xs[i] else ""
        cx = xs[i] or "0"
        if c.pinned:
            out.append(
                f'<circle class="ring" cx="{cx}" cy="{y:.1f}" r="{radius + 3:.1f}" '
                f'data-xs="{xs[i]}" data-xt="{xt[i]}" data-i="{i}"{hide}/>'
            )
        out.append(
            f'<circle id="{rid}-p{i}" class="{cls}" cx="{cx}" cy="{y:.1f}" r="{radius:.1f}" '
            f'data-i="{i}" data-xs="{xs[i]}" data-xt="{xt[i]}"{hide}>'
            f"<title>{_e(_title(r, rr.metric))}</title></circle>"
        )
    out.append("</g>")
    if rr.best is not None:
        i = next(i for i, r in enumerate(rows) if r.info.name == rr.best)
        r = rows[i]
        y = sy(yv[i] or 0.0)
        hide = ' style="display:none"' if not xs[i] else ""
        value = _metric_text(r.info.metrics[rr.metric or ""])
        out.append(
            f'<circle class="best" cx="{xs[i] or 0}" cy="{y:.1f}" r="{radius + 5:.1f}" '
            f'data-xs="{xs[i]}" data-xt="{xt[i]}"{hide}/>'
            f'<text class="bestlabel" x="{xs[i] or 0}" y="{max(y - radius - 9, 12):.1f}" '
            f'text-anchor="{_anchor(float(xs[i] or 0))}" '
            f'data-xs="{xs[i]}" data-xt="{xt[i]}"{hide}>best {_e(rr.metric)} '
            f"{_e(value)} · {_e(r.info.name)}</text>"
        )
    out.append("</svg>")
    return "".join(out)


def _anchor(x: float) -> str:
    """Where a label at ``x`` hangs: towards the middle near either edge of the chart."""
    return "end" if x > _ANCHOR_HI else "start" if x < _ANCHOR_LO else "middle"


def _dd(field_: str, value: object, text: str, label: str) -> str:
    return (
        f'<div><dt>{_e(label)}</dt><dd data-field="{field_}" data-value="{_e(value)}">'
        f"{_e(text)}</dd></div>"
    )


def _summary(doc: Mapping[str, object], has_plan: bool, scope: str) -> str:
    out = [f'<dl class="summary" data-scope="{_e(scope)}">']
    if "runs" in doc:
        out.append(_dd("runs", doc["runs"], str(doc["runs"]), "runs"))
    out.append(_dd("checkpoints", doc["checkpoints"], str(doc["checkpoints"]), "checkpoints"))
    for state in (*STATES, "pinned"):
        n = doc.get(state, 0)
        out.append(_dd(state, n, str(n), state.replace("_", " ")))
    size = int(doc["total_size"])  # type: ignore[call-overload]
    out.append(_dd("total_size", size, format_bytes(size), "total size"))
    out.append(_dd("num_objects", doc["num_objects"], str(doc["num_objects"]), "objects"))
    cost = float(doc["cost_month"])  # type: ignore[arg-type]
    out.append(_dd("cost_month", _num(cost), f"{format_usd(cost)}/mo", "storage now"))
    if has_plan:
        for action in ("keep", "delete", "skip"):
            n = doc.get(action, 0)
            out.append(_dd(action, n, str(n), action))
        freed = int(doc["bytes_freed"])  # type: ignore[call-overload]
        out.append(_dd("bytes_freed", freed, format_bytes(freed), "freed by the plan"))
        out.append(
            _dd(
                "objects_deleted",
                doc["objects_deleted"],
                str(doc["objects_deleted"]),
                "objects deleted",
            )
        )
        after = float(doc["cost_month_after"])  # type: ignore[arg-type]
        saved = float(doc["cost_saved"])  # type: ignore[arg-type]
        out.append(
            _dd("cost_month_after", _num(after), f"{format_usd(after)}/mo", "after the plan")
        )
        out.append(_dd("cost_saved", _num(saved), f"{format_usd(saved)}/mo", "saved"))
    out.append("</dl>")
    return "".join(out)


_COLUMNS: tuple[tuple[str, str, str], ...] = (
    # (header, data attribute to sort on, "num" | "str")
    ("#", "i", "num"),
    ("name", "name", "str"),
    ("step", "step", "num"),
    ("state", "state", "str"),
    ("committed", "committedAt", "str"),
    ("size", "size", "num"),
    ("objects", "numObjects", "num"),
    ("metrics", "metric", "num"),
    ("$/month", "cost", "num"),
    ("pinned", "pinned", "str"),
    ("action", "action", "str"),
    ("reasons", "", ""),
)


def _row(r: CheckpointRow, i: int, rid: str, metric: str | None) -> str:
    c = r.info
    step = "" if c.step is None else str(c.step)
    committed = iso_z(c.committed_at) or ""
    mv = c.metrics.get(metric) if metric is not None else None
    attrs = [
        f'id="{rid}-c{i}" class="checkpoint" data-i="{i}" data-name="{_e(c.name)}"',
        f'data-url="{_e(c.url)}" data-step="{step}" data-state="{c.state.value}"',
        f'data-committed-at="{committed}" data-size="{c.size}" data-num-objects="{c.num_objects}"',
        f'data-cost="{_num(r.cost)}" data-action="{r.action or ""}"',
    ]
    if r.time is not None:
        attrs.append(f'data-t="{r.time.timestamp():.3f}"')
    if mv is not None:
        attrs.append(f'data-metric="{_num(mv)}"')
    if c.pinned:
        attrs.append(f'data-pinned="{_e(c.pinned)}"')
    if r.info.bytes_by_class and set(r.info.bytes_by_class) != {"STANDARD"}:
        attrs.append(
            'data-classes="'
            + _e(" ".join(f"{k}={v}" for k, v in sorted(r.info.bytes_by_class.items())))
            + '"'
        )
    metrics = "".join(
        f'<span data-metric="{_e(k)}" data-value="{_num(v)}">{_e(k)}={_e(_metric_text(v))}</span> '
        for k, v in c.metrics.items()
    )
    reasons = "".join(f"<li>{_e(x)}</li>" for x in r.reasons)
    action = f'<span class="act a-{r.action}">{r.action}</span>' if r.action else "-"
    classes = ""
    if r.info.bytes_by_class and set(r.info.bytes_by_class) != {"STANDARD"}:
        classes = '<small class="cls">' + _e(", ".join(sorted(r.info.bytes_by_class))) + "</small>"
    return (
        f"<tr {' '.join(attrs)}>"
        f"<td>{i + 1}</td>"
        f'<td class="name">{_e(c.name)}</td>'
        f'<td class="n">{step or "-"}</td>'
        f'<td><span class="badge s-{c.state.value}"'
        + (f' title="{_e(c.error or "")}">damaged' if c.damaged else f">{c.state.value}")
        + "</span></td>"
        f'<td class="t">{_e(_when(c.committed_at)) or "-"}</td>'
        f'<td class="n">{_e(format_bytes(c.size))}<small class="b">{c.size} B</small>'
        f"{classes}</td>"
        f'<td class="n">{c.num_objects}</td>'
        f'<td class="metrics">{metrics or "-"}</td>'
        f'<td class="n">{_e(format_usd(r.cost))}</td>'
        f'<td class="pin">{_e(c.pinned or "")}</td>'
        f"<td>{action}</td>"
        f'<td><ul class="reasons">{reasons}</ul></td>'
        "</tr>"
    )


def _run_section(rr: RunReport, k: int) -> str:
    rid = f"r{k}"
    has_plan = rr.plan is not None
    out = [
        f'<section class="run" id="{rid}" data-run="{_e(rr.run)}" data-x="step" '
        f'data-metric="{_e(rr.metric or "")}" data-mode="{rr.mode}" '
        f'data-best="{_e(rr.best or "")}">',
        f'<h2><span class="runname">{_e(rr.run)}</span></h2>',
        _summary(rr.summary(), has_plan, str(rr.run)),
    ]
    if rr.rows:
        no_step = sum(1 for r in rr.rows if r.info.step is None)
        note = f" · {no_step} without a step (shown on the time axis only)" if no_step else ""
        out.append(
            '<figure class="chartbox"><div class="controls" role="group" aria-label="x axis">'
            '<span>x axis:</span><button type="button" data-xmode="step" aria-pressed="true">'
            'step</button><button type="button" data-xmode="time" aria-pressed="false">'
            f'commit time</button><span class="muted">{_e(note)}</span></div>'
            + _chart(rr, rid)
            + '<figcaption class="detail" aria-live="polite">Hover a point for details; '
            "click it to find its row.</figcaption></figure>"
        )
        head = "".join(
            (
                f'<th data-sort="{key}" data-type="{kind}" aria-sort="none">{_e(h)}</th>'
                if key
                else f"<th>{_e(h)}</th>"
            )
            for h, key, kind in _COLUMNS
        )
        body = "".join(_row(r, i, rid, rr.metric) for i, r in enumerate(rr.rows))
        out.append(
            f'<div class="tablewrap"><table class="checkpoints"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>"
        )
    else:
        out.append('<p class="muted">No checkpoints (the run holds only a lease).</p>')
    out.append("</section>")
    return "".join(out)


def _prices(report: Report, used: Iterable[str]) -> str:
    used = set(used)
    rows = "".join(
        f'<tr data-class="{_e(cls)}" data-price="{_num(p)}"{" class=used" if cls in used else ""}>'
        f"<td>{_e(cls)}</td><td class=n>${p:g}</td><td>{'used' if cls in used else ''}</td></tr>"
        for cls, p in sorted(report.prices.prices.items(), key=lambda kv: -kv[1])
    )
    return (
        '<details class="prices"><summary>Storage prices (USD per GB-month, GB = 2<sup>30</sup>'
        f" bytes): {_e(report.prices.source)}</summary><table><thead><tr><th>storage class</th>"
        f"<th>USD / GB-month</th><th></th></tr></thead><tbody>{rows}</tbody></table>"
        '<p class="muted">An estimate: bytes times the price. Minimum billable sizes and '
        "durations, per-object overheads, requests and transfer are not counted.</p></details>"
    )


_CSS = """
:root{color-scheme:light dark;--bg:#fff;--fg:#1b1f24;--muted:#59636e;--line:#d0d7de;
--card:#f6f8fa;--hl:#fff3bf;--committed:#0072b2;--in_progress:#e69f00;--abandoned:#8c8c8c;
--foreign:#cc79a7;--pin:#009e73;--best:#d55e00;--curve:#7a8794;--del:#c0392b}
@media (prefers-color-scheme:dark){:root{--bg:#0d1117;--fg:#e6edf3;--muted:#8d96a0;
--line:#30363d;--card:#161b22;--hl:#3b3413;--committed:#56b4e9;--in_progress:#f0b428;
--abandoned:#9a9a9a;--foreign:#e59cc8;--pin:#2fc39a;--best:#ff7f3f;--curve:#6e7a86;
--del:#ff7b72}}
*{box-sizing:border-box}
body{margin:0;padding:20px 28px;background:var(--bg);color:var(--fg);
font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:0 0 10px;word-break:break-all}
.muted,.meta{color:var(--muted)}.meta{margin:0 0 12px}.meta b{color:var(--fg);font-weight:600}
.toolbar{display:flex;gap:16px;align-items:center;flex-wrap:wrap;margin:10px 0 16px}
select,button{font:inherit;color:inherit;background:var(--card);border:1px solid var(--line);
border-radius:6px;padding:2px 8px}button[aria-pressed=true]{border-color:var(--committed);
box-shadow:inset 0 0 0 1px var(--committed)}
.summary{display:flex;flex-wrap:wrap;gap:6px 8px;margin:0 0 12px}
.summary div{background:var(--card);border:1px solid var(--line);border-radius:6px;
padding:4px 10px;min-width:88px}
.summary dt{font-size:11px;color:var(--muted);text-transform:uppercase;letter-spacing:.03em}
.summary dd{margin:0;font-weight:600;font-variant-numeric:tabular-nums}
.summary dd[data-field=cost_saved],.summary dd[data-field=bytes_freed]{color:var(--pin)}
section.run{border-top:1px solid var(--line);padding:16px 0 8px;content-visibility:auto;
contain-intrinsic-size:auto 900px}
figure{margin:0 0 10px}.controls{display:flex;gap:6px;align-items:center;margin-bottom:4px}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;align-items:center;font-size:12px;
color:var(--muted);margin:6px 0}.legend svg{vertical-align:middle}
svg.chart{width:100%;height:auto;max-height:340px;display:block;background:var(--card);
border:1px solid var(--line);border-radius:6px}
svg text{fill:var(--muted);font-size:11px}svg .yt,svg .lane,svg .ylabel{text-anchor:end}
svg .ax text{text-anchor:middle}svg .xlabel{text-anchor:end!important}
svg .grid line{stroke:var(--line);stroke-width:.6}
svg .axis,svg .ax line{stroke:var(--muted);stroke-width:.8}
svg .laneline{stroke:var(--line);stroke-dasharray:3 3}
section[data-x=step] .ax-time,section[data-x=time] .ax-step{display:none}
.curve{fill:none;stroke:var(--curve);stroke-width:1.3;stroke-linejoin:round;opacity:.8}
.pt,.sw{stroke-width:1.4}.pt{cursor:pointer}
circle.s-committed{fill:var(--committed);stroke:var(--committed)}
circle.s-in_progress{fill:var(--in_progress);stroke:var(--in_progress)}
circle.s-abandoned{fill:var(--abandoned);stroke:var(--abandoned)}
circle.s-foreign{fill:var(--foreign);stroke:var(--foreign)}
circle.a-delete{fill:var(--card);stroke-width:1.6}
circle.a-skip{fill-opacity:.35}
.pt.hl{stroke:var(--fg);stroke-width:3}
.ring{fill:none;stroke:var(--pin);stroke-width:1.8;pointer-events:none}
.best{fill:none;stroke:var(--best);stroke-width:2;pointer-events:none}
.bestlabel{fill:var(--best)!important;font-weight:600;font-size:12px!important}
.detail{font-size:12px;color:var(--muted);white-space:pre-line;min-height:3.2em;margin-top:4px}
.tablewrap{max-height:70vh;overflow:auto;border:1px solid var(--line);border-radius:6px}
table.checkpoints{border-collapse:collapse;width:100%;display:block;min-width:1180px}
table.checkpoints thead,table.checkpoints tbody{display:block}
table.checkpoints tr{display:grid;grid-template-columns:3.2em minmax(9em,1.4fr) 5.5em 7.2em
10.5em 8.6em 4.6em minmax(8em,1.1fr) 5.6em minmax(4em,.7fr) 4.6em minmax(12em,2fr);
border-bottom:1px solid var(--line)}
table.checkpoints tbody tr{content-visibility:auto;contain-intrinsic-size:auto 30px}
table.checkpoints thead{position:sticky;top:0;z-index:1;background:var(--card)}
th,td{padding:4px 6px;text-align:left;overflow-wrap:anywhere;min-width:0}
th{font-size:12px;color:var(--muted);font-weight:600;user-select:none}
th[data-sort]{cursor:pointer}th[aria-sort=ascending]::after{content:" ▲"}
th[aria-sort=descending]::after{content:" ▼"}
td.n{text-align:right;font-variant-numeric:tabular-nums}td.t{font-variant-numeric:tabular-nums}
td.name{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12.5px}
td.metrics span{display:inline-block;margin-right:6px;white-space:nowrap;
font-variant-numeric:tabular-nums}td.t{font-size:12.5px}
small.cls,small.b{display:block;color:var(--muted);font-size:11px}small.b{white-space:nowrap}
tr.checkpoint:hover{background:var(--card)}tr.checkpoint.hl{background:var(--hl)}
.badge,.act{display:inline-block;padding:0 6px;border-radius:9px;font-size:12px;
border:1px solid currentColor}
.badge.s-committed{color:var(--committed)}.badge.s-in_progress{color:var(--in_progress)}
.badge.s-abandoned{color:var(--abandoned)}.badge.s-foreign{color:var(--foreign)}
.act.a-keep{color:var(--pin)}.act.a-delete{color:var(--del)}.act.a-skip{color:var(--muted)}
ul.reasons{margin:0;padding:0 0 0 14px;font-size:12.5px}
td.pin{color:var(--pin);font-size:12.5px}
details.prices{margin:8px 0 16px;font-size:13px}details.prices table{border-collapse:collapse;
margin-top:6px}details.prices td,details.prices th{border-bottom:1px solid var(--line)}
details.prices tr.used{font-weight:600}
footer{color:var(--muted);font-size:12px;margin-top:20px}
"""


def _filter_css(has_plan: bool) -> str:
    """One rule per filter value: filtering is a body attribute, no per-row script."""
    rules = []
    for s in STATES:
        rules.append(
            f'body[data-fstate="{s}"] tr.checkpoint:not([data-state="{s}"]),'
            f'body[data-fstate="{s}"] .pt:not(.s-{s}){{display:none!important}}'
        )
    rules.append(
        'body[data-fstate="pinned"] tr.checkpoint:not([data-pinned]),'
        'body[data-fstate="pinned"] .pt:not(.pinned){display:none!important}'
    )
    for a in ("keep", "delete", "skip") if has_plan else ():
        rules.append(
            f'body[data-faction="{a}"] tr.checkpoint:not([data-action="{a}"]),'
            f'body[data-faction="{a}"] .pt:not(.a-{a}){{display:none!important}}'
        )
    return "\n".join(rules)


# No innerHTML anywhere: data reaches the page only as escaped markup rendered above; the
# script reads attributes and writes textContent. Listeners are delegated (one per event
# type for the whole document), so 10,000 points cost nothing to wire.
_JS = r"""
(function () {
  "use strict";
  function run(el) { return el.closest("section.run"); }
  function pointOf(sec, i) { return document.getElementById(sec.id + "-p" + i); }
  function rowOf(sec, i) { return document.getElementById(sec.id + "-c" + i); }
  var lit = [];
  function unlight() { lit.forEach(function (e) { e.classList.remove("hl"); }); lit = []; }
  function light(sec, i) {
    unlight();
    if (!sec) { return; }
    var p = pointOf(sec, i), r = rowOf(sec, i);
    if (p) { p.classList.add("hl"); lit.push(p); }
    if (r) { r.classList.add("hl"); lit.push(r); }
    var d = sec.querySelector(".detail"), t = p && p.querySelector("title");
    if (d && t) { d.textContent = t.textContent; }
  }
  function anchor(x) { return x > %(hi)s ? "end" : (x < %(lo)s ? "start" : "middle"); }
  function setAxis(sec, mode) {
    if (sec.getAttribute("data-x") === mode) { return; }
    sec.setAttribute("data-x", mode);
    var key = mode === "time" ? "data-xt" : "data-xs";
    var els = sec.querySelectorAll("[data-xs]");
    for (var k = 0; k < els.length; k++) {
      var el = els[k], v = el.getAttribute(key);
      if (!v) { el.style.display = "none"; continue; }
      el.style.display = "";
      if (el.tagName.toLowerCase() === "text") {
        el.setAttribute("x", v);
        el.setAttribute("text-anchor", anchor(+v));
      } else {
        el.setAttribute("cx", v);
      }
    }
    var cs = sec.querySelectorAll("polyline[data-ps]");
    for (k = 0; k < cs.length; k++) {
      cs[k].setAttribute("points", cs[k].getAttribute(mode === "time" ? "data-pt" : "data-ps"));
    }
    var bs = sec.querySelectorAll("button[data-xmode]");
    for (k = 0; k < bs.length; k++) {
      bs[k].setAttribute("aria-pressed", String(bs[k].getAttribute("data-xmode") === mode));
    }
  }
  function sortBy(th) {
    var table = th.closest("table"), body = table.tBodies[0];
    var key = th.getAttribute("data-sort"), num = th.getAttribute("data-type") === "num";
    var dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
    var ths = table.querySelectorAll("th[data-sort]");
    for (var k = 0; k < ths.length; k++) { ths[k].setAttribute("aria-sort", "none"); }
    th.setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
    var rows = Array.prototype.slice.call(body.rows);
    var keyed = rows.map(function (r) {
      var v = r.dataset[key];
      if (num) { v = (v === undefined || v === "") ? NaN : parseFloat(v); }
      else { v = v === undefined ? "" : v; }
      return [v, +r.dataset.i, r];
    });
    keyed.sort(function (a, b) {
      var x = a[0], y = b[0];
      if (num) {
        var xn = x !== x, yn = y !== y;  // missing values last, either way
        if (xn || yn) { return xn && yn ? a[1] - b[1] : (xn ? 1 : -1); }
        return x === y ? a[1] - b[1] : (x < y ? -dir : dir);
      }
      return x === y ? a[1] - b[1] : (x < y ? -dir : dir);
    });
    var frag = document.createDocumentFragment();
    keyed.forEach(function (k) { frag.appendChild(k[2]); });
    body.appendChild(frag);
  }
  document.addEventListener("click", function (e) {
    var t = e.target;
    var b = t.closest && t.closest("button[data-xmode]");
    if (b) { setAxis(run(b), b.getAttribute("data-xmode")); return; }
    var th = t.closest && t.closest("th[data-sort]");
    if (th) { sortBy(th); return; }
    var p = t.closest && t.closest(".pt");
    if (p) {
      var sec = run(p), r = rowOf(sec, p.getAttribute("data-i"));
      light(sec, p.getAttribute("data-i"));
      if (r) { r.scrollIntoView({block: "nearest"}); }
    }
  });
  document.addEventListener("mouseover", function (e) {
    var t = e.target, el = t.closest && (t.closest(".pt") || t.closest("tr.checkpoint"));
    if (el) { light(run(el), el.getAttribute("data-i")); }
  });
  document.addEventListener("change", function (e) {
    var f = e.target.getAttribute && e.target.getAttribute("data-filter");
    if (f) { document.body.setAttribute("data-f" + f, e.target.value); }
  });
})();
"""


def _legend(has_plan: bool) -> str:
    def dot(cls: str, extra: str = "") -> str:
        return (
            f'<svg width="14" height="14" viewBox="0 0 14 14"><circle class="{cls}" cx="7" '
            f'cy="7" r="4"/>{extra}</svg>'
        )

    items = [f"{dot(f'sw s-{s}')} {s.replace('_', ' ')}" for s in STATES]
    items.append(f"{dot('sw s-committed', '<circle class=ring cx=7 cy=7 r=6 />')} pinned (ring)")
    items.append(
        '<svg width="14" height="14" viewBox="0 0 14 14"><circle class="best" cx="7" cy="7" '
        'r="6"/></svg> best by the metric'
    )
    if has_plan:
        items.append(f"{dot('sw s-committed a-keep')} kept (filled)")
        items.append(f"{dot('sw s-committed a-delete')} deleted by the plan (hollow)")
        items.append(f"{dot('sw s-in_progress a-skip')} skipped (faint)")
    return '<div class="legend">' + "".join(f"<span>{i}</span>" for i in items) + "</div>"


def render_html(report: Report) -> str:
    """The page of ``report``: one HTML document, no external resources (its
    Content-Security-Policy allows none), every number in the DOM before any script runs.

    The DOM contract (stable; ``docs/report.md``): ``main`` carries ``data-root``,
    ``data-now`` and ``data-policy``; ``dl.summary[data-scope]`` holds ``dd[data-field]``
    with exact ``data-value``\\ s (bytes, counts, USD per month); each run is a
    ``section.run[data-run]`` with ``data-metric`` and ``data-best``; each checkpoint a
    ``tr.checkpoint`` with ``data-name``, ``data-url``, ``data-step``, ``data-state``,
    ``data-committed-at``, ``data-size``, ``data-num-objects``, ``data-cost``,
    ``data-action`` (and ``data-pinned``, ``data-metric``, ``data-t``, ``data-classes`` when
    they apply), its reasons as ``ul.reasons > li``; and a chart point ``circle.pt`` per
    checkpoint (``id`` ``{run id}-p{i}``, row ``{run id}-c{i}``) with a ``<title>``.
    """
    has_plan = report.policy is not None
    used: set[str] = set()
    for rr in report.runs:
        used |= set(rr.bytes_by_class())
    script = (_JS % {"lo": _ANCHOR_LO, "hi": _ANCHOR_HI}).strip()
    digest = hashlib.sha256(script.encode("utf-8")).digest()
    script_hash = base64.b64encode(digest).decode("ascii")
    csp = (
        "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
        f"script-src 'sha256-{script_hash}'"
    )
    meta = [f"root <b>{_e(report.root)}</b>", f"as of <b>{_e(iso_z(report.now))}</b>"]
    if has_plan:
        meta.append(f"policy <b>{_e(report.policy)}</b> (dry run: nothing was deleted)")
    else:
        meta.append("no policy (pass --policy to overlay a plan)")
    meta.append(f"grace {_e(format_duration(report.grace))}")
    if report.include_foreign:
        meta.append("foreign checkpoints included")
    state_opts = "".join(
        f'<option value="{s}">{s.replace("_", " ")}</option>' for s in (*STATES, "pinned")
    )
    toolbar = (
        '<div class="toolbar"><label>state <select data-filter="state">'
        f'<option value="">all</option>{state_opts}</select></label>'
    )
    if has_plan:
        toolbar += (
            '<label>action <select data-filter="action"><option value="">all</option>'
            '<option value="keep">keep</option><option value="delete">delete</option>'
            '<option value="skip">skip</option></select></label>'
        )
    toolbar += "</div>"
    notes = "".join(f'<p class="muted">note: {_e(n)}</p>' for n in report.notes)
    runs = "".join(_run_section(rr, k) for k, rr in enumerate(report.runs))
    if not report.runs:
        runs = f'<p class="muted">No checkpoints under {_e(report.root)}.</p>'
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f'<meta name="generator" content="s3ckpt {_e(__version__)}">'
        f"<title>{_e(report.title)}</title><style>{_CSS}{_filter_css(has_plan)}</style></head>"
        f'<body data-fstate="" data-faction=""><main data-root="{_e(report.root)}" '
        f'data-now="{_e(iso_z(report.now))}" data-policy="{_e(report.policy or "")}">'
        f"<h1>{_e(report.title)}</h1>"
        f'<p class="meta">{" · ".join(meta)}</p>{notes}'
        + _summary(report.summary(), has_plan, "all")
        + _prices(report, used)
        + toolbar
        + _legend(has_plan)
        + runs
        + f"</main><footer>Generated by s3ckpt {_e(__version__)} at "
        f"{_e(iso_z(report.now))}; one self-contained file, no network.</footer>"
        f"<script>{script}</script></body></html>\n"
    )
