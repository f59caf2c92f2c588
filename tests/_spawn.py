"""Start the ranks of a multi-process test: fresh processes, torch imported once.

``torch.multiprocessing.spawn`` starts every rank as a new interpreter that imports torch
again (and the first DTensor operation imports ``torch._dynamo``); on the 2-core CI machines
that costs 20-60 s per rank, and most of the suite's multi-process time went there.

Here ranks start from a *forkserver* instead: a clean server process, started once per test
session from a fresh interpreter (not forked from pytest, so it holds none of pytest's
threads, sockets or the moto server), imports torch once, and each rank is forked from it.
Ranks are still separate processes with their own gloo rendezvous, exactly as with spawn.

The forkserver keeps the environment it started with, so the caller's ``AWS_*`` / ``S3CKPT_*``
variables (the moto endpoint, dummy credentials) are passed to each rank explicitly.
"""

from __future__ import annotations

import faulthandler
import os
import sys
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

# torch._dynamo: the first DTensor operation imports it (~20 s on a 2-core CI machine).
_PRELOAD = [
    "torch",
    "torch._dynamo",
    "torch.distributed",
    "torch.distributed.checkpoint",
    "torch.distributed.checkpoint.state_dict",
    "torch.distributed.device_mesh",
    "torch.distributed.tensor",
    "torch.distributed.fsdp",
    "boto3",
    "botocore",
    "s3ckpt",
    "s3ckpt.dcp",
    "s3ckpt.checkpointer",
]
_ctx = mp.get_context("forkserver")
_ctx.set_forkserver_preload(_PRELOAD)


_DUMP_AFTER_S = 100.0
"""Seconds after which a rank still running dumps its threads' stacks: below the shortest
pytest-timeout of a multi-process test (120 s); a long test's rank that passes may print one
dump, which pytest shows only when the test fails."""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "S3CKPT_", "MOTO_"))}


def _entry(rank: int, fn: Callable[..., Any], env: dict[str, str], *args: Any) -> None:
    for key in [k for k in os.environ if k.startswith(("AWS_", "S3CKPT_", "MOTO_"))]:
        del os.environ[key]
    os.environ.update(env)
    # A rank stuck past this prints every thread's stack to stderr (which pytest shows with
    # the failing test), so a hang that pytest-timeout ends in CI says where each rank was.
    faulthandler.dump_traceback_later(_DUMP_AFTER_S, exit=False, file=sys.stderr)
    fn(rank, *args)
    faulthandler.cancel_dump_traceback_later()


def run_ranks(fn: Callable[..., Any], nprocs: int, args: tuple[Any, ...] = ()) -> None:
    """Run ``fn(rank, *args)`` in ``nprocs`` processes and wait; a rank's exception fails here
    as an AssertionError whose first line is the rank's own error (pytest's one-line summary,
    which a cut CI log still shows), then the rank's whole traceback."""
    try:
        mp.start_processes(
            _entry,
            args=(fn, _env(), *args),
            nprocs=nprocs,
            join=True,
            start_method="forkserver",
        )
    except mp.ProcessRaisedException as exc:
        last = [line for line in str(exc).splitlines() if line.strip()][-1:]
        raise AssertionError(f"rank {exc.error_index} raised {''.join(last)}\n{exc}") from None


def _entry_one(fn: Callable[..., Any], env: dict[str, str], *args: Any) -> None:
    _entry(0, lambda _rank, *a: fn(*a), env, *args)


def start_process(fn: Callable[..., Any], args: tuple[Any, ...] = ()) -> Any:
    """Start ``fn(*args)`` in one process from the same forkserver and return the started
    ``multiprocessing.Process`` (the caller joins or kills it)."""
    proc = _ctx.Process(target=_entry_one, args=(fn, _env(), *args), daemon=True)
    proc.start()
    return proc


def set_torchrun_env(rank: int, world: int, port: int) -> None:
    """Set this rank's environment as ``torchrun`` would (frameworks such as Lightning and
    accelerate then join these processes on 127.0.0.1:``port`` instead of launching their
    own); nothing for one rank, which needs no process group."""
    if world > 1:
        os.environ.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(world),
            NODE_RANK="0",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )


def event() -> Any:
    """A ``multiprocessing.Event`` that processes from :func:`start_process` can set."""
    return _ctx.Event()
