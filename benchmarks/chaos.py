"""Chaos harness: attack s3ckpt the way production fails, and count what happens.

Runs a moto S3 server in its own process, puts tests/faultproxy's FaultProxy (in this
process) in front of it, and runs every saver/loader under attack in a child process
(benchmarks/_chaos_worker.py) so a SIGKILL is real. After every trial the bucket is
inspected directly (no proxy) and the invariants are checked:

* no checkpoint lost (a committed checkpoint is still committed, unless a newer one
  legitimately replaced it);
* no silent wrong load (everything committed loads bit-exact to the state its writer saved);
* nothing committed-but-unloadable (including the stock ``.metadata`` copy after gc);
* no leftovers after ``gc --apply`` (only committed checkpoints' objects, control objects
  and the planted foreign files remain; no open multipart uploads);
* no non-s3ckpt object deleted;
* every failure a clear s3ckpt error, within a minute.

Classes (see docs/reliability.md): 1 kill -9 at every commit-protocol step, 2 lost replies
on every request type and random fault mixes, 3 stalls past timeouts, 4 gc/prune during
slow saves, 5 concurrent savers of one step, 6 at-rest corruption, 7 uncommitted and
stock-DCP prefixes.

Usage::

    .venv/bin/python benchmarks/chaos.py --seed 1 --classes all --trials-scale 1.0 \
        --out results.json --report docs/reliability.md
    .venv/bin/python benchmarks/chaos.py --quick          # the slice tests run

Exit status: 0 when no invariant was violated, 1 otherwise, 2 on a harness error.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
import uuid
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT / "tests"))
if str(ROOT) not in sys.path:
    sys.path.insert(1, str(ROOT))

# Never reach a real account: dummy credentials, no profiles, no instance metadata.
for _var in (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
):
    os.environ.pop(_var, None)
os.environ.update(
    AWS_ACCESS_KEY_ID="testing",
    AWS_SECRET_ACCESS_KEY="testing",
    AWS_DEFAULT_REGION="us-east-1",
    AWS_CONFIG_FILE=os.devnull,
    AWS_SHARED_CREDENTIALS_FILE=os.devnull,
    AWS_EC2_METADATA_DISABLED="true",
    MOTO_ALLOW_NONEXISTENT_REGION="true",
)

warnings.filterwarnings("ignore", message="torch.distributed is disabled")

from _chaos_life import LIFE_CLASSES, LifeClasses  # noqa: E402
from _chaos_trust import TRUST_CLASSES, TRUST_VIOLATIONS, TrustClasses  # noqa: E402

CLASSES = {
    1: "kill -9 at commit-protocol steps",
    2: "lost replies and random fault mixes",
    3: "stalls past timeouts",
    4: "gc/prune during slow saves",
    5: "concurrent savers of one step",
    6: "at-rest corruption",
    7: "uncommitted and stock-DCP prefixes",
    **TRUST_CLASSES,
    **LIFE_CLASSES,
}
VIOLATION_KINDS = (
    "lost",
    "silent_wrong_load",
    "committed_unloadable",
    "leftover_after_gc",
    "foreign_deleted",
    "unclear_error",
    "slow_error",
    "undetected_corruption",
    *TRUST_VIOLATIONS,
)
ERROR_LIMIT_S = 60.0
WORKER_TIMEOUT_S = 90.0
SEED_STEP = 1  # the committed baseline of a run
SAVE_STEP = 2  # the step saved under attack
W_STEP = 7  # step recorded by the S3StorageWriter checkpoints
SMALL_TC = {"part_size": 5 * 1024 * 1024, "max_inflight_bytes": 20 * 1024 * 1024}
PLANT_RUN = "notes.txt"
PLANT_CKPT = "events.out.tfevents.chaos"

_TAG_META = re.compile(r"\.metadata\.[0-9a-f]{8}")


def log(msg: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def keyclass(op: str, key: str) -> str:
    """What a request touches, in commit-protocol terms."""
    base = key.rsplit("/", 1)[-1]
    if not key:
        return "bucket"
    if base == "s3ckpt.json":
        return "marker"
    if base == ".metadata":
        return "metadata"
    if _TAG_META.fullmatch(base):
        return "metadata_tag"
    if base.startswith("s3ckpt.alive."):
        return "heartbeat"
    if base.startswith("s3ckpt.items."):
        return "items"
    if base.endswith(".distcp"):
        return "data"
    if base == "s3ckpt.latest.json":
        return "latest"
    if base == "s3ckpt.lease":
        return "lease"
    if base == "s3ckpt.pin.json":
        return "pin"
    return "other"


def gc_after_grace(store: Any, run_url: Any) -> Any:
    """``gc(apply=True)`` as it runs once every grace period is long past: the clock three
    days ahead, and every dead save's uploads aborted at once."""
    from s3ckpt.retention import RetentionOptions, gc
    from s3ckpt.store import Location

    return gc(
        Location(run_url, store),
        apply=True,
        older_than=timedelta(0),
        options=RetentionOptions(now=datetime.now(UTC) + timedelta(days=3)),
    )


# --------------------------------------------------------------------------- results
@dataclass
class Trial:
    cls: int
    name: str
    params: dict[str, Any]
    outcome: str = "?"
    violations: list[tuple[str, str]] = field(default_factory=list)
    time_to_error: float | None = None
    duration: float = 0.0
    notes: list[str] = field(default_factory=list)

    def violate(self, kind: str, detail: str) -> None:
        assert kind in VIOLATION_KINDS, kind
        self.violations.append((kind, detail[:800]))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trial:
        t = cls(d["class"], d["name"], d["params"], d["outcome"])
        t.violations = [(v["kind"], v["detail"]) for v in d["violations"]]
        t.time_to_error = d["time_to_error"]
        t.duration = d["duration"]
        t.notes = d["notes"]
        return t

    def to_dict(self) -> dict[str, Any]:
        return {
            "class": self.cls,
            "name": self.name,
            "params": self.params,
            "outcome": self.outcome,
            "violations": [{"kind": k, "detail": d} for k, d in self.violations],
            "time_to_error": self.time_to_error,
            "duration": round(self.duration, 2),
            "notes": self.notes,
        }


class Results:
    def __init__(self) -> None:
        self.trials: list[Trial] = []
        self.class_time: dict[int, float] = {}
        self.harness_errors: list[str] = []
        self.harness_notes: list[str] = []

    def add(self, t: Trial) -> None:
        self.trials.append(t)
        v = ", ".join(f"{k}: {d[:160]}" for k, d in t.violations)
        status = f"VIOLATION {v}" if t.violations else "ok"
        log(f"  class {t.cls} {t.name}: {t.outcome} ({t.duration:.1f}s) {status}")

    def summary(self) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        for cls in sorted({t.cls for t in self.trials} | set(self.class_time)):
            ts = [t for t in self.trials if t.cls == cls]
            viol = Counter(k for t in ts for k, _ in t.violations)
            tte = [t.time_to_error for t in ts if t.time_to_error is not None]
            out[cls] = {
                "trials": len(ts),
                "outcomes": dict(Counter(t.outcome for t in ts).most_common()),
                "violations": {k: viol.get(k, 0) for k in VIOLATION_KINDS},
                "violating_trials": sum(1 for t in ts if t.violations),
                "max_time_to_error": max(tte) if tte else None,
                "seconds": round(self.class_time.get(cls, 0.0), 1),
            }
        return out

    def n_violations(self) -> int:
        return sum(len(t.violations) for t in self.trials)


# --------------------------------------------------------------------------- moto + S3
def _joined(marker: bytes, items: bytes | None) -> bytes:
    """A marker document with its item rows inline whatever its format (format 4 keeps them
    in their own object, ``items`` naming it): what the manifest mutations edit."""
    doc = json.loads(marker)
    if items is not None and isinstance(doc["items"], dict):
        rows = json.loads(items)
        doc |= {"item_fields": rows["item_fields"], "items": rows["items"]}
    return json.dumps(doc).encode()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Moto:
    """``python -m moto.server`` on 127.0.0.1 in its own process."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the server
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=2).read()
                break
            except Exception:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class S3:
    """Direct (fault-free) access to moto for arranging and inspecting trials."""

    def __init__(self, endpoint: str) -> None:
        import boto3
        from botocore.config import Config

        self.endpoint = endpoint
        self.c = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            config=Config(retries={"total_max_attempts": 3}, max_pool_connections=16),
        )

    def new_bucket(self, tag: str) -> str:
        name = f"chaos-{tag}-{uuid.uuid4().hex[:10]}".lower()
        self.c.create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> dict[str, int]:
        out: dict[str, int] = {}
        for page in self.c.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for o in page.get("Contents", []):
                out[o["Key"]] = o["Size"]
        return out

    def uploads(self, bucket: str, prefix: str = "") -> list[tuple[str, str]]:
        resp = self.c.list_multipart_uploads(Bucket=bucket, Prefix=prefix)
        return [(u["Key"], u["UploadId"]) for u in resp.get("Uploads", [])]

    def get(self, bucket: str, key: str) -> bytes:
        return self.c.get_object(Bucket=bucket, Key=key)["Body"].read()

    def put(self, bucket: str, key: str, body: bytes) -> None:
        self.c.put_object(Bucket=bucket, Key=key, Body=body)

    def copy_prefix(self, src_bucket: str, src: str, dst_bucket: str, dst: str) -> list[str]:
        out = []
        for key in self.keys(src_bucket, src):
            new = dst + key[len(src) :]
            self.c.copy_object(
                Bucket=dst_bucket, Key=new, CopySource={"Bucket": src_bucket, "Key": key}
            )
            out.append(new)
        return out

    def wipe(self, bucket: str) -> None:
        with contextlib.suppress(Exception):
            for key, uid in self.uploads(bucket):
                self.c.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=uid)
            keys = list(self.keys(bucket))
            for i in range(0, len(keys), 1000):
                self.c.delete_objects(
                    Bucket=bucket,
                    Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]], "Quiet": True},
                )
            self.c.delete_bucket(Bucket=bucket)


# --------------------------------------------------------------------------- workers
_CTX: Any = None


def _mp() -> Any:
    """The forkserver context, with the worker module (torch, s3ckpt) preloaded."""
    global _CTX
    if _CTX is None:
        import multiprocessing as mp

        _CTX = mp.get_context("forkserver")
        _CTX.set_forkserver_preload(["_chaos_worker"])
    return _CTX


class Worker:
    """One child process (forked from the preloaded forkserver), good for one command."""

    def __init__(self) -> None:
        import _chaos_worker

        ctx = _mp()
        self.conn, child_conn = ctx.Pipe()
        self.proc = ctx.Process(target=_chaos_worker.child, args=(child_conn,), daemon=True)
        self.proc.start()
        child_conn.close()
        self.pid = self.proc.pid
        self.killed_at: float | None = None

    def _next(self, timeout: float) -> dict[str, Any] | None:
        try:
            if self.conn.poll(max(0.0, timeout)):
                return self.conn.recv()
        except (EOFError, OSError):
            return {"eof": True}
        return None

    def wait_ready(self, timeout: float = 120.0) -> None:
        msg = self._next(timeout)
        if not msg or "ready" not in msg:
            raise RuntimeError(f"worker did not start (exit code {self.proc.exitcode})")

    def send(self, cmd: dict[str, Any]) -> None:
        self.conn.send(cmd)
        msg = self._next(30)
        if not msg or "armed" not in msg:
            raise RuntimeError(f"worker did not take the command (exit code {self.proc.exitcode})")

    def go(self) -> None:
        self.conn.send("go")

    def result(self, timeout: float = WORKER_TIMEOUT_S) -> tuple[str, dict[str, Any] | None]:
        """("done", result) / ("killed", None) / ("timeout", None) / ("crashed", None)."""
        msg = self._next(timeout)
        if msg is not None and "result" in msg:
            self.reap()
            return "done", msg["result"]
        if self.killed_at is not None:
            self.reap()
            return "killed", None
        if msg is not None:  # EOF: the child died on its own
            self.reap()
            return "crashed", None
        self.kill()
        self.reap()
        return "timeout", None

    def kill(self) -> None:
        """SIGKILL and wait until the process is gone (its sockets closed)."""
        if self.killed_at is None:
            self.killed_at = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{self.pid}/stat") as f:
                    if f.read().split(") ", 1)[1][:1] in ("Z", "X"):
                        return
            except (OSError, IndexError):  # gone (ProcessLookupError while reading, too)
                return
            time.sleep(0.005)

    def reap(self) -> None:
        with contextlib.suppress(Exception):
            self.proc.join(10)
        with contextlib.suppress(Exception):
            self.conn.close()


class Pool:
    """Keeps one spare worker warming up while a trial runs (torch imports take seconds)."""

    def __init__(self) -> None:
        self._spare: Worker | None = Worker()
        self.live: list[Worker] = []

    def take(self) -> Worker:
        w = self._spare if self._spare is not None else Worker()
        self._spare = Worker()
        w.wait_ready()
        self.live = [x for x in self.live if x.proc.exitcode is None]
        self.live.append(w)
        return w

    def close(self) -> None:
        for w in [*self.live, *([self._spare] if self._spare else [])]:
            if w.proc.exitcode is None:
                w.kill()
                w.reap()


# --------------------------------------------------------------------------- the harness
class Harness(TrustClasses, LifeClasses):
    def __init__(
        self, seed: int, scale: float, quick: bool, class_scale: dict[int, float] | None = None
    ) -> None:
        import _chaos_state as state
        import torch

        from tests.faultproxy import OPERATIONS, FaultProxy  # noqa: F401  (fails early if missing)

        torch.set_num_threads(1)
        self.state = state
        self.seed = seed
        self.scale = scale
        self.class_scale = class_scale or {}
        self.quick = quick
        self.rng = random.Random(seed)
        self.results = Results()
        log("starting moto")
        self.moto = Moto()
        self.s3 = S3(self.moto.endpoint)
        self.pool = Pool()
        self._digests: dict[tuple[str, int, int, int], str] = {}
        self.recordings: dict[str, list[tuple[str, str]]] = {}
        self.save_seconds: dict[str, float] = {}
        self.template = self.s3.new_bucket("template")
        self._build_templates()

    def close(self) -> None:
        try:
            self.pool.close()
        finally:
            self.moto.stop()

    deadline: float | None = None

    def sc(self, cls: int) -> float:
        """The trial scale of class ``cls`` (--class-scale, else --trials-scale)."""
        return self.class_scale.get(cls, self.scale)

    def over_budget(self, where: str) -> bool:
        """Past --budget-minutes: stop adding trials (said in the report)."""
        if self.deadline is None or time.monotonic() < self.deadline:
            return False
        msg = f"time budget reached: stopped {where}"
        if msg not in self.results.harness_notes:
            self.results.harness_notes.append(msg)
            log(msg)
        return True

    # -- expectations ------------------------------------------------------------------------
    def expect_model(self, step: int, variant: int = 0) -> str:
        key = ("model", self.seed, step, variant)
        if key not in self._digests:
            m, o = self.state.build_model(self.seed, step, variant)
            self._digests[key] = self.state.model_digest(m, o)
        return self._digests[key]

    def expect_flat(self, step: int, variant: int = 0) -> str:
        key = ("flat", self.seed, step, variant)
        if key not in self._digests:
            self._digests[key] = self.state.digest(self.state.flat_state(self.seed, step, variant))
        return self._digests[key]

    # -- s3ckpt access without faults ------------------------------------------------------------
    def s3cfg(self, endpoint: str | None = None) -> Any:
        from s3ckpt import S3Config

        return S3Config(endpoint_url=endpoint or self.moto.endpoint)

    def store(self, url: str, endpoint: str | None = None) -> tuple[Any, Any]:
        from s3ckpt.store import open_store

        return open_store(url, s3_config=self.s3cfg(endpoint))

    def small_tc(self, **kw: Any) -> Any:
        from s3ckpt import TransferConfig

        return TransferConfig(**{**SMALL_TC, **kw})

    def load_model_digest(self, run_url: str, step: int) -> str:
        from s3ckpt import Checkpointer

        m, o = self.state.build_model(-1, 0)
        ck = Checkpointer(run_url, s3_config=self.s3cfg(), transfer_config=self.small_tc())
        try:
            ck.load(m, o, step=step)
        finally:
            ck.close()
        return self.state.model_digest(m, o)

    def load_flat_digest(self, url: str, **reader_kw: Any) -> str:
        import torch.distributed.checkpoint as dcp

        from s3ckpt import S3StorageReader

        dest = self.state.blank_flat_state()
        reader = S3StorageReader(url, s3_config=self.s3cfg(), **reader_kw)
        dcp.load(dest, storage_reader=reader)
        return self.state.digest(dest)

    def direct_ckpt_save(self, run_url: str, step: int, variant: int = 0) -> None:
        from s3ckpt import Checkpointer

        m, o = self.state.build_model(self.seed, step, variant)
        ck = Checkpointer(run_url, s3_config=self.s3cfg(), transfer_config=self.small_tc())
        try:
            ck.save(step, m, o)
        finally:
            ck.close()

    def direct_writer_save(self, url: str, step: int, variant: int, overwrite: bool) -> None:
        import torch.distributed.checkpoint as dcp

        from s3ckpt import S3StorageWriter

        w = S3StorageWriter(
            url,
            s3_config=self.s3cfg(),
            transfer_config=self.small_tc(),
            overwrite=overwrite,
            step=step,
        )
        dcp.save(self.state.flat_state(self.seed, step, variant), storage_writer=w)

    # -- templates ---------------------------------------------------------------------------
    def _build_templates(self) -> None:
        t0 = time.monotonic()
        b = self.template
        self.direct_ckpt_save(f"s3://{b}/run", SEED_STEP)
        self.s3.put(b, f"run/{PLANT_RUN}", b"foreign: a user's notes\n")
        self.s3.put(b, f"run/step_{SEED_STEP:09d}/{PLANT_CKPT}", b"foreign: tensorboard\n")
        self.direct_writer_save(f"s3://{b}/ow/ckpt", W_STEP, 0, overwrite=False)
        self.s3.put(b, f"ow/ckpt/{PLANT_CKPT}", b"foreign: tensorboard\n")
        self.s3.put(b, f"ow/{PLANT_RUN}", b"foreign\n")
        log(f"templates built in {time.monotonic() - t0:.1f}s: {sorted(self.s3.keys(b))}")

    def arena(self, kind: str) -> tuple[str, str, list[str]]:
        """A fresh bucket holding a copy of the template run for ``kind``; returns
        (bucket, run prefix, planted foreign keys)."""
        b = self.s3.new_bucket(kind[:6])
        if kind == "ckpt":
            self.s3.copy_prefix(self.template, "run/", b, "run/")
            plant_new = f"run/step_{SAVE_STEP:09d}/{PLANT_CKPT}"
            self.s3.put(b, plant_new, b"foreign: written before the save\n")
            planted = [f"run/{PLANT_RUN}", f"run/step_{SEED_STEP:09d}/{PLANT_CKPT}", plant_new]
            return b, "run", planted
        self.s3.copy_prefix(self.template, "ow/", b, "ow/")
        return b, "ow", [f"ow/ckpt/{PLANT_CKPT}", f"ow/{PLANT_RUN}"]

    def command(self, kind: str, bucket: str, endpoint: str, **kw: Any) -> dict[str, Any]:
        if kind == "ckpt":
            cmd = {"kind": "ckpt_save", "run_url": f"s3://{bucket}/run", "step": SAVE_STEP}
        else:
            cmd = {
                "kind": "writer_save",
                "ckpt_url": f"s3://{bucket}/ow/ckpt",
                "step": W_STEP,
                "variant": 1,
                "overwrite": True,
            }
        cmd.update(endpoint=endpoint, seed=self.seed, tc=dict(SMALL_TC))
        cmd.update(kw)
        return cmd

    # -- the invariants ----------------------------------------------------------------------
    def check(
        self,
        t: Trial,
        bucket: str,
        run: str,
        kind: str,
        planted: list[str],
        *,
        fresh_save: bool = True,
        require: dict[str, str] | None = None,
    ) -> None:
        """Check every invariant on ``bucket``'s run ``run`` (direct, fault-free).

        ``require``: checkpoint name -> why it must still be committed.
        """
        from s3ckpt.retention import list_checkpoints
        from s3ckpt.retention._catalog import CheckpointState
        from s3ckpt.store import Location

        store, run_url = self.store(f"s3://{bucket}/{run}")
        catalog = list_checkpoints(Location(run_url, store))
        committed = {c.name: c for c in catalog if c.state is CheckpointState.COMMITTED}
        for name, why in (require or {}).items():
            if name not in committed:
                t.violate("lost", f"{name} is no longer committed ({why})")
        newest = None
        for name, c in committed.items():
            if kind == "ckpt":
                want = {self.expect_model(c.step or -1, v): v for v in (0,)}
                loader: Callable[[], str] = lambda c=c: self.load_model_digest(  # noqa: E731
                    f"s3://{bucket}/{run}", c.step
                )
            else:
                want = {self.expect_flat(c.step or W_STEP, v): v for v in range(0, 6)}
                loader = lambda c=c: self.load_flat_digest(str(c.url))  # noqa: E731
            try:
                got = loader()
            except CAUGHT as exc:
                t.violate("committed_unloadable", f"{name}: {type(exc).__name__}: {exc}")
                continue
            if got not in want:
                t.violate(
                    "silent_wrong_load",
                    f"{name} (step {c.step}) loaded state {got} "
                    f"which no writer saved for that step",
                )
            if c.step is not None and (newest is None or c.step > newest):
                newest = c.step
        if kind == "ckpt":
            from s3ckpt import Checkpointer

            ck = Checkpointer(f"s3://{bucket}/{run}", s3_config=self.s3cfg())
            try:
                latest = ck.latest()
            finally:
                ck.close()
            if newest is not None and (latest is None or latest < newest):
                t.violate(
                    "committed_unloadable",
                    f"Checkpointer.latest() = {latest} but step {newest} is committed",
                )
        if fresh_save:
            try:
                if kind == "ckpt":
                    nxt = (newest or SAVE_STEP) + 1
                    self.direct_ckpt_save(f"s3://{bucket}/{run}", nxt)
                    if self.load_model_digest(f"s3://{bucket}/{run}", nxt) != self.expect_model(
                        nxt
                    ):
                        t.violate("silent_wrong_load", f"fresh save of step {nxt} loads wrong")
                else:
                    self.direct_writer_save(f"s3://{bucket}/{run}/ckpt", W_STEP, 5, overwrite=True)
                    if self.load_flat_digest(f"s3://{bucket}/{run}/ckpt") != self.expect_flat(
                        W_STEP, 5
                    ):
                        t.violate("silent_wrong_load", "fresh overwrite loads wrong")
            except CAUGHT as exc:
                t.violate(
                    "committed_unloadable",
                    f"a fresh save after the trial failed: {type(exc).__name__}: {exc}",
                )
        # gc with the grace period long past, then only committed objects may remain.
        try:
            res = gc_after_grace(store, run_url)
            if not res.ok:
                t.notes.append(f"gc failures: {[f.key for f in res.failures][:5]}")
        except CAUGHT as exc:
            t.violate(
                "unclear_error" if not _is_s3ckpt(exc) else "leftover_after_gc",
                f"gc --apply raised {type(exc).__name__}: {exc}",
            )
        self.check_bucket(t, bucket, run, planted)

    def gone_fence(self, bucket: str, key: str) -> bool:
        """A finished tombstone on a marker key: the fence of a deleted step whose reaped
        save may still be paused (issue 37); it stays until a new save replaces it."""
        from s3ckpt._tombstone import Tombstone

        if not key.endswith("/s3ckpt.json"):
            return False
        try:
            tomb = Tombstone.parse(self.s3.get(bucket, key))
        except CAUGHT:
            return False
        return tomb is not None and tomb.done

    def check_bucket(self, t: Trial, bucket: str, run: str, planted: list[str]) -> None:
        """Only committed checkpoints' objects, control objects and planted files remain."""
        from s3ckpt.format._manifest import Manifest
        from s3ckpt.retention import list_checkpoints
        from s3ckpt.retention._catalog import CheckpointState
        from s3ckpt.store import Location

        store, run_url = self.store(f"s3://{bucket}/{run}")
        keys = self.s3.keys(bucket)
        allowed = {f"{run}/s3ckpt.latest.json", f"{run}/s3ckpt.lease", *planted}
        for c in list_checkpoints(Location(run_url, store)):
            if c.state is not CheckpointState.COMMITTED:
                continue
            p = c.url.prefix
            allowed |= {p + "s3ckpt.json", p + ".metadata", p + "s3ckpt.pin.json"}
            try:
                m = Manifest.from_json(self.s3.get(bucket, p + "s3ckpt.json"))
            except CAUGHT as exc:
                t.violate("committed_unloadable", f"{p}s3ckpt.json unreadable: {exc}")
                continue
            allowed |= {p + n for n, _, _ in m.controls} | {p + o.name for o in m.objects}
            plain = p + ".metadata"
            if m.metadata_key != ".metadata" and plain in keys:
                if self.s3.get(bucket, plain) != self.s3.get(bucket, p + m.metadata_key):
                    t.violate(
                        "committed_unloadable",
                        f"{plain} (what stock DCP readers load) "
                        f"differs from the committed {m.metadata_key} after gc",
                    )
            elif plain not in keys:
                t.violate(
                    "committed_unloadable",
                    f"{plain} is missing after gc: stock DCP "
                    "readers cannot load the committed checkpoint",
                )
        for k in planted:
            if k not in keys:
                t.violate("foreign_deleted", f"planted non-s3ckpt object {k} was deleted")
        extra = sorted(k for k in keys if k not in allowed and not self.gone_fence(bucket, k))
        if extra:
            t.violate("leftover_after_gc", f"objects left after gc --apply: {extra}")
        ups = self.s3.uploads(bucket)
        if ups:
            t.violate(
                "leftover_after_gc",
                f"open multipart uploads after gc --apply: {sorted(k for k, _ in ups)}",
            )

    def judge_worker(self, t: Trial, status: str, res: dict[str, Any] | None, kind: str) -> None:
        """Outcome of a faulted (not killed) save/load run."""
        if status == "timeout":
            t.outcome = "hung"
            t.violate("slow_error", f"no result within {WORKER_TIMEOUT_S:.0f}s (killed)")
            t.time_to_error = WORKER_TIMEOUT_S
            return
        if status != "done" or res is None:
            t.outcome = status
            t.violate("unclear_error", f"worker {status}")
            return
        if res.get("dropped_tc"):
            t.notes.append(f"TransferConfig lacks {res['dropped_tc']}")
        if res["ok"]:
            t.outcome = "committed+loaded" if "loaded_digest" in res else "committed"
            if "loaded_digest" in res:
                want = (
                    self.expect_model(SAVE_STEP) if kind == "ckpt" else self.expect_flat(W_STEP, 1)
                )
                if res["loaded_digest"] != want:
                    t.violate(
                        "silent_wrong_load",
                        f"the worker's load after its save returned other data "
                        f"(step {res.get('loaded_step')})",
                    )
            return
        err = res["error"]
        t.time_to_error = err["after_s"]
        t.outcome = f"failed:{err['s3ckpt_type'] or err['type']}"
        if not err["clear"]:
            t.violate("unclear_error", f"{err['type']}: {err['message']}")
        if err["after_s"] > ERROR_LIMIT_S:
            t.violate("slow_error", f"error after {err['after_s']:.1f}s: {err['message'][:200]}")

    # -- class 1 -----------------------------------------------------------------------------
    def record(self, kind: str) -> None:
        """One unfaulted save through a recording proxy: the request sequence to attack."""
        from tests.faultproxy import FaultProxy

        b, _run, _planted = self.arena(kind)
        seq: list[tuple[str, str]] = []
        lock = threading.Lock()

        def hook(op: str, key: str, phase: str) -> None:
            if phase == "before":
                with lock:
                    seq.append((op, keyclass(op, key)))

        with FaultProxy(self.moto.endpoint, fault_rate=0.0, hook=hook) as proxy:
            w = self.pool.take()
            t0 = time.monotonic()
            w.send(self.command(kind, b, proxy.endpoint_url))
            status, res = w.result()
            self.save_seconds[kind] = time.monotonic() - t0
        if status != "done" or not res or not res["ok"]:
            raise RuntimeError(f"recording save ({kind}) failed: {status} {res}")
        self.recordings[kind] = seq
        self.s3.wipe(b)
        log(
            f"recorded {kind} save: {len(seq)} requests in {self.save_seconds[kind]:.1f}s: "
            + ", ".join(f"{op}/{kc}x{n}" for (op, kc), n in Counter(seq).items())
        )

    def kill_points(self, kind: str) -> list[dict[str, Any]]:
        seq = self.recordings[kind]
        counts = Counter(seq)
        pts = []
        for (op, kc), n in counts.items():
            for k in sorted({1, 2, n} & set(range(1, n + 1))):
                for phase in ("before", "after"):
                    pts.append({"mode": "request", "op": op, "kc": kc, "k": k, "phase": phase})
        return pts

    def kill_trial(self, kind: str, point: dict[str, Any], name: str) -> Trial:
        from tests.faultproxy import FaultProxy

        t = Trial(1, name, {"saver": kind, **point})
        t0 = time.monotonic()
        b, run, planted = self.arena(kind)
        t_arena = time.monotonic() - t0
        fired: dict[str, Any] = {}
        lock = threading.Lock()
        counts: Counter[tuple[str, str, str]] = Counter()
        total: Counter[str] = Counter()
        worker: list[Worker] = []

        def hook(op: str, key: str, phase: str) -> None:
            kc = keyclass(op, key)
            with lock:
                counts[(op, kc, phase)] += 1
                total[phase] += 1
                if fired or not worker or point["mode"] == "time":
                    return
                if point["mode"] == "request":
                    hit = (op, kc, phase) == (point["op"], point["kc"], point["phase"]) and counts[
                        (op, kc, phase)
                    ] == point["k"]
                else:  # "index": the n-th request overall
                    hit = phase == point["phase"] and total[phase] == point["n"]
                if not hit:
                    return
                fired.update(op=op, key=key, phase=phase)
            worker[0].kill()

        with FaultProxy(self.moto.endpoint, fault_rate=0.0, hook=hook) as proxy:
            w = self.pool.take()
            worker.append(w)
            w.send(self.command(kind, b, proxy.endpoint_url))
            timer = None
            if point["mode"] == "time":

                def later() -> None:
                    fired.update(at_s=point["at_s"])
                    w.kill()

                timer = threading.Timer(point["at_s"], later)
                timer.start()
            status, res = w.result()
            if timer is not None:
                timer.cancel()
                if status == "done":
                    fired.clear()
        if status == "killed":
            t.outcome = "killed"
            t.params["fired"] = fired
        elif status == "done" and res and res["ok"]:
            t.outcome = "completed (kill point not reached)"
        else:
            self.judge_worker(t, status, res, kind)
        require = (
            {f"step_{SEED_STEP:09d}": "the previous commit"}
            if kind == "ckpt"
            else {"ckpt": "the overwritten checkpoint (old or new) must stay committed"}
        )
        t_run = time.monotonic() - t0 - t_arena
        try:
            self.check(t, b, run, kind, planted, require=require)
        finally:
            self.s3.wipe(b)
        t.duration = time.monotonic() - t0
        t.params["timing"] = [
            round(t_arena, 2),
            round(t_run, 2),
            round(t.duration - t_arena - t_run, 2),
        ]
        return t

    def class1(self) -> None:
        n_total = max(4, round(200 * self.sc(1)))
        kinds = ["ckpt", "writer"]
        plan: list[tuple[str, dict[str, Any]]] = []
        det = [] if self.quick else [(k, p) for k in kinds for p in self.kill_points(k)]
        if self.quick:  # fixed points, no recording needed
            det = [
                (k, {"mode": "request", "op": "PutObject", "kc": kc, "k": 1, "phase": "after"})
                for k, kc in (("ckpt", "metadata_tag"), ("ckpt", "items"), ("ckpt", "marker"))
            ]
            det.append(
                (
                    "writer",
                    {
                        "mode": "request",
                        "op": "DeleteObjects",
                        "kc": "bucket",
                        "k": 1,
                        "phase": "before",
                    },
                )
            )
        plan.extend(det)
        if self.quick:
            n_total = len(det)
        i = 0
        while len(plan) < n_total:
            kind = kinds[i % 2]
            i += 1
            if i % 2:
                n = len(self.recordings[kind])
                plan.append(
                    (
                        kind,
                        {
                            "mode": "index",
                            "n": self.rng.randint(1, n),
                            "phase": self.rng.choice(["before", "after"]),
                        },
                    )
                )
            else:
                plan.append(
                    (
                        kind,
                        {
                            "mode": "time",
                            "at_s": round(self.rng.uniform(0.0, 1.1 * self.save_seconds[kind]), 3),
                        },
                    )
                )
        # Leave class 2 (which runs after this one) at least 45 % of what budget is left.
        own_deadline = (
            None
            if self.deadline is None
            else time.monotonic() + 0.55 * max(0.0, self.deadline - time.monotonic())
        )
        for j, (kind, point) in enumerate(plan):
            if self.over_budget(f"class 1 after {j} of {len(plan)} trials"):
                break
            if own_deadline is not None and time.monotonic() > own_deadline:
                self.results.harness_notes.append(
                    f"time budget: class 1 stopped after {j} of {len(plan)} trials"
                )
                break
            label = (
                f"{kind}:{point['op']}/{point['kc']}#{point['k']}@{point['phase']}"
                if point["mode"] == "request"
                else f"{kind}:req{point['n']}@{point['phase']}"
                if point["mode"] == "index"
                else f"{kind}:t+{point['at_s']}s"
            )
            self.results.add(self.kill_trial(kind, point, f"[{j + 1}/{len(plan)}] {label}"))

    # -- class 2 -----------------------------------------------------------------------------
    def fault_run(
        self,
        t: Trial,
        kind: str,
        proxy_kw: dict[str, Any],
        arms: list[dict[str, Any]],
        tc: dict[str, Any] | None = None,
        gc_through_proxy: bool = True,
        fresh_save: bool = False,
    ) -> None:
        """A save then a load through a faulting proxy, gc through it, then the invariants."""
        from tests.faultproxy import FaultProxy

        b, run, planted = self.arena(kind)
        # A stale upload and an abandoned prefix for gc to clean up through the proxy.
        self.s3.c.create_multipart_upload(
            Bucket=b, Key=f"{run}/step_000000009/__0_0.deadbeef.distcp"
        )
        self.s3.put(b, f"{run}/step_000000008/__0_0.deadbee8.distcp", b"x" * 100)
        t0 = time.monotonic()
        with FaultProxy(self.moto.endpoint, **proxy_kw) as proxy:
            armed = [proxy.arm(**a) for a in arms]
            w = self.pool.take()
            cmd = self.command(kind, b, proxy.endpoint_url, then_load=True)
            if tc is not None:
                cmd["tc"] = tc
            w.send(cmd)
            status, res = w.result()
            self.judge_worker(t, status, res, kind)
            if gc_through_proxy and status == "done":
                store, run_url = self.store(f"s3://{b}/{run}", proxy.endpoint_url)
                g0 = time.monotonic()
                try:
                    gc_after_grace(store, run_url)
                except CAUGHT as exc:
                    el = time.monotonic() - g0
                    t.notes.append(f"gc through the proxy: {type(exc).__name__}: {exc}"[:300])
                    if not _is_s3ckpt(exc):
                        t.violate("unclear_error", f"gc raised {type(exc).__name__}: {exc}")
                    if el > ERROR_LIMIT_S:
                        t.violate("slow_error", f"gc error after {el:.0f}s")
            stats = proxy.stats
            t.params["faults"] = {
                k: stats.get(k, 0)
                for k in (
                    "lost_reply",
                    "stall",
                    "stall_after",
                    "slowdown",
                    "internal",
                    "reset",
                    "reset_mid_body",
                )
                if stats.get(k, 0)
            }
            hits = [getattr(a, "hits", getattr(a, "_hits", None)) for a in armed]
            if arms and not any(hits):
                t.outcome += " (fault never fired)"
        require = (
            {f"step_{SEED_STEP:09d}": "the previous commit"}
            if kind == "ckpt"
            else {"ckpt": "the overwritten checkpoint"}
        )
        if res and res.get("ok") and kind == "ckpt":
            require[f"step_{SAVE_STEP:09d}"] = "the save reported success"
        try:
            self.check(t, b, run, kind, planted, fresh_save=fresh_save, require=require)
            # The abandoned prefixes planted above must be gone; the harness's own check
            # counts them as leftovers otherwise.
        finally:
            self.s3.wipe(b)
        t.duration = time.monotonic() - t0

    def class2(self) -> None:
        from tests.faultproxy import OPERATIONS

        ops = [o for o in OPERATIONS if o != "Other"]
        seqs = {k: Counter(op for op, _ in self.recordings.get(k, [])) for k in ("ckpt", "writer")}
        plan: list[tuple[str, str, list[dict[str, Any]]]] = []
        for op in ops:
            kind = "writer" if op in ("DeleteObjects",) and not seqs["ckpt"].get(op) else "ckpt"
            n = max(1, seqs[kind].get(op, 1))
            skips = sorted({0, 1, self.rng.randrange(n)} if not self.quick else {0})
            for s in skips:
                plan.append((kind, f"{op}#{s + 1}", [dict(op=op, kind="lost_reply", skip=s)]))
        for cond in (True, False):
            for s in (0, 1):
                plan.append(
                    (
                        "ckpt",
                        f"PutObject(conditional={cond})#{s + 1}",
                        [dict(op="PutObject", kind="lost_reply", skip=s, conditional=cond)],
                    )
                )
            plan.append(
                (
                    "writer",
                    f"writer PutObject(conditional={cond})#1",
                    [dict(op="PutObject", kind="lost_reply", skip=0, conditional=cond)],
                )
            )
        for kc_glob in (
            "*s3ckpt.json",
            "*/.metadata",
            "*/.metadata.*",
            "*s3ckpt.latest.json",
            "*s3ckpt.alive.*",
        ):
            plan.append(
                (
                    "ckpt",
                    f"PutObject {kc_glob}",
                    [dict(op="PutObject", kind="lost_reply", key_glob=kc_glob)],
                )
            )
        plan.append(
            (
                "writer",
                "GetObject s3ckpt.json (overwrite)",
                [dict(op="GetObject", kind="lost_reply", key_glob="*s3ckpt.json")],
            )
        )
        if self.quick:
            keep = {"PutObject(conditional=True)#1", "CompleteMultipartUpload#1"}
            plan = [p for p in plan if p[1] in keep]
        n_random = max(2, round(100 * self.sc(2))) if not self.quick else 0
        for j, (kind, label, arms) in enumerate(plan):
            if self.over_budget(f"class 2 after {j} of {len(plan)} armed runs"):
                return
            t = Trial(
                2, f"[{j + 1}/{len(plan)}] lost_reply {kind}:{label}", {"saver": kind, "arms": arms}
            )
            self.fault_run(t, kind, dict(fault_rate=0.0), arms)
            self.results.add(t)
        kinds_mix = ("slowdown", "internal", "reset", "reset_mid_body", "lost_reply")
        for j in range(n_random):
            if self.over_budget(f"class 2 after {j} of {n_random} random runs"):
                return
            kind = ("ckpt", "writer")[j % 2]
            rate = round(self.rng.uniform(0.10, 0.20), 3)
            pseed = self.rng.randrange(1 << 30)
            t = Trial(
                2,
                f"[{j + 1}/{n_random}] random {kind} rate={rate} seed={pseed}",
                {"saver": kind, "rate": rate, "proxy_seed": pseed, "faults": list(kinds_mix)},
            )
            self.fault_run(t, kind, dict(fault_rate=rate, faults=kinds_mix, seed=pseed), [])
            self.results.add(t)

    # -- class 3 -----------------------------------------------------------------------------
    def class3(self) -> None:
        tc = {**SMALL_TC, "read_timeout": 2, "request_deadline": 6}
        plan = [
            ("ckpt", "stall", dict(op="PutObject", key_glob="*s3ckpt.json")),
            ("ckpt", "stall", dict(op="UploadPart")),
            ("ckpt", "stall", dict(op="CompleteMultipartUpload")),
            ("ckpt", "stall", dict(op="GetObject", key_glob="*.distcp")),
            ("ckpt", "stall", dict(op="PutObject", key_glob="*.metadata*")),
            ("ckpt", "stall_after", dict(op="PutObject", key_glob="*s3ckpt.json")),
            ("ckpt", "stall_after", dict(op="CompleteMultipartUpload")),
            ("writer", "stall", dict(op="DeleteObjects")),
            ("writer", "stall_after", dict(op="PutObject", key_glob="*s3ckpt.json")),
            ("ckpt", "stall", dict(op="GetObject", key_glob="*s3ckpt.json")),
        ]
        if self.quick:
            plan = plan[:1]
        for j, (kind, fk, arm) in enumerate(plan):
            t = Trial(
                3,
                f"[{j + 1}/{len(plan)}] {fk} {kind}:{arm}",
                {"saver": kind, "tc": tc, "arm": {**arm, "kind": fk}},
            )
            self.fault_run(
                t,
                kind,
                dict(fault_rate=0.0),
                [dict(**arm, kind=fk, times=2)],
                tc=tc,
                gc_through_proxy=False,
            )
            self.results.add(t)
        if not self.quick:
            self.black_hole()

    def black_hole(self) -> None:
        """Default TransferConfig against an endpoint that never answers."""
        from tests.faultproxy import FaultProxy

        t = Trial(
            3,
            "black hole (default TransferConfig, every request stalls)",
            {"saver": "ckpt", "tc": "default"},
        )
        t0 = time.monotonic()
        b, _run, _ = self.arena("ckpt")
        limit = ERROR_LIMIT_S + 20
        with FaultProxy(self.moto.endpoint, fault_rate=1.0, faults=("stall",)) as proxy:
            w = self.pool.take()
            cmd = self.command("ckpt", b, proxy.endpoint_url)
            cmd["tc"] = {}
            w.send(cmd)
            status, res = w.result(timeout=limit)
        if status == "timeout":
            t.outcome = "hung"
            t.time_to_error = limit
            t.violate(
                "slow_error",
                f"no error within {limit:.0f}s against a black hole "
                "(killed); the default config must fail within a minute",
            )
        else:
            self.judge_worker(t, status, res, "ckpt")
        self.s3.wipe(b)
        t.duration = time.monotonic() - t0
        self.results.add(t)

    # -- class 4 -----------------------------------------------------------------------------
    def class4(self) -> None:
        from s3ckpt import format as fmt

        n = 1 if self.quick else max(2, round(4 * self.sc(4)))
        for j in range(n):
            self.slow_save_trial(j, n, hold=1.5 + j * 0.5, grace_s=1.0)
        if not self.quick and self.sc(4) >= 0.5:
            # The shortest grace gc accepts, held past on one object (real time).
            min_grace = float(getattr(fmt, "MIN_GRACE_SECONDS", 60.0))
            self.slow_save_trial(n, n + 1, hold=min_grace + 5, grace_s=min_grace, single=True)

    def slow_save_trial(
        self, j: int, n: int, hold: float, grace_s: float, single: bool = False
    ) -> None:
        from s3ckpt.retention import KeepLast, RetentionOptions, gc, prune
        from s3ckpt.store import Location
        from tests.faultproxy import FaultProxy

        t = Trial(
            4,
            f"[{j + 1}/{n}] UploadPart held {hold:.1f}s, gc+prune(keep-last 1) "
            f"loop with grace {grace_s:.0f}s",
            {"hold_s": hold, "grace_s": grace_s},
        )
        t0 = time.monotonic()
        b, run, planted = self.arena("ckpt")
        held = [0]

        def hook(op: str, key: str, phase: str) -> None:
            if op == "UploadPart" and phase == "before" and (not single or held[0] == 0):
                held[0] += 1
                time.sleep(hold)

        stop = threading.Event()
        loop_stats: Counter[str] = Counter()
        store, run_url = self.store(f"s3://{b}/{run}")
        here, opts = Location(run_url, store), RetentionOptions(grace=timedelta(seconds=grace_s))

        def loop() -> None:
            end = time.monotonic() + 300
            while not stop.is_set() and time.monotonic() < end:
                for what, fn in (
                    (
                        "gc",
                        lambda: gc(here, apply=True, older_than=timedelta(0), options=opts),
                    ),
                    ("prune", lambda: prune(here, KeepLast(1), apply=True, options=opts)),
                ):
                    try:
                        fn()
                        loop_stats[f"{what}:ok"] += 1
                    except CAUGHT as exc:
                        loop_stats[f"{what}:{type(exc).__name__}"] += 1
                        if type(exc).__name__ == "ConfigError":
                            loop_stats["config_error_msg:" + str(exc)[:120]] += 1
                stop.wait(0.2)

        tc = {**SMALL_TC, "max_concurrency": 1, "read_timeout": max(60, hold + 30)}
        with FaultProxy(self.moto.endpoint, fault_rate=0.0, hook=hook) as proxy:
            th = threading.Thread(target=loop, daemon=True)
            w = self.pool.take()
            w.send(self.command("ckpt", b, proxy.endpoint_url, tc=tc, then_load=True))
            th.start()
            status, res = w.result(timeout=WORKER_TIMEOUT_S + hold * 4)
            stop.set()
            th.join(60)
        t.params["loop"] = dict(loop_stats)
        self.judge_worker(t, status, res, "ckpt")
        if not (res and res.get("ok")):
            t.violate(
                "lost",
                "the slow save did not commit while gc/prune ran: "
                + (res["error"]["message"][:300] if res and res.get("error") else status),
            )
        # keep-last-1 may legitimately prune the older step once the new one committed.
        try:
            self.check(
                t,
                b,
                run,
                "ckpt",
                planted,
                fresh_save=False,
                require={f"step_{SAVE_STEP:09d}": "the slow save's commit"}
                if res and res.get("ok")
                else None,
            )
        finally:
            self.s3.wipe(b)
        t.duration = time.monotonic() - t0
        self.results.add(t)

    # -- class 5 -----------------------------------------------------------------------------
    def class5(self) -> None:
        plan = (
            [(2, False), (3, True)]
            if self.quick
            else [(n, ow) for ow in (False, True) for n in (2, 3, 4)] * max(1, round(self.sc(5)))
        )
        if self.quick:
            plan = plan[:1]
        for j, (n, ow) in enumerate(plan):
            self.race_trial(j, len(plan), n, ow)

    def race_trial(self, j: int, total: int, n: int, overwrite: bool) -> None:
        t = Trial(
            5,
            f"[{j + 1}/{total}] {n} savers, overwrite={overwrite}",
            {"savers": n, "overwrite": overwrite},
        )
        t0 = time.monotonic()
        b = self.s3.new_bucket("race")
        planted = [f"race/{PLANT_RUN}"]
        self.s3.put(b, planted[0], b"foreign\n")
        if overwrite:
            self.s3.copy_prefix(self.template, "ow/ckpt/", b, "race/ckpt/")
            planted.append(f"race/ckpt/{PLANT_CKPT}")
        url = f"s3://{b}/race/ckpt"
        workers = []
        for i in range(n):
            w = self.pool.take()
            w.send(
                {
                    "kind": "writer_save",
                    "ckpt_url": url,
                    "endpoint": self.moto.endpoint,
                    "seed": self.seed,
                    "step": W_STEP,
                    "variant": i + 1,
                    "overwrite": overwrite,
                    "tc": dict(SMALL_TC),
                    "barrier": True,
                }
            )
            workers.append(w)
        for w in workers:
            w.go()
        outs = [w.result() for w in workers]
        ok = [i + 1 for i, (s, r) in enumerate(outs) if s == "done" and r and r["ok"]]
        failed = [
            (i + 1, r["error"])
            for i, (s, r) in enumerate(outs)
            if s == "done" and r and not r["ok"]
        ]
        for i, (s, _r) in enumerate(outs):
            if s != "done":
                t.violate("unclear_error", f"saver {i + 1}: {s}")
        for i, err in failed:
            if not err["clear"]:
                t.violate("unclear_error", f"saver {i}: {err['type']}: {err['message']}")
            if err["after_s"] > ERROR_LIMIT_S:
                t.violate("slow_error", f"saver {i} failed after {err['after_s']}s")
        t.params["winners"] = ok
        t.params["losers"] = {i: e["s3ckpt_type"] or e["type"] for i, e in failed}
        t.time_to_error = max((e["after_s"] for _, e in failed), default=None)
        if not overwrite and len(ok) != 1:
            t.violate(
                "silent_wrong_load" if len(ok) > 1 else "lost",
                f"{len(ok)} savers reported success with overwrite=False (want exactly 1)",
            )
        if overwrite and not ok:
            t.violate("lost", "no saver succeeded with overwrite=True")
        t.outcome = f"{len(ok)} won, {len(failed)} refused"
        want = {self.expect_flat(W_STEP, v): v for v in range(1, n + 1)}
        try:
            got = self.load_flat_digest(url)
            winner = want.get(got)
            t.params["committed_variant"] = winner
            if winner is None:
                t.violate("silent_wrong_load", "the committed checkpoint equals no saver's state")
            elif winner not in ok:
                t.notes.append(f"committed state is saver {winner}'s, which reported failure")
                if not overwrite:
                    t.violate(
                        "silent_wrong_load",
                        f"committed state is saver {winner}'s, but saver(s) {ok} were told "
                        "they won",
                    )
            elif not overwrite and ok and winner != ok[0]:
                t.violate(
                    "silent_wrong_load",
                    f"saver {ok[0]} won but saver {winner}'s state is committed",
                )
        except CAUGHT as exc:
            got = None
            t.violate("committed_unloadable", f"s3ckpt reader: {type(exc).__name__}: {exc}")
        try:
            stock = self.stock_load(b, "race/ckpt")
            if got is not None and stock != got:
                t.violate(
                    "silent_wrong_load",
                    f"a stock DCP reader (FsspecReader over s3fs) loads saver "
                    f"{want.get(stock)}'s state, s3ckpt's reader saver {want.get(got)}'s",
                )
        except CAUGHT as exc:
            t.violate(
                "committed_unloadable",
                f"stock DCP reader (FsspecReader over s3fs): {type(exc).__name__}: {exc}"[:400],
            )

        store, run_url = self.store(f"s3://{b}/race")
        try:
            gc_after_grace(store, run_url)
        except CAUGHT as exc:
            t.notes.append(f"gc: {type(exc).__name__}: {exc}")
        self.check_bucket(t, b, "race", planted)
        self.s3.wipe(b)
        t.duration = time.monotonic() - t0
        self.results.add(t)

    def stock_load(self, bucket: str, prefix: str) -> str:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        dest = self.state.blank_flat_state()
        reader = FsspecReader(
            f"s3://{bucket}/{prefix}",
            endpoint_url=self.moto.endpoint,
            key="testing",
            secret="testing",
            skip_instance_cache=True,
        )
        dcp.load(dest, storage_reader=reader)
        return self.state.digest(dest)

    # -- class 6 -----------------------------------------------------------------------------
    def class6(self) -> None:
        from s3ckpt.format._manifest import Manifest

        b = self.s3.new_bucket("corrupt")
        src = "ow/ckpt/"
        keys = self.s3.keys(self.template, src)
        man_raw = self.s3.get(self.template, src + "s3ckpt.json")
        m = Manifest.from_json(man_raw)
        self._committed_meta = m.metadata_key
        data = [o.name for o in m.objects]
        muts: list[tuple[str, str, Callable[[dict[str, bytes]], None]]] = []
        n_flips = 2 if self.quick else max(3, round(8 * self.sc(6)))

        def flip(name: str, off: int) -> Callable[[dict[str, bytes]], None]:
            def f(objs: dict[str, bytes]) -> None:
                buf = bytearray(objs[name])
                buf[off % len(buf)] ^= 0x5A
                objs[name] = bytes(buf)

            return f

        def trunc(name: str, size: int) -> Callable[[dict[str, bytes]], None]:
            def f(objs: dict[str, bytes]) -> None:
                objs[name] = objs[name][:size]

            return f

        metas = sorted({".metadata", m.metadata_key, *([m.items_ref.name] if m.items_ref else [])})
        for name in data + metas:
            size = keys[src + name]
            offs = [0, size - 1, size // 2] + [self.rng.randrange(size) for _ in range(n_flips)]
            for off in offs if not self.quick else offs[1:3]:
                muts.append((f"flip {name}@{off}", name, flip(name, off)))
            for sz in (size - 1, size // 2, 0) if not self.quick else (size - 1,):
                muts.append((f"truncate {name} to {sz}", name, trunc(name, sz)))
        muts.append(
            ("flip s3ckpt.json@middle", "s3ckpt.json", flip("s3ckpt.json", len(man_raw) // 2))
        )
        items_raw = self.s3.get(self.template, src + m.items_ref.name) if m.items_ref else None
        for label, fn in self.manifest_mutations(_joined(man_raw, items_raw), data):
            for reseal in (False, True):
                muts.append(
                    (
                        f"manifest {label}{' (resealed)' if reseal else ''}",
                        "s3ckpt.json",
                        self._manifest_mut(fn, reseal),
                    )
                )
        if self.quick:
            muts = (
                muts[:3]
                + [x for x in muts if "data_offset" in x[0]][:3]
                + [x for x in muts if "resealed" in x[0] and "start" in x[0]][:2]
            )
        for j, (label, target, fn) in enumerate(muts):
            if self.over_budget(f"class 6 after {j} of {len(muts)} mutations"):
                break
            t = Trial(6, f"[{j + 1}/{len(muts)}] {label}", {"mutation": label, "object": target})
            t0 = time.monotonic()
            dst = f"c{j}/ckpt/"
            objs = {k[len(src) :]: self.s3.get(self.template, k) for k in keys}
            before = dict(objs)
            try:
                fn(objs)
            except CAUGHT as exc:
                t.outcome = f"mutation not applicable ({exc})"
                self.results.add(t)
                continue
            for name, body in objs.items():
                self.s3.put(b, dst + name, body)
            changed = sorted(n for n in objs if objs[n] != before.get(n))
            self.corrupt_trial(t, b, dst, target, changed)
            t.duration = time.monotonic() - t0
            self.results.add(t)
        self.s3.wipe(b)

    @staticmethod
    def manifest_mutations(
        raw: bytes, data: list[str]
    ) -> list[tuple[str, Callable[[dict[str, Any]], None]]]:
        doc = json.loads(raw)
        fields = doc["item_fields"]
        ix = {f: i for i, f in enumerate(fields)}
        items = doc["items"]
        big = max(range(len(items)), key=lambda i: items[i][ix["length"]])
        small = min(range(len(items)), key=lambda i: items[i][ix["length"]])
        out: list[tuple[str, Callable[[dict[str, Any]], None]]] = []

        def item_set(i: int, f: str, fn: Callable[[Any], Any]) -> Callable[[dict[str, Any]], None]:
            def g(d: dict[str, Any]) -> None:
                d["items"][i][ix[f]] = fn(d["items"][i][ix[f]])

            return g

        for which, i in (("big", big), ("small", small)):
            for delta in (1, -1, 8, -8, 64, -64):
                if items[i][ix["data_offset"]] is not None:
                    out.append(
                        (
                            f"item[{which}].data_offset{delta:+d}",
                            item_set(i, "data_offset", lambda v, d=delta: v + d),
                        )
                    )
            for delta in (1, -1):
                out.append(
                    (
                        f"item[{which}].start{delta:+d}",
                        item_set(i, "start", lambda v, d=delta: v + d),
                    )
                )
                out.append(
                    (
                        f"item[{which}].length{delta:+d}",
                        item_set(i, "length", lambda v, d=delta: v + d),
                    )
                )
            out.append(
                (
                    f"item[{which}].crc32c^1",
                    item_set(i, "crc32c", lambda v: f"{int(v, 16) ^ 1:08x}"),
                )
            )
            out.append((f"item[{which}].object='../x'", item_set(i, "object", lambda v: "../x")))
            out.append(
                (
                    f"item[{which}].object=other",
                    item_set(i, "object", lambda v: "__0_9.deadbeef.distcp"),
                )
            )
            if items[i][ix["offset"]] is not None:
                out.append(
                    (
                        f"item[{which}].offset+1",
                        item_set(i, "offset", lambda v: [x + 1 for x in v] if v else [1]),
                    )
                )
        if len(items) > 1:

            def swap(d: dict[str, Any]) -> None:
                a, c = d["items"][big], d["items"][small]
                for f in ("start", "length", "crc32c", "data_offset", "object"):
                    a[ix[f]], c[ix[f]] = c[ix[f]], a[ix[f]]

            out.append(("swap big/small item locations", swap))

        def meta(f: str, fn: Callable[[Any], Any]) -> Callable[[dict[str, Any]], None]:
            def g(d: dict[str, Any]) -> None:
                d["metadata"][f] = fn(d["metadata"][f])

            return g

        out += [
            ("metadata.key='.metadata.deadbeef'", meta("key", lambda v: ".metadata.deadbeef")),
            ("metadata.key='../.metadata'", meta("key", lambda v: "../.metadata")),
            ("metadata.key='.metadata'", meta("key", lambda v: ".metadata")),
            ("metadata.crc32c^1", meta("crc32c", lambda v: f"{int(v, 16) ^ 1:08x}")),
            ("metadata.size+1", meta("size", lambda v: v + 1)),
            ("metadata.size-1", meta("size", lambda v: v - 1)),
        ]

        def obj(i: int, k: int, fn: Callable[[Any], Any]) -> Callable[[dict[str, Any]], None]:
            def g(d: dict[str, Any]) -> None:
                d["objects"][i][k] = fn(d["objects"][i][k])

            return g

        out += [
            ("objects[0].size+1", obj(0, 1, lambda v: v + 1)),
            ("objects[0].size-1", obj(0, 1, lambda v: v - 1)),
            ("objects[0].name='../x'", obj(0, 0, lambda v: "../x")),
            ("objects[0].name=other (renamed)", obj(0, 0, lambda v: "__0_9.deadbeef.distcp")),
        ]
        return out

    @staticmethod
    def _manifest_mut(
        fn: Callable[[dict[str, Any]], None], reseal: bool
    ) -> Callable[[dict[str, bytes]], None]:
        def f(objs: dict[str, bytes]) -> None:
            doc = json.loads(objs["s3ckpt.json"])
            ref = doc["items"] if isinstance(doc["items"], dict) else None
            if ref is not None:  # format 4: the rows are in their own object, the marker names it
                from s3ckpt._crc import crc32c

                doc = json.loads(_joined(objs["s3ckpt.json"], objs[ref["name"]]))
            fn(doc)
            if ref is not None:
                rows = json.loads(objs[ref["name"]])
                rows["items"] = doc.pop("items")
                doc.pop("item_fields")
                records = json.dumps(rows, separators=(",", ":")).encode()
                if records != objs[ref["name"]]:
                    objs[ref["name"]] = records
                    if reseal:  # the marker commits the changed records
                        ref |= {"size": len(records), "crc32c": f"{crc32c(records):08x}"}
                doc["items"] = ref
            if reseal and "digest" in doc:
                body = {k: v for k, v in doc.items() if k != "digest"}
                canon = json.dumps(
                    body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
                ).encode("ascii")
                doc["digest"] = "sha256:" + hashlib.sha256(canon).hexdigest()
            objs["s3ckpt.json"] = json.dumps(doc, separators=(",", ":")).encode()

        return f

    def corrupt_trial(self, t: Trial, b: str, dst: str, target: str, changed: list[str]) -> None:
        from s3ckpt.errors import CorruptCheckpointError

        url = f"s3://{b}/{dst.rstrip('/')}"
        want = self.expect_flat(W_STEP, 0)
        t0 = time.monotonic()
        resealed = "(resealed)" in t.params["mutation"]
        rc, text = run_cli(["verify", url, "--no-progress", "--endpoint-url", self.moto.endpoint])
        t.params["verify_rc"] = rc
        t.params["verify_named"] = rc != 0 and any(c in text for c in changed)
        if rc == 0 and changed and not resealed:
            t.violate(
                "undetected_corruption", f"`s3ckpt verify` exited 0 for {t.params['mutation']}"
            )
        # A resealed manifest change makes good data look bad: naming any object is right.
        if rc != 0 and changed and not resealed and not any(c in text for c in changed):
            t.violate(
                "unclear_error",
                f"`s3ckpt verify` exited {rc} without naming {changed}: {text[-300:]}",
            )
        t0 = time.monotonic()
        try:
            got = self.load_flat_digest(url)
            if got == want:
                t.outcome = "loaded correct data (change not detected)"
                # One of two copies of the metadata (plain and .metadata.{tag}): the reader
                # may use the intact one.
                redundant = (
                    len(changed) == 1
                    and self._committed_meta != ".metadata"
                    and changed[0] in (".metadata", self._committed_meta)
                )
                if changed and not resealed and redundant:
                    t.outcome = "loaded correct data (from the intact .metadata copy)"
                elif changed and not resealed:
                    t.violate(
                        "undetected_corruption",
                        f"load of a corrupted checkpoint ({changed}) succeeded without error",
                    )
                elif changed:
                    t.notes.append("a resealed manifest change the reader ignores (data correct)")
            else:
                t.outcome = "LOADED WRONG DATA"
                t.violate(
                    "silent_wrong_load",
                    f"load returned tensors differing from the saved "
                    f"ones after {t.params['mutation']}",
                )
        except CAUGHT as exc:
            from s3ckpt.errors import find_s3ckpt_error

            inner = find_s3ckpt_error(exc)
            t.time_to_error = round(time.monotonic() - t0, 3)
            if isinstance(inner, CorruptCheckpointError):
                t.outcome = f"refused:{type(inner).__name__}"
            elif inner is not None:
                t.outcome = f"refused:{type(inner).__name__}"
                t.notes.append(f"refused with {type(inner).__name__}, not CorruptCheckpointError")
            else:
                t.outcome = f"error:{type(exc).__name__}"
                t.violate("unclear_error", f"load raised {type(exc).__name__}: {exc}"[:400])
        if (
            t.params.get("verify_rc") == 0
            and changed
            and resealed
            and t.outcome == "LOADED WRONG DATA"
        ):
            t.violate(
                "undetected_corruption", f"`s3ckpt verify` exited 0 for {t.params['mutation']}"
            )

    # -- class 7 -----------------------------------------------------------------------------
    def class7(self) -> None:
        from tests.faultproxy import FaultProxy

        j = 0
        for kind in ("ckpt",) if self.quick else ("ckpt", "writer"):
            j += 1
            t = Trial(
                7,
                f"[{j}] {kind}: killed after its .metadata PUT, before the marker",
                {"saver": kind},
            )
            t0 = time.monotonic()
            b, run, planted = self.arena(kind)
            # writer: a fresh prefix (nothing committed there before)
            url_prefix = "ow/fresh" if kind == "writer" else f"run/step_{SAVE_STEP:09d}"
            fired: dict[str, Any] = {}
            holder: list[Worker] = []

            def hook(
                op: str,
                key: str,
                phase: str,
                fired: dict[str, Any] = fired,
                holder: list[Worker] = holder,
            ) -> None:
                if fired or not holder or op != "PutObject" or phase != "after":
                    return
                if keyclass(op, key) in ("metadata", "metadata_tag"):
                    fired["key"] = key
                    holder[0].kill()

            with FaultProxy(self.moto.endpoint, fault_rate=0.0, hook=hook) as proxy:
                w = self.pool.take()
                holder.append(w)
                cmd = self.command(kind, b, proxy.endpoint_url)
                if kind == "writer":
                    cmd.update(ckpt_url=f"s3://{b}/{url_prefix}", overwrite=False)
                w.send(cmd)
                status, _ = w.result()
            t.params["fired"] = fired
            url = f"s3://{b}/{url_prefix}"
            try:
                if kind == "ckpt":
                    from s3ckpt import S3StorageReader

                    S3StorageReader(url, s3_config=self.s3cfg())
                    m, o = self.state.build_model(-1, 0)
                    import torch.distributed.checkpoint as dcp
                    from torch.distributed.checkpoint.state_dict import get_state_dict

                    msd, osd = get_state_dict(m, o)
                    dcp.load(
                        {"model": msd, "optim": osd},
                        storage_reader=S3StorageReader(url, s3_config=self.s3cfg()),
                    )
                else:
                    self.load_flat_digest(url)
                t.outcome = "UNCOMMITTED PREFIX LOADED"
                t.violate(
                    "committed_unloadable" if False else "silent_wrong_load",
                    f"S3StorageReader loaded the uncommitted prefix {url} (killed at "
                    f"{fired.get('key')}) instead of refusing it",
                )
            except CAUGHT as exc:
                from s3ckpt.errors import find_s3ckpt_error

                inner = find_s3ckpt_error(exc)
                t.outcome = f"refused:{type(inner or exc).__name__}"
                if inner is None:
                    t.violate("unclear_error", f"{type(exc).__name__}: {exc}")
            if status != "killed":
                t.outcome += f" (worker {status}: kill point not reached)"
            import inspect

            from s3ckpt import S3StorageReader as R

            if "allow_uncommitted" in inspect.signature(R.__init__).parameters and kind == "writer":
                try:
                    ok = self.load_flat_digest(url, allow_uncommitted=True) == self.expect_flat(
                        W_STEP, 1
                    )
                    t.notes.append(
                        f"allow_uncommitted=True loads {'bit-exact' if ok else 'OTHER DATA'}"
                    )
                    if not ok:
                        t.violate("silent_wrong_load", "allow_uncommitted=True loaded other data")
                except CAUGHT as exc:
                    t.notes.append(f"allow_uncommitted=True: {type(exc).__name__}: {exc}"[:200])
            try:
                self.check(
                    t,
                    b,
                    run,
                    kind,
                    planted,
                    fresh_save=False,
                    require={f"step_{SEED_STEP:09d}": "previous commit"}
                    if kind == "ckpt"
                    else {"ckpt": "the committed neighbour"},
                )
            finally:
                self.s3.wipe(b)
            t.duration = time.monotonic() - t0
            self.results.add(t)
        for how in ("fsspec-s3", "filesystem-local"):
            j += 1
            self.stock_trial(j, how)

    def stock_trial(self, j: int, how: str) -> None:
        import torch.distributed.checkpoint as dcp

        t = Trial(
            7, f"[{j}] stock DCP checkpoint ({how}) loads through S3StorageReader", {"writer": how}
        )
        t0 = time.monotonic()
        sd = self.state.flat_state(self.seed, W_STEP, 3)
        b = self.s3.new_bucket("stock")
        tmp = tempfile.TemporaryDirectory()
        try:
            if how == "fsspec-s3":
                from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

                url = f"s3://{b}/stock/step_000000007"
                dcp.save(
                    sd,
                    storage_writer=FsspecWriter(
                        url,
                        endpoint_url=self.moto.endpoint,
                        key="testing",
                        secret="testing",
                        skip_instance_cache=True,
                    ),
                )
            else:
                path = os.path.join(tmp.name, "ckpt")
                dcp.save(sd, storage_writer=dcp.FileSystemWriter(path))
                url = "file://" + path
            before = self.s3.keys(b)
            try:
                got = self.load_flat_digest(url)
                t.outcome = "loaded"
                if got != self.expect_flat(W_STEP, 3):
                    t.outcome = "LOADED WRONG DATA"
                    t.violate("silent_wrong_load", f"stock checkpoint ({how}) loads other data")
            except CAUGHT as exc:
                t.outcome = f"error:{type(exc).__name__}"
                t.violate(
                    "committed_unloadable",
                    f"stock DCP checkpoint ({how}) does not load: {type(exc).__name__}: {exc}",
                )
            if how == "fsspec-s3":
                store, run_url = self.store(f"s3://{b}/stock")
                gc_after_grace(store, run_url)
                gone = sorted(set(before) - set(self.s3.keys(b)))
                if gone:
                    t.violate("foreign_deleted", f"gc --apply deleted stock DCP objects {gone}")
        finally:
            tmp.cleanup()
            self.s3.wipe(b)
        t.duration = time.monotonic() - t0
        self.results.add(t)


def _caught() -> tuple[type[BaseException], ...]:
    """Exception, plus torch DCP's CheckpointException (a BaseException wrapping rank errors)."""
    try:
        from torch.distributed.checkpoint.api import CheckpointException

        return (Exception, CheckpointException)
    except ImportError:  # pragma: no cover
        return (Exception,)


CAUGHT = _caught()


def _is_s3ckpt(exc: BaseException) -> bool:
    from s3ckpt.errors import find_s3ckpt_error

    return find_s3ckpt_error(exc) is not None


def run_cli(argv: list[str]) -> tuple[int, str]:
    """``s3ckpt ARGV`` in this process (the CLI's own main), stdout+stderr captured."""
    from s3ckpt.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = int(exc.code) if isinstance(exc.code, int) else 2
        except CAUGHT as exc:
            print(f"CLI crashed: {type(exc).__name__}: {exc}")
            rc = 99
    return rc, buf.getvalue()


# --------------------------------------------------------------------------- report
BEGIN = "<!-- chaos:begin (generated by benchmarks/chaos.py; do not edit by hand) -->"
END = "<!-- chaos:end -->"


def render(results: Results, meta: dict[str, Any]) -> str:
    summ = results.summary()
    lines = [
        BEGIN,
        "",
        f"Run: `{meta['command']}` at commit `{meta['commit']}` on {meta['when']} "
        f"({meta['seconds'] / 60:.1f} min, {meta['python']}, torch {meta['torch']}).",
        "",
        "| # | class | trials | outcomes | lost | wrong load | unloadable | gc leftovers "
        "| foreign deleted | unclear error | slow error | undetected corruption "
        "| max time-to-error |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    tot: Counter[str] = Counter()
    for cls, s in summ.items():
        v = s["violations"]
        tot.update(v)
        tot["trials"] += s["trials"]
        outs = "; ".join(f"{k} {n}" for k, n in s["outcomes"].items())
        tte = "-" if s["max_time_to_error"] is None else f"{s['max_time_to_error']:.1f} s"
        lines.append(
            f"| {cls} | {CLASSES[cls]} | {s['trials']} | {outs} | {v['lost']} | "
            f"{v['silent_wrong_load']} | {v['committed_unloadable']} | {v['leftover_after_gc']} | "
            f"{v['foreign_deleted']} | {v['unclear_error']} | {v['slow_error']} | "
            f"{v['undetected_corruption']} | {tte} |"
        )
    lines.append(
        f"| | **total** | {tot['trials']} | | {tot['lost']} | {tot['silent_wrong_load']} | "
        f"{tot['committed_unloadable']} | {tot['leftover_after_gc']} | {tot['foreign_deleted']} | "
        f"{tot['unclear_error']} | {tot['slow_error']} | {tot['undetected_corruption']} | |"
    )
    lines.append("")
    trust = [c for c in summ if c in TRUST_CLASSES]
    if trust:
        lines += [
            "Invariants of classes 8-12 (counted in the table above too where they apply):",
            "",
            "| # | class | trials | s/trial | live save touched | newer step deleted "
            "| two winners | lease stolen |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for cls in trust:
            s, v = summ[cls], summ[cls]["violations"]
            per = s["seconds"] / s["trials"] if s["trials"] else 0.0
            lines.append(
                f"| {cls} | {CLASSES[cls]} | {s['trials']} | {per:.1f} | "
                f"{v['live_save_touched']} | {v['newer_step_deleted']} | {v['two_winners']} | "
                f"{v['lease_stolen']} |"
            )
        lines.append("")
    bad = [t for t in results.trials if t.violations]
    if bad:
        lines.append(
            f"Violations ({len(bad)} trials; first {min(len(bad), 40)} listed, all in the "
            "results JSON):"
        )
        lines.append("")
        for t in bad[:40]:
            kinds = ", ".join(sorted({k for k, _ in t.violations}))
            first = t.violations[0][1].replace("|", "/").replace("\n", " ")[:220]
            lines.append(f"- class {t.cls} `{t.name}` ({kinds}): {first}")
        lines.append("")
    else:
        lines.append("No invariant was violated.")
        lines.append("")
    for note in results.harness_notes:
        lines.append(f"Note: {note}.")
        lines.append("")
    if results.harness_errors:
        lines.append("Harness errors: " + "; ".join(e[:200] for e in results.harness_errors))
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


def write_report(path: Path, block: str) -> None:
    text = path.read_text() if path.exists() else ""
    if BEGIN.split(" (")[0] in text and END in text:
        head = text[: text.index(BEGIN.split(" (")[0])]
        tail = text[text.index(END) + len(END) :]
        text = head + block + tail
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--classes", default="all", help="'all' or a comma list of 1..17")
    ap.add_argument("--trials-scale", type=float, default=1.0)
    ap.add_argument(
        "--class-scale",
        default="",
        metavar="CLS=F,...",
        help="per-class trial scale overriding --trials-scale, e.g. 1=0.5,6=3",
    )
    ap.add_argument("--quick", action="store_true", help="the small fixed slice (~2 min)")
    ap.add_argument("--out", default=None, help="results JSON")
    ap.add_argument("--report", default=None, help="markdown file whose generated block to rewrite")
    ap.add_argument(
        "--budget-minutes",
        type=float,
        default=None,
        help="stop starting new trials after this long (the report says so)",
    )
    ap.add_argument(
        "--from-results",
        default=None,
        metavar="FILE.json",
        help="keep the trials of the classes not run now from an earlier results file "
        "(re-run one class after a fix and still write the whole table)",
    )
    args = ap.parse_args(argv)
    # Cheap classes first, so a --budget-minutes cut falls on the long classes 1 and 2.
    classes = (
        [7, 6, 5, 3, 4, 9, 10, 11, 12, 8, 14, 17, 13, 15, 16, 1, 2]
        if args.classes == "all"
        else [int(c) for c in args.classes.split(",")]
    )
    scale = args.trials_scale
    t_start = time.monotonic()

    def _term(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _term)
    class_scale = {
        int(k): float(v)
        for k, v in (kv.split("=", 1) for kv in args.class_scale.split(",") if kv.strip())
    }
    h = Harness(args.seed, scale, args.quick, class_scale)
    if args.budget_minutes:
        h.deadline = t_start + args.budget_minutes * 60
    earlier: dict[str, Any] = {}
    if args.from_results:
        earlier = json.loads(Path(args.from_results).read_text())
        for d in earlier["trials"]:
            if d["class"] not in classes:
                h.results.trials.append(Trial.from_dict(d))
        for cls_s, summ in earlier.get("summary", {}).items():
            if int(cls_s) not in classes:
                h.results.class_time[int(cls_s)] = summ.get("seconds", 0.0)
        h.results.harness_notes.extend(
            n for n in earlier.get("harness_notes", []) if not n.startswith("classes [")
        )
        h.results.harness_notes.append(
            f"classes {sorted(set(h.results.class_time))} are from {earlier['meta']['command']!r} "
            f"at {earlier['meta']['commit']} ({earlier['meta']['when']}); classes {classes} "
            "were re-run"
        )
    try:
        for cls in classes:
            log(f"class {cls}: {CLASSES[cls]}")
            c0 = time.monotonic()
            try:
                for kind in ("ckpt", "writer"):
                    if kind not in h.recordings and not h.quick:
                        h.record(kind)
                getattr(h, f"class{cls}")()
            except CAUGHT as exc:
                msg = f"class {cls}: {type(exc).__name__}: {exc}\n{traceback.format_exc()[-2000:]}"
                h.results.harness_errors.append(msg)
                log("HARNESS ERROR " + msg)
            h.results.class_time[cls] = time.monotonic() - c0
            s = h.results.summary().get(cls, {})
            log(
                f"class {cls} done in {h.results.class_time[cls]:.1f}s: "
                f"{s.get('trials', 0)} trials, "
                f"{s.get('violating_trials', 0)} with violations {s.get('violations')}"
            )
    finally:
        h.close()
    seconds = time.monotonic() - t_start
    import torch

    meta = {
        "command": "benchmarks/chaos.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": _git_commit(),
        "when": time.strftime("%Y-%m-%d %H:%M %Z"),
        "seconds": seconds,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "seed": args.seed,
        "scale": scale,
        "class_scale": class_scale,
        "quick": args.quick,
    }
    doc = {
        "meta": meta,
        "summary": {str(k): v for k, v in h.results.summary().items()},
        "violations": h.results.n_violations(),
        "harness_errors": h.results.harness_errors,
        "harness_notes": h.results.harness_notes,
        "trials": [t.to_dict() for t in h.results.trials],
    }
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1, default=str))
    if args.report:
        write_report(Path(args.report), render(h.results, meta))
    log(
        f"done in {seconds / 60:.1f} min: {len(h.results.trials)} trials, "
        f"{h.results.n_violations()} invariant violations, "
        f"{len(h.results.harness_errors)} harness errors"
    )
    for cls, s in h.results.summary().items():
        log(f"  class {cls} ({CLASSES[cls]}): {s['trials']} trials, violations {s['violations']}")
    if h.results.harness_errors:
        return 2
    return 1 if h.results.n_violations() else 0


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "s3ckpt"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return out + ("+dirty s3ckpt/" if dirty else "")
    except Exception:
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
