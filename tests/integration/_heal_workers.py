"""Rank bodies for tests/integration/test_heal_plugins.py (forked by tests._spawn): the
resume that heals, in fresh processes against the moto server: the Checkpointer at world
size 2 (gloo), and ``s3ckpt.accelerate`` with automatic checkpoint naming."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tests._spawn import set_torchrun_env


def model_at(step: int) -> torch.nn.Module:
    torch.manual_seed(step)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _warnings() -> _Warnings:
    handler = _Warnings()
    logging.getLogger("s3ckpt").addHandler(handler)
    return handler


def checkpointer_load(rank: int, world: int, port: int, run: str, out: str) -> None:
    """Every rank: ``Checkpointer(run).load(model)`` (latest); writes the step loaded, the
    model's tensors and the WARNINGs to ``out``."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    from s3ckpt import Checkpointer

    warned = _warnings()
    model = model_at(0)
    with Checkpointer(run) as ckpt:
        step = ckpt.load(model)
    torch.save(model.state_dict(), Path(out) / f"model_{rank}.pt")
    (Path(out) / f"result_{rank}.json").write_text(
        json.dumps({"step": step, "warned": warned.messages})
    )
    dist.destroy_process_group()


def accelerate_run(rank: int, world: int, port: int, project: str, out: str, phase: str) -> None:
    """``save``: three saves by automatic naming (``checkpoint_0..2``), model_at(100, 200,
    300)'s weights. ``load``: a fresh accelerator's ``load_state()``, then ``load_latest``,
    then the same with ``fallback=False``; writes what each did to ``out``."""
    set_torchrun_env(rank, world, port)
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    from s3ckpt.accelerate import use_s3ckpt

    config = ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True)
    accelerator = Accelerator(cpu=True, project_config=config)
    model = accelerator.prepare(model_at(0))
    result: dict[str, Any] = {}
    if phase == "save":
        ckpt = use_s3ckpt(accelerator)
        for step in (100, 200, 300):
            model.load_state_dict(model_at(step).state_dict())
            accelerator.save_state()
    else:
        warned = _warnings()
        ckpt = use_s3ckpt(accelerator)
        accelerator.load_state()
        torch.save(model.state_dict(), Path(out) / "load_state.pt")
        result["load_state_warned"] = list(warned.messages)
        model.load_state_dict(model_at(0).state_dict())
        result["load_latest"] = ckpt.load_latest(f"{project}/checkpoints")
        torch.save(model.state_dict(), Path(out) / "load_latest.pt")
        result["latest"] = ckpt.latest(f"{project}/checkpoints")
        strict = use_s3ckpt(accelerator, fallback=False)
        try:
            strict.load_latest(f"{project}/checkpoints")
        except Exception as exc:
            result["strict"] = [type(exc).__name__, str(exc)]
    (Path(out) / f"{phase}.json").write_text(json.dumps(result))
    accelerator.end_training()
