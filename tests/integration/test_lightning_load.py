"""Loading Lightning checkpoints from S3 as users call it (issue 28, items 1, 3 and 6), against
a real S3 endpoint (moto on 127.0.0.1), with s3fs installed and without.

* ``MyModule.load_from_checkpoint("s3://...")`` equals the saved weights, for checkpoints of
  ``S3CheckpointIO`` (one process) and ``S3ModelParallelStrategy`` (FSDP2, two ranks: read
  back as full tensors without a process group), ``map_location`` and hparams honoured;
* a stock Lightning checkpoint (one ``torch.save`` object) resumes through a Trainer with
  ``S3CheckpointIO`` bit for bit, is streamed, and obeys the plug-in's ``weights_only`` rules;
* the ``CheckpointIO`` contract: ``OrderedDict`` state dicts with ``_metadata``,
  ``storage_options`` refused, a missing checkpoint is a ``FileNotFoundError``.

The two framework runs that write the checkpoints (examples/lightning_train.py's ``train()``,
one epoch, world size 1 and FSDP2 at 2) run once for the module.
"""

from __future__ import annotations

import importlib
import io
import logging
import pickle
import sys
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("lightning")

import lightning.pytorch as pl

from s3ckpt.config import TransferConfig
from s3ckpt.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    UnsafeCheckpointError,
)
from s3ckpt.lightning import S3CheckpointIO, install
from s3ckpt.lightning._load import load_object
from s3ckpt.store import MemoryStore
from s3ckpt.tools import flatten_state_dict, unflatten_state_dict
from tests._http import free_port
from tests._spawn import run_ranks
from tests.integration import _lightning_workers as workers
from tests.integration.test_lightning import Custom, lightning_like, same


class HParamsData(pl.LightningDataModule):
    """A data module whose hyperparameters travel in the checkpoint."""

    def __init__(self, batch_size: int = 1, root: Path = Path("/nowhere")) -> None:
        super().__init__()
        self.save_hyperparameters()


@pytest.fixture(autouse=True)
def load_hook() -> None:
    """The documented opt-in for ``load_from_checkpoint("s3://...")`` (idempotent)."""
    install()


@pytest.fixture(params=["s3fs", "no_s3fs"])
def fs_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """With s3fs installed (fsspec resolves ``s3://`` to it) or not (unimportable; whatever
    s3ckpt registers). fsspec's registry for s3:// is restored afterwards."""
    registry = importlib.import_module("fsspec.registry")
    saved = {p: registry._registry.get(p) for p in ("s3", "s3a")}
    for p in saved:
        registry._registry.pop(p, None)
    if request.param == "no_s3fs":
        monkeypatch.setitem(sys.modules, "s3fs", None)
    yield request.param
    for p, cls in saved.items():
        if cls is None:
            registry._registry.pop(p, None)
        else:
            registry._registry[p] = cls


def _fit(epochs: int, **trainer_kwargs: Any) -> tuple[pl.Trainer, pl.LightningModule]:
    example = workers.example()
    pl.seed_everything(0, workers=True)
    model = example.build_module()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
        **trainer_kwargs,
    )
    return trainer, model


@pytest.fixture(scope="module")
def trained(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """examples/lightning_train.py's model after one epoch, saved by S3CheckpointIO in this
    process, and by S3ModelParallelStrategy (FSDP2) on two forked ranks: each checkpoint's
    path, and the weights the model ended with."""
    import boto3

    bucket = f"test-{uuid.uuid4().hex[:16]}"
    boto3.client("s3", endpoint_url=moto_endpoint).create_bucket(Bucket=bucket)
    trainer, model = _fit(1, plugins=[S3CheckpointIO()])
    trainer.fit(model, *workers.example().loaders())
    path = f"s3://{bucket}/ws1/epoch=0-step=8.ckpt"
    trainer.save_checkpoint(path)  # through the strategy's checkpoint_io: S3CheckpointIO
    out: dict[str, Any] = {
        "ws1": {"path": path, "weights": model.state_dict(), "step": trainer.global_step}
    }
    url = f"s3://{bucket}/fsdp2"
    final = tmp_path_factory.mktemp("fsdp2") / "final.pt"
    run_ranks(workers.train_rank, 2, (2, free_port(), url, 1, False, str(final), "model_parallel"))
    state = torch.load(final)
    out["fsdp2"] = {
        "path": f"{url}/epoch=0-step=4.ckpt",
        "weights": {f"net.{k}": v for k, v in state["model"].items()},
        "step": state["step"],
    }
    return out


def regressor_class() -> type[pl.LightningModule]:
    return type(workers.example().build_module())


# -- item 1: load_from_checkpoint ---------------------------------------------------------------


@pytest.mark.parametrize("kind", ["ws1", "fsdp2"])
@pytest.mark.parametrize("where", ["cpu", torch.device("cpu")], ids=["str", "device"])
def test_load_from_checkpoint_equals_the_saved_weights(
    trained: dict[str, Any], kind: str, where: Any, fs_mode: str
) -> None:
    saved = trained[kind]
    model = regressor_class().load_from_checkpoint(saved["path"], map_location=where)
    assert model.hparams["width"] == 16 and model.hparams["data_dir"] == Path("/data/regression")
    got = model.state_dict()
    assert sorted(got) == sorted(saved["weights"])
    for name, tensor in saved["weights"].items():
        assert got[name].device == torch.device("cpu")
        assert torch.equal(got[name], tensor), name


def test_map_location_moves_tensors(trained: dict[str, Any]) -> None:
    """``map_location`` reaches every tensor: ``meta`` as a stand-in for a GPU."""
    io_ = S3CheckpointIO()
    for kind in ("ws1", "fsdp2"):
        ckpt = io_.load_checkpoint(trained[kind]["path"], map_location=torch.device("meta"))
        assert all(t.device.type == "meta" for t in ckpt["state_dict"].values())
        by_dict = io_.load_checkpoint(trained[kind]["path"], map_location={"cpu": "meta"})
        assert all(t.device.type == "meta" for t in by_dict["state_dict"].values())


def test_sharded_checkpoint_loads_in_lightnings_shape(trained: dict[str, Any]) -> None:
    """A sharded checkpoint read by S3CheckpointIO: model FQNs whole (not split on dots),
    Lightning's keys at the top level, as a checkpoint saved in one file has them."""
    ckpt = S3CheckpointIO().load_checkpoint(trained["fsdp2"]["path"])
    assert "lightning" not in ckpt
    assert ckpt["global_step"] == trained["fsdp2"]["step"] == 4 and ckpt["epoch"] == 0
    assert sorted(ckpt["state_dict"]) == sorted(trained["fsdp2"]["weights"])
    assert ckpt["hyper_parameters"]["data_dir"] == Path("/data/regression")
    (optim,) = ckpt["optimizer_states"]
    assert set(optim["state"]) == set(trained["fsdp2"]["weights"])  # by parameter name
    assert optim["param_groups"][0]["lr"] == pytest.approx(1e-2)
    callbacks = ckpt["callbacks"]
    assert any(k.startswith("ModelCheckpoint{") for k in callbacks), list(callbacks)
    assert ckpt["lr_schedulers"][0]["step_size"] == 3


def test_datamodule_load_from_checkpoint(bucket: str, fs_mode: str) -> None:
    path = f"s3://{bucket}/run/epoch=0-step=1.ckpt"
    ckpt = lightning_like()
    ckpt["datamodule_hyper_parameters"] = {"batch_size": 7, "root": Path("/data/x")}
    S3CheckpointIO().save_checkpoint(ckpt, path)
    dm = HParamsData.load_from_checkpoint(path)
    assert dm.hparams["batch_size"] == 7 and dm.hparams["root"] == Path("/data/x")


def test_strategy_refuses_a_checkpoint_that_is_not_sharded(bucket: str) -> None:
    path = f"s3://{bucket}/run/last.ckpt"
    S3CheckpointIO().save_checkpoint(lightning_like(), path)
    with pytest.raises(CheckpointError, match="not a sharded checkpoint"):
        S3CheckpointIO().load_sharded({}, path, None)


# -- item 3: stock Lightning checkpoints ---------------------------------------------------------


def _put_stock(s3_client: Any, bucket: str, key: str, obj: Any) -> None:
    buf = io.BytesIO()
    torch.save(obj, buf)  # what stock Lightning's TorchCheckpointIO / s3fs write: one object
    s3_client.put_object(Bucket=bucket, Key=key, Body=buf.getvalue())


def test_stock_checkpoint_resumes_bit_exact(s3_client: Any, bucket: str, tmp_path: Path) -> None:
    """Stock Lightning saved ``last.ckpt`` after one epoch (one torch.save object on S3);
    a Trainer with S3CheckpointIO resumes it to two epochs and ends exactly where an
    uninterrupted two-epoch run does."""
    train, val = workers.example().loaders()
    whole_trainer, whole = _fit(2)
    whole_trainer.fit(whole, train, val)

    half_trainer, half = _fit(1)
    half_trainer.fit(half, train, val)
    half_trainer.save_checkpoint(tmp_path / "last.ckpt")  # stock TorchCheckpointIO
    s3_client.put_object(
        Bucket=bucket, Key="old/last.ckpt", Body=(tmp_path / "last.ckpt").read_bytes()
    )
    url = f"s3://{bucket}/old/last.ckpt"
    stock = torch.load(tmp_path / "last.ckpt", weights_only=False)
    assert same(stock, S3CheckpointIO().load_checkpoint(url))

    resumed_trainer, resumed = _fit(2, plugins=[S3CheckpointIO()])
    resumed_trainer.fit(resumed, train, val, ckpt_path=url)
    assert resumed_trainer.global_step == whole_trainer.global_step == 16
    mine, theirs = resumed.state_dict(), whole.state_dict()
    assert sorted(mine) == sorted(theirs)
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
    assert not all(torch.equal(half.state_dict()[k], theirs[k]) for k in theirs)  # it trained


def test_stock_checkpoint_load_from_checkpoint(s3_client: Any, bucket: str, fs_mode: str) -> None:
    model = workers.example().build_module()
    ckpt = {
        "epoch": 0,
        "global_step": 3,
        "pytorch-lightning_version": pl.__version__,
        "state_dict": model.state_dict(),
        "hyper_parameters": {"width": 16, "data_dir": Path("/data/regression")},
    }
    _put_stock(s3_client, bucket, "old/epoch=0-step=3.ckpt", ckpt)
    back = type(model).load_from_checkpoint(
        f"s3://{bucket}/old/epoch=0-step=3.ckpt", map_location="cpu"
    )
    assert all(torch.equal(back.state_dict()[k], v) for k, v in model.state_dict().items())
    assert back.hparams["data_dir"] == Path("/data/regression")


def test_stock_checkpoint_weights_only_rules(s3_client: Any, bucket: str) -> None:
    ckpt = lightning_like()
    ckpt["hyper_parameters"]["custom"] = Custom(3)
    _put_stock(s3_client, bucket, "old/last.ckpt", ckpt)
    url = f"s3://{bucket}/old/last.ckpt"
    # torch.distributed.tensor adds its classes to torch's list when first imported, which a
    # load may do: import it first, so the comparison sees only what the loader changed.
    import torch.distributed.tensor

    before = set(torch.serialization.get_safe_globals())
    with pytest.raises(UnsafeCheckpointError, match=r"old/last\.ckpt.*Custom") as info:
        S3CheckpointIO().load_checkpoint(url)
    assert info.value.bucket == bucket and info.value.key == "old/last.ckpt"
    with pytest.raises(UnsafeCheckpointError):
        S3CheckpointIO().load_checkpoint(url, weights_only=True)
    assert (
        S3CheckpointIO().load_checkpoint(url, weights_only=False)["hyper_parameters"]["custom"].x
        == 3
    )
    listed = S3CheckpointIO(safe_globals=[Custom]).load_checkpoint(url)
    assert listed["hyper_parameters"]["custom"].x == 3
    assert listed["hyper_parameters"]["data_dir"] == Path("/data/x")  # SAFE_GLOBALS
    after = set(torch.serialization.get_safe_globals())
    assert after == before and Custom not in after  # nothing left behind


def test_stock_checkpoint_streams_in_ranges_over_s3(s3_client: Any, bucket: str) -> None:
    """A stock checkpoint larger than the part size loads through ranged reads."""
    weights = torch.randn(6 * 1024 * 1024 // 4 + 123)
    ckpt = {"state_dict": OrderedDict(w=weights), "epoch": 1}
    _put_stock(s3_client, bucket, "old/big.ckpt", ckpt)
    io_ = S3CheckpointIO(transfer_config=TransferConfig(part_size=5 * 1024 * 1024))
    back = io_.load_checkpoint(f"s3://{bucket}/old/big.ckpt")
    assert torch.equal(back["state_dict"]["w"], weights)


class _NoWholeGets(MemoryStore):
    def get(self, key: str) -> bytes:
        raise AssertionError(f"whole-object GET of {key}: expected ranged reads")


def test_stock_object_reader_uses_bounded_ranges() -> None:
    store = _NoWholeGets()
    ckpt = {"state_dict": OrderedDict(a=torch.arange(50_000.0), b=torch.ones(3)), "n": 5}
    buf = io.BytesIO()
    torch.save(ckpt, buf)
    store.put("run/last.ckpt", buf.getvalue())
    info = store.head("run/last.ckpt")
    assert info is not None
    back = load_object(
        store, info, map_location=None, weights_only=None, safe_globals=(), block=4096
    )
    assert same(ckpt, back)


def test_stock_object_errors_name_the_object(s3_client: Any, bucket: str) -> None:
    s3_client.put_object(Bucket=bucket, Key="old/junk.ckpt", Body=b"not a checkpoint at all")
    s3_client.put_object(Bucket=bucket, Key="old/empty.ckpt", Body=b"")
    from s3ckpt.errors import CorruptCheckpointError

    with pytest.raises(CorruptCheckpointError, match=r"old/junk\.ckpt \(23 B\)"):
        S3CheckpointIO().load_checkpoint(f"s3://{bucket}/old/junk.ckpt", weights_only=False)
    with pytest.raises(CorruptCheckpointError, match="empty object"):
        S3CheckpointIO().load_checkpoint(f"s3://{bucket}/old/empty.ckpt")


def test_committed_s3ckpt_checkpoint_wins_over_an_old_object(
    s3_client: Any, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    old = lightning_like()
    old["global_step"] = 1
    _put_stock(s3_client, bucket, "run/last.ckpt", old)
    new = lightning_like()
    new["global_step"] = 2
    url = f"s3://{bucket}/run/last.ckpt"
    S3CheckpointIO().save_checkpoint(new, url)
    with caplog.at_level(logging.WARNING, logger="s3ckpt.lightning"):
        assert S3CheckpointIO().load_checkpoint(url)["global_step"] == 2
    assert "both an s3ckpt checkpoint" in caplog.text


# -- item 6: the CheckpointIO contract -----------------------------------------------------------


def test_state_dict_comes_back_an_ordered_dict_with_metadata(bucket: str) -> None:
    module = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    ckpt = lightning_like()
    ckpt["state_dict"] = module.state_dict()
    path = f"s3://{bucket}/run/last.ckpt"
    S3CheckpointIO().save_checkpoint(ckpt, path)
    back = S3CheckpointIO().load_checkpoint(path)["state_dict"]
    assert type(back) is OrderedDict and list(back) == list(ckpt["state_dict"])
    assert back._metadata == ckpt["state_dict"]._metadata  # type: ignore[attr-defined]
    assert back._metadata["1"] == {"version": 2}  # type: ignore[attr-defined]
    torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2)).load_state_dict(back)


def test_flatten_keeps_ordered_dicts_and_metadata_only_where_they_were() -> None:
    sd = torch.nn.Linear(2, 2).state_dict()
    tree = {"sd": sd, "plain": {"x": 1}, "od": OrderedDict(y=2)}
    back = unflatten_state_dict(flatten_state_dict(tree, objects=True))
    assert type(back["sd"]) is OrderedDict
    assert back["sd"]._metadata == sd._metadata  # type: ignore[attr-defined]
    assert type(back["plain"]) is dict and type(back["od"]) is OrderedDict
    assert not hasattr(back["od"], "_metadata")


def test_storage_options_raise_type_error(bucket: str, tmp_path: Path) -> None:
    io_ = S3CheckpointIO()
    with pytest.raises(TypeError, match="storage_options"):
        io_.save_checkpoint(lightning_like(), f"s3://{bucket}/run/x.ckpt", storage_options={})
    with pytest.raises(TypeError, match="storage_options"):
        io_.save_checkpoint(lightning_like(), tmp_path / "x.ckpt", storage_options={"a": 1})


def test_missing_checkpoint_is_a_file_not_found_error(bucket: str, fs_mode: str) -> None:
    url = f"s3://{bucket}/run/nothing.ckpt"
    with pytest.raises(FileNotFoundError) as info:
        S3CheckpointIO().load_checkpoint(url)
    assert isinstance(info.value, CheckpointNotFoundError)
    assert "run/nothing.ckpt" in str(info.value)
    err = pickle.loads(pickle.dumps(info.value))
    assert isinstance(err, CheckpointNotFoundError) and isinstance(err, FileNotFoundError)
    assert err.bucket == bucket
    with pytest.raises(FileNotFoundError):
        regressor_class().load_from_checkpoint(url)
