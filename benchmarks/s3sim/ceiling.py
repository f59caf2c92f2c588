"""The server's own ceiling: PUT then GET from several lean client processes.

Each client process holds one keep-alive ``http.client`` connection and sends preallocated
bodies (no SDK, no signing, no checksums: as little client CPU per byte as Python allows),
then reads every object back into a preallocated buffer. The server runs with shaping off.
Reported per phase: MB/s over the wall time (MB = 10**6 bytes), server CPU seconds per GiB
(from the server's own getrusage) and client CPU seconds per GiB (all clients); for the
small-object phases, requests per second and server CPU microseconds per request.

Usage (repository root)::

    .venv/bin/python -m benchmarks.s3sim.ceiling --clients 2 --size-mib 16 --total-mib 2048
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import resource
import sys
import time
from typing import Any

from ._client import S3Sim
from ._options import Options

MIB = 1024 * 1024
GIB = 1024 * MIB


def _worker(port: int, index: int, count: int, size: int, phase: str, start: Any, out: Any) -> None:
    body = bytearray(size)
    for i in range(0, size, 4096):
        body[i] = (i // 4096 + index) & 0xFF
    view = memoryview(body)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    start.wait()
    t0 = time.perf_counter()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    for n in range(count):
        path = f"/ceiling/c{index}/o{n}"
        if phase == "put":
            conn.request("PUT", path, body=view, headers={"Content-Length": str(size)})
            resp = conn.getresponse()
            resp.read()
        else:
            conn.request("GET", path)
            resp = conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"GET {path}: {resp.status} {resp.read()[:200]!r}")
            got = 0
            while got < size:
                k = resp.readinto(view[got:])
                if not k:
                    break
                got += k
            resp.read()
            if got != size:
                raise RuntimeError(f"short GET {got}/{size}")
        if resp.status != 200:
            raise RuntimeError(f"{phase} {path}: {resp.status}")
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    conn.close()
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    out.put((time.perf_counter() - t0, cpu))


def _phase(sim: S3Sim, clients: int, count: int, size: int, phase: str) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(sim.port, i, count, size, phase, start, out))
        for i in range(clients)
    ]
    for p in procs:
        p.start()
    time.sleep(1.0)  # let the interpreters start before the clock does
    sim.reset_stats()
    t0 = time.perf_counter()
    start.set()
    rows = [out.get(timeout=600) for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join()
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
    }


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
