"""gpu_check.py's fan-out phase: one replicated checkpoint, loaded by one process per device.

The concept: what a data-parallel resume does, measured once per mode. The orchestrator
saves a replicated state dict (:func:`save_replicated`) and starts the ranks
(:func:`run_ranks`); each rank (:func:`rank_main`) joins the group (NCCL on CUDA, one
device per rank; gloo in the CPU dry run), loads directly, then with
``S3StorageReader(fan_out=True)``, and checks every tensor's CRC32C against the saver's.

Decisions: ranks are forked from a forkserver that imports torch and s3ckpt once (started
early by gpu_check.py so its imports overlap the main process's work; a forkserver holds
no CUDA context, so forking from it is safe). GETs and GET bytes come from s3sim's own
counters (reset by rank 0 between two barriers before each load), so no proxy sits in the
data path. The ranks are killed when the budget runs out: a stuck collective never hangs
the run. Only torch APIs of 2.11 and earlier.
"""

from __future__ import annotations

import http.client
import json
import os
import time
from collections.abc import Callable
from typing import Any

__all__ = [
    "MODES",
    "rank_main",
    "run_ranks",
    "save_replicated",
    "server_gets",
    "sim_call",
    "start_forkserver",
    "summarise",
]

MiB = 1024 * 1024
MODES = ("direct", "fan_out")
N_TENSORS = 16


def sim_call(endpoint: str, method: str, path: str) -> Any:
    """s3sim's control API (``/_s3sim/stats``, ``/_s3sim/reset``) from any process."""
    host, port = endpoint.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=b"" if method == "POST" else None)
        payload = conn.getresponse().read()
    finally:
        conn.close()
    return json.loads(payload) if payload else None


def server_gets(endpoint: str) -> dict[str, int]:
    """GetObject requests and the bytes they returned, since s3sim's last reset."""
    op = sim_call(endpoint, "GET", "/_s3sim/stats")["ops"].get("GetObject", {})
    return {"gets": int(op.get("count", 0)), "get_bytes": int(op.get("bytes_out", 0))}


def start_forkserver() -> None:
    """Start the ranks' forkserver now (idempotent): torch and s3ckpt imported once."""
    import multiprocessing.forkserver

    import torch.multiprocessing as mp

    mp.get_context("forkserver").set_forkserver_preload(
        ["torch", "torch.distributed.checkpoint", "boto3", "s3ckpt"]
    )
    multiprocessing.forkserver.ensure_running()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _crc(t: Any) -> int:
    import torch

    from s3ckpt._crc import crc32c

    return crc32c(memoryview(t.detach().cpu().contiguous().view(torch.uint8).numpy()))


def save_replicated(url: str, nbytes: int, s3_config: Any) -> dict[str, Any]:
    """Save ``nbytes`` of seeded fp32 in 16 tensors to ``url``; the ranks' spec part."""
    import torch
    import torch.distributed.checkpoint as dcp

    from s3ckpt import S3StorageWriter

    numel = max(1, nbytes // 4 // N_TENSORS)
    gen = torch.Generator().manual_seed(1)
    sd = {f"p{i}": torch.randn(numel, generator=gen) for i in range(N_TENSORS)}
    dcp.save(sd, no_dist=True, storage_writer=S3StorageWriter(url, s3_config=s3_config))
    return {"url": url, "numel": numel, "crcs": {k: _crc(v) for k, v in sd.items()}}


def run_ranks(
    spec: dict[str, Any], time_left: Callable[[], float], procs: list[Any]
) -> list[dict[str, Any]]:
    """Start ``spec["world"]`` ranks, wait for them within ``time_left()``, return each
    rank's record. ``procs`` receives the processes (for a watchdog to kill).

    Raises:
        TimeoutError: the ranks were still running when the budget ran out (killed).
        torch.multiprocessing.ProcessRaisedException: a rank failed (the others stopped).
    """
    import tempfile

    import torch.multiprocessing as mp

    start_forkserver()
    with tempfile.TemporaryDirectory(prefix="gpu_check_fanout_") as out:
        spec = {**spec, "out": out, "port": _free_port()}
        ctx = mp.start_processes(
            rank_main, args=(spec,), nprocs=spec["world"], join=False, start_method="forkserver"
        )
        procs.extend(ctx.processes)
        while not ctx.join(timeout=1.0):
            if time_left() < 0:
                for p in ctx.processes:
                    p.kill()
                raise TimeoutError(
                    f"fan-out: {spec['world']} ranks still loading {spec['url']} when the "
                    "budget ran out (killed); raise --budget-s or lower --fanout-size-mib"
                )
        ranks = []
        for r in range(spec["world"]):
            with open(os.path.join(out, f"rank{r}.json")) as f:
                ranks.append(json.load(f))
    return ranks


def summarise(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode: rank 0's wall (the slowest rank's, between barriers), the server's GETs,
    the bytes the ranks read and received; then fan-out over direct."""
    out: dict[str, Any] = {}
    for mode in MODES:
        out[mode] = {
            "wall_s": ranks[0][mode]["wall_s"],
            **ranks[0][mode]["server"],
            "bytes_read": sum(r[mode]["bytes_read"] for r in ranks),
            "bytes_received": sum(r[mode]["bytes_received"] for r in ranks),
        }
    d, f = out["direct"], out["fan_out"]
    out["fan_out_over_direct"] = {
        "get_bytes": f["get_bytes"] / d["get_bytes"] if d["get_bytes"] else None,
        "wall": f["wall_s"] / d["wall_s"] if d["wall_s"] else None,
    }
    return out


def rank_main(rank: int, spec: dict[str, Any]) -> None:
    """One rank: join the group, load directly then with fan-out, check, record."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from s3ckpt import S3Config, S3StorageReader

    os.environ.update(spec["env"])
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    kwargs: dict[str, Any] = {}
    device = torch.device("cpu")
    if spec["cuda"]:
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        kwargs["device_id"] = device  # NCCL knows its device: barriers use it
    dist.init_process_group(
        "nccl" if spec["cuda"] else "gloo",
        init_method=f"tcp://127.0.0.1:{spec['port']}",
        rank=rank,
        world_size=spec["world"],
        **kwargs,
    )
    record: dict[str, Any] = {}
    try:
        sd = {k: torch.zeros(spec["numel"], device=device) for k in spec["crcs"]}
        for mode in MODES:
            reader = S3StorageReader(
                spec["url"],
                s3_config=S3Config(endpoint_url=spec["endpoint"]),
                fan_out=mode == "fan_out",
                fan_out_piece_size=spec["piece_mib"] * MiB,
            )
            for t in sd.values():
                t.zero_()
            dist.barrier()
            if rank == 0:  # the marker and .metadata were read above: data GETs only
                sim_call(spec["endpoint"], "POST", "/_s3sim/reset")
            dist.barrier()
            t0 = time.perf_counter()
            dcp.load(sd, storage_reader=reader)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            dist.barrier()
            wall = time.perf_counter() - t0
            server = server_gets(spec["endpoint"]) if rank == 0 else {}
            dist.barrier()  # nobody reads (the next reader's metadata) before rank 0 counted
            bad = [k for k, v in sd.items() if _crc(v) != spec["crcs"][k]]
            if bad:
                raise AssertionError(
                    f"rank {rank} ({mode}) loaded wrong bytes from {spec['url']} for {bad[:3]}"
                )
            record[mode] = {
                "wall_s": wall,
                "bytes_read": reader.bytes_read,
                "bytes_received": reader.bytes_received,
                "server": server,
            }
        with open(os.path.join(spec["out"], f"rank{rank}.json"), "w") as f:
            json.dump(record, f)
    finally:
        dist.destroy_process_group()
