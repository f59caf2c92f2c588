"""Rank entry points of the fan-out load tests (importable by the forked ranks).

Each rank writes what it saw (counters, or the error it raised) to ``{out}/rank{r}.json``,
so the test process can assert on every rank, not only on the ones that fail.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from tests.integration._workers import FULL_SHAPE, _init, full_int, full_tensor, rank_tensor

N_TENSORS = 8
TENSOR_NUMEL = 64 * 1024  # 256 KiB of float32 each: 2 MiB in all


def replicated_state() -> dict[str, Any]:
    """What a data-parallel job saves: every tensor whole, plus non-tensor items."""
    sd: dict[str, Any] = {
        f"layer{i}.w": torch.arange(TENSOR_NUMEL, dtype=torch.float32) * (i + 1) / 7
        for i in range(N_TENSORS)
    }
    sd["layer0.b"] = torch.arange(10, dtype=torch.int64)
    sd["step"] = 42
    sd["train_state"] = {"lr": 0.125, "tokens": [1, 2, 3]}
    return sd


def blank_replicated() -> dict[str, Any]:
    sd = replicated_state()
    for k, v in sd.items():
        if isinstance(v, torch.Tensor):
            sd[k] = torch.zeros_like(v)
    sd["step"] = 0
    sd["train_state"] = {"lr": 0.0, "tokens": []}
    return sd


def _write(out: str, rank: int, record: dict[str, Any]) -> None:
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


def _reader(url: str, endpoint: str, **kw: Any) -> Any:
    from s3ckpt import S3Config, S3StorageReader

    return S3StorageReader(url, s3_config=S3Config(endpoint_url=endpoint), **kw)


def replicated_load_worker(
    rank: int, world: int, port: int, url: str, endpoints: dict[str, str], out: str
) -> None:
    """Every rank loads the whole replicated checkpoint twice, reading directly through
    ``endpoints["direct"]``, then with fan_out through ``endpoints["fan_out"]``; checks
    every value both times."""
    _init(rank, world, port)
    try:
        want = replicated_state()
        record = {}
        for mode in ("direct", "fan_out"):
            sd = blank_replicated()
            reader = _reader(url, endpoints[mode], fan_out=mode == "fan_out")
            dcp.load(sd, storage_reader=reader)
            for k, v in want.items():
                if isinstance(v, torch.Tensor):
                    assert torch.equal(sd[k], v), (mode, k)
                else:
                    assert sd[k] == v, (mode, k, sd[k])
            record[mode] = {"bytes_read": reader.bytes_read, "received": reader.bytes_received}
        _write(out, rank, record)
    finally:
        dist.destroy_process_group()


def resharded_load_worker(
    rank: int, world: int, port: int, url: str, saved_world: int, piece: int, out: str
) -> None:
    """Load the checkpoint of ``tests.integration._workers.save_worker`` (DTensor shards,
    a replicated tensor, per-rank tensors, an int) on ``world`` ranks with fan_out and
    pieces of ``piece`` bytes; then a part of it with ``no_dist=True``."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from s3ckpt import S3StorageReader

    _init(rank, world, port)
    try:
        mesh = init_device_mesh("cpu", (world,))
        sd: dict[str, Any] = {
            "model.w": distribute_tensor(torch.zeros(FULL_SHAPE), mesh, [Shard(0)]),
            "model.i": distribute_tensor(torch.zeros(100, dtype=torch.int64), mesh, [Shard(0)]),
            "replicated": torch.zeros(4),
            "step": 0,
        }
        # Rank r < saved_world loads saved rank r's own tensor, which no other rank loads: a
        # direct read beside the shared ones.
        own = [rank] if rank < saved_world else []
        for r in own:
            sd[f"rank{r}.state"] = torch.zeros(5, 3)
        reader = S3StorageReader(url, fan_out=True, fan_out_piece_size=piece)
        dcp.load(sd, storage_reader=reader)
        expected = distribute_tensor(full_tensor(), mesh, [Shard(0)]).to_local()
        assert torch.equal(sd["model.w"].to_local(), expected), "model.w"
        assert torch.equal(sd["model.i"].full_tensor(), full_int()), "model.i"
        assert torch.equal(sd["replicated"], torch.ones(4) * 2), "replicated"
        assert sd["step"] == 11
        for r in own:
            assert torch.equal(sd[f"rank{r}.state"], rank_tensor(r)), f"rank{r}.state"
        # no_dist=True in the same job: each rank plans alone, so it reads directly.
        alone: dict[str, Any] = {"replicated": torch.zeros(4), "step": 0}
        solo = S3StorageReader(url, fan_out=True, fan_out_piece_size=piece)
        dcp.load(alone, storage_reader=solo, no_dist=True)
        assert torch.equal(alone["replicated"], torch.ones(4) * 2) and alone["step"] == 11
        assert solo.bytes_received == 0 and solo.bytes_read > 0
        _write(out, rank, {"bytes_read": reader.bytes_read, "received": reader.bytes_received})
    finally:
        dist.destroy_process_group()


def failing_load_worker(
    rank: int,
    world: int,
    port: int,
    url: str,
    piece: int,
    failing_rank: int | None,
    skip: tuple[int, str] | None,
    out: str,
) -> None:
    """A fan-out load that must fail on every rank: the checkpoint is corrupted, or
    (``failing_rank``) that rank's ranged GETs are refused. ``skip = (n, fqn)``: ranks
    ``>= n`` do not load ``fqn``. Records the errors DCP gathered."""
    from torch.distributed.checkpoint.api import CheckpointException

    from s3ckpt import S3StorageReader
    from s3ckpt.errors import EndpointError

    _init(rank, world, port)
    try:
        reader = S3StorageReader(url, fan_out=True, fan_out_piece_size=piece)
        if rank == failing_rank:
            bucket = reader.store.bucket

            def refuse(key: str, *args: Any, **kwargs: Any) -> Any:
                raise EndpointError(
                    "simulated: connection refused", bucket=bucket, key=key, rank=rank
                )

            reader.store.open_range = refuse
        sd = blank_replicated()
        if skip is not None and rank >= skip[0]:
            del sd[skip[1]]
        try:
            dcp.load(sd, storage_reader=reader)
        except CheckpointException as exc:
            _write(out, rank, {"failures": _failures(exc)})
            return
        _write(out, rank, {"failures": None})
    finally:
        dist.destroy_process_group()


def _failures(exc: BaseException) -> dict[str, str]:
    """``{rank: "ErrorType: message"}`` of DCP's gathered exception."""
    out = {}
    for r, (err, _trace) in getattr(exc, "failures", {}).items():
        out[str(r)] = f"{type(err).__name__}: {err}"
    return out


class TrainState:
    """A Stateful train state (what the Checkpointer takes)."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.epoch = sd["epoch"]


def checkpointer_worker(rank: int, world: int, port: int, run: str, endpoint: str) -> None:
    """A data-parallel job: every rank holds the same model; the Checkpointer saves it and
    loads it back with ``fan_out=True`` on its own process group."""
    from s3ckpt import Checkpointer, S3Config

    _init(rank, world, port)
    try:
        torch.manual_seed(3)
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
        # The caller counts the data GETs of the load. On moto (which accepts a wrong
        # CRC32C) verify_after_write is on by default and the save re-reads each data
        # object before its marker; that read is the save's, so it is off here.
        cfg = S3Config(endpoint_url=endpoint, verify_after_write=False)
        with Checkpointer(run, s3_config=cfg) as ckpt:
            ckpt.save(5, model, train_state=TrainState(2))
            torch.manual_seed(4)
            fresh = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
            train_state = TrainState(0)
            assert ckpt.load(fresh, None, train_state, fan_out=True) == 5
        for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True):
            assert torch.equal(a, b)
        assert train_state.epoch == 2, train_state.epoch
    finally:
        dist.destroy_process_group()
