"""A retention run is one value: RetentionOptions, a Location first in every entry point,
the policy checked and the step
pattern compiled once per run, prune_runs over every run, the counting store and the
metrics file of the CLI as library values."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import s3ckpt._step_names as step_names
import s3ckpt.retention._toml as toml_mod
from s3ckpt import metrics
from s3ckpt.errors import ConfigError, LeaseHeldError, PolicyError
from s3ckpt.retention import (
    KeepLast,
    KeepPinned,
    PolicyFile,
    RetentionOptions,
    delete_checkpoint,
    gc,
    list_checkpoints,
    list_runs,
    prune,
    prune_runs,
)
from s3ckpt.retention._lease import Lease
from s3ckpt.retention._scan import scan
from s3ckpt.store import CountingStore, Location, MemoryStore
from s3ckpt.uri import StoreURL
from tests._retention_util import Clock, ckpt_name, clock_and_store_fixtures, write_checkpoint

T0 = datetime(2025, 1, 1, tzinfo=UTC)
ROOT = StoreURL("memory", "b", "runs/")
RUN = ROOT.child("a")
PATTERN = r"ckpt_(\d+)"

clock, store = clock_and_store_fixtures(T0)


def fill(store: MemoryStore, clock: Clock, run: StoreURL = RUN, n: int = 4) -> None:
    for step in range(1, n + 1):
        write_checkpoint(store, run, step * 100, created=clock.t)
        clock.t += 60
    clock.t += 3 * 3600  # past the grace period: nothing in progress


def at(clock: Clock) -> datetime:
    return datetime.fromtimestamp(clock.t, UTC)


# -- the value ---------------------------------------------------------------------------------
def test_options_are_checked_when_made() -> None:
    with pytest.raises(ConfigError, match="batch_size"):
        RetentionOptions(batch_size=0)
    with pytest.raises(PolicyError, match="max_delete must be an integer >= 0, got -1"):
        RetentionOptions(max_delete=-1)
    with pytest.raises(PolicyError, match="got True"):
        RetentionOptions(max_delete=True)
    with pytest.raises(ConfigError, match="retries"):
        RetentionOptions(retries=-1)
    with pytest.raises(ConfigError, match="capture groups"):
        RetentionOptions(step_pattern="nogroup")
    with pytest.raises(ValueError, match="timezone-aware"):
        RetentionOptions(now=datetime(2025, 1, 1))


def test_the_step_pattern_is_compiled_once_and_handed_on() -> None:
    opts = RetentionOptions(step_pattern=PATTERN)
    matcher = opts.step_pattern
    assert matcher is not None and not isinstance(matcher, str) and matcher.pattern == PATTERN
    assert opts.replace(grace=timedelta(hours=1)).step_pattern is matcher
    with pytest.raises(ConfigError):  # a Python re.Pattern is recompiled (with RE2), checked
        RetentionOptions(step_pattern=re.compile(r"x"))


# -- a Location -----------------------------------------------------------------------------------
def test_every_entry_point_takes_a_location(store: MemoryStore, clock: Clock) -> None:
    fill(store, clock)
    opts = RetentionOptions(now=at(clock))
    loc = Location(RUN, store)
    assert [c.url for c in list_checkpoints(loc, options=opts)] == [
        RUN.child(ckpt_name(s * 100)) for s in range(1, 5)
    ]
    assert [cat.run for cat in scan(Location(ROOT, store), options=opts)] == [RUN]
    assert list_runs(Location(ROOT, store), options=opts) == [RUN]
    a = prune(loc, KeepLast(1), options=opts)
    assert len(a.plan.delete) == 3
    dry = delete_checkpoint(loc.child(ckpt_name(100)), dry_run=True, options=opts)
    assert dry.checkpoint == RUN.child(ckpt_name(100)) and not dry.applied
    assert gc(Location(ROOT, store), options=opts).root == ROOT


def test_prune_checks_the_policy_once_and_compiles_the_pattern_once(
    store: MemoryStore, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill(store, clock)
    calls: dict[str, int] = {}

    def counting(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            calls[name] = calls.get(name, 0) + 1
            return fn(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(toml_mod, "check_policy", counting("check", toml_mod.check_policy))
    # The pattern is compiled by RE2 once per run; its copies hand the compiled one on.
    step_names._compile.cache_clear()
    monkeypatch.setattr(step_names.re2, "compile", counting("compile", step_names.re2.compile))
    prune(
        Location.of(RUN, store=store),
        KeepLast(1),
        apply=True,
        options=RetentionOptions(now=at(clock), step_pattern=r"step_(\d+)"),
    )
    assert calls == {"check": 1, "compile": 1}


# -- every run under a prefix ------------------------------------------------------------------
def test_prune_runs_prunes_each_run_and_skips_a_busy_one(store: MemoryStore, clock: Clock) -> None:
    fill(store, clock, ROOT.child("a"))
    fill(store, clock, ROOT.child("b"))
    Lease(store, ROOT.child("b"), owner="someone-else").acquire()  # another pruner, alive
    runs = prune_runs(
        Location(ROOT, store), KeepLast(1), apply=True, options=RetentionOptions(now=at(clock))
    )
    assert runs.notes == () and runs.runs == (ROOT.child("a"), ROOT.child("b"))
    done, busy = list(runs)
    assert done.result is not None and len(done.result.deleted) == 3 and done.busy is None
    assert busy.result is None and isinstance(busy.busy, LeaseHeldError)
    assert done.event is not None and done.event.bytes_freed > 0
    m = done.run_metrics()
    assert m.deleted == 3 and m.checkpoints == {"committed": 1} and m.bytes_freed > 0
    assert busy.run_metrics() == metrics.RunMetrics(run=str(ROOT.child("b")), lease_busy=1)


def test_prune_runs_refuses_an_empty_policy_before_any_request() -> None:
    store = MemoryStore("b")
    with pytest.raises(PolicyError, match="no keep rule"):
        prune_runs(Location.of(ROOT, store=store), PolicyFile(KeepPinned()), apply=True)
    assert store.calls == {}


# -- the CLI's progress store, as a library value ----------------------------------------------
def test_the_counting_store_counts_five_things_and_passes_the_rest_through() -> None:
    inner = MemoryStore("b")
    counts: dict[str, int] = {}
    counted = CountingStore(
        inner, lambda what, n: counts.__setitem__(what, counts.get(what, 0) + n)
    )
    counted.put("k1", b"x")
    counted.put("k2", b"y")
    assert counted.bucket == "b" and counted.head("k1") is not None  # not restated: delegated
    assert [o.key for o in counted.list("")] == ["k1", "k2"]
    assert counted.get("k1") == b"x"
    assert counted.delete(["k1", "k2"]) == []
    upload = counted.create_multipart("u")
    assert len(list(counted.list_multipart_uploads(""))) == 1
    counted.abort_multipart("u", upload)
    assert counts == {
        "objects listed": 2,
        "read": 1,
        "deleted": 2,
        "uploads listed": 1,
        "uploads aborted": 1,
    }
    with pytest.raises(AttributeError):
        _ = counted._lock  # private attributes are the wrapped store's own business


def test_the_metrics_file_counts_the_requests_since_it_was_made(tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    path = tmp_path / "prune.prom"
    report = metrics.MetricsFile(str(path), "prune", dry_run=True)
    for _ in range(3):
        metrics.instrument.record_request("head", 2, 1, "not_found")
    report.add(metrics.RunMetrics(run="memory://b/runs/a/", deleted=2))
    report.write(success=True)
    samples = {
        s.name: s.value
        for family in text_string_to_metric_families(path.read_text())
        for s in family.samples
    }
    assert samples["s3ckpt_prune_success"] == 1.0 and samples["s3ckpt_prune_dry_run"] == 1.0
    assert samples["s3ckpt_prune_deleted_checkpoints"] == 2.0
    assert samples["s3ckpt_prune_requests"] == 3.0 and samples["s3ckpt_prune_retries"] == 3.0
    with pytest.raises(OSError):
        metrics.MetricsFile(str(tmp_path / "no" / "such.prom"), "gc", dry_run=False).write(
            success=False
        )
