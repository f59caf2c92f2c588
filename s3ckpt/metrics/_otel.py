"""s3ckpt's events as OpenTelemetry metrics (the ``otel`` extra: ``opentelemetry-api``)."""

from __future__ import annotations

from typing import Any

from s3ckpt.metrics._events import OperationMetrics, Subscription, subscribe

__all__ = ["OpenTelemetryMetrics"]


def _version() -> str | None:
    # Not s3ckpt._version: this package sits beside the leaves and imports none of them.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("s3ckpt")
    except PackageNotFoundError:
        return None


class OpenTelemetryMetrics:
    """Record every s3ckpt event on OpenTelemetry instruments of the meter ``s3ckpt``.

    ::

        from s3ckpt.metrics import OpenTelemetryMetrics

        otel = OpenTelemetryMetrics().install()   # the global MeterProvider
        ...
        otel.close()

    Instruments (attributes ``s3ckpt.kind`` = save / load / prune / gc, ``s3ckpt.bucket``,
    ``s3ckpt.ok``, and ``error.type`` on failures):

    ========================== ========= =================================================
    name                       unit      what
    ========================== ========= =================================================
    s3ckpt.operations          {op}      operations finished
    s3ckpt.operation.duration  s         histogram: how long each took
    s3ckpt.save.blocked        s         histogram: training time held by each save
    s3ckpt.bytes               By        bytes written (save) or read (load)
    s3ckpt.requests            {req}     S3 requests
    s3ckpt.requests.failed     {req}     S3 requests that failed (not the expected 404/412)
    s3ckpt.requests.expected   {req}     expected 404s and 412s (``s3ckpt.outcome``)
    s3ckpt.retries             {req}     attempts after the first
    s3ckpt.throttled           {req}     attempts answered 503 SlowDown
    s3ckpt.checksum.failures   {item}    CRC32C mismatches
    s3ckpt.checkpoints.deleted {ckpt}    checkpoints deleted by prune and gc
    s3ckpt.bytes.freed         By        bytes under them
    s3ckpt.lease.wait          s         histogram: time taking a run's lease
    s3ckpt.lease.busy          {run}     runs skipped because their lease was held
    ========================== ========= =================================================

    Args:
        meter_provider: The provider to take the meter from (default: the global one,
            ``opentelemetry.metrics.get_meter_provider()``).

    Raises:
        ImportError: ``opentelemetry-api`` is not installed (``pip install "s3ckpt[otel]"``).
    """

    def __init__(self, meter_provider: Any | None = None) -> None:
        try:
            from opentelemetry import metrics
        except ImportError as exc:
            raise ImportError(
                "s3ckpt.metrics.OpenTelemetryMetrics needs the OpenTelemetry API: "
                'pip install "s3ckpt[otel]"'
            ) from exc
        provider = meter_provider or metrics.get_meter_provider()
        meter = provider.get_meter("s3ckpt", _version())
        counter, histogram = meter.create_counter, meter.create_histogram
        self._duration = histogram(
            "s3ckpt.operation.duration", "s", "Duration of s3ckpt saves, loads, prunes and gcs"
        )
        self._blocked = histogram("s3ckpt.save.blocked", "s", "Time a save held the training loop")
        self._lease_wait = histogram("s3ckpt.lease.wait", "s", "Time taking a run's lease")
        expected = "S3 requests answered with an expected 404 or 412 (s3ckpt.outcome)"
        self._expected = counter("s3ckpt.requests.expected", "{req}", expected)
        # (instrument, unit, description, the event's field it adds)
        counters = [
            ("s3ckpt.operations", "{op}", "s3ckpt operations finished", ""),
            ("s3ckpt.bytes", "By", "Bytes written by saves or read by loads", "bytes"),
            ("s3ckpt.requests", "{req}", "S3 requests", "requests"),
            ("s3ckpt.requests.failed", "{req}", "S3 requests that failed after their last "
             "attempt (expected 404s/412s excluded)", "failed_requests"),
            ("s3ckpt.retries", "{req}", "S3 attempts after the first", "retries"),
            ("s3ckpt.throttled", "{req}", "S3 attempts answered SlowDown", "throttled"),
            ("s3ckpt.checksum.failures", "{item}", "CRC32C mismatches detected on load",
             "checksum_failures"),
            ("s3ckpt.checkpoints.deleted", "{ckpt}", "Checkpoints deleted by prune and gc",
             "deleted"),
            ("s3ckpt.bytes.freed", "By", "Bytes under deleted checkpoints", "bytes_freed"),
            ("s3ckpt.lease.busy", "{run}", "Runs skipped because another pruner held the lease",
             "lease_busy"),
        ]  # fmt: skip
        self._counters = [(counter(n, unit, doc), field) for n, unit, doc, field in counters]
        self._subscription: Subscription | None = None

    def install(self) -> OpenTelemetryMetrics:
        """Start recording events (idempotent); returns ``self``."""
        if self._subscription is None or self._subscription.closed:
            self._subscription = subscribe(self.record)
        return self

    def close(self) -> None:
        """Stop recording events."""
        if self._subscription is not None:
            self._subscription.close()

    def __enter__(self) -> OpenTelemetryMetrics:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def record(self, event: OperationMetrics) -> None:
        """Add one event to the instruments (what the subscription calls)."""
        attrs: dict[str, str | bool] = {"s3ckpt.kind": event.kind, "s3ckpt.ok": event.ok}
        attrs["s3ckpt.bucket"] = event.bucket
        if event.error is not None:
            attrs["error.type"] = event.error
        for instrument, field in self._counters:
            if value := getattr(event, field) if field else 1:
                instrument.add(value, attrs)
        self._duration.record(event.duration_s, attrs)
        if event.blocked_s is not None:
            self._blocked.record(event.blocked_s, attrs)
        for outcome in ("not_found", "precondition_failed"):
            if value := getattr(event, outcome):
                self._expected.add(value, {**attrs, "s3ckpt.outcome": outcome})
        if event.kind in ("prune", "gc") and not event.dry_run:
            self._lease_wait.record(event.lease_wait_s, attrs)
