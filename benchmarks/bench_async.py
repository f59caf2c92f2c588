#!/usr/bin/env python
"""Training-blocked time of ``Checkpointer.async_save`` vs a synchronous ``save``.

One process saves the same ~1 GiB CPU state (a module of a few large and many small
parameters, bench_dcp.py's mix) to a moto server running in its own process, alternating
``save`` (synchronous: training is blocked for the whole upload) and ``async_save`` (blocked
until the state is staged into the cached CPU copy; the upload overlaps training). For the
async saves, "blocked" is the time from the call until ``handle.staged`` resolves: the
longest a training loop that waits for staging before its next optimizer step is held up.
The first async save allocates the staging cache (cold); later ones reuse it (warm).

Usage::

    .venv/bin/python benchmarks/bench_async.py --size-mib 1024 --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_dcp


def _module_of(size_mib: int) -> Any:
    import torch

    sd = bench_dcp.build_state_dict(size_mib)["model"]
    module = torch.nn.Module()
    for i, (name, t) in enumerate(sd.items()):
        module.register_parameter(f"p{i}_{name.replace('.', '_')}", torch.nn.Parameter(t))
    return module


def worker(url: str, size_mib: int, runs: int) -> dict[str, Any]:
    import torch

    from s3ckpt import Checkpointer

    warnings.filterwarnings("ignore")
    model = _module_of(size_mib)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    sync_s: list[float] = []
    async_blocked: list[float] = []
    async_commit: list[float] = []
    step = 0
    with Checkpointer(url) as ckpt:
        for _ in range(runs):
            step += 1
            h = ckpt.save(step, model)
            sync_s.append(h.blocked_seconds or 0.0)
            step += 1
            with torch.no_grad():
                next(model.parameters()).add_(1.0)  # a training step changed the weights
            h = ckpt.async_save(step, model)
            h.staged.result()
            h.wait()
            async_blocked.append(h.blocked_seconds or 0.0)
            async_commit.append(h.commit_seconds or 0.0)
    return {
        "bytes": nbytes,
        "sync_s": sync_s,
        "async_blocked_s": async_blocked,
        "async_commit_s": async_commit,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.size_mib, args.runs)))
        return 0

    import subprocess

    import boto3

    port = bench_dcp._free_port()
    log = os.path.join(tempfile.mkdtemp(), "moto.log")
    server = bench_dcp.MotoServer(port, log)
    try:
        server.wait_ready()
        env = bench_dcp._child_env(server.endpoint)
        boto3.client(
            "s3", endpoint_url=server.endpoint, region_name=bench_dcp.REGION,
            aws_access_key_id="testing", aws_secret_access_key="testing",
        ).create_bucket(Bucket="bench-async")
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--worker", "s3://bench-async/run",
             "--size-mib", str(args.size_mib), "--runs", str(args.runs)],
            env=env, capture_output=True, text=True, check=False,
        )
        if proc.returncode != 0:
            print(proc.stderr[-4000:], file=sys.stderr)
            return 1
        res = json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        server.stop()
    gib = res["bytes"] / 2**30
    sync_med = statistics.median(res["sync_s"])
    cold = res["async_blocked_s"][0]
    warm = res["async_blocked_s"][1:] or res["async_blocked_s"]
    warm_med = statistics.median(warm)
    print(f"state: {gib:.2f} GiB in {args.runs} rounds ({time.perf_counter() - t0:.0f} s); "
          f"load avg {os.getloadavg()[0]:.1f}")
    print("| save | training blocked per save (s) | fraction of a sync save |")
    print("|---|---|---|")
    print(f"| synchronous `save` | {sync_med:.2f} (min {min(res['sync_s']):.2f}, "
          f"max {max(res['sync_s']):.2f}) | 1.00 |")
    print(f"| `async_save`, first (allocates the staging cache) | {cold:.3f} | "
          f"{cold / sync_med:.3f} |")
    print(f"| `async_save`, cache warm (median of {len(warm)}) | {warm_med:.3f} | "
          f"{warm_med / sync_med:.3f} |")
    print(f"async upload to commit: median {statistics.median(res['async_commit_s']):.2f} s")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
