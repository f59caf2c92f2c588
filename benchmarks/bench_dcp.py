#!/usr/bin/env python
"""Save/load throughput, client CPU and peak memory of DCP storage backends on S3.

Backends (all against one local moto S3 server, run as a separate process so that its
CPU is not the client's):

  s3ckpt   s3ckpt.S3StorageWriter / S3StorageReader (default TransferConfig)
  s3tc     s3torchconnector.dcp.S3StorageWriter / S3StorageReader (AWS CRT client)
  fsspec   torch's FsspecWriter / FsspecReader over s3fs
  boto3    raw boto3 of the same tensor bytes as ONE in-memory blob: upload_fileobj
           (multipart, 16 MiB parts, 8 threads) and download_fileobj (one streamed GET;
           see docs/performance.md for why not ranged). No DCP at all: a ceiling.

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

Usage::

    .venv/bin/python benchmarks/bench_dcp.py --size-mib 1024 --runs 3 --out results.json

See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import io
import json
import os
import platform
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

MiB = 1024 * 1024
GiB = 1024 * MiB
MB = 1_000_000

BACKENDS = ("s3ckpt", "s3tc", "fsspec", "boto3")
DCP_BACKENDS = ("s3ckpt", "s3tc", "fsspec")
LABELS = {
    "s3ckpt": "s3ckpt",
    "s3tc": "s3torchconnector",
    "fsspec": "FsspecWriter/Reader + s3fs",
    "boto3": "raw boto3 (1 blob, ceiling)",
}
REGION = "us-east-1"
N_LARGE = 4
N_SMALL = 2000
RESULT_TAG = "BENCH_RESULT "
GOAL_SPEEDUP = 1.5  # s3ckpt save and load MB/s over the best other DCP backend
GOAL_CPU = 0.7  # s3ckpt client CPU per GiB over s3torchconnector's


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


def build_state_dict(size_mib: int, seed: int = 0) -> dict[str, Any]:
    """~size_mib MiB of fp32: 4 large 2-D tensors holding 3/4 of the bytes and 2000 small
    ones holding the rest (at 1024 MiB: 4 x 192 MiB + 2000 x 128 KiB), plus a non-tensor."""
    import torch

    total = size_mib * MiB
    large_numel = max(1024, (total * 3 // 4) // N_LARGE // 4 // 1024 * 1024)
    small_numel = max(1, (total - N_LARGE * large_numel * 4) // N_SMALL // 4)
    g = torch.Generator().manual_seed(seed)
    model: dict[str, Any] = {}
    for i in range(N_LARGE):
        model[f"layers.{i}.mlp.weight"] = torch.rand(large_numel // 1024, 1024, generator=g)
    for j in range(N_SMALL):
        model[f"layers.{j // 20}.small.{j % 20}"] = torch.rand(small_numel, generator=g)
    return {"model": model, "step": 1}


def blank_like(sd: dict[str, Any]) -> dict[str, Any]:
    """Destination state dict: same shapes, zero-filled (pages touched), step 0."""
    import torch

    return {
        "model": {k: torch.zeros_like(v) for k, v in sd["model"].items()},
        "step": 0,
    }


def blank_state_dict(size_mib: int) -> dict[str, Any]:
    """Like blank_like(build_state_dict(size_mib)) without generating the source."""
    import torch

    total = size_mib * MiB
    large_numel = max(1024, (total * 3 // 4) // N_LARGE // 4 // 1024 * 1024)
    small_numel = max(1, (total - N_LARGE * large_numel * 4) // N_SMALL // 4)
    model: dict[str, Any] = {}
    for i in range(N_LARGE):
        model[f"layers.{i}.mlp.weight"] = torch.zeros(large_numel // 1024, 1024)
    for j in range(N_SMALL):
        model[f"layers.{j // 20}.small.{j % 20}"] = torch.zeros(small_numel)
    return {"model": model, "step": 0}


def tensors_in_order(sd: dict[str, Any]) -> list[tuple[str, Any]]:
    return sorted(sd["model"].items())


def tensor_bytes(sd: dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for _, t in tensors_in_order(sd))


def checksum_state_dict(sd: dict[str, Any]) -> str:
    """Order-independent digest of every tensor's bytes (CRC32C each) and the step."""
    import crc32c

    h = hashlib.sha256()
    for name, t in tensors_in_order(sd):
        view = memoryview(t.detach().contiguous().numpy()).cast("B")
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}:{crc32c.crc32c(view):08x}\n".encode())
    h.update(f"step={sd['step']!r}".encode())
    return h.hexdigest()


def checksum_blob(buf: Any) -> str:
    import crc32c

    return f"blob:{len(buf)}:{crc32c.crc32c(buf):08x}"


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
        sd = build_state_dict(size_mib, seed=spec.get("seed", 0))
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
            sd = blank_state_dict(size_mib)
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
                timeout: float) -> dict[str, Any]:
    load1 = os.getloadavg()[0]
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
        return {**spec, "error": f"worker exit {proc.returncode}:\n{tail}"}
    result.update(
        loadavg_1m_before=load1,
        process_s=elapsed,
        server_cpu_s=srv_cpu,
        server_cpu_s_per_gib=srv_cpu / (result["bytes"] / GiB),
        server_rss_mib_after=server.rss_mib(),
    )
    if "sim_cpu_s" in result:  # the timed op's own server CPU, warm-up left out
        result["server_cpu_s"] = result["sim_cpu_s"]
        result["server_cpu_s_per_gib"] = result["sim_cpu_s"] / (result["bytes"] / GiB)
    return result


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


def _fmt(x: float | None, spec: str = ".0f") -> str:
    return "n/a" if x is None else format(x, spec)


def _median_of(runs: list[dict[str, Any]], field: str) -> float | None:
    values = [r[field] for r in runs if field in r]
    return statistics.median(values) if values and len(values) == len(runs) else None


def summarize(results: list[dict[str, Any]], backends: list[str]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for b in backends:
        for op in ("save", "load"):
            mine = [r for r in results if r["backend"] == b and r["op"] == op]
            ok = [r for r in mine if "error" not in r]
            bad = [r for r in mine if "error" in r]
            if not ok:
                summary[f"{b}.{op}"] = {"runs": 0, "failed": len(bad)}
                continue
            mbs = [r["mb_per_s"] for r in ok]
            summary[f"{b}.{op}"] = {
                "runs": len(ok),
                "failed": len(bad),
                "mb_per_s_median": statistics.median(mbs),
                "mb_per_s_min": min(mbs),
                "mb_per_s_max": max(mbs),
                "wall_s_median": statistics.median(r["wall_s"] for r in ok),
                "cpu_s_per_gib_median": statistics.median(r["cpu_s_per_gib"] for r in ok),
                "server_cpu_s_per_gib_median": statistics.median(
                    r["server_cpu_s_per_gib"] for r in ok
                ),
                "peak_over_baseline_mib_max": max(r["peak_over_baseline_mib"] for r in ok),
                "baseline_mib_median": statistics.median(r["baseline_mib"] for r in ok),
                "requests_per_gib_median": _median_of(ok, "requests_per_gib"),
                "slowdowns_per_gib_median": _median_of(ok, "slowdowns_per_gib"),
                "slowdowns_median": _median_of(ok, "slowdowns"),
                "bytes_read_median": (
                    statistics.median(r["bytes_read"] for r in ok)
                    if all("bytes_read" in r for r in ok) else None
                ),
            }
    return summary


def ratios(summary: dict[str, Any]) -> dict[str, Any]:
    def get(b: str, op: str, field: str) -> float | None:
        s = summary.get(f"{b}.{op}", {})
        return s.get(field) if s.get("runs") else None

    others = [b for b in DCP_BACKENDS if b != "s3ckpt"]
    out: dict[str, Any] = {}
    for op in ("save", "load"):
        mine = get("s3ckpt", op, "mb_per_s_median")
        cands = [(get(b, op, "mb_per_s_median"), b) for b in others]
        cands = [(v, b) for v, b in cands if v is not None]
        if mine is not None and cands:
            best, who = max(cands)
            out[f"{op}_mb_per_s_vs_best_other"] = {"ratio": mine / best, "best_other": who}
        cpu_me = get("s3ckpt", op, "cpu_s_per_gib_median")
        cpu_tc = get("s3tc", op, "cpu_s_per_gib_median")
        if cpu_me is not None and cpu_tc:
            out[f"{op}_cpu_per_gib_vs_s3torchconnector"] = cpu_me / cpu_tc
        slow_me = get("s3ckpt", op, "slowdowns_median")
        slows = [(get(b, op, "slowdowns_median"), b) for b in others]
        slows = [(v, b) for v, b in slows if v is not None]
        if slow_me is not None and slows and any(v for v, _ in slows):
            fewest, who = min(slows)
            out[f"{op}_slowdowns_vs_fewest_other"] = {
                "ratio": slow_me / fewest if fewest else None, "fewest_other": who,
                "s3ckpt": slow_me, "other": fewest,
            }
        mem_me = get("s3ckpt", op, "peak_over_baseline_mib_max")
        mems = [(get(b, op, "peak_over_baseline_mib_max"), b) for b in others]
        mems = [(v, b) for v, b in mems if v is not None]
        if mem_me is not None:
            out[f"{op}_peak_over_baseline_mib"] = mem_me
            if mems:
                best, who = min(mems)
                out[f"{op}_peak_vs_lowest_other"] = {
                    "ratio": mem_me / best if best > 0 else None, "lowest_other": who,
                }
    return out


def render(summary: dict[str, Any], rat: dict[str, Any], backends: list[str],
           meta: dict[str, Any]) -> str:
    lines = [
        f"State dict: {meta['size_mib']} MiB fp32 ({meta['tensor_bytes'] / MiB:.0f} MiB of "
        f"tensor data; {N_LARGE} large + {N_SMALL} small tensors), {meta['runs']} interleaved "
        f"run(s) per backend and op. MB = 10^6 bytes. Load average (1 min) before runs: "
        f"{meta['loadavg_min']:.1f}-{meta['loadavg_max']:.1f} on {meta['cpus']} CPUs.",
        "",
        f"Server: {meta.get('server', 'moto')}"
        + (f", shaping {meta['shaping']}" if meta.get("shaping") else "")
        + (f", rates x{meta['rate_scale']}" if meta.get("rate_scale", 1.0) != 1.0 else "")
        + (f", bucket throttled to {meta['throttle']} reads/writes per s"
           if meta.get("throttle") else "") + ".",
        "",
        "| backend | op | MB/s median | MB/s min-max | client CPU s/GiB (median) "
        "| server CPU s/GiB (median) | peak RSS over baseline MiB (max) | requests/GiB "
        "| 503s/GiB | runs ok/failed |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for op in ("save", "load"):
        for b in backends:
            s = summary.get(f"{b}.{op}", {})
            if not s.get("runs"):
                if s.get("failed"):
                    lines.append(f"| {LABELS[b]} | {op} | FAILED | | | | | | | 0/{s['failed']} |")
                else:  # not asked for (--ops), not a failure
                    lines.append(f"| {LABELS[b]} | {op} | not run | | | | | | | 0/0 |")
                continue
            lines.append(
                f"| {LABELS[b]} | {op} | {_fmt(s['mb_per_s_median'])} | "
                f"{_fmt(s['mb_per_s_min'])}-{_fmt(s['mb_per_s_max'])} | "
                f"{_fmt(s['cpu_s_per_gib_median'], '.2f')} | "
                f"{_fmt(s['server_cpu_s_per_gib_median'], '.2f')} | "
                f"{_fmt(s['peak_over_baseline_mib_max'])} | "
                f"{_fmt(s.get('requests_per_gib_median'))} | "
                f"{_fmt(s.get('slowdowns_per_gib_median'), '.1f')} | {s['runs']}/{s['failed']} |"
            )
    lines += ["", "| goal | target | measured | met |", "|---|---|---:|---|"]

    def row(goal: str, target: str, value: float | None, ok: bool | None, fmt: str) -> None:
        lines.append(
            f"| {goal} | {target} | {_fmt(value, fmt)} | "
            f"{'n/a' if ok is None else ('yes' if ok else 'NO')} |"
        )

    for op in ("save", "load"):
        r = rat.get(f"{op}_mb_per_s_vs_best_other")
        row(f"{op} MB/s, s3ckpt / best other DCP ({LABELS[r['best_other']] if r else '-'})",
            f">= {GOAL_SPEEDUP}", r and r["ratio"], r and r["ratio"] >= GOAL_SPEEDUP, ".2f")
    for op in ("save", "load"):
        v = rat.get(f"{op}_cpu_per_gib_vs_s3torchconnector")
        row(f"{op} client CPU/GiB, s3ckpt / s3torchconnector", f"<= {GOAL_CPU}", v,
            None if v is None else v <= GOAL_CPU, ".2f")
    for op in ("save", "load"):
        m = rat.get(f"{op}_slowdowns_vs_fewest_other")
        if m:
            row(f"{op} 503s, s3ckpt / fewest other ({LABELS[m['fewest_other']]}: "
                f"{m['s3ckpt']:.0f} vs {m['other']:.0f})", "<= 0.33", m["ratio"],
                None if m["ratio"] is None else m["ratio"] <= 1 / 3, ".2f")
    v = rat.get("save_peak_over_baseline_mib")
    row(f"save peak RSS over state dict, s3ckpt (MiB, {meta['size_mib']} MiB state dict)",
        "<= 256", v, None if v is None else v <= 256, ".0f")
    for op in ("save", "load"):
        m = rat.get(f"{op}_peak_vs_lowest_other")
        if m and m["ratio"] is not None:
            lines.append(
                f"| {op} peak memory, s3ckpt / lowest other ({LABELS[m['lowest_other']]}) "
                f"| (info) | {m['ratio']:.2f} | |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mib", type=int, default=1024, help="state dict size (default 1024)")
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
    results: list[dict[str, Any]] = []
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
        print(f"{args.server} at {server.endpoint}, bucket {bucket}, log {log_path}",
              file=sys.stderr)

        for run in range(1, args.runs + 1):
            for b in backends:
                prefix = f"{b}/run{run}-{uuid.uuid4().hex[:8]}"
                url = f"s3://{bucket}/{prefix}"
                spec = {"backend": b, "url": url, "endpoint": server.endpoint,
                        "size_mib": args.size_mib, "threads": args.threads, "seed": run,
                        "warmup": not args.no_warmup, "sim": args.server == "s3sim"}
                try:
                    save = _run_worker({**spec, "op": "save"}, env, server, args.timeout)
                    save["run"] = run
                    results.append(save)
                    _progress(save)
                    if do_load and "error" not in save:
                        load_spec = {**spec, "op": "load"}
                        if b == "boto3":
                            load_spec["blob_size"] = save["blob_size"]
                        load = _run_worker(load_spec, env, server, args.timeout)
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
                        json.dump({"runs": results}, f, indent=2)
        with contextlib.suppress(Exception):
            client.delete_bucket(Bucket=bucket)
    finally:
        server.stop()
        if not args.keep_log:
            shutil.rmtree(tmp, ignore_errors=True)

    ok = [r for r in results if "error" not in r]
    loads = [r["loadavg_1m_before"] for r in ok] or [os.getloadavg()[0]]
    meta = {
        "size_mib": args.size_mib,
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
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
        "duration_s": time.time() - started,
        "python": platform.python_version(),
        "versions": _versions(),
        "command": " ".join([os.path.relpath(sys.executable), *sys.argv]),
    }
    summary = summarize(results, backends)
    rat = ratios(summary)
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
    if "error" in r:
        print(f"[{r['backend']:>6} {r['op']:>4} run {r.get('run')}] ERROR "
              f"{r['error'].splitlines()[-1] if r['error'] else ''}", file=sys.stderr, flush=True)
        return
    print(
        f"[{r['backend']:>6} {r['op']:>4} run {r['run']}] {r['mb_per_s']:7.1f} MB/s "
        f"wall {r['wall_s']:6.1f}s cpu {r['cpu_s_per_gib']:5.2f}s/GiB "
        f"peak+{r['peak_over_baseline_mib']:6.0f}MiB "
        f"srv-cpu {r['server_cpu_s_per_gib']:5.2f}s/GiB "
        + (f"req {r['requests']} 503 {r['slowdowns']} " if "requests" in r else "")
        + f"load1 {r['loadavg_1m_before']:.1f}"
        + (f" read {r['bytes_read'] / MiB:.0f}MiB" if "bytes_read" in r else ""),
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
