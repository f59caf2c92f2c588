#!/usr/bin/env python
"""The request model of docs/scale.md: requests per save, per load, per prefix per second,
and the listing cost of resume discovery and of the retention cron, from 8 to 4,096 ranks.

Pure arithmetic over s3ckpt's request pattern (each term is named after the code path that
makes the requests; ``benchmarks/bench_scale.py`` checks the terms against requests counted
by ``benchmarks/s3sim`` at world size 2, 4 and 8). Prints the tables of docs/scale.md::

    .venv/bin/python benchmarks/scale_model.py                 # the default scenario
    .venv/bin/python benchmarks/scale_model.py --rank-gib 2 --part-mib 16 --fanout 16

Nothing here imports s3ckpt: the numbers are a model, the measurements are elsewhere.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, replace

MiB = 1024 * 1024
GiB = 1024 * MiB
MB = 1_000_000

WRITES_PER_PARTITION = 3500.0
"""AWS: at least 3,500 PUT/COPY/POST/DELETE requests per second per partitioned prefix."""
READS_PER_PARTITION = 5500.0
"""AWS: at least 5,500 GET/HEAD requests per second per partitioned prefix."""
CONNECTION_MBPS = 90.0
"""AWS: one concurrent request per 85-90 MB/s of desired throughput."""
HEARTBEAT_INTERVAL = 15.0
"""s3ckpt.format.HEARTBEAT_INTERVAL: a saving rank re-PUTs its heartbeat this often."""
LIST_PAGE = 1000


@dataclass(frozen=True)
class Scenario:
    """One training job's checkpoint shape and s3ckpt's transfer settings."""

    world: int = 8
    rank_bytes: int = 2 * GiB
    """Bytes each rank saves (a sharded save: FSDP / tensor parallel)."""
    part_size: int = 16 * MiB
    target_object_size: int = 128 * MiB
    read_request_size: int = 256 * MiB
    rank_mbps: float = 1250.0
    """What one rank moves per second: min(connections x 90 MB/s, its NIC share).
    s3ckpt's default target, 10 Gbit/s, is 14 connections, 1,250 MB/s."""
    fanout: int = 1
    """Hashed key prefixes (HashedPrefixes(fanout)); 1 = the default layout."""
    replicas: int = 1
    """Data-parallel replicas loading the same shards (a load reads W/replicas shards)."""

    # -- per rank --------------------------------------------------------------------------
    @property
    def objects_per_rank(self) -> int:
        """s3ckpt._transfer.pack: ceil(rank bytes / target_object_size), at least one."""
        return max(1, math.ceil(self.rank_bytes / self.target_object_size))

    @property
    def object_size(self) -> float:
        return self.rank_bytes / self.objects_per_rank

    @property
    def requests_per_object(self) -> int:
        """One PUT up to a part; else CreateMultipartUpload + parts + Complete."""
        if self.object_size <= self.part_size:
            return 1
        return math.ceil(self.object_size / self.part_size) + 2

    @property
    def save_seconds(self) -> float:
        """Unthrottled: every rank streams at rank_mbps in parallel."""
        return self.rank_bytes / MB / self.rank_mbps

    @property
    def heartbeats_per_rank(self) -> int:
        return 1 + int(self.save_seconds // HEARTBEAT_INTERVAL)

    # -- per save --------------------------------------------------------------------------
    @property
    def data_objects(self) -> int:
        return self.world * self.objects_per_rank

    @property
    def save_data_requests(self) -> int:
        return self.data_objects * self.requests_per_object

    @property
    def save_control_requests(self) -> int:
        """Per rank: the writer's fail-fast GET of the marker, its heartbeat PUTs. The
        coordinator: heartbeat at plan and commit, .metadata.{tag}, the commit's LIST of
        the checkpoint, HEAD of the marker, the marker PUT, the plain .metadata PUT,
        DeleteObjects of the heartbeats, and the Checkpointer's latest pointer."""
        keys = self.data_objects + self.world + 2
        per_rank = 1 + self.heartbeats_per_rank
        coordinator = 2 + 1 + math.ceil(keys / LIST_PAGE) + 1 + 1 + 1
        coordinator += math.ceil(self.world / LIST_PAGE) + 1
        return self.world * per_rank + coordinator

    @property
    def save_requests(self) -> int:
        return self.save_data_requests + self.save_control_requests

    def save_rate_per_partition(self) -> float:
        """Data requests per second per partition at full speed (the writes S3 counts)."""
        return self.save_data_requests / self.save_seconds / self.fanout

    def throttled_save_seconds(self) -> float:
        """The save's duration when the partitions' write rate, not bandwidth, binds."""
        limit = self.save_data_requests / (WRITES_PER_PARTITION * self.fanout)
        return max(self.save_seconds, limit)

    # -- per load --------------------------------------------------------------------------
    @property
    def load_data_requests_direct(self) -> int:
        """Each rank reads its shards whole-object (objects <= read_request_size are one
        GET); replicas read the same bytes again."""
        per_object = math.ceil(self.object_size / self.read_request_size)
        return self.data_objects * per_object

    @property
    def load_data_requests_fan_out(self) -> int:
        """Fan-out: each byte range is read once per group and broadcast; replicated
        shards are read once, whatever the number of replicas."""
        return math.ceil(self.load_data_requests_direct / self.replicas)

    @property
    def load_control_requests(self) -> int:
        """Every rank GETs the marker and .metadata once."""
        return 2 * self.world

    def load_rate_per_partition(self, fan_out: bool) -> float:
        data = self.load_data_requests_fan_out if fan_out else self.load_data_requests_direct
        return (data + self.load_control_requests) / self.save_seconds / self.fanout


RESUME_REQUESTS = 3
"""Checkpointer.load(step="latest"): GET s3ckpt.latest.json, one LIST after it
(start_after: one page whatever the run holds), HEAD of the marker. Coordinator only."""


def retention_cron_requests(runs: int, checkpoints: int, keys_per_checkpoint: int) -> int:
    """``s3ckpt prune`` over a bucket prefix: one paged listing of every key, one GET per
    commit marker (pins too), one paged listing of open uploads."""
    keys = runs * (checkpoints * keys_per_checkpoint + 1)
    return math.ceil(keys / LIST_PAGE) + runs * checkpoints + 1


def shallow_cron_requests(
    runs: int, checkpoints: int, keys_per_checkpoint: int, deletions_per_run: int = 0
) -> int:
    """``s3ckpt prune --scan shallow`` (the CLI's default) over a bucket prefix:

    * finding the runs: one delimited LIST of the root, one of each run (no marker read);
    * each run's catalog: one delimited LIST of the run (its checkpoint prefixes and control
      objects), one GET per commit marker, one LIST of open uploads;
    * confirming a plan that deletes (per run with deletions): each checkpoint to delete
      listed deeply (``ceil(keys / 1000)`` LISTs, a LIST of its uploads, a GET of its marker)
      and one HEAD to make the newest commit time exact.

    ``1 + R + R (2 + C) + R d (ceil(K/1000) + 2) + R [d > 0]``, with R runs, C checkpoints
    per run, K keys per checkpoint and d deletions per run.
    """
    page = math.ceil(runs / LIST_PAGE)
    runs_found = page + runs * math.ceil((checkpoints + 3) / LIST_PAGE)
    catalogs = runs * (math.ceil((checkpoints + 3) / LIST_PAGE) + checkpoints + 1)
    per_delete = math.ceil(keys_per_checkpoint / LIST_PAGE) + 2
    confirm = runs * (deletions_per_run * per_delete + (1 if deletions_per_run else 0))
    return runs_found + catalogs + confirm


def _fmt(n: float) -> str:
    if n >= 1e6:
        return f"{n / 1e6:.2f} M"
    if n >= 1e4:
        return f"{n / 1e3:.0f} k"
    return f"{n:,.0f}"


def table(base: Scenario, worlds: list[int]) -> str:
    """The markdown table of docs/scale.md for ``base`` at each world size."""
    rows = [
        "| ranks | requests / save | writes/s / partition (1 prefix) | same, fanout "
        f"{max(base.fanout, 16)} | save s (bandwidth) | save s (1 prefix, throttled) | "
        f"same, fanout {max(base.fanout, 16)} | GETs / load | GETs / load, {base.replicas or 1} "
        "replicas direct | same, fan-out |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    hashed = max(base.fanout, 16)
    for w in worlds:
        one = replace(base, world=w, fanout=1)
        many = replace(base, world=w, fanout=hashed)
        rep = replace(one, replicas=max(base.replicas, 1))
        direct = rep.load_data_requests_direct * rep.replicas + rep.load_control_requests
        fanned = rep.load_data_requests_direct + rep.load_control_requests
        rows.append(
            f"| {w:,} | {_fmt(one.save_requests)} | {_fmt(one.save_rate_per_partition())} | "
            f"{_fmt(many.save_rate_per_partition())} | {one.save_seconds:.1f} | "
            f"{one.throttled_save_seconds():.1f} | {many.throttled_save_seconds():.1f} | "
            f"{_fmt(one.load_data_requests_direct + one.load_control_requests)} | "
            f"{_fmt(direct)} | {_fmt(fanned)} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rank-gib", type=float, default=2.0, help="GiB saved per rank (2)")
    p.add_argument("--part-mib", type=int, default=16)
    p.add_argument("--object-mib", type=int, default=128)
    p.add_argument("--rank-mbps", type=float, default=1250.0)
    p.add_argument("--fanout", type=int, default=16, help="hashed fanout column (16)")
    p.add_argument("--replicas", type=int, default=8, help="DP replicas for the load columns")
    p.add_argument("--worlds", default="8,64,512,1024,2048,4096")
    args = p.parse_args(argv)
    base = Scenario(
        rank_bytes=int(args.rank_gib * GiB),
        part_size=args.part_mib * MiB,
        target_object_size=args.object_mib * MiB,
        rank_mbps=args.rank_mbps,
        fanout=args.fanout,
        replicas=args.replicas,
    )
    worlds = [int(w) for w in args.worlds.split(",")]
    print(table(base, worlds))
    print()
    print(
        "| retention cron over | keys / checkpoint | deep scan | shallow, plan deletes nothing "
        "| shallow, 1 deletion per run |"
    )
    print("|---|---:|---:|---:|---:|")
    for w in (8, 512, 4096):
        keys = replace(base, world=w).data_objects + 3
        n = retention_cron_requests(1000, 100, keys)
        s0 = shallow_cron_requests(1000, 100, keys)
        s1 = shallow_cron_requests(1000, 100, keys, 1)
        print(
            f"| 1,000 runs x 100 checkpoints, {w:,} ranks | {keys:,} | {_fmt(n)} | {_fmt(s0)} "
            f"| {_fmt(s1)} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
