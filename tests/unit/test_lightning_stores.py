"""s3ckpt.lightning without a plug-in at hand: which settings open a bucket, one store per
settings across the process, and ``install()`` (the explicit opt-in; importing the package
installs nothing, tests/unit/test_lightning_import.py) is idempotent. No requests are made:
stores are only opened."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("lightning")  # the `lightning` extra; the test extra installs it

from s3ckpt.config import S3Config, TransferConfig
from s3ckpt.lightning import S3CheckpointIO, install
from s3ckpt.lightning import _async as _stores
from s3ckpt.lightning._async import location_for
from s3ckpt.store import Location

OURS = S3Config(endpoint_url="http://127.0.0.1:9", region="us-east-1")
OTHER = S3Config(endpoint_url="http://127.0.0.1:10", region="us-east-1")


@pytest.fixture(autouse=True)
def empty_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process's registry, empty for the test and restored after it."""
    monkeypatch.setattr(_stores, "_SETTINGS", {})
    yield


def test_without_a_plugin_the_environment_opens_a_bucket() -> None:
    assert location_for("s3://bkt/run/x.ckpt").store is Location.of("s3://bkt/run/").store


def test_the_bucket_a_plugin_opened_wins_over_the_last_plugin_constructed() -> None:
    first = S3CheckpointIO(s3_config=OURS, register_filesystem=False)
    here = first._open("s3://ours/run/last.ckpt")
    S3CheckpointIO(s3_config=OTHER, register_filesystem=False)  # constructed last
    # The hook and the file system open "ours" as the plug-in did: the same store.
    assert location_for("s3://ours/run/epoch=1.ckpt").store is here.store
    assert here.s3_config == OURS
    # A bucket no plug-in opened: the last plug-in constructed.
    assert location_for("s3://elsewhere/run/").s3_config == OTHER


def test_a_plugin_and_the_hook_share_one_store_per_settings() -> None:
    tc = TransferConfig(part_size=8 * 1024 * 1024)
    io = S3CheckpointIO(s3_config=OURS, transfer_config=tc, register_filesystem=False)
    a, b = io._open("s3://ours/a/x.ckpt"), io._open("s3://ours/b/y.ckpt")
    assert a.store is b.store is location_for("s3://ours/c/").store
    assert a.transfer_config.part_size == tc.part_size


def test_settings_are_kept_by_scheme_and_bucket() -> None:
    io = S3CheckpointIO(s3_config=OURS, register_filesystem=False)
    io._open("s3://ours/run/")
    S3CheckpointIO(s3_config=OTHER, register_filesystem=False)
    assert location_for("s3://ours/other/").s3_config == OURS  # the bucket, any prefix
    assert location_for("s3://theirs/run/").s3_config == OTHER


def test_install_is_idempotent() -> None:
    from lightning.pytorch.callbacks.model_checkpoint import ModelCheckpoint
    from lightning.pytorch.core import saving
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    install()
    before = (saving.pl_load, ModelCheckpoint._find_last_checkpoints, AsyncCheckpointIO.teardown)
    install()
    after = (saving.pl_load, ModelCheckpoint._find_last_checkpoints, AsyncCheckpointIO.teardown)
    assert after == before  # nothing is wrapped twice
    assert getattr(saving.pl_load, "_s3ckpt_hook", False)
