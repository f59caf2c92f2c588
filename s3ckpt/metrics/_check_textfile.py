"""``s3ckpt check --metrics-file``: the scrub's values as a Prometheus text file for
node_exporter's textfile collector.

Like the retention cron's files (:mod:`s3ckpt.metrics._prometheus`) every value is a gauge
describing the last invocation, and the file is written atomically once, at the end, also
when the check failed. One value is carried over from the file the last invocation wrote:
``s3ckpt_check_last_success_timestamp_seconds``, when the last *clean* check finished (every
committed checkpoint checked in full, nothing damaged, every record written). A failed or
damaged check keeps the previous one, so "no clean check for 8 days" is one alert rule
(docs/metrics.md) whether the job stopped, fails, or keeps finding damage.

The values are plain numbers (this module is a leaf: the CLI takes them from
:class:`s3ckpt.tools.CheckResult`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from s3ckpt.metrics._events import totals
from s3ckpt.metrics._prometheus import registry_of

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

__all__ = ["CheckMetricsFile", "CheckValues", "last_success"]

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
    success: bool
    finished_at: float
    duration_s: float
    last_success: float | None
    requests: int
    retries: int
    throttled: int
    failed: int

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        v = self.values
        plain: list[tuple[str, str, float]] = [
            (
                "s3ckpt_check_last_run_timestamp_seconds",
                "When the last s3ckpt check finished (seconds since the epoch).",
                self.finished_at,
            ),
            (
                "s3ckpt_check_success",
                "1 if the last s3ckpt check was clean: every committed checkpoint checked in "
                "full, nothing damaged, every record written.",
                float(self.success),
            ),
            (
                "s3ckpt_check_duration_seconds",
                "How long the last s3ckpt check took.",
                self.duration_s,
            ),
            (
                "s3ckpt_check_checked_checkpoints",
                "Committed checkpoints the last s3ckpt check checked.",
                v.checked,
            ),
            (
                "s3ckpt_check_damaged_checkpoints",
                "Checkpoints the last s3ckpt check found damaged.",
                v.damaged,
            ),
            (
                "s3ckpt_check_incomplete_checkpoints",
                "Checkpoints the last s3ckpt check could not read in full (read errors).",
                v.incomplete,
            ),
            (
                "s3ckpt_check_read_bytes",
                "Bytes the last s3ckpt check read back (markers, metadata and data).",
                v.bytes_read,
            ),
            (
                "s3ckpt_check_read_items",
                "Items the last s3ckpt check read back and compared with their CRC32C.",
                v.items_read,
            ),
            (
                "s3ckpt_check_read_fraction",
                "The share of each checkpoint's item bytes the last s3ckpt check read "
                "(--read-data).",
                v.read_fraction,
            ),
            (
                "s3ckpt_check_requests",
                "S3 requests the last s3ckpt check made (retries not counted).",
                self.requests,
            ),
            (
                "s3ckpt_check_retries",
                "Attempts after the first over the last s3ckpt check's requests.",
                self.retries,
            ),
            (
                "s3ckpt_check_throttled",
                "Attempts of the last s3ckpt check answered 503 SlowDown.",
                self.throttled,
            ),
            (
                "s3ckpt_check_failed_requests",
                "S3 requests of the last s3ckpt check that failed after their last attempt.",
                self.failed,
            ),
        ]
        for name, doc, value in plain:
            yield GaugeMetricFamily(name, doc, value=float(value))
        skipped = GaugeMetricFamily(
            "s3ckpt_check_skipped_checkpoints",
            "Checkpoints the last s3ckpt check did not check, by reason.",
            labels=["reason"],
        )
        for reason, n in sorted(v.skipped.items()):
            skipped.add_metric([reason], float(n))
        yield skipped
        if self.last_success is not None:
            yield GaugeMetricFamily(
                LAST_SUCCESS,
                "When the last clean s3ckpt check finished (seconds since the epoch; kept "
                "from earlier files while checks fail or find damage).",
                value=self.last_success,
            )

    def write(self, path: str) -> None:
        registry = registry_of(self)
        from prometheus_client import write_to_textfile

        write_to_textfile(path, registry)


def last_success(path: str) -> float | None:
    """``s3ckpt_check_last_success_timestamp_seconds`` in the file at ``path``; None when
    there is no such file or value (or it cannot be read)."""
    try:
        from prometheus_client.parser import text_string_to_metric_families

        with open(path, encoding="utf-8") as f:
            text = f.read(1 << 20)
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == LAST_SUCCESS:
                    return float(sample.value)
    except (OSError, ValueError, UnicodeDecodeError, ImportError):
        return None
    return None


class CheckMetricsFile:
    """One ``s3ckpt check``'s metrics file (``--metrics-file PATH``): made when the check
    starts (it takes the process's request totals then), written once at the end.

    Attributes:
        path: The file to write.
        command: ``"check"`` (what the CLI's messages name).
    """

    command = "check"

    def __init__(self, path: str) -> None:
        self.path = path
        self._before = totals()
        self._t0 = time.monotonic()

    def write(self, values: CheckValues, *, success: bool) -> None:
        """Write the file atomically (see the module docs for what ``success`` keeps).

        Raises:
            OSError: It could not be written (what the check did stands).
        """
        now = time.time()
        after, before = totals(), self._before
        _CheckInvocation(
            values,
            success=success,
            finished_at=now,
            duration_s=time.monotonic() - self._t0,
            last_success=now if success else last_success(self.path),
            requests=after.requests - before.requests,
            retries=after.retries - before.retries,
            throttled=after.throttled - before.throttled,
            failed=after.failed - before.failed,
        ).write(self.path)
