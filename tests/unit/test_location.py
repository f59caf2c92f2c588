"""A location is one value: ``Location.of`` at the entry points, the settings held once (by
an S3 store, resolved when it is built; by the Location for a store without), one retry
policy per store serving calls on many threads, and the upload buffer count derived in one
place."""

from __future__ import annotations

import pickle
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from tenacity import retry_if_exception_type

from s3ckpt import Checkpointer, S3StorageReader, S3StorageWriter
from s3ckpt.config import MiB, S3Config, TransferConfig
from s3ckpt.errors import ConfigError, InvalidURLError
from s3ckpt.store import Location, MemoryStore, S3Store
from s3ckpt.store.retry import RetryPolicy
from s3ckpt.uri import StoreURL, parse_url

URL = "s3://bkt/run"
TC = TransferConfig(part_size=5 * MiB, max_concurrency=2)


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No attempts or profile from the environment; an empty AWS config file (returned)."""
    for var in ("AWS_MAX_ATTEMPTS", "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    config = tmp_path / "aws_config"
    config.write_text("")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    return config


def test_an_s3_store_resolves_its_settings_once_and_never_changes_them(aws_env: Path) -> None:
    aws_env.write_text("[default]\nmax_attempts = 3\n")
    loc = Location.of(URL, transfer_config=TC)
    store = loc.store
    assert isinstance(store, S3Store)
    tc = store.transfer_config
    assert tc.max_attempts == 3 and tc.part_size == TC.part_size  # the profile's, at once
    assert loc.transfer_config is tc and loc.child("step_1").transfer_config is tc
    policy = store.retry_policy
    _ = store.client  # building the client changes nothing
    assert store.transfer_config is tc and store.retry_policy is policy
    # The caller's choice wins over the profile's; the same settings share one store.
    assert S3Store("bkt", None, TransferConfig(max_attempts=5)).transfer_config.max_attempts == 5
    assert Location.of(URL + "/other", transfer_config=TC).store is store
    # A pickled store (spawned workers) keeps the resolved settings and its frozen policy.
    again = pickle.loads(pickle.dumps(store))
    assert again.transfer_config == tc and again.retry_policy == policy


def test_a_store_without_settings_gets_them_from_its_location() -> None:
    store = MemoryStore("bkt")
    sc = S3Config(single_writer=True)
    loc = Location.of(URL, store=store, transfer_config=TC, s3_config=sc)
    step = loc.child("step_1")
    assert step.store is store and step.transfer_config is TC and step.s3_config is sc
    assert step.at("s3://bkt/run/step_2/").transfer_config is TC  # same bucket, same store
    assert Location.of(URL, store=store).transfer_config == TransferConfig()
    writer = S3StorageWriter(step)
    assert writer.location is step and writer.transfer_config is TC and writer.s3_config is sc
    with pytest.raises(ConfigError, match="already a Location"):
        S3StorageWriter(step, transfer_config=TC)


def test_the_checkpointer_hands_its_location_down() -> None:
    store = MemoryStore("bkt")
    model = torch.nn.Linear(4, 2)
    with Checkpointer(URL, store=store, transfer_config=TC) as ckpt:
        assert ckpt.url == parse_url(URL) and ckpt.transfer_config is TC
        writer = ckpt._writer(1, None)
        assert writer.store is store and writer.transfer_config is TC
        assert writer.url == parse_url(URL + "/step_000000001")
        ckpt.save(1, model)
        assert ckpt.load(torch.nn.Linear(4, 2)) == 1
    with Checkpointer(ckpt.location) as again:  # a Location passes through
        assert again.location is ckpt.location and again.latest() == 1


def test_strings_must_be_urls_and_path_objects_are_local_paths(tmp_path: Path) -> None:
    with pytest.raises(InvalidURLError, match="not a checkpoint URL"):
        Location.of("bkt/run")  # a forgotten s3:// is not a local folder
    local = Location.of(tmp_path / "run")
    assert local.url.scheme == "file" and local.url.prefix.endswith("/run/")
    sd = {"w": torch.arange(6.0)}
    dcp.save(sd, storage_writer=S3StorageWriter(tmp_path / "ckpt"))
    out = {"w": torch.zeros(6)}
    dcp.load(out, storage_reader=S3StorageReader(tmp_path / "ckpt"))
    assert torch.equal(out["w"], sd["w"])


def test_reset_and_validate_are_shared_by_the_writer_and_reader() -> None:
    store = MemoryStore("bkt")
    dcp.save({"w": torch.ones(2)}, storage_writer=S3StorageWriter(URL + "/a", store=store))
    reader = S3StorageReader(URL + "/a", store=store)
    for cls in (S3StorageWriter, S3StorageReader):
        assert cls.reset is reader.reset.__func__  # type: ignore[attr-defined]
        assert cls.validate_checkpoint_id("s3://bkt/x") and cls.validate_checkpoint_id(
            Location(StoreURL("s3", "bkt", "x/"), store)
        )
        assert not cls.validate_checkpoint_id("gs://bkt/x")
    dcp.save({"w": torch.ones(2)}, storage_writer=S3StorageWriter(URL + "/b", store=store))
    reader.reset(URL + "/b")
    assert reader.url.prefix == "run/b/" and reader.store is store


def test_the_upload_buffer_count_is_derived_in_one_place() -> None:
    tc = TransferConfig(part_size=16 * MiB, max_inflight_bytes=64 * MiB)
    assert tc.upload_buffers(16 * MiB) == 5 and tc.max_inflight_parts == 4
    assert tc.upload_buffers(64 * MiB) == 2 and tc.upload_buffers(256 * MiB) == 2


def test_one_policy_serves_calls_on_many_threads_each_with_its_own_retrying() -> None:
    tc = TransferConfig(max_attempts=4, retry_initial_delay=0.0, request_deadline=30.0)
    policy = RetryPolicy.of(tc, sleep=lambda s: None)
    resets = retry_if_exception_type(ConnectionResetError)
    barrier = threading.Barrier(8)
    made: dict[int, int] = {}

    def one(i: int) -> None:
        left, calls = [i % 4], [0]  # call i fails i % 4 times (within the 4 attempts)

        def attempt() -> int:
            calls[0] += 1
            if calls[0] == 1:
                barrier.wait()  # every call's first attempt in flight at once
            if left[0]:
                left[0] -= 1
                raise ConnectionResetError
            return i

        assert policy.retrying(retry=resets)(attempt) == i
        made[i] = calls[0]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert made == {i: i % 4 + 1 for i in range(8)}
    # Attempts a call already spent count against the policy's, for that call only.
    spent = [0]

    def always_reset() -> None:
        spent[0] += 1
        raise ConnectionResetError

    with pytest.raises(ConnectionResetError):
        policy.retrying(retry=resets, attempts_used=2)(always_reset)
    assert spent[0] == 2
