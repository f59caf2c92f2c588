"""s3ckpt.lightning at the seams users meet next to resume (issue 28, items 2, 4, 5, 7).

Against a real S3 endpoint (moto on 127.0.0.1), Lightning in this process, world size 1:

* ``ckpt_path="last"`` with s3fs installed and without: a resume is bit-exact (weights,
  optimizer state, ``global_step``), the newest of several ``last*.ckpt`` candidates wins
  (by the commit marker's store time), ``validate(ckpt_path="last")`` too;
* ``AsyncCheckpointIO(S3CheckpointIO())`` with a churning top-k leaves exactly the top-k
  plus ``last.ckpt`` on S3, and a removal of a checkpoint whose save is still queued is
  carried out after its commit (a gated save makes that order certain);
* no retention policy deletes what ``ModelCheckpoint`` tracks (a falling metric, the
  policy the docs recommend, and ``KeepLast(1)``);
* ``CSVLogger("s3://...")`` logs through a fit with the plug-in imported and s3fs hidden.

The rules of :class:`s3ckpt.lightning._async.Removals` are also checked one by one, with a
recording delete function and no store.
"""

from __future__ import annotations

import importlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from s3ckpt.store import Location

pytest.importorskip("lightning")  # the `lightning` extra; the test extra installs it

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.plugins.io import AsyncCheckpointIO

from s3ckpt.errors import CheckpointNotFoundError, DeleteRefusedError
from s3ckpt.lightning import S3CheckpointIO
from s3ckpt.lightning._async import MAX_PENDING_REMOVALS, Removals
from s3ckpt.lightning._last import _S3CkptFileSystem, install_filesystem
from s3ckpt.retention import KeepBest, KeepLast, Policy, list_checkpoints
from s3ckpt.store import open_store
from tests._helpers import list_keys
from tests.integration import _lightning_workers as workers
from tests.integration.test_lightning import lightning_like

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

_MC = "ModelCheckpoint{'monitor': 'val_loss'}"


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture
def run(bucket: str) -> str:
    return f"s3://{bucket}/runs/exp1"


@pytest.fixture
def fsspec_registry() -> Iterator[None]:
    """fsspec's registry for s3:// emptied for the test and restored afterwards."""
    registry = importlib.import_module("fsspec.registry")
    saved = {p: registry._registry.pop(p, None) for p in ("s3", "s3a")}
    yield
    for p, cls in saved.items():
        registry._registry.pop(p, None)
        if cls is not None:
            registry._registry[p] = cls


@pytest.fixture
def no_s3fs(monkeypatch: pytest.MonkeyPatch, fsspec_registry: None) -> Iterator[None]:
    """A process without s3fs, in which ``s3ckpt.lightning`` was just imported (Lightning
    caches whether s3fs is importable: forgotten before and after)."""
    from lightning_utilities.core.imports import module_available, package_available

    monkeypatch.setitem(sys.modules, "s3fs", None)
    module_available.cache_clear()
    package_available.cache_clear()
    install_filesystem(None)  # what S3ModelCheckpoint / S3CheckpointIO construction does
    yield
    module_available.cache_clear()
    package_available.cache_clear()


@pytest.fixture(params=["s3fs", "no-s3fs"])
def s3fs_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both setups: s3fs owns s3:// (as pip installs it), or it is missing."""
    request.getfixturevalue("fsspec_registry")
    if request.param == "no-s3fs":
        request.getfixturevalue("no_s3fs")
    else:
        import fsspec

        assert type(fsspec.filesystem("s3")).__module__.startswith("s3fs")
    return str(request.param)


# -- models -----------------------------------------------------------------------------------


def _trainer(**kwargs: Any) -> pl.Trainer:
    options: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
    )
    options.update(kwargs)
    return pl.Trainer(**options)


def _scripted(scores: list[float]) -> pl.LightningModule:
    """A tiny model whose ``val_loss`` after training step ``k`` is ``scores[k - 1]``."""

    class Scripted(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("val_loss", torch.tensor(scores[self.trainer.global_step - 1]))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Scripted()


def _fit_scripted(
    scores: list[float], run: str, io: Any, **checkpoint: Any
) -> tuple[pl.Trainer, ModelCheckpoint]:
    """One validation (and one round of checkpoints) after each of ``len(scores)`` steps."""
    pl.seed_everything(0)
    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=2)
    # val_check_interval=1 reads as "once an epoch" to ModelCheckpoint: say when to save.
    mc = ModelCheckpoint(
        dirpath=run, monitor="val_loss", save_on_train_epoch_end=False, **checkpoint
    )
    trainer = _trainer(
        max_steps=len(scores),
        val_check_interval=1,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        callbacks=[mc],
        plugins=[io],
    )
    trainer.fit(_scripted(scores), loader, loader)
    return trainer, mc


def _tracked(mc: ModelCheckpoint) -> set[str]:
    paths = {*mc.best_k_models, mc.last_model_path, mc.best_model_path, mc.kth_best_model_path}
    return {p.rpartition("/")[2] for p in paths if p}


def _names(run: str) -> set[str]:
    store, url = open_store(run)
    return {c.name for c in list_checkpoints(Location.of(url, store=store))}


def _loads(io: S3CheckpointIO, run: str, names: set[str]) -> None:
    for name in names:
        ckpt = io.load_checkpoint(f"{run}/{name}")
        assert set(ckpt["state_dict"]) == {"net.weight", "net.bias"}, name


# -- item 2: ckpt_path="last" -----------------------------------------------------------------


def _regressor_fit(epochs: int, callbacks: list[Any], plugins: list[Any], **fit: Any) -> Any:
    example = workers.example()
    pl.seed_everything(0, workers=True)
    trainer = _trainer(
        max_epochs=epochs,
        callbacks=callbacks,
        plugins=plugins,
        enable_checkpointing=bool(callbacks),
    )
    model = example.build_module()
    train, val = example.loaders()
    trainer.fit(model, train, val, **fit)
    return trainer


def _final(trainer: pl.Trainer) -> dict[str, Any]:
    return {
        "model": {k: v.clone() for k, v in trainer.lightning_module.state_dict().items()},
        "optim": trainer.optimizers[0].state_dict(),
        "step": trainer.global_step,
    }


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@pytest.fixture(scope="module")
def uninterrupted() -> dict[str, Any]:
    """Two epochs without checkpoints: where a resumed run must end."""
    return _final(_regressor_fit(2, [], []))


def test_ckpt_path_last_resumes_exactly_and_picks_the_newest(
    run: str, s3fs_mode: str, uninterrupted: dict[str, Any]
) -> None:
    """1 epoch, then ``fit(ckpt_path="last")`` to 2 epochs in a new Trainer: equal to an
    uninterrupted run. An older ``last-v1.ckpt`` (another model's) lies beside
    ``last.ckpt``, so only the newest by store time resumes; then a newer ``last-v2.ckpt``
    is what ``validate(ckpt_path="last")`` loads."""
    io = S3CheckpointIO()
    io.save_checkpoint(lightning_like(), f"{run}/last-v1.ckpt")  # older, and not loadable here
    time.sleep(1.1)  # S3's LastModified counts whole seconds

    def checkpoint() -> ModelCheckpoint:
        return ModelCheckpoint(dirpath=run, save_top_k=0, save_last=True)

    half = _regressor_fit(1, [checkpoint()], [io])
    assert half.global_step == 8
    resumed = _regressor_fit(2, [checkpoint()], [io], ckpt_path="last")
    assert resumed.ckpt_path == f"{run}/last.ckpt"
    assert _equal(_final(resumed), uninterrupted)

    time.sleep(1.1)
    newer = io.load_checkpoint(f"{run}/last.ckpt")
    newer["state_dict"]["net.0.bias"] += 1.0
    io.save_checkpoint(newer, f"{run}/last-v2.ckpt")
    model = resumed.lightning_module
    resumed.validate(model, workers.example().loaders()[1], ckpt_path="last", verbose=False)
    assert resumed.ckpt_path == f"{run}/last-v2.ckpt"
    assert torch.equal(model.state_dict()["net.0.bias"], newer["state_dict"]["net.0.bias"])


# -- item 4: AsyncCheckpointIO ----------------------------------------------------------------


def _tracking_state(*paths: str) -> dict[str, Any]:
    return {
        _MC: {
            "monitor": "val_loss",
            "best_k_models": dict.fromkeys(paths, torch.tensor(1.0)),
            "best_model_path": paths[0] if paths else "",
            "kth_best_model_path": paths[-1] if paths else "",
            "last_model_path": "",
        }
    }


def test_a_removal_while_the_save_is_queued_takes_effect_after_its_commit(
    run: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plug-in's saves are held until both are queued and the first is removed (as
    ``save_top_k`` does while the wrapper's executor is busy): the removed one is deleted
    after it commits and the save that displaced it arrives; the other stays."""
    io = S3CheckpointIO()
    wrapper = AsyncCheckpointIO(io)
    gate = threading.Event()
    save = io._save

    def held(*args: Any, **kwargs: Any) -> None:
        gate.wait(60)
        save(*args, **kwargs)

    monkeypatch.setattr(io, "_save", held)
    a, b = f"{run}/epoch=0-step=4.ckpt", f"{run}/epoch=0-step=8.ckpt"
    first, second = lightning_like(), lightning_like()
    first.update(global_step=4, callbacks=_tracking_state(a))
    second.update(global_step=8, callbacks=_tracking_state(b))  # a is displaced
    wrapper.save_checkpoint(first, a)
    wrapper.save_checkpoint(second, b)
    wrapper.remove_checkpoint(a)  # nothing committed yet
    assert io._removals.pending == (a,)
    gate.set()
    wrapper.teardown()  # the queued saves, then the plug-in's teardown
    assert _names(run) == {"epoch=0-step=8.ckpt"}
    assert io._removals.pending == ()


def test_async_checkpoint_io_leaves_exactly_the_top_k_and_last(run: str, s3_client: Any) -> None:
    """save_top_k=2 over val_loss 5, 4, 3, 2 (two checkpoints displaced while saves queue
    up behind each other): exactly the two best and last.ckpt stay, and all load."""
    io = S3CheckpointIO()
    _, mc = _fit_scripted(
        [5.0, 4.0, 3.0, 2.0], run, AsyncCheckpointIO(io), save_top_k=2, save_last=True
    )
    expected = {"epoch=0-step=3.ckpt", "epoch=0-step=4.ckpt", "last.ckpt"}
    assert _tracked(mc) == expected
    assert _names(run) == expected
    bucket, _, prefix = run.removeprefix("s3://").partition("/")
    folders = {k[len(prefix) + 1 :].partition("/")[0] for k in list_keys(s3_client, bucket, prefix)}
    assert folders - {"s3ckpt.lease"} <= expected, folders
    _loads(io, run, expected)


# -- item 5: retention never deletes what ModelCheckpoint tracks ------------------------------


@pytest.mark.parametrize(
    "policy",
    [
        pytest.param(KeepLast(2) | KeepBest(2, "val_loss"), id="last2-best2"),
        pytest.param(KeepLast(1), id="last1"),
    ],
)
def test_no_policy_deletes_a_tracked_checkpoint(run: str, policy: Policy) -> None:
    """A falling val_loss: last.ckpt records the same score as the newest top-k checkpoint
    and is newer, so ``KeepBest(2)`` alone would keep last.ckpt and the newest, and
    ``KeepLast`` the newest ones, and both would drop a checkpoint best_k_models lists."""
    io = S3CheckpointIO(policy=policy)
    _, mc = _fit_scripted([3.0, 2.0, 1.0], run, io, save_top_k=2, save_last=True)
    expected = {"epoch=0-step=2.ckpt", "epoch=0-step=3.ckpt", "last.ckpt"}
    assert _tracked(mc) == expected
    assert _names(run) == expected
    _loads(io, run, expected)
    history = io.retention_history
    assert history and all(r.ok for r in history), history
    last = history[-1].result
    assert last is not None
    assert "tracked by ModelCheckpoint" in last.plan.keep["epoch=0-step=2.ckpt"]


# -- item 7: Lightning's loggers on s3:// without s3fs ----------------------------------------


def test_csv_logger_logs_to_s3_without_s3fs(bucket: str, no_s3fs: None, s3_client: Any) -> None:
    """metrics.csv (written, appended, rewritten with a new header) and hparams.yaml end
    up on S3; a second logger finds version_0 there and takes version_1."""
    save_dir = f"s3://{bucket}/logs"
    logger = CSVLogger(save_dir, name="exp", flush_logs_every_n_steps=1)
    example = workers.example()
    pl.seed_everything(0)
    trainer = _trainer(
        max_steps=3,
        limit_val_batches=1,
        val_check_interval=3,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
        logger=logger,
        enable_checkpointing=False,
        plugins=[S3CheckpointIO()],
    )
    train, val = example.loaders()
    trainer.fit(example.build_module(), train, val)

    def text(key: str) -> str:
        return str(s3_client.get_object(Bucket=bucket, Key=key)["Body"].read().decode())

    metrics = text("logs/exp/version_0/metrics.csv").splitlines()
    header = metrics[0].split(",")
    assert {"step", "train_loss", "val_loss"} <= set(header), header
    assert len(metrics) == 1 + 3 + 1  # three training rows and one validation row
    assert "width: 16" in text("logs/exp/version_0/hparams.yaml")
    assert CSVLogger(save_dir, name="exp").version == 1


def test_the_s3_file_system_deletes_plain_objects_but_never_a_checkpoint(
    run: str, no_s3fs: None
) -> None:
    import fsspec

    fs = fsspec.filesystem("s3")
    assert isinstance(fs, _S3CkptFileSystem)
    fs.makedirs(f"{run}/logs", exist_ok=True)
    assert fs.isdir(f"{run}/logs") and fs.ls(f"{run}/logs") == []
    with fs.open(f"{run}/logs/a.txt", "w") as f:
        f.write("one\n")
    with fs.open(f"{run}/logs/a.txt", "a") as f:
        f.write("two\n")
    with fs.open(f"{run}/logs/a.txt", "r") as f:
        assert f.read() == "one\ntwo\n"
    fs.rm_file(f"{run}/logs/a.txt")
    assert not fs.exists(f"{run}/logs/a.txt")
    S3CheckpointIO().save_checkpoint(lightning_like(), f"{run}/last.ckpt")
    with pytest.raises(IsADirectoryError):
        fs.rm_file(f"{run}/last.ckpt")
    with pytest.raises(PermissionError):
        fs.rm_file(f"{run}/last.ckpt/s3ckpt.json")
    assert _names(run) == {"last.ckpt"}


def test_another_s3_file_system_is_not_replaced(
    fsspec_registry: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fsspec

    class Other(fsspec.AbstractFileSystem):
        protocol = "s3"

    monkeypatch.setitem(sys.modules, "s3fs", None)
    fsspec.register_implementation("s3", Other)
    install_filesystem(None)
    assert fsspec.get_filesystem_class("s3") is Other
    install_filesystem(True)  # S3CheckpointIO(register_filesystem=True)
    assert fsspec.get_filesystem_class("s3") is _S3CkptFileSystem


# -- the rules of deferred removals, one by one -----------------------------------------------


class _Deletes:
    """A delete function that records its calls and raises what it is told to."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.raises: dict[str, Exception] = {}

    def __call__(self, path: str) -> None:
        self.calls.append(path)
        exc = self.raises.get(path)
        if exc is not None:
            raise exc


def _ckpt(*tracked: str) -> dict[str, Any]:
    return {"callbacks": _tracking_state(*tracked)}


def _on_other_thread(fn: Any, *args: Any) -> None:
    t = threading.Thread(target=fn, args=args)
    t.start()
    t.join()


A, B, C = (f"s3://b/run/epoch=0-step={s}.ckpt" for s in (1, 2, 3))


def test_removal_waits_until_the_displacing_save_arrives() -> None:
    deletes = _Deletes()
    removals = Removals(deletes)
    _on_other_thread(removals.begin_save, A, _ckpt(A))  # the executor's thread
    removals.request(A)  # uploading now: wait
    _on_other_thread(removals.end_save, A)
    removals.flush()  # committed, but the latest state still tracks it (B's is queued)
    assert deletes.calls == []
    _on_other_thread(removals.begin_save, B, _ckpt(B))
    _on_other_thread(removals.end_save, B)
    removals.flush()
    assert deletes.calls == [A] and removals.pending == ()


def test_a_save_requested_after_the_removal_is_kept() -> None:
    deletes = _Deletes()
    deletes.raises[C] = CheckpointNotFoundError("none")
    removals = Removals(deletes)
    removals.request(C)  # nothing there: remembered
    assert deletes.calls == [C] and removals.pending == (C,)
    _on_other_thread(removals.begin_save, C, _ckpt(C))  # tracked again: a new save of it
    _on_other_thread(removals.end_save, C)
    del deletes.raises[C]
    removals.flush()
    removals.flush(final=True)
    assert deletes.calls == [C] and removals.pending == ()


def test_refused_as_newest_is_retried_and_a_resave_on_the_same_thread_cancels() -> None:
    deletes = _Deletes()
    deletes.raises[A] = DeleteRefusedError("newest", reason="newest")
    removals = Removals(deletes)
    removals.request(A)
    assert removals.pending == (A,)
    del deletes.raises[A]
    removals.flush()  # after the next commit
    assert deletes.calls == [A, A] and removals.pending == ()

    deletes.raises[B] = DeleteRefusedError("newest", reason="newest")
    removals.request(B)
    removals.begin_save(B, {})  # this thread asked for the removal, then saved it again
    removals.end_save(B)
    removals.flush(final=True)
    assert deletes.calls == [A, A, B] and removals.pending == ()


def test_a_pinned_checkpoint_is_left_and_pending_removals_are_bounded() -> None:
    deletes = _Deletes()
    deletes.raises[A] = DeleteRefusedError("pinned", reason="pinned")
    removals = Removals(deletes)
    removals.request(A)
    assert removals.pending == ()
    missing = CheckpointNotFoundError("none")
    paths = [f"s3://b/run/x{i}.ckpt" for i in range(MAX_PENDING_REMOVALS + 1)]
    for p in paths:
        deletes.raises[p] = missing
        removals.request(p)
    assert len(removals.pending) == MAX_PENDING_REMOVALS and removals.pending[0] == paths[1]
