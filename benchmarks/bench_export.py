#!/usr/bin/env python
"""Peak memory of ``s3ckpt export`` (safetensors) against shard size, on a moto S3 server.

The claim under test: exporting streams tensors into the shards' multipart uploads, so
the client's memory is bounded by the read windows plus the upload buffers, *not* by the
shard size or the model size (torch's HF writer and TorchTitan's export build each shard
in memory or on local disk first).

What it does:

1. Starts ``python -m moto.server`` on 127.0.0.1 as a separate process, creates a bucket,
   and saves a deterministic checkpoint of ``--size-mib`` MiB (``--tensor-mib`` fp32
   tensors under ``model.``) with ``S3StorageWriter``.
2. For each ``--shard-sizes`` value, runs one export in a **fresh process**: imports,
   opens the checkpoint, resets the kernel's peak-RSS counter (``/proc/self/clear_refs``),
   takes an RSS baseline, then runs ``export_checkpoint(..., only="model")`` with a 10 ms
   RSS sampler. Reports wall time, MB/s (tensor bytes / wall, MB = 10**6 B), peak RSS
   above the baseline, and checks the shard count and the index's ``total_size``. The
   export prefix is deleted afterwards.
3. Prints a markdown table and the bound the design predicts:
   ``2 * max(read_window, largest tensor) + max_inflight_bytes + part_size``.

Usage::

    .venv/bin/python benchmarks/bench_export.py                      # 1 GiB, 3 shard sizes
    .venv/bin/python benchmarks/bench_export.py --size-mib 128 --shard-sizes 50MB,1GB
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from typing import Any

MiB = 1024 * 1024
MB = 1_000_000
RESULT_TAG = "BENCH_RESULT "

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_dcp  # noqa: E402 - the shared RSS sampler, port and child environment


# -- worker: one export per process ---------------------------------------------------------------
def worker(spec: dict[str, Any]) -> dict[str, Any]:
    warnings.filterwarnings("ignore")
    from s3ckpt.config import TransferConfig
    from s3ckpt.tools import export_checkpoint, inspect_checkpoint

    tc = TransferConfig(max_concurrency=spec["concurrency"], read_timeout=600.0)
    info = inspect_checkpoint(
        spec["ckpt"], transfer_config=tc
    )  # imports, client, metadata: outside the timing
    t0 = time.perf_counter()
    with bench_dcp._RssSampler() as rss:
        res = export_checkpoint(
            spec["ckpt"],
            spec["dest"],
            only="model",
            max_shard_size=spec["shard"],
            read_window=spec["read_window"],
            transfer_config=tc,
        )
    wall = time.perf_counter() - t0
    return {
        "shard": spec["shard"],
        "wall_s": wall,
        "mb_s": res.tensor_bytes / MB / wall,
        "peak_mib": (rss.peak_kib - rss.baseline_kib) / 1024,
        "baseline_mib": rss.baseline_kib / 1024,
        "shards": len(res.files) - 1,
        "tensor_bytes": res.tensor_bytes,
        "expected_bytes": info.tensor_bytes,
    }


# -- driver ---------------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--tensor-mib", type=int, default=32)
    ap.add_argument("--shard-sizes", default="128MB,512MB,5GB")
    ap.add_argument("--read-window-mib", type=int, default=64)
    ap.add_argument(
        "--concurrency",
        type=int,
        default=8,
        help="TransferConfig.max_concurrency for the setup save and the exports (lower it "
        "when moto drops connections on a loaded machine)",
    )
    ap.add_argument("--out", default=None, help="write every result as JSON here")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(RESULT_TAG + json.dumps(worker(json.loads(args.worker))), flush=True)
        return 0

    port = bench_dcp._free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = bench_dcp._child_env(endpoint)
    os.environ.update(env)
    log = tempfile.NamedTemporaryFile(prefix="moto-", suffix=".log", delete=False)  # noqa: SIM115
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    failed = False
    try:
        import boto3
        import torch
        import torch.distributed.checkpoint as dcp

        from s3ckpt import S3StorageWriter
        from s3ckpt.config import TransferConfig

        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        for _ in range(300):
            try:
                client.list_buckets()
                break
            except Exception:
                time.sleep(0.1)
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        client.create_bucket(Bucket=bucket)
        ckpt = f"s3://{bucket}/run/step_1"
        tc = TransferConfig(max_concurrency=args.concurrency, read_timeout=600.0)
        n = max(1, args.size_mib // args.tensor_mib)
        numel = args.tensor_mib * MiB // 4
        g = torch.Generator().manual_seed(0)
        sd = {"model": {f"layers.{i}.weight": torch.randn(numel, generator=g) for i in range(n)}}
        warnings.filterwarnings("ignore")
        t0 = time.perf_counter()
        try:
            dcp.save(sd, storage_writer=S3StorageWriter(ckpt, transfer_config=tc), no_dist=True)
        except Exception as exc:
            from s3ckpt.errors import find_s3ckpt_error

            msg = f"saving the checkpoint failed: {find_s3ckpt_error(exc) or exc}"
            raise SystemExit(msg) from exc
        print(f"saved {n} x {args.tensor_mib} MiB to {ckpt} in {time.perf_counter() - t0:.1f} s")
        del sd
        window = args.read_window_mib * MiB
        bound = (
            2 * max(window, args.tensor_mib * MiB) + tc.max_inflight_bytes + tc.part_size
        ) / MiB
        results = []
        for shard in args.shard_sizes.split(","):
            dest = f"s3://{bucket}/export-{shard}"
            spec = {
                "ckpt": ckpt,
                "dest": dest,
                "shard": shard,
                "read_window": window,
                "concurrency": args.concurrency,
            }
            proc = subprocess.run(
                [sys.executable, __file__, "--worker", json.dumps(spec)],
                env=env,
                capture_output=True,
                text=True,
            )
            line = next((x for x in proc.stdout.splitlines() if x.startswith(RESULT_TAG)), None)
            if proc.returncode or line is None:
                failed = True
                print(
                    f"export with shards of {shard} FAILED:\n{proc.stderr[-3000:]}", file=sys.stderr
                )
                continue
            r = json.loads(line[len(RESULT_TAG) :])
            index = json.loads(
                client.get_object(
                    Bucket=bucket, Key=f"export-{shard}/model.safetensors.index.json"
                )["Body"].read()
            )
            r["valid"] = index["metadata"]["total_size"] == r["expected_bytes"]
            failed |= not r["valid"]
            results.append(r)
            keys = [
                {"Key": o["Key"]}
                for o in client.list_objects_v2(Bucket=bucket, Prefix=f"export-{shard}/").get(
                    "Contents", []
                )
            ]
            if keys:
                client.delete_objects(Bucket=bucket, Delete={"Objects": keys})
        load = os.getloadavg()[0]
        print(
            f"\nexport of {args.size_mib} MiB ({n} fp32 tensors of {args.tensor_mib} MiB), "
            f"read window {args.read_window_mib} MiB, {args.concurrency} threads, "
            f"(max_inflight_bytes {tc.max_inflight_bytes // MiB} MiB, part {tc.part_size // MiB} "
            f"MiB); load average {load:.1f}\n"
        )
        print("| max shard size | shards | wall s | MB/s | peak RSS above baseline | valid |")
        print("|---|---|---|---|---|---|")
        for r in results:
            print(
                f"| {r['shard']} | {r['shards']} | {r['wall_s']:.1f} | {r['mb_s']:.0f} | "
                f"{r['peak_mib']:.0f} MiB | {'yes' if r['valid'] else 'NO'} |"
            )
        print(f"\npredicted bound: {bound:.0f} MiB (2 read windows + upload buffers)")
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"results": results, "bound_mib": bound}, f, indent=2)
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
        os.unlink(log.name)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
