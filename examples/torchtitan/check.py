"""Instrumentation for the example (not part of the recipe): a manager that proves resumes
are exact.

``CheckedS3CheckpointManager`` is :class:`s3ckpt.torchtitan.S3CheckpointManager` plus two
things: before every save it writes each rank's state (every tensor of model, optimizer,
LR scheduler, dataloader and train state, DTensors as their local shard) to a local file,
and after a resume it compares the state it loaded with the file of that step and writes
the verdict (tensors compared, tensors that differ) to ``verdict-rank{R}.json``. The folder
is ``$S3CKPT_EXAMPLE_STATES``.
"""

from __future__ import annotations

import json
import os
import posixpath
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.tensor import DTensor

from s3ckpt._step_names import checkpoint_step
from s3ckpt.torchtitan import S3CheckpointManager


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf of a nested state dict, by dotted path; tensors as CPU copies of their
    local shard."""
    if isinstance(obj, Stateful) and not isinstance(obj, torch.Tensor):
        obj = obj.state_dict()
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for key, value in obj.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    if isinstance(obj, (list, tuple)):
        out = {}
        for i, value in enumerate(obj):
            out.update(_flatten(value, f"{prefix}{i}."))
        return out
    if isinstance(obj, DTensor):
        obj = obj.to_local()
    if isinstance(obj, torch.Tensor):
        return {prefix[:-1]: obj.detach().to("cpu", copy=True)}
    return {prefix[:-1]: obj}


def compare(expected: dict[str, Any], actual: dict[str, Any]) -> dict[str, Any]:
    """Tensors compared and the paths that differ (dtype, shape or any element; a missing
    or extra entry counts as a difference)."""
    differ = sorted(set(expected) ^ set(actual))
    tensors = 0
    for path in sorted(set(expected) & set(actual)):
        want, got = expected[path], actual[path]
        if isinstance(want, torch.Tensor):
            tensors += 1
            same = (
                isinstance(got, torch.Tensor)
                and want.dtype == got.dtype
                and want.shape == got.shape
                and torch.equal(want, got)
            )
        else:
            same = want == got
        if not same:
            differ.append(path)
    return {"tensors": tensors, "entries": len(expected), "differ": differ}


class CheckedS3CheckpointManager(S3CheckpointManager):
    """:class:`S3CheckpointManager` that records the state it saves and checks what it
    loads against it (see the module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config(S3CheckpointManager.Config):
        pass

    def _states_file(self, step: int) -> str:
        folder = os.environ["S3CKPT_EXAMPLE_STATES"]
        return os.path.join(folder, f"step-{step}-rank{_rank()}.pt")

    def dcp_save(self, state_dict: dict[str, Any], checkpoint_id: str, *args: Any, **kw: Any):
        step = checkpoint_step(posixpath.basename(checkpoint_id.rstrip("/")))
        torch.save(_flatten(state_dict), self._states_file(step))
        return super().dcp_save(state_dict, checkpoint_id, *args, **kw)

    def _load(self, step: int = -1) -> bool:
        loaded = super()._load(step)
        if loaded:
            step = self.states["train_state"].state_dict()["step"]
            expected = torch.load(self._states_file(step), weights_only=False)
            verdict = compare(expected, _flatten(self._flattened_model_states_sd()))
            verdict.update(step=step, rank=_rank())
            folder = os.environ["S3CKPT_EXAMPLE_STATES"]
            with open(os.path.join(folder, f"verdict-rank{_rank()}.json"), "w") as f:
                json.dump(verdict, f)
            print(
                f"[check] rank {_rank()}: resumed step {step}: {verdict['tensors']} tensors "
                f"({verdict['entries']} entries) compared with the state saved, "
                f"{len(verdict['differ'])} differ",
                flush=True,
            )
        return loaded
