"""The retention cron's metrics as a Prometheus text file for node_exporter's textfile
collector (``s3ckpt prune --metrics-file``, ``s3ckpt gc --metrics-file``).

Every value is a gauge: it describes the last invocation, which node_exporter re-reads
on every scrape. The file is written atomically (``prometheus_client.write_to_textfile``
writes a temporary file beside it and renames it), so a scrape never reads half a file.

An invocation's values are one frozen value (:class:`_Invocation`), which both
:func:`render_textfile` and :func:`write_textfile` build once from their arguments.
:class:`MetricsFile` is an invocation's file from start to end: it takes the process's
request totals when it is made, gathers each run's :class:`RunMetrics` as they finish, and
writes once at the end (success or not) with the requests made in between. The values
are plain data: retention's results give them (``PruneResult.run_metrics``).

``s3ckpt check --metrics-file`` (:class:`CheckMetricsFile`) writes the scrub's values the
same way: gauges of the last invocation, written atomically once, at the end, also when the
check failed. One value is carried over from the file the last invocation wrote:
``s3ckpt_check_last_success_timestamp_seconds``, when the last *clean* check finished (every
committed checkpoint checked in full, nothing damaged, every record written). A failed or
damaged check keeps the previous one, so "no clean check for 8 days" is one alert rule
(docs/metrics.md) whether the job stopped, fails, or keeps finding damage.

Its values are plain numbers (:class:`CheckValues`: the CLI takes them from
:class:`s3ckpt.tools.CheckResult`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Required, TypedDict, Unpack

from s3ckpt.metrics._events import totals

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

__all__ = [
    "CheckMetricsFile",
    "CheckValues",
    "MetricsFile",
    "RunMetrics",
    "TextfileValues",
    "last_success",
    "registry_of",
    "render_textfile",
    "write_textfile",
]

Command = Literal["prune", "gc"]

_REQUESTS = ("requests", "retries", "throttled", "failed", "not_found", "precondition_failed")
# The request counts of an invocation (:class:`~s3ckpt.metrics.Totals` fields).


@dataclass(frozen=True)
class RunMetrics:
    """One run (prune) or prefix (gc) of an invocation, for the text file.

    Attributes:
        run: The run's (or gc's prefix's) URL, the ``run`` label.
        checkpoints: Checkpoints by state (``committed``, ``in_progress``, ...) after the
            invocation; empty when the run was not catalogued (its lease was busy).
        bytes: Bytes under the run's checkpoints, by state, after the invocation.
        latest_committed_at: Commit time (seconds since the epoch) of the newest committed
            checkpoint, ``None`` when there is none.
        latest_committed_step: Its step, when known.
        deleted: Checkpoints deleted.
        bytes_freed: Bytes under them.
        lease_busy: Runs skipped because another pruner held their lease (prune: 0 or 1).
        failures: Keys or uploads that could not be deleted.
        lease_wait_s: Seconds spent taking the run's lease (0 for a dry run, which takes
            none).
    """

    run: str
    checkpoints: Mapping[str, int] = field(default_factory=dict)
    bytes: Mapping[str, int] = field(default_factory=dict)
    latest_committed_at: float | None = None
    latest_committed_step: int | None = None
    deleted: int = 0
    bytes_freed: int = 0
    lease_busy: int = 0
    failures: int = 0
    lease_wait_s: float = 0.0


class TextfileValues(TypedDict, total=False):
    """An invocation's values beside its runs (the keyword arguments of
    :func:`render_textfile` and :func:`write_textfile`).

    Attributes:
        success: Every run succeeded (no failed delete, no busy lease, no error).
        finished_at: When it finished (seconds since the epoch).
        duration_s: How long it took.
        requests: S3 requests made by the whole invocation.
        retries: Attempts after the first.
        throttled: Attempts answered 503 SlowDown.
        dry_run: The invocation only planned.
        failed: Requests that failed after their last attempt (outcome ``"failed"``).
        not_found: Requests answered with an expected 404 (outcome ``"not_found"``).
        precondition_failed: Requests answered with an expected 412.
    """

    success: Required[bool]
    finished_at: Required[float]
    duration_s: Required[float]
    requests: int
    retries: int
    throttled: int
    dry_run: bool
    failed: int
    not_found: int
    precondition_failed: int


@dataclass(frozen=True, eq=False)  # hashed by identity: the registry keys on it
class _Invocation:
    """One invocation's values (:class:`TextfileValues` and its runs); a prometheus-client
    collector (by its ``collect()``)."""

    command: Command
    runs: Sequence[RunMetrics]
    values: Mapping[str, Any]  # a TextfileValues

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        v = {**dict.fromkeys(_REQUESTS, 0), "dry_run": False, **self.values}

        c, what = self.command, f"the last s3ckpt {self.command}"
        plain: list[tuple[str, str, float, str]] = [
            ("last_run_timestamp", f"When {what} finished (seconds since the epoch).",
             v["finished_at"], "seconds"),
            ("success", f"1 if {what} succeeded for every run, else 0.", v["success"], ""),
            ("duration", f"How long {what} took.", v["duration_s"], "seconds"),
            ("dry_run", f"1 if {what} was a dry run.", v["dry_run"], ""),
            ("requests", f"S3 requests {what} made (listings included; retries not).",
             v["requests"], ""),
            ("retries", f"Attempts after the first over {what}'s requests.", v["retries"], ""),
            ("throttled", f"Attempts of {what} answered 503 SlowDown.", v["throttled"], ""),
            ("failed_requests", f"S3 requests of {what} that failed after their last attempt "
             "(expected 404s and 412s not included).", v["failed"], ""),
        ]  # fmt: skip
        for name, doc, value, unit in plain:
            yield GaugeMetricFamily(f"s3ckpt_{c}_{name}", doc, value=float(value), unit=unit)
        expected = GaugeMetricFamily(
            f"s3ckpt_{c}_expected_requests",
            f"S3 requests of {what} answered with an expected 404 (not_found) or 412 "
            "(precondition_failed): answers, not failures.",
            labels=["outcome"],
        )
        expected.add_metric(["not_found"], float(v["not_found"]))
        expected.add_metric(["precondition_failed"], float(v["precondition_failed"]))
        yield expected
        per_run = [  # (name, help, the RunMetrics field)
            ("deleted_checkpoints", "Checkpoints deleted, by run.", "deleted"),
            ("freed_bytes", "Bytes under the checkpoints deleted, by run.", "bytes_freed"),
            ("lease_busy", "Runs skipped because their lease was held.", "lease_busy"),
            ("failures", "Keys or uploads that could not be deleted.", "failures"),
            ("lease_wait_seconds", "Seconds spent taking the run's lease.", "lease_wait_s"),
        ]
        for name, doc, attr in per_run:
            g = GaugeMetricFamily(f"s3ckpt_{c}_{name}", doc, labels=["run"])
            for r in self.runs:
                g.add_metric([r.run], float(getattr(r, attr)))
            yield g
        newest = "the run's newest committed checkpoint"
        by_state = [  # (name, help, the RunMetrics field): yielded when it has samples
            ("checkpoints", "Checkpoints of the run, by state.", "checkpoints"),
            ("checkpoint_bytes", "Bytes under the run's checkpoints, by state.", "bytes"),
        ]
        for name, doc, attr in by_state:
            g = GaugeMetricFamily(f"s3ckpt_{name}", doc, labels=["run", "state"])
            for r in self.runs:
                for state, n in sorted(getattr(r, attr).items()):
                    g.add_metric([r.run, state], float(n))
            if g.samples:
                yield g
        latest = [  # (name, help, the RunMetrics field): yielded when it has samples
            ("timestamp_seconds", f"Commit time of {newest} (seconds since the epoch).", "at"),
            ("step", f"Step of {newest}.", "step"),
        ]
        for name, doc, attr in latest:
            g = GaugeMetricFamily(f"s3ckpt_latest_committed_{name}", doc, labels=["run"])
            for r in self.runs:
                if (value := getattr(r, f"latest_committed_{attr}")) is not None:
                    g.add_metric([r.run], float(value))
            if g.samples:
                yield g


def render_textfile(
    command: Command, runs: Sequence[RunMetrics], **values: Unpack[TextfileValues]
) -> str:
    """The Prometheus text exposition of one ``prune`` or ``gc`` invocation.

    Args:
        command: ``"prune"`` or ``"gc"`` (the metric names' prefix: ``s3ckpt_prune_...``).
        runs: Per-run values (the ``run`` label).
        **values: ``success``, ``finished_at`` and ``duration_s`` (required), and the
            request counts (:class:`TextfileValues`).
    """
    from prometheus_client import generate_latest

    return generate_latest(registry_of(_Invocation(command, runs, values))).decode("utf-8")


def write_textfile(
    path: str, command: Command, runs: Sequence[RunMetrics], **values: Unpack[TextfileValues]
) -> None:
    """Write :func:`render_textfile`'s text to ``path`` atomically (a temporary file in the
    same folder, renamed over ``path``), for node_exporter's textfile collector."""
    _write(path, _Invocation(command, runs, values))


class _Started:
    """An invocation's metrics file, from when it starts: the process's request totals
    and the clock then."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._before = totals()
        self._t0 = time.monotonic()

    def _since(self) -> dict[str, Any]:
        """``duration_s`` and the request counts since the start."""
        after = totals()
        counts = {n: getattr(after, n) - getattr(self._before, n) for n in _REQUESTS}
        return {"duration_s": time.monotonic() - self._t0, **counts}


class MetricsFile(_Started):
    """One ``prune`` or ``gc`` invocation's metrics file (``--metrics-file PATH``), from
    start to end: made when the invocation starts (it takes the process's request totals
    then), given each run's values as they are known, written once at the end.

    Attributes:
        path: The file to write.
        command: ``"prune"`` or ``"gc"``.
        dry_run: The invocation only plans.
        runs: The runs' values so far.
    """

    def __init__(self, path: str, command: Command, *, dry_run: bool) -> None:
        super().__init__(path)
        self.command: Command = command
        self.dry_run = dry_run
        self.runs: list[RunMetrics] = []

    def add(self, run: RunMetrics) -> None:
        """Record one run's (or gc's prefix's) values."""
        self.runs.append(run)

    def write(self, *, success: bool) -> None:
        """Write the file atomically, with the requests made since this was made.

        Raises:
            OSError: It could not be written (what the invocation did stands).
        """
        values = {"success": success, "finished_at": time.time(), "dry_run": self.dry_run}
        _write(self.path, _Invocation(self.command, tuple(self.runs), {**values, **self._since()}))


def registry_of(collector: object) -> CollectorRegistry:
    """A registry holding ``collector`` alone (an object with ``collect()``), for one
    text exposition or one textfile write."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]  # a Collector by its collect()
    return registry


def _write(path: str, collector: object) -> None:
    """Write ``collector``'s text exposition to ``path`` atomically."""
    from prometheus_client import write_to_textfile

    write_to_textfile(path, registry_of(collector))


LAST_SUCCESS = "s3ckpt_check_last_success_timestamp_seconds"


@dataclass(frozen=True)
class CheckValues:
    """What one ``s3ckpt check`` found, for its metrics file (zeros for a check that failed
    before it found anything).

    Attributes:
        checked: Committed checkpoints checked.
        damaged: Those found damaged.
        incomplete: Those not checked in full (read errors), none damaged.
        skipped: Checkpoints not checked, by reason (``in_progress``, ``archived``, ...).
        bytes_read: Bytes read back (markers, metadata, data).
        items_read: Items read back and compared with their CRC32C.
        read_fraction: The share of item bytes the check was asked to read (0 to 1).
    """

    checked: int = 0
    damaged: int = 0
    incomplete: int = 0
    skipped: Mapping[str, int] = field(default_factory=dict)
    bytes_read: int = 0
    items_read: int = 0
    read_fraction: float = 0.0


@dataclass(frozen=True, eq=False)  # hashed by identity: the registry keys on it
class _CheckInvocation:
    """One invocation's values; a prometheus-client collector (by its ``collect()``)."""

    values: CheckValues
    run: Mapping[str, Any]  # success, finished_at, last_success, duration_s, request counts

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        v, s = self.values, self.run
        last = "the last s3ckpt check"
        plain: list[tuple[str, str, float]] = [
            ("last_run_timestamp_seconds",
             f"When {last} finished (seconds since the epoch).", s["finished_at"]),
            ("success", f"1 if {last} was clean: every committed checkpoint checked in full, "
             "nothing damaged, every record written.", s["success"]),
            ("duration_seconds", f"How long {last} took.", s["duration_s"]),
            ("checked_checkpoints", f"Committed checkpoints {last} checked.", v.checked),
            ("damaged_checkpoints", f"Checkpoints {last} found damaged.", v.damaged),
            ("incomplete_checkpoints",
             f"Checkpoints {last} could not read in full (read errors).", v.incomplete),
            ("read_bytes",
             f"Bytes {last} read back (markers, metadata and data).", v.bytes_read),
            ("read_items",
             f"Items {last} read back and compared with their CRC32C.", v.items_read),
            ("read_fraction", f"The share of each checkpoint's item bytes {last} read "
             "(--read-data).", v.read_fraction),
            ("requests", f"S3 requests {last} made (retries not counted).", s["requests"]),
            ("retries", f"Attempts after the first over {last}'s requests.", s["retries"]),
            ("throttled", f"Attempts of {last} answered 503 SlowDown.", s["throttled"]),
            ("failed_requests",
             f"S3 requests of {last} that failed after their last attempt.", s["failed"]),
        ]  # fmt: skip
        for name, doc, value in plain:
            yield GaugeMetricFamily(f"s3ckpt_check_{name}", doc, value=float(value))
        skipped = GaugeMetricFamily(
            "s3ckpt_check_skipped_checkpoints",
            "Checkpoints the last s3ckpt check did not check, by reason.",
            labels=["reason"],
        )
        for reason, n in sorted(v.skipped.items()):
            skipped.add_metric([reason], float(n))
        yield skipped
        if s["last_success"] is not None:
            yield GaugeMetricFamily(
                LAST_SUCCESS,
                "When the last clean s3ckpt check finished (seconds since the epoch; kept "
                "from earlier files while checks fail or find damage).",
                value=s["last_success"],
            )


def last_success(path: str) -> float | None:
    """``s3ckpt_check_last_success_timestamp_seconds`` in the file at ``path``; None when
    there is no such file or value (or it cannot be read)."""
    try:
        from prometheus_client.parser import text_string_to_metric_families

        with open(path, encoding="utf-8") as f:
            text = f.read(1 << 20)
        samples = (s for family in text_string_to_metric_families(text) for s in family.samples)
        return next((float(s.value) for s in samples if s.name == LAST_SUCCESS), None)
    except (OSError, ValueError, UnicodeDecodeError, ImportError):
        return None


class CheckMetricsFile(_Started):
    """One ``s3ckpt check``'s metrics file (``--metrics-file PATH``): made when the check
    starts (it takes the process's request totals then), written once at the end.

    Attributes:
        path: The file to write.
        command: ``"check"`` (what the CLI's messages name).
    """

    command = "check"

    def write(self, values: CheckValues, *, success: bool) -> None:
        """Write the file atomically (see the module docs for what ``success`` keeps).

        Raises:
            OSError: It could not be written (what the check did stands).
        """
        now = time.time()
        last = now if success else last_success(self.path)
        run = {"success": success, "finished_at": now, "last_success": last, **self._since()}
        _write(self.path, _CheckInvocation(values, run))
