"""The server's own ceiling: PUT then GET from several lean client processes.

Each client process holds one keep-alive ``http.client`` connection and sends preallocated
bodies (no SDK, no signing, no checksums: as little client CPU per byte as Python allows),
then reads every object back into a preallocated buffer. The server runs with shaping off.
Reported per phase: MB/s over the wall time (MB = 10**6 bytes), server CPU seconds per GiB
(from the server's own getrusage) and client CPU seconds per GiB (all clients); for the
small-object phases, requests per second and server CPU microseconds per request.

Usage (repository root)::

    .venv/bin/python -m benchmarks.s3sim.ceiling --clients 2 --size-mib 16 --total-mib 2048

:func:`shaped_limit` runs the same lean clients against a server that is already running
(bench_dcp.py's, S3's shaping on) under a bucket prefix, each PUT carrying an
``x-amz-checksum-crc32c`` header with the body's real CRC32C (computed once per preallocated
body before the clock starts), and deletes its objects afterwards: what the leanest possible
client gets through the shaping the backends face.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import multiprocessing as mp
import resource
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ._client import S3Sim
from ._options import Options

__all__ = ["crc32c_header", "run", "shaped_limit"]

MIB = 1024 * 1024
GIB = 1024 * MIB


def crc32c_header(body: Any) -> str:
    """``x-amz-checksum-crc32c``'s value for ``body``: base64 of the big-endian CRC32C."""
    import crc32c

    return base64.b64encode(crc32c.crc32c(body).to_bytes(4, "big")).decode("ascii")


#: How often a lean client retries a request the server answered 503 (SlowDown) to.
_RETRIES_503 = 20


def _worker(
    port: int, index: int, count: int, size: int, phase: str, start: Any, out: Any,
    base: str = "/ceiling", checksum: bool = False, host: str = "127.0.0.1",
) -> None:
    try:
        out.put(_work(host, port, index, count, size, phase, start, base, checksum))
    except BaseException as e:  # the parent must not wait for a row that never comes
        out.put(("error", f"client {index}: {type(e).__name__}: {e}"))
        raise


def _work(
    host: str, port: int, index: int, count: int, size: int, phase: str, start: Any,
    base: str, checksum: bool,
) -> tuple[float, float, int]:
    body = bytearray(size)
    for i in range(0, size, 4096):
        body[i] = (i // 4096 + index) & 0xFF
    view = memoryview(body)
    headers = {"Content-Length": str(size)}
    if checksum and phase == "put":
        headers["x-amz-checksum-crc32c"] = crc32c_header(view)  # once, before the clock
    conn = http.client.HTTPConnection(host, port, timeout=120)
    start.wait()
    t0 = time.perf_counter()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    retried = 0
    for n in range(count):
        path = f"{base}/c{index}/o{n}"
        for _attempt in range(_RETRIES_503 + 1):
            if phase == "put":
                conn.request("PUT", path, body=view, headers=headers)
                resp = conn.getresponse()
                detail = resp.read()
            else:
                conn.request("GET", path)
                resp = conn.getresponse()
                if resp.status != 200:
                    detail = resp.read()
                else:
                    got = 0
                    while got < size:
                        k = resp.readinto(view[got:])
                        if not k:
                            break
                        got += k
                    resp.read()
                    if got != size:
                        raise RuntimeError(f"short GET {got}/{size}")
                    detail = b""
            if resp.status != 503:
                break
            retried += 1  # SlowDown: S3's request rates; back off a little, as SDKs do
            time.sleep(min(0.05 * 2**_attempt, 1.0))
        if resp.status != 200:
            raise RuntimeError(f"{phase} {path}: {resp.status} {detail[:300]!r}")
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    conn.close()
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return time.perf_counter() - t0, cpu, retried


def _collect(out: Any, procs: list[Any], timeout: float) -> list[Any]:
    """One row per client process; a client that died without one (it failed to start)
    or a phase past ``timeout`` seconds raises instead of waiting forever."""
    import queue

    rows: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(rows) < len(procs):
        try:
            rows.append(out.get(timeout=0.2))
            continue
        except queue.Empty:
            pass
        dead = [p for p in procs if p.exitcode not in (None, 0)]
        if dead and len(rows) < len(procs):
            with_rows = len(rows)
            try:  # a row may still be in flight from a client that failed after sending it
                while True:
                    rows.append(out.get(timeout=0.5))
            except queue.Empty:
                pass
            if len(rows) < len(procs):
                told = "; ".join(r[1] for r in rows if r[0] == "error")
                raise RuntimeError(
                    f"{len(dead)} client process(es) exited with "
                    f"{sorted({p.exitcode for p in dead})} ({with_rows} row(s) received)"
                    + (f": {told}" if told else "")
                )
        if time.monotonic() > deadline:
            raise RuntimeError(f"clients did not finish in {timeout:.0f}s")
    return rows


def _phase(
    sim: S3Sim, clients: int, count: int, size: int, phase: str,
    base: str = "/ceiling", checksum: bool = False,
) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker,
            args=(sim.port, i, count, size, phase, start, out, base, checksum, sim.host),
        )
        for i in range(clients)
    ]
    for p in procs:
        p.start()
    time.sleep(1.0)  # let the interpreters start before the clock does
    sim.reset_stats()
    t0 = time.perf_counter()
    start.set()
    try:
        rows = _collect(out, procs, 600.0)
        wall = time.perf_counter() - t0
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    errors = [r[1] for r in rows if r[0] == "error"]
    if errors:
        raise RuntimeError(f"{phase}: " + "; ".join(errors))
    stats = sim.stats()
    total = count * clients * size
    requests = count * clients
    return {
        "wall_s": round(wall, 3),
        "mb_per_s": round(total / wall / 1e6, 1),
        "requests_per_s": round(requests / wall),
        "server_cpu_s_per_gib": round(stats["cpu_s_since_reset"] / (total / GIB), 3),
        "server_cpu_us_per_request": round(stats["cpu_s_since_reset"] / requests * 1e6, 1),
        "client_cpu_s_per_gib": round(sum(r[1] for r in rows) / (total / GIB), 3),
        "server_requests": stats["requests"],
        "retried_503": sum(r[2] for r in rows),
    }


def _delete_objects(sim: S3Sim, base: str, clients: int, count: int) -> int:
    """DELETE ``base/c{i}/o{n}`` for every client and object (8 connections); how many
    answered 204/200 (an object a failed phase never wrote answers 204 too)."""

    def one_client(index: int) -> int:
        conn = http.client.HTTPConnection(sim.host, sim.port, timeout=60)
        ok = 0
        try:
            for n in range(count):
                for _attempt in range(_RETRIES_503 + 1):
                    conn.request("DELETE", f"{base}/c{index}/o{n}")
                    resp = conn.getresponse()
                    resp.read()
                    if resp.status != 503:
                        break
                    time.sleep(0.05)
                ok += resp.status in (200, 204)
        finally:
            conn.close()
        return ok

    with ThreadPoolExecutor(max_workers=min(8, clients)) as pool:
        return sum(pool.map(one_client, range(clients)))


def limit_layout(clients: int, size_mib: int, total_mib: int) -> tuple[int, int]:
    """(objects per client, MiB per phase) of :func:`shaped_limit`: about ``total_mib`` but
    at least one ``size_mib`` object per client."""
    per_client = max(1, round(total_mib / size_mib / clients))
    return per_client, per_client * clients * size_mib


def shaped_limit(
    sim: S3Sim, bucket: str, prefix: str, clients: int = 14, size_mib: int = 16,
    total_mib: int = 0,
) -> dict[str, Any]:
    """PUT then GET phase of lean clients through a running server (its shaping as it is),
    under ``bucket/prefix``, PUTs carrying the body's CRC32C; the objects are deleted after.

    ``sim`` need not have been started by this process: an ``S3Sim(host=..., port=...)``
    handle is enough (only its control API is used). Returns the phases as :func:`run` does
    (plus ``retried_503``), the layout and ``deleted``.
    """
    size = size_mib * MIB
    per_client, phase_mib = limit_layout(clients, size_mib, total_mib)
    base = f"/{bucket}/{prefix.strip('/')}"
    results: dict[str, Any] = {
        "clients": clients,
        "object_mib": size_mib,
        "total_mib": phase_mib,
        "checksum": "CRC32C",
        "bucket": bucket,
        "prefix": prefix.strip("/"),
        "python": sys.version.split()[0],
    }
    try:
        for phase in ("put", "get"):
            results[phase] = _phase(sim, clients, per_client, size, phase, base, checksum=True)
    finally:
        results["deleted"] = _delete_objects(sim, base, clients, per_client)
    return results


def run(clients: int, size_mib: int, total_mib: int, small: int, small_kib: int) -> dict[str, Any]:
    """Every phase on a fresh server; the measurements as a dict."""
    size = size_mib * MIB
    per_client = max(1, total_mib // size_mib // clients)
    results: dict[str, Any] = {
        "clients": clients,
        "object_mib": size_mib,
        "total_mib": per_client * clients * size // MIB,
        "small_objects": small // clients * clients,
        "small_kib": small_kib,
        "python": sys.version.split()[0],
    }
    with S3Sim(options=Options(), buckets=["ceiling"]) as sim:
        for phase in ("put", "get"):
            results[phase] = _phase(sim, clients, per_client, size, phase)
        sim.clear()
        sim.create_bucket("ceiling")
        if small:
            for phase in ("put", "get"):
                row = _phase(sim, clients, small // clients, small_kib * 1024, phase)
                results[f"small_{phase}"] = row
    return results


def main(argv: list[str] | None = None) -> int:
    """Command line: print one JSON object."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.s3sim.ceiling", description=__doc__)
    p.add_argument("--clients", type=int, default=2, help="client processes (one connection each)")
    p.add_argument("--size-mib", type=int, default=16, help="bytes per PUT/GET, MiB")
    p.add_argument("--total-mib", type=int, default=2048, help="bytes per phase, MiB")
    p.add_argument("--small", type=int, default=20000, help="small objects per phase (0: skip)")
    p.add_argument("--small-kib", type=int, default=4, help="bytes per small object, KiB")
    args = p.parse_args(argv)
    res = run(args.clients, args.size_mib, args.total_mib, args.small, args.small_kib)
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
