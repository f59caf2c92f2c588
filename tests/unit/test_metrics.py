"""s3ckpt.metrics in process: the callback API, request attribution through contexts and
threads, the totals, prune and gc events on MemoryStore, the Prometheus text file and the
OpenTelemetry bridge (read back with the SDK's in-memory reader)."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import s3ckpt.metrics as metrics
from s3ckpt.errors import LeaseHeldError
from s3ckpt.metrics import instrument
from s3ckpt.metrics._events import RequestCounts
from s3ckpt.metrics._prometheus import render_textfile
from s3ckpt.retention import KeepLast, RetentionOptions, gc, prune
from s3ckpt.retention._lease import Lease
from s3ckpt.store import Location, MemoryStore
from s3ckpt.uri import StoreURL
from tests._retention_util import Clock, clock_and_store_fixtures, write_checkpoint

T0 = datetime(2025, 1, 1, tzinfo=UTC)
RUN = StoreURL("memory", "b", "runs/a/")

clock, store = clock_and_store_fixtures(T0)


def fill(store: MemoryStore, clock: Clock, steps: list[int]) -> None:
    for s in steps:
        clock.t = T0.timestamp() + s * 60
        write_checkpoint(store, RUN, s, created=clock.t)


def later(clock: Clock) -> datetime:
    return datetime.fromtimestamp(clock.t, UTC) + timedelta(hours=3)


# -- callbacks ---------------------------------------------------------------------------------
def test_subscribe_gets_events_until_closed() -> None:
    seen: list[metrics.OperationMetrics] = []
    sub = metrics.subscribe(seen.append)
    with instrument.operation("gc", "s3://b/x/"):
        pass
    sub.close()
    sub.close()  # idempotent
    with instrument.operation("gc", "s3://b/y/"):
        pass
    assert [e.url for e in seen] == ["s3://b/x/"]
    assert seen[0].ok and seen[0].error is None and seen[0].bucket == "b"


def test_a_failing_callback_is_logged_and_breaks_nothing(caplog: pytest.LogCaptureFixture) -> None:
    def boom(event: metrics.OperationMetrics) -> None:
        raise RuntimeError("exporter down")

    with (
        metrics.subscribe(boom),
        metrics.capture() as events,
        caplog.at_level(logging.ERROR, "s3ckpt.metrics"),
        instrument.operation("gc", "s3://b/x/"),
    ):
        pass
    assert len(events) == 1  # the other subscriber still got it
    assert "a subscriber failed on a gc event" in caplog.text
    assert "exporter down" in caplog.text


def test_a_failed_operation_names_its_error() -> None:
    with (
        metrics.capture() as events,
        pytest.raises(KeyError),
        instrument.operation("gc", "s3://b/x/"),
    ):
        raise KeyError("k")
    (e,) = events
    assert not e.ok and e.error == "KeyError" and e.duration_s >= 0


def test_requests_count_for_the_innermost_operation_and_follow_in_context() -> None:
    before = metrics.totals()
    with metrics.capture() as events:
        with instrument.operation("save", "s3://b/r/step_1", step=1) as outer:
            instrument.record_request("put", 1, 0, "ok")
            with instrument.operation("prune", "s3://b/r/"):
                instrument.record_request("delete", 3, 2, "ok")
            with ThreadPoolExecutor(4) as pool:
                # carried into the pool: counted for the save
                list(pool.map(instrument.in_context(_one_get), range(8)))
                # not carried: in the totals only
                list(pool.map(_one_get, range(5)))
            outer.add(bytes=123)
        instrument.record_request("head", 1, 0, "failed")  # outside any operation
    prune_event, save_event = events
    assert (prune_event.kind, prune_event.requests, prune_event.retries) == ("prune", 1, 2)
    assert prune_event.throttled == 2
    assert (save_event.kind, save_event.requests, save_event.retries) == ("save", 9, 0)
    assert save_event.bytes == 123 and save_event.step == 1
    after = metrics.totals()
    ops = {k: after.operations[k].requests - _req(before, k) for k in ("put", "get", "head")}
    assert ops == {"put": 1, "get": 13, "head": 1}
    assert after.operations["head"].failed - _failed(before, "head") == 1
    assert after.throttled - before.throttled == 2


def _one_get(_: int) -> None:
    instrument.record_request("get", 1, 0, "ok")


def _req(t: metrics.Totals, op: str) -> int:
    return t.operations[op].requests if op in t.operations else 0


def _failed(t: metrics.Totals, op: str) -> int:
    return t.operations[op].failed if op in t.operations else 0


def test_in_context_is_the_function_itself_when_nothing_records() -> None:
    assert instrument.in_context(_one_get) is _one_get


def test_a_bound_recorder_counts_on_another_thread_and_finishes_once() -> None:
    rec = instrument.Recorder("load", "s3://b/r/step_2", step=2, rank=3)

    def work() -> None:
        with instrument.bound(rec):
            instrument.record_request("get", 2, 1, "ok")
            instrument.record_checksum_failure()

    t = threading.Thread(target=work)
    t.start()
    t.join()
    with metrics.capture() as events:
        first = rec.finish()
        assert rec.finish() is None
    assert events == [first]
    assert first is not None
    assert (first.rank, first.retries, first.throttled, first.checksum_failures) == (3, 1, 1, 1)


# -- retention events --------------------------------------------------------------------------
def test_prune_event_counts_deleted_checkpoints_and_bytes(store: MemoryStore, clock: Clock) -> None:
    fill(store, clock, [10, 20, 30, 40])
    with metrics.capture() as events:
        dry = prune(
            Location.of(RUN, store=store), KeepLast(1), options=RetentionOptions(now=later(clock))
        )
        r = prune(
            Location.of(RUN, store=store),
            KeepLast(1),
            apply=True,
            options=RetentionOptions(now=later(clock)),
        )
    planned, applied = events
    assert planned.dry_run and planned.deleted == 0 and planned.ok
    assert applied.kind == "prune" and applied.url == str(RUN) and not applied.dry_run
    assert applied.deleted == len(r.deleted) == 3
    assert applied.bytes_freed == dry.plan.bytes_freed > 0
    assert applied.lease_busy == 0 and applied.lease_wait_s >= 0 and applied.ok


def test_a_busy_lease_is_a_failed_prune_event(store: MemoryStore, clock: Clock) -> None:
    fill(store, clock, [10, 20])
    Lease(store, RUN, owner="someone-else").acquire()
    with metrics.capture() as events, pytest.raises(LeaseHeldError):
        prune(
            Location.of(RUN, store=store),
            KeepLast(1),
            apply=True,
            options=RetentionOptions(now=later(clock)),
        )
    (e,) = events
    assert (e.ok, e.error, e.lease_busy, e.deleted) == (False, "LeaseHeldError", 1, 0)


def test_gc_publishes_one_event(store: MemoryStore, clock: Clock) -> None:
    fill(store, clock, [10])
    write_checkpoint(store, RUN, 20, created=clock.t, commit=False, metadata=False)  # killed
    clock.t += 86400
    with metrics.capture() as events:
        r = gc(
            Location.of(RUN, store=store),
            apply=True,
            options=RetentionOptions(now=datetime.fromtimestamp(clock.t, UTC)),
        )
    (e,) = events
    assert e.kind == "gc" and e.deleted == len(r.removed) == 1 and e.bytes_freed > 0


# -- Prometheus text ---------------------------------------------------------------------------
def test_the_text_file_parses_and_carries_every_value(tmp_path: Path) -> None:
    path = tmp_path / "s3ckpt.prom"
    runs = [
        metrics.RunMetrics(
            run="s3://b/runs/a/",
            checkpoints={"committed": 2, "in_progress": 1},
            bytes={"committed": 2048, "in_progress": 10},
            latest_committed_at=1.7e9,
            latest_committed_step=400,
            deleted=3,
            bytes_freed=4096,
        ),
        metrics.RunMetrics(run='s3://b/runs/"odd"\\/', lease_busy=1),
    ]
    metrics.write_textfile(
        str(path),
        "prune",
        runs,
        success=False,
        finished_at=1.8e9,
        duration_s=1.5,
        requests=12,
        retries=2,
        throttled=1,
    )
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(path.read_text())
        for s in fam.samples
    }
    a = (("run", "s3://b/runs/a/"),)
    odd = (("run", 's3://b/runs/"odd"\\/'),)
    assert samples[("s3ckpt_prune_success", ())] == 0
    assert samples[("s3ckpt_prune_last_run_timestamp_seconds", ())] == 1.8e9
    assert samples[("s3ckpt_prune_duration_seconds", ())] == 1.5
    assert samples[("s3ckpt_prune_requests", ())] == 12
    assert samples[("s3ckpt_prune_deleted_checkpoints", a)] == 3
    assert samples[("s3ckpt_prune_freed_bytes", a)] == 4096
    assert samples[("s3ckpt_prune_lease_busy", odd)] == 1
    assert samples[("s3ckpt_checkpoints", (*a, ("state", "in_progress")))] == 1
    assert samples[("s3ckpt_checkpoint_bytes", (*a, ("state", "committed")))] == 2048
    assert samples[("s3ckpt_latest_committed_timestamp_seconds", a)] == 1.7e9
    assert samples[("s3ckpt_latest_committed_step", a)] == 400
    assert ("s3ckpt_latest_committed_step", odd) not in samples
    assert not list(tmp_path.glob("*.tmp*"))  # the atomic write left no temporary file


# -- OpenTelemetry ----------------------------------------------------------------------------
def test_opentelemetry_instruments_receive_events() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    with metrics.OpenTelemetryMetrics(provider):
        rec = instrument.Recorder("save", "s3://bkt/run/step_5", step=5)
        with instrument.bound(rec):
            instrument.record_request("put", 3, 2, "ok")
        rec.add(bytes=1000)
        rec.finish(blocked_s=0.25)
    rec2 = instrument.Recorder("load", "s3://bkt/run/step_5")
    rec2.finish()  # after close: not recorded
    data = reader.get_metrics_data()
    assert data is not None
    points: dict[str, list[Any]] = {
        m.name: list(m.data.data_points)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert points["s3ckpt.requests"][0].value == 1
    assert points["s3ckpt.retries"][0].value == 2
    assert points["s3ckpt.throttled"][0].value == 2
    assert points["s3ckpt.bytes"][0].value == 1000
    (op,) = points["s3ckpt.operations"]
    assert op.value == 1
    assert dict(op.attributes or {}) == {
        "s3ckpt.kind": "save",
        "s3ckpt.bucket": "bkt",
        "s3ckpt.ok": True,
    }
    assert points["s3ckpt.save.blocked"][0].sum == 0.25
    assert points["s3ckpt.operation.duration"][0].count == 1
    provider.shutdown()


def test_opentelemetry_missing_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    with pytest.raises(ImportError, match=r'pip install "s3ckpt\[otel\]"'):
        metrics.OpenTelemetryMetrics()


def test_public_names() -> None:
    assert sorted(metrics.__all__) == sorted(
        n
        for n in dir(metrics)
        if n.isidentifier() and not n.startswith("_") and n not in {"annotations", "instrument"}
    )


# -- outcomes: expected 404s and 412s are not failures -----------------------------------------
def _counts(t: metrics.Totals, op: str) -> RequestCounts:
    return t.operations.get(op, RequestCounts())


def test_expected_answers_count_apart_from_failures() -> None:
    before = metrics.totals()
    with metrics.capture() as events, instrument.operation("load", "s3://b/r/step_1"):
        # What store/_request.call does when a request ends 404 / 412 / otherwise.
        with instrument.expecting("not_found"):
            instrument.record_request("get", 1, 0, instrument.expected_outcome("not_found"))
            # only what the block expects: a 412 here is still a failure
            outcome = instrument.expected_outcome("precondition_failed")
            instrument.record_request("put", 1, 0, outcome)
        with instrument.expecting("precondition_failed"):
            ended = instrument.expected_outcome("precondition_failed")
            instrument.record_request("put", 2, 0, ended)
        # outside any expecting block: a 404 is a failure
        instrument.record_request("get", 1, 0, instrument.expected_outcome("not_found"))
        instrument.record_request("get", 1, 0, "ok")
    (event,) = events
    assert (event.requests, event.failed_requests) == (5, 2)
    assert (event.not_found, event.precondition_failed, event.retries) == (1, 1, 1)
    after = metrics.totals()
    get, put = _counts(after, "get"), _counts(after, "put")
    get0, put0 = _counts(before, "get"), _counts(before, "put")
    assert (get.requests - get0.requests, get.failed - get0.failed) == (3, 1)
    assert get.not_found - get0.not_found == 1
    assert (put.failed - put0.failed, put.precondition_failed - put0.precondition_failed) == (1, 1)
    assert after.failed - before.failed == 2
    assert after.expected - before.expected == 2


def test_expecting_ends_with_its_block_and_outcomes_count() -> None:
    with instrument.expecting("not_found", "precondition_failed"):
        assert instrument.expected_outcome("not_found") == "not_found"
        assert instrument.expected_outcome("precondition_failed") == "precondition_failed"
    assert instrument.expected_outcome("not_found") == "failed"
    before = metrics.totals()
    instrument.record_request("head", 1, 0, "failed")
    instrument.record_request("head", 1, 0, "ok")
    after = metrics.totals()
    assert after.failed - before.failed == 1
    assert after.requests - before.requests == 2
    with pytest.raises(ValueError, match="unknown request outcome"):
        instrument.record_request("head", 1, 0, "gone")  # type: ignore[arg-type]


def test_the_text_file_carries_failed_and_expected_requests(tmp_path: Path) -> None:
    text = render_textfile(
        "gc",
        [],
        success=True,
        finished_at=1.8e9,
        duration_s=1.0,
        requests=9,
        failed=1,
        not_found=3,
        precondition_failed=2,
    )
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    assert samples[("s3ckpt_gc_failed_requests", ())] == 1
    assert samples[("s3ckpt_gc_expected_requests", (("outcome", "not_found"),))] == 3
    assert samples[("s3ckpt_gc_expected_requests", (("outcome", "precondition_failed"),))] == 2


def test_opentelemetry_counts_failed_and_expected_requests() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    with metrics.OpenTelemetryMetrics(provider):
        rec = instrument.Recorder("save", "s3://bkt/run/step_5", step=5)
        with instrument.bound(rec):
            instrument.record_request("head", 1, 0, "not_found")
            instrument.record_request("head", 1, 0, "not_found")
            instrument.record_request("put", 1, 0, "precondition_failed")
            instrument.record_request("put", 1, 0, "failed")
        rec.finish()
    data = reader.get_metrics_data()
    assert data is not None
    points: dict[str, list[Any]] = {
        m.name: list(m.data.data_points)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert points["s3ckpt.requests"][0].value == 4
    assert points["s3ckpt.requests.failed"][0].value == 1
    expected = {
        dict(p.attributes or {})["s3ckpt.outcome"]: p.value
        for p in points["s3ckpt.requests.expected"]
    }
    assert expected == {"not_found": 2, "precondition_failed": 1}
    provider.shutdown()
