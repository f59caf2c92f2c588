"""Ranks of the Lightning framework runs (tests/integration/test_lightning.py), forked from
the test session's forkserver (tests/_spawn.py: torch already imported) rather than started
as new interpreters, which cost most of those tests' time. Each rank trains with
``examples/lightning_train.py``'s own ``train()``: the example is what is tested."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from tests._spawn import set_torchrun_env

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lightning_train.py"


def example() -> ModuleType:
    """``examples/lightning_train.py`` as a module."""
    spec = importlib.util.spec_from_file_location("lightning_train", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train_rank(
    rank: int,
    world: int,
    port: int,
    url: str,
    epochs: int,
    resume: bool,
    out: str,
    strategy: str,
) -> None:
    """One rank of one phase: ``train()`` of the example, as ``--phase train`` runs it."""
    # No s3fs in this process: the integration must not need it (tests/no_s3fs does the same
    # for subprocesses; the forkserver does not pass PYTHONPATH on).
    sys.modules["s3fs"] = None  # type: ignore[assignment]
    os.environ["OMP_NUM_THREADS"] = "1"
    set_torchrun_env(rank, world, port)  # Lightning joins these processes, launches none
    args = argparse.Namespace(
        url=url, epochs=epochs, devices=world, strategy=strategy, resume=resume, out=out
    )
    example().train(args)
    assert "s3fs" not in sys.modules or sys.modules["s3fs"] is None
