"""What every save, load, prune and gc costs, for the people who watch them.

Each finished operation publishes one :class:`OperationMetrics` event: a save or a load on
every rank (bytes, duration, the time an async save held training, S3 requests, retries,
503s, checksum failures), a prune per run (checkpoints deleted, bytes freed, lease wait,
a busy lease), a gc per prefix. Take them with a callback::

    import s3ckpt.metrics

    sub = s3ckpt.metrics.subscribe(lambda e: print(e.kind, e.duration_s, e.requests))
    ...
    sub.close()

or collect them in a block (handy in tests)::

    with s3ckpt.metrics.capture() as events:
        ckpt.save(100, model)

:func:`totals` counts every S3 request of the process by operation and outcome
(for exporters; the expected 404s and 412s of a healthy job are not failures);
:class:`OpenTelemetryMetrics` maps the events onto OpenTelemetry instruments (the ``otel``
extra); :func:`write_textfile` renders a retention run for node_exporter's textfile
collector, and :class:`MetricsFile` is one invocation's file from start to end
(``s3ckpt prune --metrics-file``); :class:`CheckMetricsFile` is ``s3ckpt check``'s.
docs/metrics.md lists every name.

The hooks s3ckpt's own modules report through live in :mod:`s3ckpt.metrics.instrument`.
This package imports no other s3ckpt module (it sits with the leaves, and every module may
import it), and nothing heavy: prometheus-client and OpenTelemetry are imported when used.
"""

from __future__ import annotations

from s3ckpt.metrics._events import OperationMetrics, Totals, capture, subscribe, totals
from s3ckpt.metrics._otel import OpenTelemetryMetrics
from s3ckpt.metrics._prometheus import CheckMetricsFile, MetricsFile, RunMetrics, write_textfile

__all__ = [
    "OperationMetrics",
    "subscribe",
    "capture",
    "totals",
    "Totals",
    "OpenTelemetryMetrics",
    "MetricsFile",
    "CheckMetricsFile",
    "RunMetrics",
    "write_textfile",
]
