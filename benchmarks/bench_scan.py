"""The retention cron's requests, deep scan against shallow scan, counted by s3sim.

Builds N runs x M checkpoints x R rank objects on :mod:`benchmarks.s3sim` (in memory, its
own process, shaping off): each checkpoint is what a commit leaves (R data objects,
``.metadata.{tag}``, the plain ``.metadata`` and a valid ``s3ckpt.json`` listing the data
objects), PUT directly and in parallel, not saved through DCP. Then the cron's plan (a dry
``prune_runs`` with ``KeepLast(M - 1)``: one deletion per run, the steady state) runs with
``scan="deep"`` and ``scan="shallow"``, and the server's own counters
(``/_s3sim/stats``) give the requests by operation, beside the model's prediction
(:func:`benchmarks.scale_model.shallow_cron_requests`) for the same sizes. Both plans must
agree; the script exits 1 if they do not.

    .venv/bin/python -m benchmarks.bench_scan --runs 4 --checkpoints 10 --ranks 256

Request counts do not depend on the machine's load; times are printed for information only.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks.s3sim import S3Sim
from benchmarks.scale_model import retention_cron_requests, shallow_cron_requests
from s3ckpt.config import S3Config
from s3ckpt.format._manifest import Manifest, ObjectRecord
from s3ckpt.format._names import MANIFEST_NAME, METADATA_NAME, data_name, items_name
from s3ckpt.format._names import metadata_name as per_save_metadata
from s3ckpt.retention import KeepLast, RetentionOptions, prune_runs
from s3ckpt.store import Location
from s3ckpt.store.s3 import S3Store
from s3ckpt.uri import StoreURL

__all__ = ["build", "main", "measure"]

BUCKET = "scan"
META = b"metadata"


def _checkpoint(prefix: str, step: int, ranks: int) -> list[tuple[str, bytes]]:
    tag = secrets.token_hex(4)
    objects = [ObjectRecord(data_name(r, 0, tag), 16, r) for r in range(ranks)]
    puts = [(prefix + o.name, b"x" * 16) for o in objects]
    puts.append((prefix + per_save_metadata(tag), META))
    puts.append((prefix + METADATA_NAME, META))
    from s3ckpt._crc import crc32c  # the marker records the metadata's checksum

    m = Manifest(
        save_id=tag + secrets.token_hex(12),
        created=time.time(),
        world_size=ranks,
        metadata_key=per_save_metadata(tag),
        metadata_crc32c=crc32c(META),
        metadata_size=len(META),
        objects=tuple(objects),
        items=(),
        step=step,
        metrics={"loss": 1.0 / (step + 1)},
    )
    m, records = m.split_items(items_name(tag))
    puts.append((prefix + items_name(tag), records))
    return [*puts, (prefix + MANIFEST_NAME, m.to_json())]


def build(store: S3Store, runs: int, checkpoints: int, ranks: int) -> int:
    """PUT the fleet (markers last within each checkpoint); returns the objects written."""
    batches = [
        _checkpoint(f"fleet/run-{r:04d}/step_{s:09d}/", s, ranks)
        for r in range(runs)
        for s in range(1, checkpoints + 1)
    ]
    with ThreadPoolExecutor(16) as pool:
        for batch in batches:
            list(pool.map(lambda kv: store.put(kv[0], kv[1]), batch[:-1]))
            store.put(*batch[-1])
    for r in range(runs):
        store.put(f"fleet/run-{r:04d}/s3ckpt.latest.json", b"{}")
    return sum(len(b) for b in batches) + runs


def measure(sim: S3Sim, store: S3Store, keep: int, scan: str) -> dict[str, Any]:
    """One dry cron over ``fleet/``: its plan and the server's request counts."""
    sim.reset_stats()
    t0 = time.perf_counter()
    root = StoreURL("s3", BUCKET, "fleet/")
    outcomes = list(
        prune_runs(Location(root, store), KeepLast(keep), options=RetentionOptions(scan=scan))
    )
    seconds = time.perf_counter() - t0
    ops = {k: v["count"] for k, v in sim.stats()["ops"].items() if v.get("count")}
    deleted = sorted(
        f"{o.run.prefix}{c.name}" for o in outcomes if o.result for c in o.result.plan.delete
    )
    return {"scan": scan, "ops": ops, "total": sum(ops.values()), "s": seconds, "delete": deleted}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=4)
    p.add_argument("--checkpoints", type=int, default=10)
    p.add_argument("--ranks", type=int, default=256, help="data objects per checkpoint")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    for k, v in {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x"}.items():
        os.environ.setdefault(k, v)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    with S3Sim(buckets=[BUCKET]) as sim:
        store = S3Store(BUCKET, S3Config(endpoint_url=sim.endpoint))
        n = build(store, args.runs, args.checkpoints, args.ranks)
        keep = args.checkpoints - 1
        results = [measure(sim, store, keep, s) for s in ("deep", "shallow")]
    keys = args.ranks + 3
    model = {
        "deep (docs/scale.md formula: one listing)": retention_cron_requests(
            args.runs, args.checkpoints, keys
        ),
        "shallow": shallow_cron_requests(args.runs, args.checkpoints, keys, 1),
    }
    same = results[0]["delete"] == results[1]["delete"]
    if args.json:
        print(json.dumps({"objects": n, "results": results, "model": model, "same": same}))
    else:
        print(
            f"{args.runs} runs x {args.checkpoints} checkpoints x {args.ranks} ranks "
            f"({n:,} objects), dry cron with KeepLast({keep}); plans agree: {same}"
        )
        ops = sorted({o for r in results for o in r["ops"]})
        print("| scan | " + " | ".join(ops) + " | total | model | seconds |")
        print("|---|" + "---:|" * (len(ops) + 3))
        for r, m in zip(results, model.values(), strict=True):
            cells = " | ".join(str(r["ops"].get(o, 0)) for o in ops)
            print(f"| {r['scan']} | {cells} | {r['total']} | {m} | {r['s']:.1f} |")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
