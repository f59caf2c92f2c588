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
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Required, TypedDict, Unpack

from s3ckpt.metrics._events import totals

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

__all__ = [
    "MetricsFile",
    "RunMetrics",
    "TextfileValues",
    "registry_of",
    "render_textfile",
    "write_textfile",
]

Command = Literal["prune", "gc"]


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
    success: bool
    finished_at: float
    duration_s: float
    requests: int = 0
    retries: int = 0
    throttled: int = 0
    dry_run: bool = False
    failed: int = 0
    not_found: int = 0
    precondition_failed: int = 0

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        c = self.command

        def gauge(name: str, doc: str, value: float, unit: str = "") -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, value=value, unit=unit)

        yield gauge(
            f"s3ckpt_{c}_last_run_timestamp",
            f"When the last s3ckpt {c} finished (seconds since the epoch).",
            self.finished_at,
            "seconds",
        )
        yield gauge(
            f"s3ckpt_{c}_success",
            f"1 if the last s3ckpt {c} succeeded for every run, else 0.",
            1.0 if self.success else 0.0,
        )
        yield gauge(
            f"s3ckpt_{c}_duration",
            f"How long the last s3ckpt {c} took.",
            self.duration_s,
            "seconds",
        )
        yield gauge(
            f"s3ckpt_{c}_dry_run", f"1 if the last s3ckpt {c} was a dry run.", float(self.dry_run)
        )
        yield gauge(
            f"s3ckpt_{c}_requests",
            f"S3 requests the last s3ckpt {c} made (listings included; retries not).",
            self.requests,
        )
        yield gauge(
            f"s3ckpt_{c}_retries",
            f"Attempts after the first over the last s3ckpt {c}'s requests.",
            self.retries,
        )
        yield gauge(
            f"s3ckpt_{c}_throttled",
            f"Attempts of the last s3ckpt {c} answered 503 SlowDown.",
            self.throttled,
        )
        yield gauge(
            f"s3ckpt_{c}_failed_requests",
            f"S3 requests of the last s3ckpt {c} that failed after their last attempt "
            "(expected 404s and 412s not included).",
            self.failed,
        )
        expected = GaugeMetricFamily(
            f"s3ckpt_{c}_expected_requests",
            f"S3 requests of the last s3ckpt {c} answered with an expected 404 (not_found) "
            "or 412 (precondition_failed): answers, not failures.",
            labels=["outcome"],
        )
        expected.add_metric(["not_found"], float(self.not_found))
        expected.add_metric(["precondition_failed"], float(self.precondition_failed))
        yield expected
        per_run: list[tuple[str, str, str]] = [
            (f"s3ckpt_{c}_deleted_checkpoints", "Checkpoints deleted, by run.", "deleted"),
            (f"s3ckpt_{c}_freed_bytes", "Bytes under the checkpoints deleted, by run.", "freed"),
            (f"s3ckpt_{c}_lease_busy", "Runs skipped because their lease was held.", "busy"),
            (f"s3ckpt_{c}_failures", "Keys or uploads that could not be deleted.", "failures"),
            (f"s3ckpt_{c}_lease_wait_seconds", "Seconds spent taking the run's lease.", "wait"),
        ]
        for name, doc, what in per_run:
            g = GaugeMetricFamily(name, doc, labels=["run"])
            for r in self.runs:
                value = {
                    "deleted": r.deleted,
                    "freed": r.bytes_freed,
                    "busy": int(r.lease_busy),
                    "failures": r.failures,
                    "wait": r.lease_wait_s,
                }[what]
                g.add_metric([r.run], float(value))
            yield g
        counts = GaugeMetricFamily(
            "s3ckpt_checkpoints", "Checkpoints of the run, by state.", labels=["run", "state"]
        )
        sizes = GaugeMetricFamily(
            "s3ckpt_checkpoint_bytes",
            "Bytes under the run's checkpoints, by state.",
            labels=["run", "state"],
        )
        latest = GaugeMetricFamily(
            "s3ckpt_latest_committed_timestamp_seconds",
            "Commit time of the run's newest committed checkpoint (seconds since the epoch).",
            labels=["run"],
        )
        step = GaugeMetricFamily(
            "s3ckpt_latest_committed_step",
            "Step of the run's newest committed checkpoint.",
            labels=["run"],
        )
        for r in self.runs:
            for state, n in sorted(r.checkpoints.items()):
                counts.add_metric([r.run, state], float(n))
            for state, n in sorted(r.bytes.items()):
                sizes.add_metric([r.run, state], float(n))
            if r.latest_committed_at is not None:
                latest.add_metric([r.run], r.latest_committed_at)
            if r.latest_committed_step is not None:
                step.add_metric([r.run], float(r.latest_committed_step))
        yield from (f for f in (counts, sizes, latest, step) if f.samples)

    def _registry(self) -> CollectorRegistry:
        return registry_of(self)

    def render(self) -> str:
        """The Prometheus text exposition."""
        from prometheus_client import generate_latest

        return generate_latest(self._registry()).decode("utf-8")

    def write(self, path: str) -> None:
        """Write :meth:`render`'s text to ``path`` atomically."""
        from prometheus_client import write_to_textfile

        write_to_textfile(path, self._registry())


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
    return _Invocation(command, runs, **values).render()


def write_textfile(
    path: str, command: Command, runs: Sequence[RunMetrics], **values: Unpack[TextfileValues]
) -> None:
    """Write :func:`render_textfile`'s text to ``path`` atomically (a temporary file in the
    same folder, renamed over ``path``), for node_exporter's textfile collector."""
    _Invocation(command, runs, **values).write(path)


class MetricsFile:
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
        self.path = path
        self.command: Command = command
        self.dry_run = dry_run
        self.runs: list[RunMetrics] = []
        self._before = totals()
        self._t0 = time.monotonic()

    def add(self, run: RunMetrics) -> None:
        """Record one run's (or gc's prefix's) values."""
        self.runs.append(run)

    def write(self, *, success: bool) -> None:
        """Write the file atomically, with the requests made since this was made.

        Raises:
            OSError: It could not be written (what the invocation did stands).
        """
        after, before = totals(), self._before
        _Invocation(
            self.command,
            tuple(self.runs),
            success=success,
            finished_at=time.time(),
            duration_s=time.monotonic() - self._t0,
            requests=after.requests - before.requests,
            retries=after.retries - before.retries,
            throttled=after.throttled - before.throttled,
            dry_run=self.dry_run,
            failed=after.failed - before.failed,
            not_found=after.not_found - before.not_found,
            precondition_failed=after.precondition_failed - before.precondition_failed,
        ).write(self.path)


def registry_of(collector: object) -> CollectorRegistry:
    """A registry holding ``collector`` alone (an object with ``collect()``), for one
    text exposition or one textfile write."""
    try:
        from prometheus_client import CollectorRegistry
    except ImportError as exc:  # a core dependency; only a broken install lacks it
        raise ImportError(
            "--metrics-file needs prometheus-client (pip install prometheus-client)"
        ) from exc
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]  # a Collector by its collect()
    return registry
