#!/usr/bin/env python
"""The scale model of docs/scale.md checked against measured runs on ``benchmarks/s3sim``.

For each world size (default 2, 4, 8; gloo ranks on this machine) and each key layout
(the default, and ``HashedPrefixes``), the ranks save a sharded state dict twice (each rank
its own tensors, as FSDP does) and load it once, against one s3sim server with S3's shaping
and its request rates scaled down (``--rate-scale``) so that a few ranks on two cores hit
the per-partition limits as thousands of ranks do on S3. Between phases rank 0 resets the
server's counters, after each phase it reads them: requests by operation, 503 SlowDowns,
the peak requests per second of each partition, the partitions that split.

Then, in this process, resume discovery (``Checkpointer.latest()``) is counted in runs
holding 1 and ``--discovery-checkpoints`` checkpoints: its cost must not grow.

Every phase is printed beside the model's prediction (``benchmarks/scale_model.py``)::

    .venv/bin/python benchmarks/bench_scale.py --out benchmarks/results/scale.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.bench_dcp import _child_env, _free_port, _sim_call  # noqa: E402
from benchmarks.scale_model import Scenario  # noqa: E402

MiB = 1024 * 1024
BUCKET = "scale-bench"


def _phase_stats(endpoint: str) -> dict[str, Any]:
    st = _sim_call(endpoint, "GET", "/_s3sim/stats")
    return {
        "seconds": st["since_reset_s"],
        "requests": st["requests"],
        "slowdowns": st["slowdowns"],
        "by_op": {op: v["count"] for op, v in sorted(st["ops"].items())},
        "slowdowns_by_op": {op: v["slowdown"] for op, v in st["ops"].items() if v["slowdown"]},
        "partitions": [
            {k: p[k] for k in ("prefix", "reads", "writes", "peak_reads_per_s",
                               "peak_writes_per_s", "throttled_reads", "throttled_writes")}
            for p in st["partitions"]
            if p["reads"] or p["writes"]
        ],
        "splits": len(st["splits"]),
    }


def _rank(rank: int, world: int, port: int, spec: dict[str, Any], out: str) -> None:
    """One rank: save twice, load once; rank 0 records the server's counters per phase."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from s3ckpt import HashedPrefixes, S3Config, S3StorageReader, S3StorageWriter, TransferConfig

    os.environ.update(spec["env"])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    endpoint = spec["endpoint"]
    cfg = S3Config(endpoint_url=endpoint)
    tc = TransferConfig(part_size=spec["part_mib"] * MiB,
                        target_object_size=spec["object_mib"] * MiB)
    strategy = HashedPrefixes(spec["fanout"]) if spec["fanout"] > 1 else None
    n = spec["rank_mib"] * MiB // 4 // 4
    gen = torch.Generator().manual_seed(rank)
    sd = {f"r{rank}.w{i}": torch.rand(n, generator=gen) for i in range(4)}
    phases: dict[str, Any] = {}

    def phase(name: str, fn: Any) -> None:
        dist.barrier()
        if rank == 0:
            _sim_call(endpoint, "POST", "/_s3sim/reset")
        dist.barrier()
        fn()
        dist.barrier()
        if rank == 0:
            phases[name] = _phase_stats(endpoint)

    run = spec["run"]
    for step in (1, 2):
        url = f"s3://{BUCKET}/{run}/step_{step:09d}"
        phase(f"save{step}", lambda url=url: dcp.save(
            sd, storage_writer=S3StorageWriter(url, s3_config=cfg, transfer_config=tc,
                                               prefix_strategy=strategy)))
    dest = {k: torch.zeros_like(v) for k, v in sd.items()}
    url = f"s3://{BUCKET}/{run}/step_{2:09d}"
    phase("load", lambda: dcp.load(
        dest, storage_reader=S3StorageReader(url, s3_config=cfg, transfer_config=tc)))
    if not all(torch.equal(dest[k], sd[k]) for k in sd):
        raise RuntimeError(f"rank {rank}: loaded tensors differ")
    if rank == 0:
        with open(out, "w") as f:
            json.dump(phases, f)
    dist.destroy_process_group()


def _discovery(endpoint: str, counts: list[int]) -> dict[int, dict[str, Any]]:
    """Requests of ``Checkpointer.latest()`` in runs of ``counts`` checkpoints (single
    process, tiny checkpoints written with the Checkpointer itself)."""
    import torch

    from s3ckpt import Checkpointer, S3Config

    out: dict[int, dict[str, Any]] = {}
    for count in counts:
        model = torch.nn.Linear(2, 2)
        with Checkpointer(f"s3://{BUCKET}/discovery-{count}",
                          s3_config=S3Config(endpoint_url=endpoint)) as ckpt:
            for step in range(1, count + 1):
                ckpt.save(step, model)
            _sim_call(endpoint, "POST", "/_s3sim/reset")
            latest = ckpt.latest()
            st = _phase_stats(endpoint)
        if latest != count:
            raise RuntimeError(f"latest() found {latest}, expected {count}")
        out[count] = {"requests": st["requests"], "by_op": st["by_op"]}
    return out


def _model(spec: dict[str, Any], world: int, scale: float) -> dict[str, float]:
    sc = Scenario(world=world, rank_bytes=spec["rank_mib"] * MiB,
                  part_size=spec["part_mib"] * MiB,
                  target_object_size=spec["object_mib"] * MiB, fanout=spec["fanout"])
    return {
        "save_requests": sc.save_requests,
        "save_data_requests": sc.save_data_requests,
        "load_requests": sc.load_data_requests_direct + sc.load_control_requests,
        "write_limit_per_partition": 3500 * scale,
        # throttled save time with the writes spread over `fanout` partitions once split
        "throttled_save_s_split": replace(sc, fanout=max(1, spec["fanout"])).save_data_requests
        / (3500 * scale * max(1, spec["fanout"])),
        "throttled_save_s_one_partition": sc.save_data_requests / (3500 * scale),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worlds", default="2,4,8")
    p.add_argument("--fanouts", default="1,16", help="1 = default layout; n = HashedPrefixes(n)")
    p.add_argument("--rank-mib", type=int, default=24, help="MiB each rank saves (24)")
    p.add_argument("--part-mib", type=int, default=5)
    p.add_argument("--object-mib", type=int, default=12)
    p.add_argument("--rate-scale", type=float, default=0.01,
                   help="s3sim request rates x this (0.01: 35 writes/s, 55 reads/s)")
    p.add_argument("--split-after", type=float, default=2.0,
                   help="s3sim: seconds of sustained load before a partition splits")
    p.add_argument("--discovery-checkpoints", type=int, default=40)
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args(argv)

    import torch.multiprocessing as mp

    from benchmarks.s3sim import S3Sim, Shaping

    results: dict[str, Any] = {"args": vars(args), "runs": []}
    shaping = Shaping.s3(rate_scale=args.rate_scale, split_after_s=args.split_after)
    with tempfile.TemporaryDirectory() as tmp, S3Sim(shaping, buckets=[BUCKET]) as sim:
        env = {k: v for k, v in _child_env(sim.endpoint).items() if k.startswith("AWS_")}
        os.environ.update(env)
        for world in [int(w) for w in args.worlds.split(",")]:
            for fanout in [int(f) for f in args.fanouts.split(",")]:
                sim.configure(shaping)  # a fresh partition layout for every run
                spec = {"env": env, "endpoint": sim.endpoint, "rank_mib": args.rank_mib,
                        "part_mib": args.part_mib, "object_mib": args.object_mib,
                        "fanout": fanout, "run": f"w{world}-f{fanout}"}
                out = os.path.join(tmp, f"{world}-{fanout}.json")
                t0 = time.perf_counter()
                mp.start_processes(_rank, args=(world, _free_port(), spec, out), nprocs=world,
                                   join=True, start_method="spawn")
                with open(out) as f:
                    phases = json.load(f)
                model = _model(spec, world, args.rate_scale)
                results["runs"].append({"world": world, "fanout": fanout, "phases": phases,
                                        "model": model,
                                        "wall_s": time.perf_counter() - t0})
                _print_run(world, fanout, phases, model)
        sim.configure(Shaping.none())
        results["discovery"] = _discovery(sim.endpoint, [1, args.discovery_checkpoints])
    for count, d in results["discovery"].items():
        print(f"resume discovery in a run of {count} checkpoints: {d['requests']} requests "
              f"{d['by_op']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    return 0


def _print_run(world: int, fanout: int, phases: dict[str, Any], model: dict[str, float]) -> None:
    layout = "default" if fanout == 1 else f"hashed/{fanout}"
    for name, ph in phases.items():
        peak = max((max(q["peak_writes_per_s"], q["peak_reads_per_s"])
                    for q in ph["partitions"]), default=0)
        predicted = model["load_requests"] if name == "load" else model["save_requests"]
        print(
            f"W={world} {layout:>9} {name:>5}: {ph['requests']:5d} requests "
            f"(model {predicted:5.0f}, x{ph['requests'] / predicted:.2f}), "
            f"{ph['slowdowns']:4d} 503s, {ph['seconds']:5.1f}s, "
            f"{len(ph['partitions'])} partition(s) used, peak {peak}/s per partition, "
            f"{ph['splits']} split(s)",
            flush=True,
        )
    print(f"    model: throttled save {model['throttled_save_s_one_partition']:.1f}s on one "
          f"partition, {model['throttled_save_s_split']:.1f}s split {fanout} ways",
          flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
