#!/usr/bin/env python
"""Fan-out load vs direct reads: N ranks (gloo) load one replicated checkpoint.

What a data-parallel job does on resume: every rank loads the same state dict. Reading
directly, each rank GETs every byte; with ``S3StorageReader(fan_out=True)`` the group GETs
each byte once and broadcasts it (s3ckpt/dcp/_fanout.py).

One process saves a replicated state dict (``--size-mib``, in objects of ``--object-mib``,
the writer's ``target_object_size``). Then, for each run and mode (interleaved: run 1
direct, run 1 fan_out, run 2 ...), ``--world`` ranks are spawned, join a gloo group,
allocate their destination tensors, wait at a barrier, load, wait at a barrier, and check
every tensor's CRC32C against the saver's. Reported per mode:

* GETs: GetObject requests for data objects (and for everything: marker, ``.metadata``),
  counted by a FaultProxy (s3ckpt.testing, no faults) between the ranks and the
  endpoint; ``--no-proxy`` skips it (no GET counts, no proxy overhead in the timings);
* bytes from S3: the sum over ranks of ``reader.bytes_read`` (what the ranks asked the
  store for); received: the sum of ``reader.bytes_received`` (what came over the group);
* wall: from the first barrier to the second on rank 0 (the slowest rank's load), median
  over runs.

The endpoint: ``--endpoint URL`` (any S3-compatible server; an existing ``--bucket`` or one
created), else a moto server started here (benchmarks/bench_dcp.py's ``MotoServer``). moto
reads a whole object to serve a ranged GET, which penalises the fan-out mode's ranged
reads; the proxy relays every byte in Python threads of this process, which penalises the
direct mode (it moves ``world`` times the bytes). Compare wall times with ``--no-proxy``.

Usage::

    .venv/bin/python benchmarks/bench_fanout.py                      # 8 ranks, 256 MiB
    .venv/bin/python benchmarks/bench_fanout.py --world 8 --size-mib 64 --object-mib 16
    .venv/bin/python benchmarks/bench_fanout.py --endpoint http://127.0.0.1:9000 --no-proxy
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for _path in (ROOT, HERE):
    if _path not in sys.path:
        sys.path.insert(0, _path)

MiB = 1024 * 1024
N_TENSORS = 16
MODES = ("direct", "fan_out")


def _state(size_mib: int) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(0)
    numel = size_mib * MiB // 4 // N_TENSORS
    return {f"layer{i}.weight": torch.randn(numel, generator=g) for i in range(N_TENSORS)}


def _crc(t: Any) -> int:
    from s3ckpt._crc import crc32c

    return crc32c(memoryview(t.contiguous().view(-1).view(__import__("torch").uint8).numpy()))


# ===========================================================================================
# Rank side.
# ===========================================================================================


def rank_main(rank: int, spec: dict[str, Any]) -> None:
    """One rank: join the group, load, check, write ``{out}/rank{r}.json``."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from s3ckpt import S3Config, S3StorageReader

    os.environ.update(spec["env"])
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{spec['port']}",
        rank=rank,
        world_size=spec["world"],
    )
    try:
        numel = spec["size_mib"] * MiB // 4 // N_TENSORS
        sd = {f"layer{i}.weight": torch.zeros(numel) for i in range(N_TENSORS)}
        reader = S3StorageReader(
            spec["url"],
            s3_config=S3Config(endpoint_url=spec["endpoint"]),
            fan_out=spec["mode"] == "fan_out",
            fan_out_piece_size=spec["piece_mib"] * MiB,
        )
        dist.barrier()
        t0 = time.perf_counter()
        dcp.load(sd, storage_reader=reader)
        dist.barrier()
        wall = time.perf_counter() - t0
        bad = [k for k, v in sd.items() if _crc(v) != spec["crcs"][k]]
        if bad:
            raise AssertionError(f"rank {rank} loaded wrong bytes for {bad}")
        record = {"wall": wall, "bytes_read": reader.bytes_read, "received": reader.bytes_received}
        with open(os.path.join(spec["out"], f"rank{rank}.json"), "w") as f:
            json.dump(record, f)
    finally:
        dist.destroy_process_group()


# ===========================================================================================
# Orchestrator side.
# ===========================================================================================


class GetCounter:
    """GetObject requests seen by the proxy, by key."""

    def __init__(self) -> None:
        self.gets: Counter[str] = Counter()
        self._lock = threading.Lock()

    def hook(self, op: str, key: str, phase: str) -> None:
        if phase == "before" and op == "GetObject":
            with self._lock:
                self.gets[key] += 1

    def take(self) -> tuple[int, int]:
        """(data GETs, all GETs) since the last call."""
        with self._lock:
            data = sum(n for k, n in self.gets.items() if k.endswith(".distcp"))
            total = sum(self.gets.values())
            self.gets.clear()
        return data, total


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _aws_env(endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    env.setdefault("AWS_ACCESS_KEY_ID", "testing")
    env.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    env["AWS_ENDPOINT_URL"] = endpoint
    return env


def _run(spec: dict[str, Any]) -> dict[str, Any]:
    import torch.multiprocessing as mp

    # Ranks fork from a server that imported torch once (as tests/_spawn.py does): a rank
    # starts in well under a second instead of importing torch again.
    mp.get_context("forkserver").set_forkserver_preload(
        ["torch", "torch.distributed", "torch.distributed.checkpoint", "boto3", "s3ckpt"]
    )
    with tempfile.TemporaryDirectory(prefix="bench_fanout_") as out:
        spec = {**spec, "out": out, "port": _free_port()}
        mp.start_processes(rank_main, args=(spec,), nprocs=spec["world"], start_method="forkserver")
        ranks = []
        for r in range(spec["world"]):
            with open(os.path.join(out, f"rank{r}.json")) as f:
                ranks.append(json.load(f))
    return {
        "wall": ranks[0]["wall"],
        "bytes_read": sum(r["bytes_read"] for r in ranks),
        "received": sum(r["received"] for r in ranks),
    }


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def render(summary: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    base = summary.get("direct")
    lines = [
        f"Fan-out load: {args.world} ranks (gloo) load one replicated checkpoint of "
        f"{args.size_mib} MiB ({N_TENSORS} tensors, objects of {args.object_mib} MiB), "
        f"pieces of at most {args.piece_mib} MiB, {args.runs} run(s), median wall.",
        "",
        "| mode | data GETs | all GETs | MiB from S3 | MiB received | wall s |"
        " GETs vs direct | bytes vs direct | wall vs direct |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def ratio(a: float | None, b: float | None) -> str:
        return "n/a" if a is None or not b else f"{a / b:.2f}"

    for mode, s in summary.items():
        gets = s["data_gets"]
        lines.append(
            f"| {mode} | {gets if gets is not None else 'n/a'} | "
            f"{s['all_gets'] if s['all_gets'] is not None else 'n/a'} | "
            f"{s['bytes_read'] / MiB:.1f} | {s['received'] / MiB:.1f} | {s['wall']:.2f} | "
            f"{ratio(gets, base['data_gets'] if base else None)} | "
            f"{ratio(s['bytes_read'], base['bytes_read'] if base else None)} | "
            f"{ratio(s['wall'], base['wall'] if base else None)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=8, help="ranks (default 8)")
    p.add_argument("--size-mib", type=int, default=256, help="checkpoint size (default 256)")
    p.add_argument(
        "--object-mib",
        type=int,
        default=128,
        help="the writer's target_object_size (default 128, its default)",
    )
    p.add_argument("--piece-mib", type=int, default=64, help="fan_out_piece_size (default 64)")
    p.add_argument("--runs", type=int, default=1, help="interleaved runs per mode (default 1)")
    p.add_argument("--modes", default=",".join(MODES), help="direct,fan_out or a subset")
    p.add_argument("--endpoint", help="S3 endpoint (http://...); default: start a moto server")
    p.add_argument("--bucket", help="bucket on --endpoint (default: a new one)")
    p.add_argument(
        "--no-proxy",
        action="store_true",
        help="no counting proxy (no GET counts, no proxy in the timings)",
    )
    p.add_argument("--out", help="write the runs and the summary as JSON here")
    args = p.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if any(m not in MODES for m in modes):
        p.error(f"--modes: choose from {MODES}")

    server = None
    tmp = tempfile.mkdtemp(prefix="bench_fanout_")
    endpoint = args.endpoint
    if endpoint is None:
        from bench_dcp import MotoServer

        server = MotoServer(_free_port(), os.path.join(tmp, "moto.log"))
        server.wait_ready()
        endpoint = server.endpoint
    env = _aws_env(endpoint)
    os.environ.update(env)
    proxy = None
    counter = GetCounter()
    try:
        import boto3
        import torch.distributed.checkpoint as dcp

        from s3ckpt import S3Config, S3StorageWriter, TransferConfig

        bucket = args.bucket or f"bench-fanout-{uuid.uuid4().hex[:8]}"
        if args.bucket is None:
            boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
        url = f"s3://{bucket}/fanout-{uuid.uuid4().hex[:8]}/step_1"
        sd = _state(args.size_mib)
        crcs = {k: _crc(v) for k, v in sd.items()}
        tc = TransferConfig(target_object_size=args.object_mib * MiB)
        t0 = time.perf_counter()
        dcp.save(
            sd,
            storage_writer=S3StorageWriter(
                url, s3_config=S3Config(endpoint_url=endpoint), transfer_config=tc
            ),
            no_dist=True,
        )
        print(
            f"saved {args.size_mib} MiB to {url} in {time.perf_counter() - t0:.1f} s",
            file=sys.stderr,
        )
        del sd
        target = endpoint
        if not args.no_proxy:
            from tests.faultproxy import FaultProxy

            proxy = FaultProxy(endpoint, fault_rate=0.0, hook=counter.hook)
            proxy.start()
            target = proxy.endpoint_url
        spec = {
            "world": args.world,
            "size_mib": args.size_mib,
            "piece_mib": args.piece_mib,
            "url": url,
            "endpoint": target,
            "env": env,
            "crcs": crcs,
        }
        runs: list[dict[str, Any]] = []
        for run in range(args.runs):
            for mode in modes:
                counter.take()
                result = _run({**spec, "mode": mode})
                data_gets, all_gets = counter.take() if proxy is not None else (None, None)
                result.update(mode=mode, run=run, data_gets=data_gets, all_gets=all_gets)
                runs.append(result)
                print(json.dumps(result), file=sys.stderr)
        summary: dict[str, dict[str, Any]] = {}
        for mode in modes:
            mine = [r for r in runs if r["mode"] == mode]
            summary[mode] = {
                "data_gets": mine[-1]["data_gets"],
                "all_gets": mine[-1]["all_gets"],
                "bytes_read": mine[-1]["bytes_read"],
                "received": mine[-1]["received"],
                "wall": _median([r["wall"] for r in mine]),
            }
        print(render(summary, args))
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"args": vars(args), "runs": runs, "summary": summary}, f, indent=2)
    finally:
        if proxy is not None:
            proxy.stop()
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
