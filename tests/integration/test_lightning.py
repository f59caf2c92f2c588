"""s3ckpt.lightning against a real S3 endpoint (moto on 127.0.0.1), with s3fs blocked.

In-process tests cover the plug-in's calls one by one (save/load exactness, safe loading,
remove, ModelCheckpoint's file-system view, ``ckpt_path="last"``). The framework runs train
with Lightning in fresh processes (``train()`` of ``examples/lightning_train.py``, ranks
forked from the session's forkserver): an uninterrupted run, a run stopped halfway and a
resume from ``ckpt_path="last"``, at world size 1, and at 2 with DDP and with FSDP2
through S3ModelParallelStrategy; the final weights and optimizer state must be equal.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pathlib
import sys
from collections import OrderedDict
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import torch

from s3ckpt.store import Location

pytest.importorskip("lightning")  # the `lightning` extra; the test extra installs it


from s3ckpt.errors import UnsafeCheckpointError
from s3ckpt.lightning import S3CheckpointIO, S3ModelCheckpoint
from s3ckpt.retention import KeepLast, list_checkpoints
from s3ckpt.store import open_store
from tests._http import free_port
from tests._spawn import run_ranks
from tests.integration import _lightning_workers as workers


class Custom:
    """A class no allow-list knows."""

    def __init__(self, x: int) -> None:
        self.x = x


def lightning_like() -> dict[str, Any]:
    w = torch.randn(4, 3)
    return {
        "epoch": 1,
        "global_step": 12,
        "pytorch-lightning_version": "2.6.6",
        "state_dict": OrderedDict([("net.0.weight", w), ("net.0.bias", torch.zeros(4))]),
        "optimizer_states": [
            {
                "state": {0: {"step": torch.tensor(12.0), "exp_avg": torch.randn(4, 3)}},
                "param_groups": [{"lr": 0.01, "betas": (0.9, 0.999), "params": [0, 1]}],
            }
        ],
        "lr_schedulers": [{"step_size": 3, "gamma": 0.5, "last_epoch": 1}],
        "callbacks": {
            "ModelCheckpoint{'monitor': 'val_loss'}": {
                "monitor": "val_loss",
                "current_score": torch.tensor(0.25),
                "best_model_path": "s3://b/run/epoch=0-step=4.ckpt",
            }
        },
        "hyper_parameters": {"width": 16, "data_dir": pathlib.PosixPath("/data/x")},
        "hparams_name": "kwargs",
    }


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return (
            isinstance(b, dict)
            and list(a) == list(b)
            and all(type(k) is type(j) for k, j in zip(a, b, strict=True))
            and all(same(a[k], b[k]) for k in a)
        )
    if isinstance(a, (list, tuple)):
        return (
            type(a) is type(b)
            and len(a) == len(b)
            and all(same(x, y) for x, y in zip(a, b, strict=True))
        )
    return type(a) is type(b) and bool(a == b)


@pytest.fixture
def run(bucket: str) -> str:
    return f"s3://{bucket}/runs/exp1"


def test_save_load_is_exact_and_records_step_and_metric(run: str) -> None:
    io = S3CheckpointIO()
    ckpt = lightning_like()
    io.save_checkpoint(ckpt, f"{run}/epoch=1-step=12.ckpt")
    back = io.load_checkpoint(f"{run}/epoch=1-step=12.ckpt")
    assert same(ckpt, back)  # int keys, tuples, Path and every tensor as saved
    store, url = open_store(run)
    (info,) = list_checkpoints(Location.of(url, store=store))
    assert info.name == "epoch=1-step=12.ckpt" and info.step == 12
    assert info.metrics == {"val_loss": 0.25}


def test_load_refuses_an_unlisted_class_unless_trusted_or_listed(run: str) -> None:
    ckpt = lightning_like()
    ckpt["hyper_parameters"]["custom"] = Custom(3)
    path = f"{run}/last.ckpt"
    S3CheckpointIO().save_checkpoint(ckpt, path)
    with pytest.raises(UnsafeCheckpointError, match=r"hyper_parameters\.custom"):
        S3CheckpointIO().load_checkpoint(path)
    assert (
        S3CheckpointIO().load_checkpoint(path, weights_only=False)["hyper_parameters"]["custom"].x
        == 3
    )
    listed = S3CheckpointIO(safe_globals=[Custom]).load_checkpoint(path)
    assert listed["hyper_parameters"]["custom"].x == 3


def test_resave_is_a_safe_overwrite(run: str) -> None:
    io = S3CheckpointIO()
    first, second = lightning_like(), lightning_like()
    second["global_step"] = 20
    io.save_checkpoint(first, f"{run}/last.ckpt")
    io.save_checkpoint(second, f"{run}/last.ckpt")
    assert same(io.load_checkpoint(f"{run}/last.ckpt"), second)
    store, url = open_store(run)
    (info,) = list_checkpoints(Location.of(url, store=store))
    assert info.step == 20


def test_remove_deletes_through_s3ckpt_and_keeps_the_newest(
    run: str, caplog: pytest.LogCaptureFixture
) -> None:
    io = S3CheckpointIO()
    for step in (4, 8):
        ckpt = lightning_like()
        ckpt["global_step"] = step
        io.save_checkpoint(ckpt, f"{run}/epoch=0-step={step}.ckpt")
    io.remove_checkpoint(f"{run}/epoch=0-step=4.ckpt")
    store, url = open_store(run)
    assert [c.name for c in list_checkpoints(Location.of(url, store=store))] == [
        "epoch=0-step=8.ckpt"
    ]
    assert not list(store.list(url.key("epoch=0-step=4.ckpt/")))
    with caplog.at_level(logging.WARNING, logger="s3ckpt.lightning"):
        io.remove_checkpoint(f"{run}/epoch=0-step=8.ckpt")  # the newest: refused, kept
    assert "left" in caplog.text
    assert [c.name for c in list_checkpoints(Location.of(url, store=store))] == [
        "epoch=0-step=8.ckpt"
    ]


def test_policy_prunes_after_each_commit_and_keeps_a_history(run: str) -> None:
    io = S3CheckpointIO(policy=KeepLast(2))
    for step in (1, 2, 3, 4):
        ckpt = lightning_like()
        ckpt["global_step"] = step
        io.save_checkpoint(ckpt, f"{run}/step={step}.ckpt")
        io.teardown()
    store, url = open_store(run)
    assert [c.step for c in list_checkpoints(Location.of(url, store=store))] == [3, 4]
    history = io.retention_history
    assert [r.step for r in history] == [1, 2, 3, 4] and all(r.ok for r in history)
    assert [len(r.result.deleted) for r in history if r.result] == [0, 0, 1, 1]


def test_model_checkpoint_sees_an_s3_folder_and_finds_last(run: str) -> None:
    import fsspec

    with pytest.raises(ImportError):
        import s3fs  # noqa: F401  (blocked: the point is that nothing needs it)
    io = S3CheckpointIO()
    mc = S3ModelCheckpoint(dirpath=run, save_last=True)  # uses fsspec for s3://
    assert not mc._fs.exists(f"{run}/last.ckpt")
    io.save_checkpoint(lightning_like(), f"{run}/epoch=0-step=4.ckpt")
    io.save_checkpoint(lightning_like(), f"{run}/last.ckpt")
    fs = fsspec.filesystem("s3")
    assert fs.exists(f"{run}/last.ckpt") and fs.isdir(f"{run}/last.ckpt")
    assert isinstance(fs.modified(f"{run}/last.ckpt"), datetime)
    names = sorted(p.rpartition("/")[2] for p in fs.ls(run, detail=False))
    assert names == ["epoch=0-step=4.ckpt", "last.ckpt"]
    trainer = argparse.Namespace(default_root_dir="/nowhere", loggers=[])
    assert mc._find_last_checkpoints(trainer) == {f"{run}/last.ckpt"}


@pytest.fixture(autouse=True)
def _no_s3fs(monkeypatch: pytest.MonkeyPatch) -> Any:
    """s3fs unimportable here, and fsspec's registry as it was afterwards (the plug-in
    registers its file system for s3:// when s3fs is missing; other tests use s3fs)."""
    registry = importlib.import_module("fsspec.registry")

    monkeypatch.setitem(sys.modules, "s3fs", None)
    saved = {p: registry._registry.get(p) for p in ("s3", "s3a")}
    yield
    for p, cls in saved.items():
        if cls is None:
            registry._registry.pop(p, None)
        else:
            registry._registry[p] = cls


def _phase(world: int, strategy: str, url: str, epochs: int, resume: bool, out: Path) -> None:
    run_ranks(
        workers.train_rank,
        world,
        (world, free_port(), url, epochs, resume, str(out), strategy),
    )


@pytest.mark.parametrize(
    ("world", "strategy"),
    [
        pytest.param(1, "ddp", id="ws1"),
        pytest.param(2, "ddp", id="ddp-ws2"),
        pytest.param(2, "model_parallel", id="fsdp2-ws2"),
    ],
)
def test_resume_in_a_fresh_process_is_exact(
    run: str, tmp_path: Path, world: int, strategy: str
) -> None:
    """Three fresh jobs, as examples/lightning_train.py runs them: 2 epochs uninterrupted;
    1 epoch; a resume from ``ckpt_path="last"`` to 2 epochs. save_last + save_top_k=2 on
    val_loss + a KeepLast(2)|KeepBest(2) policy. The resumed run ends where the
    uninterrupted one does, bit for bit (weights, optimizer state, step), and every kept
    checkpoint carries its step."""
    _phase(world, strategy, f"{run}/uninterrupted", 2, False, tmp_path / "whole.pt")
    _phase(world, strategy, f"{run}/resumed", 1, False, tmp_path / "half.pt")
    _phase(world, strategy, f"{run}/resumed", 2, True, tmp_path / "resumed.pt")
    compare = workers.example().compare
    assert compare(str(tmp_path / "whole.pt"), str(tmp_path / "resumed.pt")) == 0
    assert compare(str(tmp_path / "half.pt"), str(tmp_path / "resumed.pt")) > 0  # it trained on
    store, url = open_store(f"{run}/resumed")
    kept = {c.name: c.step for c in list_checkpoints(Location.of(url, store=store))}
    # 8 batches an epoch on one rank, 4 on each of two; 2 epochs.
    last = 2 * (8 // world)
    assert kept.get("last.ckpt") == last and f"epoch=1-step={last}.ckpt" in kept, kept
    assert None not in kept.values(), kept
