"""FSDP2 on CPU (gloo): train, async-save to S3, resume at another world size.

    torchrun --nproc_per_node 2 examples/fsdp2_gloo.py     # save on 2 ranks, load on 1
    torchrun --nproc_per_node 1 examples/fsdp2_gloo.py     # save on 1 rank, load on 2
    torchrun --nproc_per_node 2 examples/fsdp2_gloo.py --url s3://bucket/runs

The ranks train a small model sharded by ``fully_shard`` and async-save it through a
Checkpointer with a retention policy. Then rank 0 launches a second job at the other world
size, which loads the latest checkpoint into a freshly initialised model (DCP reshards
it on the way in) and checks that the full model and optimizer state equal what was saved.

Without --url or AWS_ENDPOINT_URL, rank 0 starts an embedded S3 server (moto) on 127.0.0.1
and tells the other ranks its address (so this runs on one machine; with --url, on many).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import uuid

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from s3ckpt import Checkpointer
from s3ckpt.demo import demo_server
from s3ckpt.retention import KeepLast


class TrainState:
    """The step, saved and restored with the model (torch's Stateful protocol)."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, sd: dict) -> None:
        self.step = sd["step"]


def build(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A small MLP, each Linear sharded over all ranks (FSDP2), and its optimizer."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def full_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[dict, dict]:
    """The unsharded model and optimizer state, on rank 0 (a collective call)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_state_dict(model, opt, options=options)


def train(url: str, steps: int, every: int) -> tuple[dict, dict]:
    """Train ``steps`` steps, async-saving every ``every``; returns the final full state."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model, opt = build(seed=0)
    state = TrainState()
    with Checkpointer(url, policy=KeepLast(2)) as ckpt:  # on every rank: a collective
        handle = None
        for step in range(1, steps + 1):
            batch = torch.randn(8, 16, generator=torch.Generator().manual_seed(step))
            x = batch.chunk(world)[rank]  # this rank's share of the global batch
            loss = torch.nn.functional.mse_loss(model(x), x.flip(1))
            loss.backward()
            if handle is not None:
                handle.staged.result()  # the async save has copied the shards: change them
            opt.step()
            opt.zero_grad()
            state.step = step
            if step % every == 0 or step == steps:
                handle = ckpt.async_save(step, model, opt, state, metrics={"loss": loss.item()})
            total = loss.detach().clone()
            dist.all_reduce(total)  # for printing: the loss over the global batch
            if rank == 0:
                saved = "  (async save started)" if step % every == 0 or step == steps else ""
                print(f"  step {step}  loss {total.item() / world:.4f}{saved}", flush=True)
        ckpt.wait()  # the last save has committed and retention has run after it
        if rank == 0:
            kept = [c.name for c in ckpt.list() if c.state == "committed"]
            print(f"  checkpoints kept by KeepLast(2): {', '.join(kept)}")
    return full_state(model, opt)


def resume(rank: int, world: int, rendezvous: str, url: str, saved: tuple[dict, dict]) -> None:
    """One rank of the second job: load the latest checkpoint, compare with ``saved``."""
    # The ranks meet through a file (env:// would look for torchrun's store, not ours).
    init = f"file://{rendezvous}"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    model, opt = build(seed=1)  # other weights than the run's: all must come from the load
    state = TrainState()
    with Checkpointer(url) as ckpt:
        # verify_complete: raise if any tensor of the model or optimizer was not restored.
        step = ckpt.load(model, opt, state, step="latest", verify_complete=True)
    loaded = full_state(model, opt)
    if rank == 0:
        diffs = differences(saved, loaded)
        listed = f": {', '.join(diffs)}" if diffs else ""
        print(f"  loaded step {step} on {world} rank(s): {len(diffs)} differences{listed}")
        if diffs or step != state.step:
            raise SystemExit(1)
    dist.destroy_process_group()


def differences(a: object, b: object, path: str = "") -> list[str]:
    """The paths where two nested dicts / lists of tensors and numbers differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = sorted(a.keys() | b.keys(), key=str)
        return [d for k in keys for d in differences(a.get(k), b.get(k), f"{path}/{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in differences(x, y, f"{path}/{i}")
        ]
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
        return [] if same else [path]
    return [] if a == b else [path]


@contextlib.contextmanager
def shared_run_prefix(url: str | None):
    """A new run prefix under ``url``, the same on every rank. Without ``url``: in a bucket
    on the server AWS_ENDPOINT_URL names or, without one, on an embedded S3 server (moto)
    that rank 0 runs until the block ends; the other ranks are told its address.
    """
    with contextlib.ExitStack() as stack:
        box = [None, None]
        if dist.get_rank() == 0:
            base = url or stack.enter_context(demo_server())
            box = [f"{base}/fsdp2-{uuid.uuid4().hex[:6]}", os.environ.get("AWS_ENDPOINT_URL")]
        dist.broadcast_object_list(box, src=0)
        run, endpoint = box
        if url is None and endpoint:
            os.environ["AWS_ENDPOINT_URL"] = endpoint
            os.environ.setdefault("AWS_ACCESS_KEY_ID", "demo")  # moto takes any credentials
            os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "demo")
        yield run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="run prefix, s3://bucket/prefix (default: embedded S3)")
    parser.add_argument("--steps", type=int, default=6, help="training steps (default 6)")
    parser.add_argument("--every", type=int, default=2, help="async-save every N steps (2)")
    args = parser.parse_args()
    if "RANK" in os.environ:  # started by torchrun
        dist.init_process_group("gloo")
    else:  # started by python: a job of one rank
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    rank, world = dist.get_rank(), dist.get_world_size()

    with shared_run_prefix(args.url) as url:
        if rank == 0:
            print(f"S3 endpoint {os.environ.get('AWS_ENDPOINT_URL', '(AWS)')}, run {url}")
            print(f"1. train on {world} rank(s)")
        saved = train(url, args.steps, args.every)
        if rank == 0:
            other = 1 if world > 1 else 2
            print(f"2. a new job on {other} rank(s) resumes from the latest checkpoint")
            with tempfile.TemporaryDirectory() as tmp:
                job = (other, f"{tmp}/rendezvous", url, saved)
                mp.start_processes(resume, job, nprocs=other, start_method="spawn")
            print(f"OK: saved on {world} rank(s), loaded on {other}: full state identical")
        dist.barrier()  # the other ranks wait: rank 0 serves the embedded S3 until the end
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
