#!/usr/bin/env python
"""Save/load throughput, client CPU and peak memory of DCP storage backends on S3.

Backends (all against one local S3 server, s3sim or moto, run as a separate process so that its
CPU is not the client's):

  s3ckpt   s3ckpt.S3StorageWriter / S3StorageReader (default TransferConfig)
  s3tc     s3torchconnector.dcp.S3StorageWriter / S3StorageReader (AWS CRT client)
  fsspec   torch's FsspecWriter / FsspecReader over s3fs
  boto3    raw boto3 of the same tensor bytes as ONE in-memory blob: upload_fileobj
           (multipart, 16 MiB parts, 8 threads) and download_fileobj (one streamed GET;
           see docs/performance.md for why not ranged). No DCP at all: a baseline.

Every (backend, op) run is a fresh subprocess, so its peak RSS is its own. A run builds
the state dict (deterministic, seeded), resets the kernel's peak-RSS counter, takes an
RSS baseline, samples RSS every 10 ms in a thread while the op runs, and reports wall
time, MB/s (tensor bytes / wall, MB = 10**6 bytes), client CPU (getrusage user+sys of
the process, all threads) per GiB and peak RSS above the baseline. A load run first
pre-allocates (and touches) the destination state dict, so the baseline includes it.

The timed save of round r is also the setup of that round's load (same backend); the
load runs in its own fresh process and its result is validated against the checksum
the saving process computed from the source tensors, so a backend that silently loads
the wrong bytes fails the benchmark instead of reporting a good number. The prefix is
deleted after each load (moto keeps objects in memory / spooled temp files).

Rounds are interleaved (round 1: every backend, round 2: every backend, ...), so slow
drifts in machine load hit every backend alike.

Readable numbers (issue 30): with ``--server s3sim`` the server's own ceiling (PUT and GET of
large objects, shaping off, lean clients; ``_dcp_ceiling``) is measured before the backends'
runs and again after them, and every backend's MB/s is reported as a fraction of it beside
its ratio to the best peer. Issue 40: the shaped lean-client limit (``--limit-clients`` lean
client processes, 16 MiB bodies with their CRC32C, through the benchmark's own s3sim with its
shaping, under a prefix of its bucket; ``_dcp_ceiling.measure_shaped_limit``) is measured
before and after the runs too (``--no-shaped-limit`` skips it), every backend's MB/s is also
reported as a fraction of it (the fair 100 %), and every save records the bytes it stored and
s3ckpt's marker size. Before every run the machine is sampled (1-min load average,
CPU busy fraction over ~1 s from /proc/stat, nproc; ``_dcp_machine``) and a run taken on a
busy machine is marked ``busy`` (``*`` in the table); ``--quiet-wait`` waits for quiet.
``--shape`` picks the state dict (``_dcp_state``: ``mix``, ``large5`` or ``tiny``). The summary, the
ratios and the goals table are ``_dcp_report``'s.

Usage::

    .venv/bin/python benchmarks/bench_dcp.py --size-mib 1024 --runs 3 --out results.json

See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import platform
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)  # the _dcp_* modules
_ROOT = os.path.dirname(_HERE)
if _ROOT not in sys.path:
    sys.path.insert(1, _ROOT)  # benchmarks.s3sim

from _dcp_ceiling import (  # noqa: E402
    LIMIT_CLIENTS,
    best_ceiling,
    measure_ceiling,
    measure_shaped_limit,
)
from _dcp_machine import BUSY_FRACTION, LOAD_PER_CPU, OwnLoad, wait_quiet  # noqa: E402
from _dcp_report import (  # noqa: E402
    BACKENDS,
    DCP_BACKENDS,
    LABELS,
    busy_count,
    ratios,
    render,
    summarize,
)
from _dcp_state import (  # noqa: E402
    SHAPES,
    MiB,
    blank_like,
    blank_state_dict,
    build_state_dict,
    checksum_blob,
    checksum_state_dict,
    tensor_bytes,
    tensors_in_order,
)

__all__ = [
    "BACKENDS", "DCP_BACKENDS", "LABELS", "MotoServer", "SimServer", "blank_like",
    "blank_state_dict", "build_state_dict", "checksum_blob", "checksum_state_dict", "main",
    "ratios", "render", "summarize", "tensor_bytes", "worker",
]

GiB = 1024 * MiB
MB = 1_000_000
REGION = "us-east-1"
RESULT_TAG = "BENCH_RESULT "


# ===========================================================================================
# Worker side: one (backend, op) per process.
# ===========================================================================================


_PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE_KIB


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class _RssSampler:
    """Peak RSS while the op runs: a 10 ms sampling thread plus the kernel's VmHWM
    (reset just before the baseline via /proc/self/clear_refs, when allowed)."""

    def __init__(self, interval: float = 0.01) -> None:
        self.interval = interval
        self.hwm_reset = False
        with contextlib.suppress(OSError):
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.hwm_reset = True
        self.baseline_kib = _rss_kib()
        self.peak_kib = self.baseline_kib
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_kib = max(self.peak_kib, _rss_kib())
            self._stop.wait(self.interval)

    def __enter__(self) -> _RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_kib = max(self.peak_kib, _rss_kib())
        if self.hwm_reset:
            self.peak_kib = max(self.peak_kib, _status_kib("VmHWM"))


def _cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class _BufferFile(io.RawIOBase):
    """A seekable file over a pre-allocated buffer (download target, no growth)."""

    def __init__(self, buf: bytearray) -> None:
        super().__init__()
        self._mv = memoryview(buf)
        self._pos = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        if whence == 0:
            self._pos = pos
        elif whence == 1:
            self._pos += pos
        else:
            self._pos = len(self._mv) + pos
        return self._pos

    def tell(self) -> int:
        return self._pos

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        n = view.nbytes
        self._mv[self._pos : self._pos + n] = view
        self._pos += n
        return n


def _boto3_client(endpoint: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=REGION,
        config=Config(max_pool_connections=16, retries={"mode": "standard"}),
    )


def _boto3_transfer_config(size: int, *, download: bool) -> Any:
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(
        # A download above the threshold becomes many ranged GETs, which moto serves by
        # reading the whole object each time; one streamed GET is the real ceiling here.
        multipart_threshold=(size + 1) if download else 16 * MiB,
        multipart_chunksize=16 * MiB,
        max_concurrency=8,
        use_threads=True,
    )


def _s3tc_config() -> Any:
    """s3torchconnector's client at its best settings: the CRT's throughput target (the
    same 10 Gbit/s s3ckpt derives its connections from, ``S3TC_GBPS`` to change it) and
    s3ckpt's 16 MiB parts (``S3TC_PART_MIB``)."""
    from s3torchconnector import S3ClientConfig

    return S3ClientConfig(
        force_path_style=True,
        throughput_target_gbps=float(os.environ.get("S3TC_GBPS", "10")),
        part_size=int(os.environ.get("S3TC_PART_MIB", "16")) * MiB,
    )


def _writer(backend: str, url: str, endpoint: str, threads: int) -> Any:
    if backend == "s3ckpt":
        from s3ckpt import S3Config, S3StorageWriter

        return S3StorageWriter(url, s3_config=S3Config(endpoint_url=endpoint))
    if backend == "s3tc":
        from s3torchconnector.dcp import S3StorageWriter as S3tcWriter

        # The CRT client reads the endpoint from AWS_ENDPOINT_URL (set by the parent).
        return S3tcWriter(REGION, url, s3client_config=_s3tc_config(), thread_count=threads)
    if backend == "fsspec":
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        return FsspecWriter(url, thread_count=threads, client_kwargs={"endpoint_url": endpoint})
    raise ValueError(backend)


def _reader(backend: str, url: str, endpoint: str) -> Any:
    if backend == "s3ckpt":
        from s3ckpt import S3Config, S3StorageReader

        return S3StorageReader(url, s3_config=S3Config(endpoint_url=endpoint))
    if backend == "s3tc":
        from s3torchconnector.dcp import S3StorageReader as S3tcReader
        from s3torchconnector.s3reader import S3ReaderConstructor

        # Its DCP-optimised reader (coalesced ranged reads) is its best for DCP loads.
        return S3tcReader(
            REGION, url, s3client_config=_s3tc_config(),
            reader_constructor=S3ReaderConstructor.dcp_optimized(),
        )
    if backend == "fsspec":
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        return FsspecReader(url, client_kwargs={"endpoint_url": endpoint})
    raise ValueError(backend)


def _warm_up(backend: str, url: str, endpoint: str) -> None:
    """Save and load a tiny checkpoint with the backend first, so the timed op is what a
    training job's second checkpoint costs: modules imported (this venv compiles bytecode
    on every start, PYTHONDONTWRITEBYTECODE), lazy initialisation done, caches that
    persist across saves (s3fs's filesystem instances) warm. Clients the backends create
    per writer/reader are still created inside the timed op."""
    import torch
    import torch.distributed.checkpoint as dcp

    if backend == "boto3":
        client = _boto3_client(endpoint)
        bucket, _, key = url[len("s3://") :].partition("/")
        data = b"w" * (6 * MiB)
        client.upload_fileobj(io.BytesIO(data), bucket, f"{key}/blob.bin",
                              ExtraArgs={"ChecksumAlgorithm": "CRC32C"},
                              Config=_boto3_transfer_config(len(data), download=False))
        client.download_fileobj(bucket, f"{key}/blob.bin", _BufferFile(bytearray(len(data))),
                                Config=_boto3_transfer_config(len(data), download=True))
        return
    sd = {"model": {"w": torch.ones(256, 1024), "b": torch.ones(10)}, "step": 1}
    dcp.save(sd, storage_writer=_writer(backend, url, endpoint, 1))
    dest = {"model": {"w": torch.zeros(256, 1024), "b": torch.zeros(10)}, "step": 0}
    dcp.load(dest, storage_reader=_reader(backend, url, endpoint))
    if not torch.equal(dest["model"]["w"], sd["model"]["w"]) or dest["step"] != 1:
        raise RuntimeError(f"{backend}: warm-up checkpoint did not round-trip")


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one op in this (fresh) process and return its measurements."""
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed.checkpoint as dcp

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    backend, op, url, endpoint = spec["backend"], spec["op"], spec["url"], spec["endpoint"]
    size_mib = spec["size_mib"]
    out: dict[str, Any] = {"backend": backend, "op": op, "url": url}
    bucket, _, key_prefix = url[len("s3://") :].partition("/")

    if spec.get("warmup", True):
        _warm_up(backend, f"{url}-warmup-{op}", endpoint)

    blob: Any = None
    if op == "save":
        sd = build_state_dict(size_mib, seed=spec.get("seed", 0), shape=spec.get("shape", "mix"))
        nbytes = tensor_bytes(sd)
        if backend == "boto3":
            # The ceiling moves the same bytes with no serialization: one contiguous blob.
            blob = b"".join(memoryview(t.numpy()).cast("B") for _, t in tensors_in_order(sd))
            out["checksum"] = checksum_blob(blob)
            del sd
        else:
            out["checksum"] = checksum_state_dict(sd)
    else:
        if backend == "boto3":
            nbytes = spec["blob_size"]
            blob = bytearray(nbytes)
            torch.frombuffer(blob, dtype=torch.uint8).fill_(1)  # resident before baseline
        else:
            sd = blank_state_dict(size_mib, spec.get("shape", "mix"))
            nbytes = tensor_bytes(sd)
    gc.collect()
    if spec.get("sim"):
        _sim_call(endpoint, "POST", "/_s3sim/reset")  # count the timed op only, not warm-up

    with _RssSampler() as rss:
        cpu0, t0 = _cpu_seconds(), time.perf_counter()
        if backend == "boto3":
            client = _boto3_client(endpoint)
            key = f"{key_prefix}/blob.bin"
            if op == "save":
                client.upload_fileobj(
                    io.BytesIO(blob), bucket, key,
                    ExtraArgs={"ChecksumAlgorithm": "CRC32C"},
                    Config=_boto3_transfer_config(nbytes, download=False),
                )
            else:
                client.download_fileobj(
                    bucket, key, _BufferFile(blob),
                    Config=_boto3_transfer_config(nbytes, download=True),
                )
        elif op == "save":
            dcp.save(sd, storage_writer=_writer(backend, url, endpoint, spec.get("threads", 1)))
        else:
            reader = _reader(backend, url, endpoint)
            dcp.load(sd, storage_reader=reader)
            if hasattr(reader, "bytes_read"):
                out["bytes_read"] = int(reader.bytes_read)
        wall = time.perf_counter() - t0
        cpu = _cpu_seconds() - cpu0
    if spec.get("sim"):
        st = _sim_call(endpoint, "GET", "/_s3sim/stats")
        gib = nbytes / GiB
        out.update(
            sim_cpu_s=st["cpu_s_since_reset"],
            requests=st["requests"],
            slowdowns=st["slowdowns"],
            requests_per_gib=st["requests"] / gib,
            slowdowns_per_gib=st["slowdowns"] / gib,
            requests_by_op={op: v["count"] for op, v in st["ops"].items()},
            slowdowns_by_op={op: v["slowdown"] for op, v in st["ops"].items() if v["slowdown"]},
        )

    if op == "load":
        out["checksum"] = checksum_blob(blob) if backend == "boto3" else checksum_state_dict(sd)
    if backend == "boto3" and op == "save":
        out["blob_size"] = len(blob)
    out.update(
        bytes=nbytes,
        wall_s=wall,
        mb_per_s=nbytes / MB / wall,
        cpu_s=cpu,
        cpu_s_per_gib=cpu / (nbytes / GiB),
        baseline_mib=rss.baseline_kib / 1024,
        peak_mib=rss.peak_kib / 1024,
        peak_over_baseline_mib=(rss.peak_kib - rss.baseline_kib) / 1024,
        hwm_reset=rss.hwm_reset,
    )
    return out


def _sim_call(endpoint: str, method: str, path: str) -> Any:
    """One request to s3sim's control API (``benchmarks/s3sim/README.md``)."""
    import http.client
    from urllib.parse import urlsplit

    u = urlsplit(endpoint)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    try:
        conn.request(method, path, body=b"" if method == "POST" else None)
        resp = conn.getresponse()
        payload = resp.read()
    finally:
        conn.close()
    if resp.status != 200:
        raise RuntimeError(f"s3sim {method} {path}: {resp.status}")
    return json.loads(payload) if payload else None


# ===========================================================================================
# Orchestrator side.
# ===========================================================================================


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child_env(endpoint: str) -> dict[str, str]:
    env = dict(os.environ)
    for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        env.pop(var, None)
    env.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION=REGION,
        AWS_REGION=REGION,
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        AWS_EC2_METADATA_DISABLED="true",
        AWS_ENDPOINT_URL=endpoint,
        PYTHONUNBUFFERED="1",
    )
    return env


class MotoServer:
    """``python -m moto.server`` on 127.0.0.1 in its own process (its CPU is not ours)."""

    def __init__(self, port: int, log_path: str) -> None:
        self.port = port
        self.endpoint = f"http://127.0.0.1:{port}"
        self._log = open(log_path, "wb")  # noqa: SIM115
        env = dict(os.environ, MOTO_ALLOW_NONEXISTENT_REGION="true")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=self._log, stderr=subprocess.STDOUT, env=env,
        )

    def wait_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError("moto server did not start in time")

    def cpu_seconds(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        tick = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / tick  # utime, stime

    def rss_mib(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


class SimServer(MotoServer):
    """``benchmarks/s3sim`` in its own process, with S3's shaping (or none): the same face
    as :class:`MotoServer`, plus the server's request and 503 counts per run."""

    def __init__(self, port: int, log_path: str, shaping: str, rate_scale: float) -> None:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from benchmarks.s3sim import S3Sim, Shaping

        self.port = port
        self.sim = S3Sim(Shaping.profile(shaping, rate_scale=rate_scale), port=port,
                         log=log_path)
        self.sim.start()
        self.endpoint = self.sim.endpoint
        assert self.sim.process is not None
        self.proc = self.sim.process

    def wait_ready(self, timeout: float = 300.0) -> None:
        return None  # S3Sim.start waits until the port answers

    def throttle(self, prefix: str, reads: float | None, writes: float | None) -> None:
        from benchmarks.s3sim import Throttle

        self.sim.configure(throttles=[Throttle(prefix, reads, writes)])

    def stop(self) -> None:
        self.sim.stop()


def _run_worker(spec: dict[str, Any], env: dict[str, str], server: MotoServer,
                timeout: float, machine: dict[str, Any]) -> dict[str, Any]:
    """One (backend, op) in a fresh process; ``machine`` is the state sampled just before."""
    before = {
        "loadavg_1m_before": machine["load1"],
        "load1_own_estimate": machine.get("load1_own_estimate"),
        "cpu_busy_before": machine.get("cpu_busy_fraction"),
        "nproc": machine["nproc"],
        "busy": machine["busy"],
        "quiet_waited_s": machine.get("waited_s", 0.0),
    }
    srv_cpu0 = server.cpu_seconds()
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)],
        env=env, capture_output=True, text=True, timeout=timeout,
    )
    elapsed = time.perf_counter() - t0
    srv_cpu = server.cpu_seconds() - srv_cpu0
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            result = json.loads(line[len(RESULT_TAG) :])
    if proc.returncode != 0 or result is None:
        tail = (proc.stdout[-3000:] + "\n" + proc.stderr[-6000:]).strip()
        return {**spec, **before, "error": f"worker exit {proc.returncode}:\n{tail}"}
    result.update(
        before,
        process_s=elapsed,
        server_cpu_s=srv_cpu,
        server_cpu_s_per_gib=srv_cpu / (result["bytes"] / GiB),
        server_rss_mib_after=server.rss_mib(),
    )
    if "sim_cpu_s" in result:  # the timed op's own server CPU, warm-up left out
        result["server_cpu_s"] = result["sim_cpu_s"]
        result["server_cpu_s_per_gib"] = result["sim_cpu_s"] / (result["bytes"] / GiB)
    return result


def _own_cpu_seconds(server: MotoServer | None) -> float:
    """CPU seconds of this process, its finished children (workers, the ceiling's server and
    clients) and the benchmark's server: what :class:`OwnLoad` feeds on."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    srv = 0.0
    if server is not None:
        with contextlib.suppress(OSError, ValueError):
            srv = server.cpu_seconds()
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime + srv


def _measured(label: str, when: str, sample: Any, measure: Any, describe: Any) -> dict[str, Any]:
    """One limit measured now (``measure()``), with the machine state before it, its line
    printed (``describe(result)``); a failed one is reported as ``error`` (the backends are
    still reported without it)."""
    machine = sample()
    try:
        c = measure()
    except Exception as e:
        c = {"error": f"{type(e).__name__}: {e}"}
    c.update(when=when, busy=machine["busy"], machine=machine)
    text = f"ERROR {c['error']}" if "error" in c else describe(c) + _machine_txt(machine)
    print(f"[{label} {when}] {text}", file=sys.stderr, flush=True)
    return c


def _run_ceiling(args: argparse.Namespace, when: str, sample: Any) -> dict[str, Any]:
    """s3sim's ceiling now (``_dcp_ceiling``), with the machine state before it."""
    return _measured(
        "ceiling", when, sample,
        lambda: measure_ceiling(args.size_mib, args.shape, args.ceiling_clients),
        lambda c: (f"PUT {c['put_mb_per_s']:.0f} MB/s GET {c['get_mb_per_s']:.0f} MB/s "
                   f"({c['object_mib']} MiB objects, {c['total_mib']} MiB, "
                   f"{c['measure_s']:.1f}s)"),
    )


def _run_shaped_limit(args: argparse.Namespace, when: str, sample: Any, server: SimServer,
                      client: Any, bucket: str) -> dict[str, Any]:
    """The shaped lean-client limit now (``_dcp_ceiling``) through the benchmark's own server,
    under ``bucket/_shaped-limit/...`` (deleted after), with the machine state before it."""
    prefix = f"_shaped-limit/{when}-{uuid.uuid4().hex[:8]}"

    def measure() -> dict[str, Any]:
        try:
            return measure_shaped_limit(server.sim, bucket, prefix, args.size_mib, args.shape,
                                        args.limit_clients)
        finally:
            with contextlib.suppress(Exception):
                _delete_prefix(client, bucket, prefix + "/")

    return _measured(
        "shaped limit", when, sample, measure,
        lambda c: (f"PUT {c['put_mb_per_s']:.0f} MB/s GET {c['get_mb_per_s']:.0f} MB/s "
                   f"({c['clients']} clients, {c['object_mib']} MiB bodies + CRC32C, "
                   f"{c['total_mib']} MiB, 503s retried {c['retried_503']}, "
                   f"{c['measure_s']:.1f}s)"),
    )


def _stored(client: Any, bucket: str, prefix: str) -> dict[str, Any]:
    """What a save left under ``prefix/``: total bytes, object count, and the sizes of the
    ``s3ckpt.json`` marker and torch's ``.metadata`` (None where there is none)."""
    total = count = 0
    marker = metadata = None
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                  Prefix=prefix + "/"):
        for o in page.get("Contents", []):
            total += o["Size"]
            count += 1
            name = o["Key"][len(prefix) + 1 :]
            if name == "s3ckpt.json" or (marker is None and name.endswith("/s3ckpt.json")):
                marker = o["Size"]
            elif name == ".metadata":
                metadata = o["Size"]
    out: dict[str, Any] = {"stored_bytes": total, "stored_objects": count}
    if marker is not None:
        out["marker_bytes"] = marker
    if metadata is not None:
        out["metadata_bytes"] = metadata
    return out


def _machine_txt(m: dict[str, Any]) -> str:
    frac = m.get("cpu_busy_fraction")
    return (f" load1 {m['load1']:.1f} (own ~{m.get('load1_own_estimate') or 0:.1f})"
            + (f" cpu-busy {frac:.0%}" if frac is not None else "")
            + (" BUSY" if m["busy"] else ""))


def _delete_prefix(client: Any, bucket: str, prefix: str) -> int:
    n = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        for i in range(0, len(keys), 1000):
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys[i : i + 1000]})
            n += len(keys[i : i + 1000])
    uploads = client.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", [])
    for up in uploads:
        client.abort_multipart_upload(Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"])
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mib", type=int, default=1024,
                   help="state dict size (default 1024; ignored for the tensor sizes of "
                        "--shape tiny, which are fixed)")
    p.add_argument("--shape", choices=sorted(SHAPES), default="mix",
                   help="the state dict: mix (4 large + 2000 small tensors, default) or large5 "
                        "(5 large + 512 small), large tensors holding 3/4 of the bytes; or "
                        "tiny (200,000 tensors of 4 fp32, ~3 MiB, no large ones; --size-mib "
                        "ignored)")
    p.add_argument("--runs", type=int, default=3, help="interleaved runs per backend and op")
    p.add_argument("--backends", default=",".join(BACKENDS),
                   help=f"comma-separated subset of {','.join(BACKENDS)}")
    p.add_argument("--ops", default="save,load", help="save,load or save")
    p.add_argument("--threads", type=int, default=1,
                   help="thread_count for s3torchconnector's and torch's FileSystemWriter-based "
                        "writers (their default is 1)")
    p.add_argument("--out", help="write all per-run results and the summary as JSON here")
    p.add_argument("--server", choices=("s3sim", "moto"), default="s3sim",
                   help="s3sim (benchmarks/s3sim, default) or moto (the history's server)")
    p.add_argument("--shaping", choices=("s3", "none"), default="s3",
                   help="s3sim's model: s3 (S3's latency, per-connection bandwidth and "
                        "request rates; default) or none")
    p.add_argument("--rate-scale", type=float, default=1.0,
                   help="s3sim: scale the per-partition request rates (default 1)")
    p.add_argument("--throttle", metavar="READS/WRITES",
                   help="s3sim: hold the benchmark's bucket to these requests/s (a throttled "
                        "prefix; '-' for unlimited), e.g. 40/25")
    p.add_argument("--no-ceiling", action="store_true",
                   help="s3sim: skip measuring the server's own ceiling before and after")
    p.add_argument("--ceiling-clients", type=int, default=2,
                   help="client processes of the ceiling (one connection each; default 2)")
    p.add_argument("--no-shaped-limit", action="store_true",
                   help="s3sim: skip measuring the shaped lean-client limit (the same server, "
                        "its shaping on) before and after")
    p.add_argument("--limit-clients", type=int, default=LIMIT_CLIENTS,
                   help="client processes of the shaped limit (one keep-alive connection "
                        f"each, 16 MiB bodies with CRC32C; default {LIMIT_CLIENTS})")
    p.add_argument("--quiet-wait", type=float, default=0.0, metavar="SECONDS",
                   help="before each run, wait up to SECONDS for the machine to go quiet "
                        "(see benchmarks/README.md for the busy rule; default 0: no wait)")
    p.add_argument("--port", type=int, default=0, help="server port (default: a free one)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per worker process")
    p.add_argument("--keep-log", action="store_true", help="keep the moto server log")
    p.add_argument("--no-warmup", action="store_true",
                   help="skip the tiny untimed save+load each worker does first")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.worker:
        res = worker(json.loads(args.worker))
        print(RESULT_TAG + json.dumps(res), flush=True)
        return 0

    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    for b in backends:
        if b not in BACKENDS:
            p.error(f"unknown backend {b!r}")
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    do_load = "load" in ops
    do_ceiling = args.server == "s3sim" and not args.no_ceiling
    do_limit = args.server == "s3sim" and not args.no_shaped_limit
    if args.limit_clients < 1:
        p.error("--limit-clients must be >= 1")

    # SIGTERM unwinds like Ctrl-C, so the moto server and a running worker are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = tempfile.mkdtemp(prefix="bench_dcp_")
    if args.throttle and args.server != "s3sim":
        p.error("--throttle needs --server s3sim")
    log_path = os.path.join(tmp, f"{args.server}.log")
    server: MotoServer
    if args.server == "s3sim":
        server = SimServer(args.port or _free_port(), log_path, args.shaping, args.rate_scale)
    else:
        server = MotoServer(args.port or _free_port(), log_path)
    own = OwnLoad(lambda: _own_cpu_seconds(server))

    def sample() -> dict[str, Any]:
        return wait_quiet(args.quiet_wait, own_load=own)

    results: list[dict[str, Any]] = []
    ceilings: list[dict[str, Any]] = []
    limits: list[dict[str, Any]] = []
    started = time.time()
    try:
        server.wait_ready()
        env = _child_env(server.endpoint)
        for k, v in env.items():
            if k.startswith("AWS_"):
                os.environ[k] = v
        client = _boto3_client(server.endpoint)
        bucket = f"bench-{uuid.uuid4().hex[:12]}"
        client.create_bucket(Bucket=bucket)
        if args.throttle:
            reads, _, writes = args.throttle.partition("/")
            assert isinstance(server, SimServer)
            server.throttle(
                f"{bucket}/",
                None if reads == "-" else float(reads),
                None if writes in ("-", "") else float(writes),
            )
        print(f"{args.server} at {server.endpoint}, bucket {bucket}, log {log_path}; shape "
              f"{args.shape} ({SHAPES[args.shape].describe()})", file=sys.stderr)
        if do_ceiling:
            ceilings.append(_run_ceiling(args, "before", sample))
        if do_limit:
            assert isinstance(server, SimServer)
            limits.append(_run_shaped_limit(args, "before", sample, server, client, bucket))

        for run in range(1, args.runs + 1):
            for b in backends:
                prefix = f"{b}/run{run}-{uuid.uuid4().hex[:8]}"
                url = f"s3://{bucket}/{prefix}"
                spec = {"backend": b, "url": url, "endpoint": server.endpoint,
                        "size_mib": args.size_mib, "shape": args.shape,
                        "threads": args.threads, "seed": run,
                        "warmup": not args.no_warmup, "sim": args.server == "s3sim"}
                try:
                    save = _run_worker({**spec, "op": "save"}, env, server, args.timeout,
                                       sample())
                    save["run"] = run
                    if "error" not in save:
                        try:
                            save.update(_stored(client, bucket, prefix))
                        except Exception as e:  # a listing failure costs the column only
                            print(f"[{b} save run {run}] listing failed: {e}", file=sys.stderr)
                    results.append(save)
                    _progress(save)
                    if do_load and "error" not in save:
                        load_spec = {**spec, "op": "load"}
                        if b == "boto3":
                            load_spec["blob_size"] = save["blob_size"]
                        load = _run_worker(load_spec, env, server, args.timeout, sample())
                        load["run"] = run
                        if "error" not in load:
                            load["valid"] = load["checksum"] == save["checksum"]
                            if not load["valid"]:
                                load["error"] = "checksum mismatch: loaded bytes differ"
                        results.append(load)
                        _progress(load)
                finally:
                    _delete_prefix(client, bucket, prefix)
                if args.out:  # keep what we have, should a long run be cut short
                    with open(args.out + ".partial", "w") as f:
                        json.dump({"runs": results, "ceilings": ceilings,
                                   "shaped_limits": limits}, f, indent=2)
        if do_ceiling:
            ceilings.append(_run_ceiling(args, "after", sample))
        if do_limit:
            assert isinstance(server, SimServer)
            limits.append(_run_shaped_limit(args, "after", sample, server, client, bucket))
        with contextlib.suppress(Exception):
            client.delete_bucket(Bucket=bucket)
    finally:
        server.stop()
        if not args.keep_log:
            shutil.rmtree(tmp, ignore_errors=True)

    ok = [r for r in results if "error" not in r]
    judged = [r for r in results if "loadavg_1m_before" in r]
    loads = [r["loadavg_1m_before"] for r in judged] or [os.getloadavg()[0]]
    fracs = [r["cpu_busy_before"] for r in judged if r.get("cpu_busy_before") is not None]
    busy, n_judged = busy_count(results)
    ceiling = best_ceiling([c for c in ceilings if "error" not in c])
    limit = best_ceiling([c for c in limits if "error" not in c])
    meta = {
        "size_mib": args.size_mib,
        "size_fixed": SHAPES[args.shape].fixed,
        "shape": args.shape,
        "shape_desc": SHAPES[args.shape].describe(),
        "runs": args.runs,
        "threads": args.threads,
        "warmup": not args.no_warmup,
        "server": args.server,
        "shaping": args.shaping if args.server == "s3sim" else None,
        "rate_scale": args.rate_scale,
        "throttle": args.throttle,
        "tensor_bytes": ok[0]["bytes"] if ok else args.size_mib * MiB,
        "cpus": os.cpu_count(),
        "loadavg_min": min(loads),
        "loadavg_max": max(loads),
        "cpu_busy_min": min(fracs) if fracs else None,
        "cpu_busy_max": max(fracs) if fracs else None,
        "busy_runs": busy,
        "runs_judged": n_judged,
        "busy_rule": f"cpu busy fraction over {1.0:.0f} s before the run > {BUSY_FRACTION} or "
                     f"load1 - own load estimate > {LOAD_PER_CPU} x nproc",
        "quiet_wait_s": args.quiet_wait,
        "ceiling": {"measured": ceilings, "best": ceiling} if do_ceiling else None,
        "shaped_limit": {"measured": limits, "best": limit} if do_limit else None,
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
        "duration_s": time.time() - started,
        "python": platform.python_version(),
        "versions": _versions(),
        "command": " ".join([os.path.relpath(sys.executable), *sys.argv]),
    }
    summary = summarize(results, backends, ceiling, limit)
    rat = ratios(summary, ceiling, limit)
    table = render(summary, rat, backends, meta)
    print(table)
    errors = [r for r in results if "error" in r]
    for r in errors:
        print(f"\nFAILED {r['backend']} {r['op']} run {r.get('run')}: {r['error']}",
              file=sys.stderr)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "summary": summary, "ratios": rat, "runs": results,
                       "table": table}, f, indent=2)
    return 1 if errors else 0


def _progress(r: dict[str, Any]) -> None:
    mark = " BUSY" if r.get("busy") else ""
    if "error" in r:
        print(f"[{r['backend']:>6} {r['op']:>4} run {r.get('run')}] ERROR "
              f"{r['error'].splitlines()[-1] if r['error'] else ''}{mark}", file=sys.stderr,
              flush=True)
        return
    frac = r.get("cpu_busy_before")
    print(
        f"[{r['backend']:>6} {r['op']:>4} run {r['run']}] {r['mb_per_s']:7.1f} MB/s "
        f"wall {r['wall_s']:6.1f}s cpu {r['cpu_s_per_gib']:5.2f}s/GiB "
        f"peak+{r['peak_over_baseline_mib']:6.0f}MiB "
        f"srv-cpu {r['server_cpu_s_per_gib']:5.2f}s/GiB "
        + (f"req {r['requests']} 503 {r['slowdowns']} " if "requests" in r else "")
        + f"load1 {r['loadavg_1m_before']:.1f}"
        + (f" (own ~{r['load1_own_estimate']:.1f})" if r.get("load1_own_estimate") else "")
        + (f" cpu-busy {frac:.0%}" if frac is not None else "")
        + (f" read {r['bytes_read'] / MiB:.0f}MiB" if "bytes_read" in r else "")
        + (f" stored {r['stored_bytes'] / MB:.1f}MB" if "stored_bytes" in r else "")
        + (f" marker {r['marker_bytes']}B" if "marker_bytes" in r else "")
        + mark,
        file=sys.stderr, flush=True,
    )


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("torch", "s3ckpt", "s3torchconnector", "s3fs", "boto3", "moto"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "missing"
    return out


if __name__ == "__main__":
    sys.exit(main())
