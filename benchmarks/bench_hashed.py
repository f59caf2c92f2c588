#!/usr/bin/env python
"""Hashed prefixes' steady state, measured: K consecutive saves per key layout on s3sim.

docs/scale.md models ``HashedPrefixes(f)`` as paying off from the saves *after* S3 has split
a run's shard folders into partitions of their own, while the default layout starts every
save in one partition again (each new ``step_*`` folder sorts after the previous one's
split points). This benchmark measures that: each layout (the default, and
``HashedPrefixes(f)`` for each ``--fanouts``) gets a **fresh s3sim server** with S3's
shaping, its request rates scaled down (``--rate-scale``) so that W gloo ranks on two cores
meet the per-partition write limit, and short split times (``--split-after``,
``--split-load``); one group of W ranks then saves K consecutive checkpoints (steps 1..K)
of small tensors with every layout, interleaved (save k of every layout, then save k+1).
Per save it records, from that layout's server (counters reset before each save): requests,
writes, 503 SlowDowns, partitions in use and in the map, splits; and the save's wall time
(the slowest rank's) with the machine's load average.

Decisions:

* Small objects, many requests: each rank saves ``--rank-kib`` in ``--tensors`` tensors with
  ``target_object_size`` one tensor, so every object is one PutObject and a save is
  request-bound, not byte-bound, on 2 cores (bytes stay tiny; requests are what S3 limits).
* A server per layout: each layout starts from one partition per bucket, as a new bucket
  on S3 does, and its partitions evolve only with its own saves. The layouts' saves are
  interleaved in one process group (starting 8 ranks costs more than the saves on a busy
  2-core machine, and load drift then hits every layout alike). 503s, requests and
  partitions are counted by the servers and do not depend on the machine's load; times do.
* ``--presplit`` pins one partition per shard folder (s3sim throttles at the scaled rates,
  which never split further): a bucket AWS pre-partitioned on request.
* The steady state (:func:`steady_from`) is the first save from which no later save is
  throttled; ``None`` when the last save still was.

Run (a few minutes on a 2-core machine)::

    .venv/bin/python benchmarks/bench_hashed.py --out benchmarks/results/hashed_s3sim.json
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


__all__ = ["layout_name", "main", "markdown_table", "save_stats", "steady_from", "summarise"]

KiB = 1024
BUCKET = "hashed-bench"
WRITE_OPS = frozenset(
    {
        "PutObject",
        "UploadPart",
        "CreateMultipartUpload",
        "CompleteMultipartUpload",
        "AbortMultipartUpload",
        "CopyObject",
        "DeleteObject",
        "DeleteObjects",
    }
)
"""Operations s3sim admits against a partition's write rate (its README, Shaping model)."""


def _sim_call(endpoint: str, method: str, path: str) -> Any:
    """One request to s3sim's control API (``benchmarks/s3sim/README.md``); plain
    ``http.client``, so a rank needs no S3Sim object."""
    host, _, port = endpoint.removeprefix("http://").partition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request(method, path, body=b"" if method == "POST" else None)
        resp = conn.getresponse()
        payload = resp.read()
    finally:
        conn.close()
    if resp.status != 200:
        raise RuntimeError(f"s3sim {method} {path}: HTTP {resp.status}")
    return json.loads(payload) if payload else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: The ranks' environment: s3sim accepts any credentials; nothing read from ~/.aws.
RANK_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}


def layout_name(fanout: int, presplit: bool = False) -> str:
    """``"default"`` for fanout 1, else ``"HashedPrefixes(f)"`` (``", pre-split"`` added)."""
    if fanout <= 1:
        return "default"
    return f"HashedPrefixes({fanout})" + (", pre-split" if presplit else "")


def save_stats(stats: dict[str, Any]) -> dict[str, Any]:
    """One save's figures from s3sim's ``/_s3sim/stats`` (counters since the last reset):
    requests, 503s (total and by operation), partitions in use (any request since the
    reset) and in the map, the busiest partition's writes and 503s, and splits."""
    used = [p for p in stats["partitions"] if p["reads"] or p["writes"]]
    hottest = max(used, key=lambda p: p["writes"], default=None)
    return {
        "server_s": stats["since_reset_s"],
        "requests": stats["requests"],
        "writes": sum(v["count"] for op, v in stats["ops"].items() if op in WRITE_OPS),
        "writes_admitted": sum(
            v["count"] - v["slowdown"] for op, v in stats["ops"].items() if op in WRITE_OPS
        ),
        "slowdowns": stats["slowdowns"],
        "by_op": {op: v["count"] for op, v in sorted(stats["ops"].items())},
        "slowdowns_by_op": {
            op: v["slowdown"] for op, v in sorted(stats["ops"].items()) if v["slowdown"]
        },
        "partitions_used": len(used),
        "partitions_total": len(stats["partitions"]),
        "throttled_partitions": sum(
            1 for p in used if p["throttled_writes"] or p["throttled_reads"]
        ),
        "hottest": None
        if hottest is None
        else {k: hottest[k] for k in ("prefix", "writes", "throttled_writes", "peak_writes_per_s")},
        "splits": len(stats["splits"]),
        "split_parents": [s["parent"] for s in stats["splits"]],
    }


def steady_from(saves: list[dict[str, Any]]) -> int | None:
    """The 1-based index of the first save from which no save is throttled (no 503s);
    None when the last save still saw a 503 (or there are no saves)."""
    first: int | None = None
    for i, s in enumerate(saves, start=1):
        if s["slowdowns"]:
            first = None
        elif first is None:
            first = i
    return first


def summarise(saves: list[dict[str, Any]]) -> dict[str, Any]:
    """A layout's K saves in a few figures: where the steady state starts, 503s in all and
    in the last half, the median wall time of the first save and of the last half."""
    if not saves:
        return {"saves": 0, "steady_from": None}
    half = saves[len(saves) // 2 :]
    return {
        "saves": len(saves),
        "steady_from": steady_from(saves),
        "slowdowns_total": sum(s["slowdowns"] for s in saves),
        "slowdowns_last_half": sum(s["slowdowns"] for s in half),
        "first_wall_s": saves[0]["wall_s"],
        "last_half_median_wall_s": statistics.median(s["wall_s"] for s in half),
        "last_half_median_requests": statistics.median(s["requests"] for s in half),
        "last_half_median_writes": statistics.median(s["writes"] for s in half),
        "last_half_median_writes_admitted": statistics.median(s["writes_admitted"] for s in half),
        "partitions_used_last": saves[-1]["partitions_used"],
    }


def markdown_table(runs: list[dict[str, Any]]) -> str:
    """The per-save table of docs/scale.md: one row per (layout, save)."""
    lines = [
        "| layout | save | seconds | requests | 503s | partitions used | partitions in map "
        "| splits |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        for i, s in enumerate(run["saves"], start=1):
            lines.append(
                f"| {run['layout']} | {i} | {s['wall_s']:.1f} | {s['requests']} | "
                f"{s['slowdowns']} | {s['partitions_used']} | {s['partitions_total']} | "
                f"{s['splits']} |"
            )
    return "\n".join(lines)


def _rank(rank: int, world: int, port: int, spec: dict[str, Any], out: str) -> None:
    """One rank: K rounds of one save per layout, each layout against its own server;
    rank 0 resets that server's counters before the save and reads them after."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from s3ckpt import HashedPrefixes, S3Config, S3StorageWriter, TransferConfig

    for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        os.environ.pop(var, None)
    os.environ.update(spec["env"])
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    tensor_bytes = spec["rank_kib"] * KiB // spec["tensors"]
    # one tensor per object: every object is a single PutObject, a save is request-bound
    tc = TransferConfig(target_object_size=tensor_bytes)
    gen = torch.Generator().manual_seed(rank)
    sd = {
        f"r{rank}.w{i}": torch.rand(tensor_bytes // 4, generator=gen)
        for i in range(spec["tensors"])
    }
    saves: dict[str, list[dict[str, Any]]] = {lay["name"]: [] for lay in spec["layouts"]}
    for step in range(1, spec["saves"] + 1):
        for lay in spec["layouts"]:  # interleaved: load drift hits every layout alike
            endpoint = lay["endpoint"]
            strategy = HashedPrefixes(lay["fanout"]) if lay["fanout"] > 1 else None
            writer = S3StorageWriter(
                f"s3://{BUCKET}/{lay['run']}/step_{step:09d}",
                s3_config=S3Config(endpoint_url=endpoint),
                transfer_config=tc,
                prefix_strategy=strategy,
            )
            dist.barrier()
            if rank == 0:
                _sim_call(endpoint, "POST", "/_s3sim/reset")
            dist.barrier()
            t0 = time.perf_counter()
            dcp.save(sd, storage_writer=writer)
            wall = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(wall, op=dist.ReduceOp.MAX)
            if rank == 0:
                s = save_stats(_sim_call(endpoint, "GET", "/_s3sim/stats"))
                s["wall_s"] = round(float(wall.item()), 3)
                s["loadavg"] = round(os.getloadavg()[0], 2)
                saves[lay["name"]].append(s)
                print(
                    f"{lay['name']:>29} save {step:2d}: {s['wall_s']:5.1f}s "
                    f"{s['requests']:4d} requests {s['slowdowns']:4d} 503s "
                    f"{s['partitions_used']:3d} partitions used / {s['partitions_total']:3d} "
                    f"{s['splits']} split(s), load average {s['loadavg']:.1f}",
                    flush=True,
                )
    if rank == 0:
        with open(out, "w") as f:
            json.dump(saves, f)
    dist.destroy_process_group()


def _presplit_throttles(run: str, fanout: int, rate_scale: float) -> list[Any]:
    """One pinned partition per shard folder of ``run`` at the scaled S3 rates."""
    from benchmarks.s3sim import Throttle
    from s3ckpt import HashedPrefixes

    width = HashedPrefixes(fanout).width
    return [
        Throttle(
            f"{BUCKET}/{run}/s3ckpt-shards/{h:0{width}x}/", 5500 * rate_scale, 3500 * rate_scale
        )
        for h in range(fanout)
    ]


def _model(args: argparse.Namespace, fanout: int, writes: float) -> dict[str, float]:
    """docs/scale.md's prediction for a request-bound save of ``writes`` admitted writes
    (503s not counted): on one partition the default layout needs ``(writes - burst) /
    rate`` seconds every save (the burst is one second of rate); hashed, once split,
    ``fanout`` partitions share the writes and none of them binds."""
    rate = 3500 * args.rate_scale
    return {
        "write_limit_per_partition": rate,
        "one_partition_s": max(0.0, writes - rate) / rate,
        "split_s": max(0.0, writes / max(1, fanout) - rate) / rate,
    }


def main(argv: list[str] | None = None) -> int:
    """Start a server per layout, run the interleaved saves, print the table, write JSON."""
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--world", type=int, default=8, help="gloo ranks (8)")
    p.add_argument("--saves", type=int, default=10, help="consecutive saves per layout (10)")
    p.add_argument(
        "--fanouts",
        default="1,16",
        help="layouts in order: 1 = default, n = HashedPrefixes(n) (1,16)",
    )
    p.add_argument("--rank-kib", type=int, default=2048, help="KiB each rank saves (2048)")
    p.add_argument("--tensors", type=int, default=8, help="tensors (= objects) per rank (8)")
    p.add_argument(
        "--rate-scale",
        type=float,
        default=0.003,
        help="s3sim request rates x this (0.003: 10.5 writes/s, 16.5 reads/s)",
    )
    p.add_argument(
        "--split-after",
        type=float,
        default=2.0,
        help="s3sim: seconds a partition stays hot before it splits (2)",
    )
    p.add_argument(
        "--split-load",
        type=float,
        default=0.5,
        help="s3sim: fraction of a rate that makes a 1 s window hot (0.5)",
    )
    p.add_argument(
        "--presplit",
        action="store_true",
        help="also run each HashedPrefixes layout on a server whose shard "
        "folders are pre-split partitions",
    )
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args(argv)

    import torch.multiprocessing as mp

    from benchmarks.s3sim import S3Sim, Shaping

    layouts: list[tuple[int, bool]] = []
    for f in (int(x) for x in args.fanouts.split(",")):
        layouts.append((f, False))
        if args.presplit and f > 1:
            layouts.append((f, True))
    results: dict[str, Any] = {
        "args": vars(args),
        "cpus": os.cpu_count(),
        "loadavg_before": os.getloadavg(),
        "runs": [],
    }
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        spec_layouts: list[dict[str, Any]] = []
        for fanout, presplit in layouts:  # a fresh server per layout: one partition at first
            run = f"f{fanout}" + ("-presplit" if presplit else "")
            throttles = _presplit_throttles(run, fanout, args.rate_scale) if presplit else []
            shaping = Shaping.s3(
                rate_scale=args.rate_scale,
                split_after_s=args.split_after,
                split_load=args.split_load,
                throttles=tuple(throttles),
            )
            sim = stack.enter_context(S3Sim(shaping, buckets=[BUCKET]))
            spec_layouts.append(
                {
                    "name": layout_name(fanout, presplit),
                    "fanout": fanout,
                    "presplit": presplit,
                    "run": run,
                    "endpoint": sim.endpoint,
                }
            )
        spec = {
            "env": RANK_ENV,
            "rank_kib": args.rank_kib,
            "tensors": args.tensors,
            "saves": args.saves,
            "layouts": spec_layouts,
        }
        out = os.path.join(tmp, "saves.json")
        print(
            f"W={args.world}, {args.saves} rounds of one save per layout (interleaved), "
            f"load average {results['loadavg_before'][0]:.1f}",
            flush=True,
        )
        # ranks fork from a server that imported torch once (as bench_fanout.py does): on a
        # busy 2-core machine 8 spawned ranks spend minutes importing torch each
        mp.get_context("forkserver").set_forkserver_preload(
            ["torch", "torch.distributed", "torch.distributed.checkpoint", "boto3", "s3ckpt"]
        )
        mp.start_processes(
            _rank,
            args=(args.world, _free_port(), spec, out),
            nprocs=args.world,
            join=True,
            start_method="forkserver",
        )
        with open(out) as fh:
            saves = json.load(fh)
        for lay in spec_layouts:
            final = _sim_call(lay["endpoint"], "GET", "/_s3sim/stats")["partitions"]
            summary = summarise(saves[lay["name"]])
            results["runs"].append(
                {
                    "layout": lay["name"],
                    "fanout": lay["fanout"],
                    "presplit": lay["presplit"],
                    "saves": saves[lay["name"]],
                    "summary": summary,
                    "model": _model(
                        args, lay["fanout"], summary["last_half_median_writes_admitted"]
                    ),
                    "final_partitions": [q["prefix"] for q in final],
                }
            )
            print(
                f"{lay['name']}: steady from save {summary['steady_from']}, "
                f"{summary['slowdowns_total']} 503s in all, "
                f"{summary['slowdowns_last_half']} in the last half, median "
                f"{summary['last_half_median_wall_s']:.1f}s per save in the last half",
                flush=True,
            )
    results["wall_s"] = round(time.perf_counter() - t0, 1)
    results["loadavg_after"] = os.getloadavg()
    print()
    print(markdown_table(results["runs"]))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
