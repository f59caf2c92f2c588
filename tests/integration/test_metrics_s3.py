"""s3ckpt.metrics against the moto server over HTTP: the events of a Checkpointer's save,
async save and load checked against what a counting FaultProxy saw on the wire and what
the bucket holds; 503s and a corrupted object counted; ``s3ckpt prune --metrics-file``
parsed as Prometheus text and checked against the prune's ``--json``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from prometheus_client.parser import text_string_to_metric_families

import s3ckpt.metrics as metrics
from s3ckpt import Checkpointer, S3Config, S3StorageReader, S3StorageWriter, TransferConfig
from s3ckpt.cli import main
from s3ckpt.errors import ChecksumMismatchError
from s3ckpt.store import Location
from s3ckpt.store.s3 import S3Store
from s3ckpt.uri import StoreURL
from tests._retention_util import write_checkpoint
from tests.faultproxy import FaultProxy

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
FAST_RETRIES = TransferConfig(retry_initial_delay=0.01, retry_max_delay=0.05)


class Wire:
    """Requests the proxy forwarded or answered, counted as they arrive."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def hook(self, op: str, key: str, phase: str) -> None:
        if phase == "before":
            with self._lock:
                self.count += 1

    def take(self) -> int:
        with self._lock:
            n, self.count = self.count, 0
            return n


@pytest.fixture
def wire(moto_endpoint: str) -> Iterator[tuple[Wire, FaultProxy]]:
    seen = Wire()
    with FaultProxy(moto_endpoint, fault_rate=0.0, hook=seen.hook) as proxy:
        yield seen, proxy


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 32)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _data_bytes(s3_client: Any, bucket: str, prefix: str) -> int:
    resp = s3_client.list_objects_v2(Bucket=bucket, Prefix=prefix)
    return sum(o["Size"] for o in resp.get("Contents", []) if o["Key"].endswith(".distcp"))


def test_save_async_save_and_load_events_match_the_wire_and_the_bucket(
    bucket: str, s3_client: Any, wire: tuple[Wire, FaultProxy]
) -> None:
    seen, proxy = wire
    model, opt = _model()
    cfg = S3Config(endpoint_url=proxy.endpoint_url)
    with metrics.capture() as events, Checkpointer(f"s3://{bucket}/ck", s3_config=cfg) as ckpt:
        seen.take()
        sync = ckpt.save(1, model, opt)
        sync_wire = seen.take()
        handle = ckpt.async_save(2, model, opt)
        handle.wait()
        async_wire = seen.take()
        assert ckpt.load(_model()[0], None) == 2
        load_wire = seen.take()
    save, async_save, load = events
    # Every request on the wire is in its operation's event, and nothing else is.
    assert (save.kind, save.step, save.ok, save.error) == ("save", 1, True, None)
    assert save.requests == sync_wire > 0 and save.retries == 0 and save.throttled == 0
    assert save.bytes == _data_bytes(s3_client, bucket, "ck/step_000000001/") > 0
    # A synchronous save holds training for all of it.
    assert save.blocked_s is not None and save.blocked_s == sync.blocked_seconds
    assert 0 < save.blocked_s <= save.duration_s
    assert save.url == f"s3://{bucket}/ck/step_000000001/"

    assert (async_save.kind, async_save.step, async_save.ok) == ("save", 2, True)
    assert async_save.requests == async_wire > 0
    assert async_save.bytes == _data_bytes(s3_client, bucket, "ck/step_000000002/")
    assert async_save.blocked_s == handle.blocked_seconds
    assert async_save.blocked_s is not None and async_save.blocked_s < async_save.duration_s

    assert (load.kind, load.step, load.ok, load.blocked_s) == ("load", 2, True, None)
    assert load.requests == load_wire > 0
    # The model's items only (no optimizer asked for): part of what was saved.
    assert 0 < load.bytes < async_save.bytes
    assert load.checksum_failures == 0


def test_plain_dcp_save_and_load_publish_their_own_events(
    bucket: str, wire: tuple[Wire, FaultProxy]
) -> None:
    seen, proxy = wire
    cfg = S3Config(endpoint_url=proxy.endpoint_url)
    url = f"s3://{bucket}/run/step_7"
    sd = {"w": torch.arange(256.0), "step": 7}
    seen.take()
    with metrics.capture() as events:
        dcp.save(sd, storage_writer=S3StorageWriter(url, s3_config=cfg, step=7))
        save_wire = seen.take()
        out = {"w": torch.zeros(256), "step": 0}
        dcp.load(out, storage_reader=S3StorageReader(url, s3_config=cfg))
        load_wire = seen.take()
    save, load = events
    assert (save.kind, save.step, save.ok, save.blocked_s) == ("save", 7, True, None)
    assert save.requests == save_wire and save.bytes > 1024
    assert (load.kind, load.step, load.ok) == ("load", 7, True)
    assert load.requests == load_wire and load.bytes == save.bytes
    assert torch.equal(out["w"], sd["w"])


def test_throttled_attempts_are_counted_as_retries_and_throttles(
    bucket: str, wire: tuple[Wire, FaultProxy]
) -> None:
    seen, proxy = wire
    model, opt = _model()
    cfg = S3Config(endpoint_url=proxy.endpoint_url)
    with Checkpointer(f"s3://{bucket}/ck", s3_config=cfg, transfer_config=FAST_RETRIES) as ckpt:
        burst = proxy.arm("*", "slowdown", times=3, skip=2)
        before = metrics.totals()
        seen.take()
        with metrics.capture() as events:
            ckpt.save(1, model, opt)
        on_wire = seen.take()
    (e,) = events
    assert burst.hits == 3
    assert e.ok and e.throttled == 3 and e.retries == 3
    assert e.requests + e.retries == on_wire  # every attempt is one HTTP request
    after = metrics.totals()
    assert after.throttled - before.throttled == 3


def test_a_corrupted_object_is_a_checksum_failure_in_the_load_event(
    bucket: str, s3_client: Any, moto_endpoint: str
) -> None:
    model, opt = _model()
    cfg = S3Config(endpoint_url=moto_endpoint)
    with Checkpointer(f"s3://{bucket}/ck", s3_config=cfg) as ckpt:
        ckpt.save(1, model, opt)
        resp = s3_client.list_objects_v2(Bucket=bucket, Prefix="ck/step_000000001/")
        (key,) = [o["Key"] for o in resp["Contents"] if o["Key"].endswith(".distcp")]
        body = bytearray(s3_client.get_object(Bucket=bucket, Key=key)["Body"].read())
        # A byte inside the weight's data (8 KiB of float32 from offset ~1 KiB on): the
        # framing stays intact, only the CRC32C can tell.
        body[4096] ^= 0xFF
        s3_client.put_object(Bucket=bucket, Key=key, Body=bytes(body))
        before = metrics.totals().checksum_failures
        with metrics.capture() as events, pytest.raises(ChecksumMismatchError):
            ckpt.load(_model()[0], None, step=1)
    (e,) = events
    assert (e.kind, e.ok, e.error, e.step) == ("load", False, "ChecksumMismatchError", 1)
    assert e.checksum_failures >= 1
    assert metrics.totals().checksum_failures - before == e.checksum_failures


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_prune_metrics_file_parses_and_agrees_with_the_json(
    bucket: str, moto_endpoint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = S3Store(bucket, S3Config(endpoint_url=moto_endpoint))
    run = StoreURL("s3", bucket, "runs/a/")
    t0 = time.time() - 86400
    for step in (1, 2, 3, 4, 5):
        write_checkpoint(store, run, step, created=t0 + step)
    path = tmp_path / "s3ckpt-prune.prom"
    before = time.time()
    code = main(
        [
            "prune",
            f"s3://{bucket}/runs/",
            "--policy",
            "keep-last-3",
            "--apply",
            "--json",
            "--metrics-file",
            str(path),
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    (r,) = doc["runs"]
    samples = _samples(path.read_text())
    lab = (("run", str(run)),)
    assert samples[("s3ckpt_prune_success", ())] == 1
    assert samples[("s3ckpt_prune_dry_run", ())] == 0
    assert before <= samples[("s3ckpt_prune_last_run_timestamp_seconds", ())] <= time.time()
    assert samples[("s3ckpt_prune_requests", ())] > 0
    assert samples[("s3ckpt_prune_deleted_checkpoints", lab)] == len(r["deleted"]) == 2
    assert samples[("s3ckpt_prune_freed_bytes", lab)] == r["bytes_freed"] > 0
    assert samples[("s3ckpt_prune_lease_busy", lab)] == 0
    # --apply takes the run's lease: over HTTP that is a few requests, never free.
    assert 0 < samples[("s3ckpt_prune_lease_wait_seconds", lab)] < 60
    assert samples[("s3ckpt_checkpoints", (*lab, ("state", "committed")))] == 3
    kept = [d for d in r["decisions"] if d["action"] == "keep"]
    assert samples[("s3ckpt_checkpoint_bytes", (*lab, ("state", "committed")))] == sum(
        d["size"] for d in kept
    )
    assert samples[("s3ckpt_latest_committed_step", lab)] == 5
    # The commit time is the store's (when the marker's save reached it), not the writer's
    # created (t0 + 5, a day ago): moto's clock is this host's, so it is about now.
    latest = samples[("s3ckpt_latest_committed_timestamp_seconds", lab)]
    assert latest == pytest.approx(before, abs=60) and latest != pytest.approx(t0 + 5, abs=60)


def test_a_failed_prune_still_writes_the_file_a_usage_error_does_not(
    moto_endpoint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s3ckpt-prune.prom"
    bad = ["prune", "s3://no-such-bucket-x/runs/", "--metrics-file", str(path)]
    assert main([*bad, "--policy", "no-such-policy"]) == 2
    assert not path.exists()
    assert main([*bad, "--policy", "keep-last-3"]) != 0
    samples = _samples(path.read_text())
    assert samples[("s3ckpt_prune_success", ())] == 0
    capsys.readouterr()


def test_a_metrics_file_that_cannot_be_written_is_a_clear_error_never_a_traceback(
    bucket: str, moto_endpoint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = S3Store(bucket, S3Config(endpoint_url=moto_endpoint))
    run = StoreURL("s3", bucket, "runs/a/")
    for step in (1, 2, 3, 4):
        write_checkpoint(store, run, step, created=time.time() - 86400 + step)
    prune = ["prune", f"s3://{bucket}/runs/", "--policy", "keep-last-3", "--apply"]
    # A directory that does not exist, or a directory given as the file: refused by the
    # parser, before any request (nothing deleted).
    for where in (tmp_path / "missing" / "m.prom", tmp_path):
        assert main([*prune, "--metrics-file", str(where)]) == 2
        err = capsys.readouterr().err
        assert "--metrics-file" in err and ("does not exist" in err or "is a directory" in err)
    assert [c.step for c in _committed(store, run)] == [1, 2, 3, 4]
    # The directory goes away while the prune runs: the prune stands, the error is one
    # line on stderr, and the exit code says the metrics are missing.
    folder = tmp_path / "textfile"
    folder.mkdir()
    path = folder / "s3ckpt-prune.prom"
    real = S3Store.delete

    def delete_then_lose_the_folder(self: S3Store, keys: Any) -> Any:
        if folder.exists():
            folder.rmdir()
        return real(self, keys)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(S3Store, "delete", delete_then_lose_the_folder)
        code = main([*prune, "--metrics-file", str(path)])
    err = capsys.readouterr().err
    assert code == 2
    assert f"cannot write the metrics file {path}" in err and "Traceback" not in err
    assert [c.step for c in _committed(store, run)] == [2, 3, 4]


def _committed(store: S3Store, run: StoreURL) -> list[Any]:
    from s3ckpt.retention import list_checkpoints

    return [c for c in list_checkpoints(Location.of(run, store=store)) if c.is_committed]


def test_a_healthy_job_has_no_failed_requests_only_expected_404s_and_412s(
    bucket: str, moto_endpoint: str, tmp_path: Path
) -> None:
    """save + load + latest + retention prune + the cron's prune, in a fresh process: zero
    failures in its totals and in every event, while the probes' 404s (the ``latest``
    pointer and commit markers not written yet) and the conditional writes' 412s (the
    released lease, the capability probe) are counted as expected."""
    prom = tmp_path / "prune.prom"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.integration._healthy_job", bucket, str(prom)],
        cwd=ROOT,
        env={**os.environ, "AWS_ENDPOINT_URL": moto_endpoint},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc["cli"] == 0
    failed = {op: c["failed"] for op, c in doc["operations"].items() if c["failed"]}
    assert doc["failed"] == 0, failed
    assert doc["not_found"] > 0 and doc["precondition_failed"] > 0
    assert doc["operations"]["head"]["not_found"] > 0  # probes of markers not written yet
    events = doc["events"]
    assert {"save", "load", "prune"} <= {e["kind"] for e in events}
    assert all(e["ok"] and e["failed_requests"] == 0 for e in events), events
    saves = [e for e in events if e["kind"] == "save"]
    assert len(saves) == 3 and all(e["not_found"] >= 1 for e in saves)  # probed its marker
    assert sum(e["precondition_failed"] for e in events if e["kind"] == "prune") >= 1  # lease
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(prom.read_text())
        for s in fam.samples
    }
    assert samples[("s3ckpt_prune_failed_requests", ())] == 0
    assert samples[("s3ckpt_prune_expected_requests", (("outcome", "precondition_failed"),))] >= 1


def test_a_404_nobody_expected_is_still_a_failure(bucket: str, moto_endpoint: str) -> None:
    from s3ckpt.errors import ObjectNotFoundError
    from s3ckpt.metrics import instrument

    store = S3Store(bucket, S3Config(endpoint_url=moto_endpoint))
    with metrics.capture() as events, instrument.operation("load", f"s3://{bucket}/missing/"):
        with pytest.raises(ObjectNotFoundError):
            store.get("missing/data.distcp")  # a data object a manifest lists: a failure
        with pytest.raises(ObjectNotFoundError), instrument.expecting("not_found"):
            store.get("missing/s3ckpt.json")  # a probe that expects it
        assert store.head("missing/s3ckpt.json") is None  # a HEAD asks: 404 is an answer
    (event,) = [e for e in events if e.url == f"s3://{bucket}/missing/"]
    assert (event.requests, event.failed_requests, event.not_found) == (3, 1, 2)
    assert event.precondition_failed == 0
