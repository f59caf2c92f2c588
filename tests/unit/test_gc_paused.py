"""s3ckpt._gc_pause.gc_paused: nesting across threads, restoring the collector's state, and the
decoders that use it running without a single collection."""

from __future__ import annotations

import gc
import pickle
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from s3ckpt._gc_pause import gc_paused
from s3ckpt.dcp._safe import load_metadata
from s3ckpt.format._manifest import ItemRecord, Manifest, ObjectRecord


@contextmanager
def _collections() -> Iterator[list[int]]:
    seen: list[int] = []

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            seen.append(info["generation"])

    gc.callbacks.append(callback)
    try:
        yield seen
    finally:
        gc.callbacks.remove(callback)


@pytest.fixture(autouse=True)
def _collector_enabled() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_pauses_and_restores() -> None:
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_keeps_a_disabled_collector_disabled() -> None:
    gc.disable()
    with gc_paused():
        pass
    assert not gc.isenabled()


def test_overlapping_threads_reenable_only_when_the_last_leaves() -> None:
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with gc_paused():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other)
    with gc_paused():
        t.start()
        assert inside.wait(10)
    assert not gc.isenabled(), "re-enabled while another thread is still inside"
    release.set()
    t.join(10)
    assert gc.isenabled()


def test_reenables_after_an_exception() -> None:
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def _big_metadata(n: int) -> bytes:
    props = TensorProperties(dtype=torch.float32)
    md = Metadata(
        state_dict_metadata={
            f"layers.{i}.w": TensorStorageMetadata(
                properties=props,
                size=torch.Size([4, 4]),
                chunks=[ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([4, 4]))],
            )
            for i in range(n)
        },
        storage_data={MetadataIndex(f"layers.{i}.w", torch.Size([0, 0])): i for i in range(n)},
    )
    return pickle.dumps(md, protocol=pickle.HIGHEST_PROTOCOL)


def test_decoding_runs_no_collection() -> None:
    raw = _big_metadata(5000)
    manifest, records = Manifest(
        save_id="s",
        created=0.0,
        world_size=1,
        metadata_key=".metadata",
        metadata_crc32c=0,
        metadata_size=len(raw),
        objects=(ObjectRecord("__0_0.distcp", 5000, 0),),
        items=tuple(
            ItemRecord(f"layers.{i}.w", (0, 0), "__0_0.distcp", i, 1, i, None) for i in range(5000)
        ),
    ).split_items("s3ckpt.items.0badcafe")
    # Each call allocates tens of thousands of objects; with the collector running that
    # starts a young collection every 700 allocations. Paused, a call runs none; the one
    # allowed below is the collection its allocations start once the collector is back on.
    doc = manifest.to_json()
    back = Manifest.from_json(doc).with_items(records, where="items")
    assert back == manifest and len(back.item_index()) == 5000
    assert len(load_metadata(raw).state_dict_metadata) == 5000
    calls = {
        "load_metadata": lambda: load_metadata(raw),
        "to_json": manifest.to_json,
        "items_json": manifest.items_json,
        "from_json": lambda: Manifest.from_json(doc),
        "with_items": lambda: Manifest.from_json(doc).with_items(records, where="items"),
        "item_index": back.item_index,
    }
    for name, call in calls.items():
        with _collections() as seen:
            call()
        assert len(seen) <= 1, f"{name} ran {len(seen)} collections"
    with _collections() as seen:
        pickle.loads(raw)  # the same decoding with the collector running
    assert len(seen) > 10
