"""Process entry points for multi-process tests (importable by spawned children)."""

from __future__ import annotations

import os
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

warnings.filterwarnings("ignore")

FULL_SHAPE = (37, 12)


def full_tensor() -> torch.Tensor:
    return torch.arange(FULL_SHAPE[0] * FULL_SHAPE[1], dtype=torch.float32).reshape(FULL_SHAPE) / 7


def full_int() -> torch.Tensor:
    return torch.arange(100, dtype=torch.int64) * 3


def rank_tensor(rank: int) -> torch.Tensor:
    return torch.full((5, 3), float(rank) + 0.5) + torch.arange(15.0).reshape(5, 3)


def _init(rank: int, world_size: int, port: int) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # DCP's process executor rendezvouses its daemon on MASTER_ADDR (else the host's FQDN,
    # which need not resolve in a sandbox).
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )


def save_worker(rank: int, world_size: int, port: int, url: str, fanout: int = 0) -> None:
    """A world-size ``world_size`` save to ``url``; ``fanout`` > 0: with hashed prefixes."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from s3ckpt import HashedPrefixes, S3StorageWriter

    _init(rank, world_size, port)
    try:
        mesh = init_device_mesh("cpu", (world_size,))
        sd = {
            "model.w": distribute_tensor(full_tensor(), mesh, [Shard(0)]),
            "model.i": distribute_tensor(full_int(), mesh, [Shard(0)]),
            "replicated": torch.ones(4) * 2,
            f"rank{rank}.state": rank_tensor(rank),
            "step": 11,
        }
        layout = HashedPrefixes(fanout) if fanout else None
        dcp.save(sd, storage_writer=S3StorageWriter(url, step=11, prefix_strategy=layout))
    finally:
        dist.destroy_process_group()


def load_worker(rank: int, world_size: int, port: int, url: str, saved_world: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from s3ckpt import S3StorageReader

    _init(rank, world_size, port)
    try:
        mesh = init_device_mesh("cpu", (world_size,))
        sd = {
            "model.w": distribute_tensor(torch.zeros(FULL_SHAPE), mesh, [Shard(0)]),
            "model.i": distribute_tensor(torch.zeros(100, dtype=torch.int64), mesh, [Shard(0)]),
            "replicated": torch.zeros(4),
            "step": 0,
        }
        for r in range(saved_world):
            sd[f"rank{r}.state"] = torch.zeros(5, 3)
        dcp.load(sd, storage_reader=S3StorageReader(url))
        assert torch.equal(sd["model.w"].full_tensor(), full_tensor()), "model.w"
        expected_local = distribute_tensor(full_tensor(), mesh, [Shard(0)]).to_local()
        assert torch.equal(sd["model.w"].to_local(), expected_local), "local shard"
        assert torch.equal(sd["model.i"].full_tensor(), full_int()), "model.i"
        assert torch.equal(sd["replicated"], torch.ones(4) * 2)
        assert sd["step"] == 11
        for r in range(saved_world):
            assert torch.equal(sd[f"rank{r}.state"], rank_tensor(r)), f"rank{r}.state"
    finally:
        dist.destroy_process_group()


def failing_save_worker(rank: int, world_size: int, port: int, url: str) -> None:
    """Rank 1 fails mid-save (its store refuses part uploads); rank 0 succeeds."""
    from s3ckpt import S3StorageWriter

    _init(rank, world_size, port)
    try:
        writer = S3StorageWriter(url)
        if rank == 1:

            def refuse(*args: object, **kwargs: object) -> object:
                raise OSError("simulated disk-less failure on rank 1")

            writer.store.put = refuse  # type: ignore[method-assign]
            writer.store.upload_part = refuse  # type: ignore[method-assign]
        sd = {f"rank{rank}.x": torch.randn(64, 64), "shared": torch.ones(3)}
        try:
            dcp.save(sd, storage_writer=writer)
        except BaseException as exc:  # DCP raises CheckpointException (a BaseException)
            assert "simulated" in str(exc), str(exc)
            return
        raise AssertionError("save should have failed on every rank")
    finally:
        dist.destroy_process_group()
