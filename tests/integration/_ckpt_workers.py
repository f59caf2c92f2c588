"""Spawn targets and a child script for the Checkpointer tests (FSDP2 on CPU with gloo)."""

from __future__ import annotations

import json
import os
import sys
import warnings
from typing import Any

import torch
import torch.distributed as dist

warnings.filterwarnings("ignore")

GLOBAL_BATCH = 8
IN, HIDDEN, OUT = 16, 32, 8


class TrainState:
    """A Stateful train state: the step and the data RNG."""

    def __init__(self) -> None:
        self.step = 0
        self.seen = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "seen": self.seen}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.step = int(sd["step"])
        self.seen = int(sd["seen"])


def make_model() -> torch.nn.Module:
    torch.manual_seed(1234)
    return torch.nn.Sequential(
        torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUT)
    )


def batch(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step`` (deterministic), this rank's slice of it."""
    g = torch.Generator().manual_seed(step)
    x = torch.randn(GLOBAL_BATCH, IN, generator=g)
    y = torch.randn(GLOBAL_BATCH, OUT, generator=g)
    per = GLOBAL_BATCH // world
    return x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]


def _init(rank: int, world: int, port: int) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )


def _full_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    msd, osd = get_state_dict(
        model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    return {"model": msd, "optim": osd}


def train_worker(
    rank: int,
    world: int,
    port: int,
    url: str,
    total_steps: int,
    save_at: list[int],
    resume: bool,
    out_dir: str,
) -> None:
    """Train an FSDP2 model ``total_steps`` steps, async-saving at ``save_at``.

    With ``resume``, first loads "latest". Rank 0 writes ``out_dir/result.json`` (losses
    per step, the step resumed from) and ``out_dir/state_<step>.pt`` (full model + optimizer
    state right after resuming, and after each save's step).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from s3ckpt import Checkpointer

    _init(rank, world, port)
    try:
        mesh = init_device_mesh("cpu", (world,))
        model = make_model()
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        ts = TrainState()
        result: dict[str, Any] = {"losses": {}, "resumed_from": None, "blocked": {}}
        with Checkpointer(url) as ckpt:
            if resume:
                loaded = ckpt.load(model, opt, ts)
                result["resumed_from"] = loaded
                assert loaded == ts.step, (loaded, ts.step)
                state = _full_state(model, opt)
                if rank == 0:
                    torch.save(state, os.path.join(out_dir, f"state_{loaded}.pt"))
            handle = None
            for step in range(ts.step + 1, total_steps + 1):
                if handle is not None:
                    handle.staged.result()
                x, y = batch(step, rank, world)
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad()
                ts.step = step
                ts.seen += GLOBAL_BATCH
                total = loss.detach().clone()
                dist.all_reduce(total)
                result["losses"][step] = (total / world).item()
                if step in save_at:
                    state = _full_state(model, opt)
                    if rank == 0:
                        torch.save(state, os.path.join(out_dir, f"state_{step}.pt"))
                    handle = ckpt.async_save(step, model, opt, ts, metrics={"loss": loss.item()})
                    handle.committed.add_done_callback(
                        lambda _f, h=handle: result["blocked"].__setitem__(
                            h.step, h.blocked_seconds
                        )
                    )
        if rank == 0:
            with open(os.path.join(out_dir, "result.json"), "w") as f:
                json.dump(result, f)
    finally:
        dist.destroy_process_group()


class StallingStore:
    """Wraps a real store; the first ``upload_part`` of a checkpoint named ``stall_in``
    prints UPLOADING (and sets ``uploading``) and blocks forever, so the parent can SIGKILL
    mid-upload."""

    def __init__(self, inner: Any, stall_in: str, uploading: Any = None) -> None:
        self._inner = inner
        self._stall_in = stall_in
        self._uploading = uploading

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def upload_part(self, key: str, *args: Any, **kwargs: Any) -> Any:
        if self._stall_in in key:
            print("UPLOADING", flush=True)
            if self._uploading is not None:
                self._uploading.set()
            import time

            time.sleep(3600)
        return self._inner.upload_part(key, *args, **kwargs)


def kill_child(url: str, uploading: Any = None) -> None:
    """Single process: sync-save step 1, then async-save step 2 and stall in its upload
    (setting the ``uploading`` event, if given, when it gets there)."""
    from s3ckpt import Checkpointer, TransferConfig
    from s3ckpt.store import open_store

    tc = TransferConfig(part_size=5 * 1024 * 1024, target_object_size=8 * 1024 * 1024)
    store, _ = open_store(url, transfer_config=tc)
    torch.manual_seed(0)
    model = torch.nn.Linear(1024, 4096)  # 16 MiB of weights: several parts
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ts = TrainState()
    ckpt = Checkpointer(
        url, transfer_config=tc, store=StallingStore(store, "step_000000002", uploading)
    )
    ts.step = 1
    ckpt.save(1, model, opt, ts)
    with torch.no_grad():
        model.weight.add_(1.0)
    ts.step = 2
    ckpt.async_save(2, model, opt, ts)
    print("SAVING", flush=True)
    import time

    time.sleep(3600)


if __name__ == "__main__":
    kill_child(sys.argv[1])
