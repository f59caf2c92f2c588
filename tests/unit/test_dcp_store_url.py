"""The DCP writer and reader take a parsed StoreURL as well as a string, and open a store
only when they are given none."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp

import s3ckpt.dcp._locate
import s3ckpt.dcp.reader
import s3ckpt.dcp.writer
from s3ckpt import S3StorageReader, S3StorageWriter
from s3ckpt.store import MemoryStore, ObjectStore
from s3ckpt.uri import StoreURL, parse_url

URL = "s3://bkt/run/step_1"


@pytest.fixture
def no_open(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record (and refuse) every store the writer or reader would open."""
    opened: list[str] = []

    def refuse(url: object, **kw: object) -> tuple[ObjectStore, StoreURL]:
        opened.append(str(url))
        raise AssertionError(f"opened a store for {url}")

    monkeypatch.setattr(s3ckpt.dcp._locate, "open_store", refuse)
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

    def fake_open(url: object, **kw: object) -> tuple[ObjectStore, StoreURL]:
        opened.append(url)
        parsed = url if isinstance(url, StoreURL) else parse_url(str(url))
        return store, parsed

    monkeypatch.setattr(s3ckpt.dcp._locate, "open_store", fake_open)
    url = parse_url(URL)
    dcp.save({"w": torch.ones(3)}, storage_writer=S3StorageWriter(url))
    reader = S3StorageReader(URL)
    assert reader.store is store
    assert opened == [url, url]  # the StoreURL as given, then the parsed string
