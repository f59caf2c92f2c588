"""DCP round trips and failure modes against the in-memory store (fast, one process)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from s3ckpt import (
    CheckpointNotFoundError,
    ChecksumMismatchError,
    CorruptCheckpointError,
    S3StorageReader,
    S3StorageWriter,
    StoreError,
    UnsafeCheckpointError,
)
from s3ckpt.config import MiB
from s3ckpt.errors import CheckpointExistsError, find_s3ckpt_error
from s3ckpt.format._manifest import Manifest
from s3ckpt.store import MemoryStore
from tests._helpers import assert_same, zeros_like_state
from tests.unit._memory_dcp import URL, load, make_state, save


def test_round_trip_every_dtype_and_layout() -> None:
    store = MemoryStore("bkt")
    sd = make_state()
    writer = save(store, sd, step=7, metrics={"loss": 1.5})
    out = zeros_like_state(sd)
    reader = load(store, out)
    assert_same(sd, out)
    manifest = writer.last_manifest
    assert manifest is not None and manifest.step == 7 and manifest.metrics == {"loss": 1.5}
    # Several objects (target 3 MiB) and the big one went multipart.
    assert len(manifest.objects) >= 2
    assert store.calls.get("upload_part", 0) >= 2
    # Read path coalesced: far fewer GETs than items.
    assert store.calls["get"] < len(manifest.items)
    assert reader.bytes_read >= sum(o.size for o in manifest.objects) * 0.9


def test_layout_is_dcp_plus_marker() -> None:
    store = MemoryStore("bkt")
    save(store, make_state())
    names = sorted(k.rsplit("/", 1)[1] for k in store.objects)
    manifest = Manifest.from_json(store.objects["run/step_1/s3ckpt.json"].data)
    tag = manifest.tag
    # torch's names plus the save's tag, the committed .metadata.<tag>, the stock copy, the
    # item records and the marker; the heartbeats are gone once the save committed.
    assert names[:2] == [".metadata", f".metadata.{tag}"]
    assert names[-2:] == [f"s3ckpt.items.{tag}", "s3ckpt.json"]
    assert all(n.startswith("__0_") and n.endswith(f".{tag}.distcp") for n in names[2:-2])
    assert {o.name for o in manifest.objects} == set(names[2:-2])
    assert manifest.metadata_key == f".metadata.{tag}"
    meta = store.objects["run/step_1/.metadata"].data
    assert store.objects[f"run/step_1/.metadata.{tag}"].data == meta
    assert manifest.total_bytes == sum(len(o.data) for o in store.objects.values()) - len(
        store.objects["run/step_1/s3ckpt.json"].data
    ) - len(meta)


def test_existing_checkpoint_is_refused_then_overwritten_safely() -> None:
    store = MemoryStore("bkt")
    first = make_state()
    save(store, first)
    with pytest.raises(CheckpointExistsError) as info:
        S3StorageWriter(URL, store=store)
    assert "overwrite=True" in str(info.value)
    old_keys = {k for k in store.objects if k.endswith(".distcp")}
    second = make_state()
    second["big"] += 1
    save(store, second, overwrite=True)
    out = zeros_like_state(second)
    load(store, out)
    assert_same(second, out)
    new_keys = {k for k in store.objects if k.endswith(".distcp")}
    assert not (old_keys & new_keys), "old data objects must be replaced, not written over"


def test_failed_overwrite_keeps_previous_checkpoint() -> None:
    store = MemoryStore("bkt")
    first = make_state()
    save(store, first)
    before = dict(store.objects)
    store.inject("upload_part", times=100)
    second = make_state()
    second["big"] += 1
    with pytest.raises(CheckpointException) as info:
        save(store, second, overwrite=True)
    assert isinstance(find_s3ckpt_error(info.value), StoreError)
    assert store.objects.keys() == before.keys()
    assert not store.uploads, "every multipart upload must be aborted"
    out = zeros_like_state(first)
    load(store, out)
    assert_same(first, out)


@pytest.mark.parametrize(
    "operation", ["upload_part", "complete_multipart", "put", "create_multipart"]
)
def test_failed_save_leaves_nothing(operation: str) -> None:
    store = MemoryStore("bkt")
    store.put("other/keep.txt", b"unrelated")
    # Fail the first matching call for data objects only (not the marker).
    store.inject(operation, key_glob="*.distcp", times=1)
    with pytest.raises(CheckpointException):
        save(store, make_state())
    assert set(store.objects) == {"other/keep.txt"}
    assert not store.uploads


def test_failed_commit_leaves_nothing() -> None:
    store = MemoryStore("bkt")
    store.inject("put", key_glob="*s3ckpt.json")
    with pytest.raises(CheckpointException):
        save(store, make_state())
    assert store.objects == {}
    assert not store.uploads


def test_checksum_mismatch_names_tensor_and_object() -> None:
    store = MemoryStore("bkt")
    sd = make_state()
    writer = save(store, sd)
    manifest = writer.last_manifest
    assert manifest is not None
    rec = next(i for i in manifest.items if i.fqn == "ints")
    key = f"run/step_1/{rec.object}"
    data = bytearray(store.objects[key].data)
    data[rec.start + (rec.data_offset or 0) + 5] ^= 0x01
    store.objects[key].data = bytes(data)
    with pytest.raises(CheckpointException) as info:
        load(store, zeros_like_state(sd))
    err = find_s3ckpt_error(info.value)
    assert isinstance(err, ChecksumMismatchError)
    assert err.item == "ints" and err.key == key
    assert "ints" in str(err) and key in str(err)
    # Opting out of verification loads the (corrupt) bytes.
    out = zeros_like_state(sd)
    load(store, out, verify_checksums=False)
    assert not torch.equal(out["ints"], sd["ints"])


def test_truncated_object_is_reported() -> None:
    store = MemoryStore("bkt")
    sd = make_state()
    writer = save(store, sd)
    assert writer.last_manifest is not None
    obj = writer.last_manifest.objects[0]
    key = f"run/step_1/{obj.name}"
    store.objects[key].data = store.objects[key].data[: obj.size // 2]
    with pytest.raises(CheckpointException) as info:
        load(store, zeros_like_state(sd))
    err = find_s3ckpt_error(info.value)
    assert isinstance(err, CorruptCheckpointError) and "truncated" in str(err)
    assert err.key == key


def test_missing_checkpoint() -> None:
    with pytest.raises(CheckpointNotFoundError, match="no checkpoint"):
        S3StorageReader("s3://bkt/nothing/here", store=MemoryStore("bkt"))


def test_metadata_changed_after_commit_is_detected() -> None:
    store = MemoryStore("bkt")
    writer = save(store, make_state())
    assert writer.last_manifest is not None
    committed = f"run/step_1/{writer.last_manifest.metadata_key}"
    store.objects["run/step_1/.metadata"].data += b"\0"
    store.objects[committed].data += b"\0"
    with pytest.raises(CorruptCheckpointError, match="does not match") as info:
        S3StorageReader(URL, store=store)
    assert info.value.key == committed


def test_stale_stock_metadata_is_rolled_forward() -> None:
    """A commit killed before its plain .metadata copy (or an overwrite whose old copy is
    still there): s3ckpt loads the committed metadata and puts the copy back."""
    store = MemoryStore("bkt")
    sd = make_state()
    writer = save(store, sd)
    assert writer.last_manifest is not None
    good = store.objects["run/step_1/.metadata"].data
    store.objects["run/step_1/.metadata"].data = good[:-1] + bytes([good[-1] ^ 1])
    out = zeros_like_state(sd)
    load(store, out)
    assert_same(sd, out)
    assert store.objects["run/step_1/.metadata"].data == good
    del store.objects["run/step_1/.metadata"]
    load(store, zeros_like_state(sd))
    assert store.objects["run/step_1/.metadata"].data == good


class Evil:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (print, ("pwned",))


def test_unsafe_metadata_pickle_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    store = MemoryStore("bkt")
    store.put("evil/.metadata", pickle.dumps(Evil()))
    with pytest.raises(UnsafeCheckpointError, match=r"builtins\.print"):
        S3StorageReader("s3://bkt/evil", store=store)
    assert "pwned" not in capsys.readouterr().out


def test_unsafe_byte_item_is_refused_unless_allowed() -> None:
    store = MemoryStore("bkt")
    # A non-tensor value that needs full pickle to load.
    sd = {"t": torch.ones(2), "obj": Evil()}
    save(store, sd)
    with pytest.raises(CheckpointException) as info:
        load(store, {"t": torch.zeros(2), "obj": None})
    assert isinstance(find_s3ckpt_error(info.value), UnsafeCheckpointError)


def test_partial_load() -> None:
    """Loading a subset of the saved keys reads only what it needs."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    store = MemoryStore("bkt")
    sd = {"w": torch.arange(40.0).reshape(8, 5), "x": torch.ones(3)}
    save(store, sd)
    out = {"w": torch.zeros(8, 5)}
    dcp.load(
        out,
        storage_reader=S3StorageReader(URL, store=store),
        planner=DefaultLoadPlanner(allow_partial_load=True),
    )
    assert torch.equal(out["w"], sd["w"])


class _PartAddresses(MemoryStore):
    """Notes the memory address of every uploaded part's body."""

    def __init__(self, bucket: str) -> None:
        super().__init__(bucket)
        self.addresses: list[int] = []

    def upload_part(self, key, upload_id, part_number, data, *, crc32c=None):  # type: ignore[no-untyped-def]
        view = memoryview(data).cast("B")
        self.addresses.append(np.frombuffer(view, dtype=np.uint8).ctypes.data)
        return super().upload_part(key, upload_id, part_number, data, crc32c=crc32c)


def test_large_tensors_are_uploaded_from_their_own_memory_and_load_back_exactly() -> None:
    store = _PartAddresses("bkt")
    g = torch.Generator().manual_seed(1)
    sd = {
        "huge": torch.randn(6 * MiB // 4 * 4 + 123, generator=g),  # ~24 MiB: >= 2 parts
        "huge_t": torch.randn(1024, 3 * 1024, generator=g).t(),  # 12 MiB, copied (contiguous())
        "small": torch.randn(100, generator=g),
    }
    save(store, sd)

    def inside(t: torch.Tensor) -> int:
        lo = t.data_ptr()
        hi = lo + t.numel() * t.element_size()
        return sum(lo <= a < hi for a in store.addresses)

    assert inside(sd["huge"]) >= 3, "whole parts of 'huge' should be sent from its memory"
    assert inside(sd["huge_t"]) == 0
    out = zeros_like_state(sd)
    load(store, out)  # verifies every item's CRC32C
    assert_same(sd, out)
