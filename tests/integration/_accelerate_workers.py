"""Rank bodies for tests/integration/test_accelerate.py (forked by tests._spawn, so each
run is a fresh process): a tiny model trained under ``accelerate`` with
``s3ckpt.accelerate``, saving to and resuming from the moto server.

Each step uses every RNG accelerate restores (torch through dropout and the shuffling
sampler, numpy and python through input noise), so a resume that missed one of them
shows up as a different loss.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import torch

from tests._spawn import set_torchrun_env

NO_S3FS = str(Path(__file__).resolve().parents[1] / "no_s3fs")

# 32 samples, 4 per rank per step: 8 steps per epoch on 1 rank, 4 on 2.
SAMPLES = 32
BATCH = 4


def steps_per_epoch(world: int) -> int:
    return SAMPLES // (BATCH * world)


class Counter:
    """An object registered with ``accelerator.register_for_checkpointing``."""

    def __init__(self) -> None:
        self.seen = 0
        self.total = torch.zeros(4)

    def state_dict(self) -> dict[str, Any]:
        return {"seen": self.seen, "total": self.total.clone()}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.seen = int(sd["seen"])
        self.total = sd["total"].clone()


def _block_s3fs() -> None:
    """As in an environment without s3fs: tests/no_s3fs/s3fs.py raises ImportError."""
    assert "s3fs" not in sys.modules, "s3fs was imported before the worker started"
    sys.path.insert(0, NO_S3FS)
    try:
        import s3fs  # noqa: F401
    except ImportError:
        return
    raise AssertionError("s3fs is importable in the worker")


def _local(t: Any) -> Any:
    to_local = getattr(t, "to_local", None)
    return to_local().clone() if callable(to_local) else t.clone()


def _tree(x: Any) -> Any:
    """Tensors (DTensor local shards) and plain values, detached from live objects."""
    if isinstance(x, torch.Tensor):
        return _local(x.detach())
    if isinstance(x, dict):
        return {str(k): _tree(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_tree(v) for v in x]
    return x


def snaps_steps(snaps: dict[str, Any]) -> list[int]:
    """The steps saved in this process (``snaps`` holds one entry per save)."""
    return [int(k.removeprefix("step_")) for k in snaps if k.startswith("step_")]


def _snapshot(accelerator: Any, model: Any, opt: Any, sched: Any, counter: Counter) -> Any:
    import numpy as np
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt.optimizer)
    algo, keys, pos, has_gauss, cached = np.random.get_state()
    loader = accelerator._dataloaders[0]
    gen = loader.synchronized_generator  # the sampler's, on 2 ranks; None on 1
    return _tree(
        {
            "model": msd,
            "optim": osd,
            "scheduler": sched.state_dict(),
            "counter": counter.state_dict(),
            "accelerator_step": accelerator.step,
            "loader_iteration": loader.iteration,
            "sampler_generator": gen.get_state() if gen is not None else None,
            "rng": {
                "torch": torch.get_rng_state(),
                "python": list(random.getstate()[1]),
                "numpy": [algo, torch.from_numpy(keys.astype("int64")), pos, has_gauss, cached],
            },
        }
    )


def train_worker(
    rank: int,
    world: int,
    port: int,
    mode: str,
    run: str,
    epochs: int,
    resume_step: int | None,
    policy_every: int,
    out: str,
) -> None:
    """Train ``epochs`` epochs (``mode``: "ddp" or "fsdp"; one rank: no process group),
    saving at each epoch's end to ``{run}/step_{step}`` with retention; with
    ``resume_step``, first resume from that checkpoint. Writes ``snaps_{rank}.pt`` (the
    state at each save, and right after the resume) and ``result_{rank}.json`` (losses as
    ``float.hex``, the hooks seen, what ``latest`` answered)."""
    _block_s3fs()
    os.environ["OMP_NUM_THREADS"] = "1"
    set_torchrun_env(rank, world, port)
    import numpy as np
    from accelerate import Accelerator
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
    from torch.utils.data import DataLoader, TensorDataset

    from s3ckpt.accelerate import use_s3ckpt
    from s3ckpt.retention import KeepEvery, KeepLast

    torch.set_num_threads(1)
    if mode == "fsdp":
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
        accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
        # accelerate 1.15 turns FSDP on only for accelerator devices (AcceleratorState keeps
        # MULTI_CPU and drops the plugin under gloo); its FSDP2 path (fully_shard) runs on
        # CPU as it is, so switch it on before prepare.
        accelerator.state.distributed_type = DistributedType.FSDP
        accelerator.state.fsdp_plugin = plugin
    else:
        accelerator = Accelerator(cpu=True)
    assert accelerator.num_processes == world

    # The same initial weights, data and seeds in every run; training draws from every RNG.
    torch.manual_seed(0)
    random.seed(1)
    np.random.seed(2)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.25), torch.nn.Linear(16, 4)
    )
    data = TensorDataset(torch.randn(SAMPLES, 8), torch.randn(SAMPLES, 4))
    loader = DataLoader(data, batch_size=BATCH, shuffle=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.9)
    model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    hooks: list[str] = []
    accelerator.register_save_state_pre_hook(lambda models, weights, d: hooks.append(f"save {d}"))
    accelerator.register_load_state_pre_hook(lambda models, d: hooks.append(f"load {d}"))

    step = 0
    ckpt = use_s3ckpt(accelerator, policy=KeepLast(1) | KeepEvery(policy_every), step=lambda: step)
    if mode == "fsdp":
        assert type(model).__name__.startswith("FSDP"), type(model)

    spe = steps_per_epoch(world)
    start_epoch = 0
    snaps: dict[str, Any] = {}
    latest = ckpt.latest(run)
    if resume_step is not None:
        url = f"{run}/step_{resume_step}"
        accelerator.load_state(url)
        assert hooks == [f"load {url}/"], hooks
        step = resume_step
        start_epoch = resume_step // spe
        snaps["resumed"] = _snapshot(accelerator, model, opt, sched, counter)

    losses: dict[int, str] = {}
    for _epoch in range(start_epoch, epochs):
        for x, y in loader:
            noise = float(np.random.rand()) * 0.01 + random.random() * 0.01
            loss = torch.nn.functional.mse_loss(model(x + noise), y)
            accelerator.backward(loss)
            opt.step()
            sched.step()
            opt.zero_grad()
            # Registered objects hold the same state on every rank (accelerate saves the
            # main process's; s3ckpt saves it once).
            counter.seen += x.shape[0] * world
            counter.total += accelerator.reduce(y.sum(0), reduction="sum")
            step += 1
            losses[step] = loss.item().hex()
        snaps[f"step_{step}"] = _snapshot(accelerator, model, opt, sched, counter)
        saved = accelerator.save_state(f"{run}/step_{step}")
        assert saved == f"{run}/step_{step}/", saved
    ckpt.wait()
    assert all(h.startswith(("save ", "load ")) and "s3://" in h for h in hooks), hooks
    if rank == 0:
        # A pass after each commit, each with the step that triggered it, none failed.
        history = ckpt.retention_history
        assert [r.step for r in history] == sorted(snaps_steps(snaps)), history
        assert all(r.ok for r in history), history
        assert ckpt.last_retention is history[-1].outcome
    assert "s3fs" not in sys.modules
    torch.save(snaps, Path(out) / f"snaps_{rank}.pt")
    result = {"losses": losses, "hooks": hooks, "latest": latest}
    (Path(out) / f"result_{rank}.json").write_text(json.dumps(result))
    accelerator.end_training()


# -- mid-epoch resume: s3ckpt against accelerate's own local save_state ------------------------
RESUME_SAMPLES = 48  # 12 batches of 4 per epoch on one rank, 6 per rank on two
MID = 2  # batches of the first epoch seen before the save


class Step:
    """The training step, kept with the checkpoint: docs/frameworks/accelerate.md's
    snippet for recovering the step after ``load_state``."""

    def __init__(self) -> None:
        self.value = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.value}

    def load_state_dict(self, sd: dict[str, int]) -> None:
        self.value = int(sd["step"])


def _resume_setup(rank: int, world: int, port: int, stateful: bool) -> Any:
    _block_s3fs()
    os.environ["OMP_NUM_THREADS"] = "1"
    set_torchrun_env(rank, world, port)
    import numpy as np
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration
    from torch.utils.data import DataLoader, TensorDataset

    from s3ckpt.accelerate import use_s3ckpt

    torch.set_num_threads(1)
    config = DataLoaderConfiguration(use_stateful_dataloader=stateful)
    accelerator = Accelerator(cpu=True, dataloader_config=config)
    torch.manual_seed(0)
    random.seed(1)
    np.random.seed(2)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.arange(float(RESUME_SAMPLES)).unsqueeze(1))
    loader = DataLoader(data, batch_size=BATCH, shuffle=True)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    # The docs' snippet: a registered object holds the step; `step=` records it.
    progress = Step()
    accelerator.register_for_checkpointing(progress)
    ckpt = use_s3ckpt(accelerator, step=lambda: progress.value)
    return accelerator, model, opt, loader, progress, ckpt


def _batches(loader: Any, model: Any, opt: Any, accelerator: Any, progress: Step) -> list[Any]:
    """Train on every batch ``loader`` yields; the samples of each, and a draw from each
    global RNG after it (a resume that missed one shows up)."""
    import numpy as np

    seen = []
    for (x,) in loader:
        loss = model(x).pow(2).mean()
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        progress.value += 1
        draws = [torch.rand(()).item(), random.random(), float(np.random.rand())]
        seen.append([x.flatten().tolist(), draws])
    return seen


def resume_worker(
    rank: int, world: int, port: int, mode: str, url: str, local: str, out: str, phase: str
) -> None:
    """``phase`` "save": train ``MID`` batches of the first epoch, save to ``url`` (s3ckpt)
    and to ``local`` (accelerate's own ``save_state``), then train on to the end of the
    second epoch. "resume" (a fresh process): load ``local``, then ``url``, each followed by
    the rest of the first epoch (``mode`` "stateful": the stateful loader resumes itself;
    "skip": ``skip_first_batches``) and the second. Writes what each run saw."""
    accelerator, model, opt, loader, progress, ckpt = _resume_setup(
        rank, world, port, mode == "stateful"
    )
    result: dict[str, Any] = {}
    if phase == "save":
        epoch = iter(loader)
        result["before"] = [next(epoch)[0].flatten().tolist() for _ in range(MID)]
        progress.value = MID
        assert accelerator.save_state(url) == url.rstrip("/") + "/"
        accelerator.save_state(local)  # a local path: accelerate's own code
        rest = _batches(epoch, model, opt, accelerator, progress)
        result["run"] = rest + _batches(loader, model, opt, accelerator, progress)
    else:
        for source in (local, url):
            progress.value = -1
            accelerator.load_state(source)
            result[f"step_{source}"] = progress.value  # the docs' step recovery
            first = accelerator.skip_first_batches(loader, MID) if mode == "skip" else loader
            rest = _batches(first, model, opt, accelerator, progress)
            result[source] = rest + _batches(loader, model, opt, accelerator, progress)
    ckpt.remove()
    (Path(out) / f"{phase}_{rank}.json").write_text(json.dumps(result))
    accelerator.end_training()
    # Leave without the teardown of this frame's objects: freeing DDP's C++ reducer after
    # the process group can deadlock with torch's autograd thread (seen under load in CI:
    # a rank stuck past its results, in no Python frame, after every S3 request). What the
    # test checks is written above; no s3ckpt save is in flight (ckpt.remove() waited).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# -- NumPy state, refusals, save_model ------------------------------------------------------------
class NumpyState:
    """A registered object whose state holds NumPy values and what DCP alone would not
    give back: ``None`` leaves, ``int`` keys, a tuple, an empty dict."""

    def __init__(self) -> None:
        self.state: dict[str, Any] = {}

    def state_dict(self) -> dict[str, Any]:
        return self.state

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.state = sd


class Opaque:
    """A value class no allow-list knows."""

    def __init__(self, n: int) -> None:
        self.n = n


def numpy_state() -> dict[str, Any]:
    import numpy as np

    return {
        "mean": np.linspace(0, 1, 5, dtype=np.float32),
        "counts": np.arange(6, dtype=np.int64).reshape(2, 3),
        "scale": np.float64(0.1),
        "kind": np.dtype("<f2"),
        "rng": np.random.default_rng(5).bit_generator.state,
        "seen": {0: None, 7: (1, "a", None)},
        "empty": {},
        "weights": torch.arange(3.0),
    }


def seams_worker(rank: int, world: int, port: int, run: str, out: str) -> None:
    """In ``out`` as the working directory: a registered object of NumPy state saves and
    loads; an unlisted class fails the load with s3ckpt's error; ``save_model`` to a URL
    writes shards, then one file. Writes ``seams.json`` and ``model.pt``."""
    _block_s3fs()
    os.chdir(out)  # relative paths land here: a local "s3:" folder would show
    set_torchrun_env(rank, world, port)
    from accelerate import Accelerator

    from s3ckpt.accelerate import use_s3ckpt
    from s3ckpt.errors import UnsafeCheckpointError

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = accelerator.prepare(torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2)))
    held = NumpyState()
    accelerator.register_for_checkpointing(held)
    use_s3ckpt(accelerator)
    result: dict[str, Any] = {}

    held.state = numpy_state()
    accelerator.save_state(f"{run}/numpy")
    held.state = {"stale": 1}
    accelerator.load_state(f"{run}/numpy")
    torch.save(held.state, Path(out) / "loaded.pt")

    held.state = {"opaque": Opaque(3)}
    accelerator.save_state(f"{run}/opaque")
    try:
        accelerator.load_state(f"{run}/opaque")
    except Exception as exc:  # an Exception: DCP's CheckpointException is not one
        result["refused"] = [type(exc).__name__, isinstance(exc, UnsafeCheckpointError), str(exc)]

    accelerator.save_model(model, f"{run}/sharded", max_shard_size=100)  # 3 shards, an index
    accelerator.save_model(model, f"{run}/export", max_shard_size=100)
    accelerator.save_model(model, f"{run}/export")  # one file: the shards and index go
    torch.save(accelerator.unwrap_model(model).state_dict(), Path(out) / "model.pt")
    (Path(out) / "seams.json").write_text(json.dumps(result))
    accelerator.end_training()
