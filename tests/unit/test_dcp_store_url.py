"""The DCP writer and reader take a parsed StoreURL as well as a string, and open a store
only when they are given none."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp

import s3ckpt.store._location
from s3ckpt import S3StorageReader, S3StorageWriter
from s3ckpt.store import MemoryStore, ObjectStore
from s3ckpt.uri import StoreURL, parse_url

URL = "s3://bkt/run/step_1"


@pytest.fixture
def no_open(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record (and refuse) every store the writer or reader would open."""
    opened: list[str] = []

    def refuse(url: object, *args: object) -> ObjectStore:
        opened.append(str(url))
        raise AssertionError(f"opened a store for {url}")

    monkeypatch.setattr(s3ckpt.store._location, "shared_store", refuse)
    return opened


@pytest.mark.parametrize("form", ["str", "StoreURL"])
def test_a_given_store_is_used_and_none_is_opened(form: str, no_open: list[str]) -> None:
    path: str | StoreURL = URL if form == "str" else parse_url(URL)
    store = MemoryStore("bkt")
    sd = {"w": torch.arange(10.0)}
    writer = S3StorageWriter(path, store=store)
    assert writer.url == parse_url(URL) and writer.checkpoint_id == "s3://bkt/run/step_1/"
    dcp.save(sd, storage_writer=writer)
    reader = S3StorageReader(path, store=store)
    assert reader.store is store and reader.url == parse_url(URL)
    out = {"w": torch.zeros(10)}
    dcp.load(out, storage_reader=reader)
    assert torch.equal(out["w"], sd["w"])
    writer.reset(parse_url("s3://bkt/run/step_2"))
    assert writer.url.prefix == "run/step_2/" and writer.store is store
    assert no_open == []


def test_without_a_store_one_is_opened_for_the_parsed_url(monkeypatch: pytest.MonkeyPatch) -> None:
    store = MemoryStore("bkt")
    opened: list[object] = []

    def fake_open(url: object, *args: object) -> ObjectStore:
        opened.append(url)
        return store

    monkeypatch.setattr(s3ckpt.store._location, "shared_store", fake_open)
    url = parse_url(URL)
    dcp.save({"w": torch.ones(3)}, storage_writer=S3StorageWriter(url))
    reader = S3StorageReader(URL)
    assert reader.store is store
    assert opened == [url, url]  # the StoreURL as given, then the parsed string


def test_a_reset_to_the_same_location_reads_nothing_again() -> None:
    """``dcp.save/load(..., checkpoint_id=URL)`` with the writer's or reader's own URL,
    spelled without the trailing slash: the location is compared parsed."""
    store = MemoryStore("bkt")
    # The store's capabilities are probed once per store (its race reads a key back): not
    # what this test counts.
    dcp.save(
        {"w": torch.ones(3)}, storage_writer=S3StorageWriter("s3://bkt/run/step_0", store=store)
    )
    store.calls.clear()
    writer = S3StorageWriter(URL, store=store)
    assert store.calls == {"get": 1}  # the fail-fast check of the marker (a ranged GET)
    dcp.save({"w": torch.ones(3)}, checkpoint_id=URL, storage_writer=writer)
    assert store.calls["get"] == 1  # not again on reset, nor when planning
    store.calls.clear()
    reader = S3StorageReader(URL, store=store)
    assert store.calls == {"get": 3}  # s3ckpt.json, its item records and .metadata
    out = {"w": torch.zeros(3)}
    for same in (URL, URL + "/", parse_url(URL), "s3a://bkt/run/step_1"):
        reader.reset(same)
    assert store.calls == {"get": 3}
    dcp.load(out, checkpoint_id=URL, storage_reader=reader)
    assert store.calls == {"get": 4}  # and the one data object
    assert torch.equal(out["w"], torch.ones(3))


def test_a_writer_saving_again_checks_the_marker_when_planning() -> None:
    from s3ckpt.errors import CheckpointExistsError, find_s3ckpt_error

    store = MemoryStore("bkt")
    writer = S3StorageWriter(URL, store=store)
    dcp.save({"w": torch.ones(3)}, storage_writer=writer)
    store.calls.clear()
    with pytest.raises(BaseException) as info:  # DCP's CheckpointException
        dcp.save({"w": torch.ones(3)}, storage_writer=writer)
    err = find_s3ckpt_error(info.value)
    assert isinstance(err, CheckpointExistsError)
    assert "this job already committed" in str(err)  # the marker's writer is this process
    # Refused when planning, nothing uploaded: the first bytes of the marker, then the
    # marker read whole (HEAD and GET) to name who committed it.
    assert store.calls == {"get": 2, "head": 1}


def test_a_reset_to_another_prefix_of_the_bucket_keeps_the_opened_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    opened: list[str] = []

    def fake_open(url: object, *args: object) -> ObjectStore:
        opened.append(str(url))
        return MemoryStore(parse_url(str(url)).bucket)

    monkeypatch.setattr(s3ckpt.store._location, "shared_store", fake_open)
    writer = S3StorageWriter(URL)
    first = writer.store
    writer.reset("s3://bkt/run/step_2")
    assert writer.store is first and writer.url.prefix == "run/step_2/"
    writer.reset("s3://other-bkt/run/step_2")
    assert writer.store is not first and writer.store.bucket == "other-bkt"
    assert opened == ["s3://bkt/run/step_1/", "s3://other-bkt/run/step_2/"]


def test_the_marker_check_tells_a_deleted_step_from_a_taken_one() -> None:
    from s3ckpt._tombstone import Tombstone
    from s3ckpt.errors import CheckpointExistsError
    from s3ckpt.format._names import MANIFEST_NAME

    store = MemoryStore("bkt")
    key = parse_url(URL).key(MANIFEST_NAME)
    store.put(key, Tombstone("a-deleter", by="gc", keep=True).to_json())  # being deleted
    with pytest.raises(CheckpointExistsError):
        S3StorageWriter(URL, store=store)
    store.put(key, Tombstone("a-deleter", by="gc", keep=True, done=True).to_json())  # gone
    dcp.save({"w": torch.ones(3)}, storage_writer=S3StorageWriter(URL, store=store))
    out = {"w": torch.zeros(3)}
    dcp.load(out, storage_reader=S3StorageReader(URL, store=store))
    assert torch.equal(out["w"], torch.ones(3))
