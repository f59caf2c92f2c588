"""Stream transforms (torch DCP's ``_extensions`` / ``_extension_registry``) on MemoryStore and
local folders: what s3ckpt writes through them loads (every item type, every value equal),
with s3ckpt's reader and torch's stock ``FileSystemReader``; what torch's stock
``FileSystemWriter`` writes through them loads with s3ckpt's reader; a transformed item is
read whole (never streamed into the destination), and its CRC32C covers the bytes stored.
The moto counterparts (FsspecWriter / FsspecReader over s3fs) are in
tests/integration/test_interop.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint._extension import ExtensionRegistry, ZStandard
from torch.distributed.checkpoint.api import CheckpointException
from torch.testing._internal.distributed.checkpoint_utils import (
    Rot13Example,
    get_test_extension_registry,
)

from s3ckpt import S3StorageReader, S3StorageWriter
from s3ckpt.errors import ChecksumMismatchError, ConfigError, find_s3ckpt_error
from s3ckpt.format._manifest import Manifest
from s3ckpt.store import MemoryStore
from s3ckpt.tools import verify_checkpoint
from tests._helpers import assert_same, committed_manifest
from tests._helpers import zeros_like_state as zeros
from tests.unit._memory_dcp import CONFIG, URL, load, make_state, save

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),  # DCP's single-process warning
    pytest.mark.skipif(not ZStandard.is_available(), reason="no zstandard (the test extra)"),
]

PREFIX = "run/step_1/"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _small_state() -> dict[str, Any]:
    """Tensors and every kind of non-tensor item, small (Rot13Example is pure Python)."""
    g = torch.Generator().manual_seed(3)
    return {
        "w": torch.randn(16, 8, generator=g),
        "half": torch.randn(5, 3, generator=g).to(torch.bfloat16),
        "noncontig": torch.randn(6, 4, generator=g).t(),
        "empty": torch.empty(0, 2),
        "blob": b"SomeBlobForTesting",
        "name": "run-rot13",
        "steps": [1, 2, 3],
        "nested": {"lr": 0.5, "t": torch.arange(4)},
    }


def _blank(sd: dict[str, Any]) -> dict[str, Any]:
    out = zeros(sd)
    out["blob"], out["name"], out["steps"] = b"", "", [0]
    return out


def _error(exc: BaseException) -> BaseException:
    return find_s3ckpt_error(exc) or exc


def _items(store: MemoryStore) -> Manifest:
    return committed_manifest(store.get, PREFIX)


def test_zstandard_save_and_load_every_value_equal() -> None:
    """Every item (an 8 MiB multipart tensor read in pieces, bf16, a non-contiguous view,
    an empty tensor, bytes items) stored compressed, with its descriptor, and loaded back
    bit-exact; the manifest gives no tensor offset (nothing streams into a destination)."""
    store = MemoryStore("bkt")
    sd = make_state()
    writer = save(store, sd, _extensions=[ZStandard()])
    reader = S3StorageReader(URL, store=store, transfer_config=CONFIG)
    infos = reader.metadata.storage_data.values()
    assert infos and all(i.transform_descriptors == ["stream.zstd/1"] for i in infos)
    manifest = _items(store)
    assert manifest.items and all(i.data_offset is None for i in manifest.items)
    for item in manifest.items:
        data = store.objects[PREFIX + item.object].data
        assert data[item.start : item.start + 4] == ZSTD_MAGIC, item.fqn
    out = zeros(sd)
    load(store, out)
    assert_same(sd, out)
    assert writer.bytes_written == sum(o.size for o in manifest.objects)


def test_rot13_with_the_readers_registry_loads_tensors_and_bytes_items() -> None:
    """A custom extension: the reader finds it in its own registry; bytes items are undone
    too (before the fix only tensors were, and the safe loader refused the rot13'd pickle)."""
    store = MemoryStore("bkt")
    sd = _small_state()
    save(store, sd, _extensions=[Rot13Example()])
    out = _blank(sd)
    load(store, out, _extension_registry=get_test_extension_registry())
    assert_same(sd, out)


def test_an_unknown_transform_names_the_item_and_the_registry_argument() -> None:
    store = MemoryStore("bkt")
    sd = {"w": torch.ones(3), "blob": b"x"}
    save(store, sd, _extensions=[Rot13Example()])
    with pytest.raises(CheckpointException) as info:
        load(store, {"w": torch.zeros(3), "blob": b""})  # torch's default registry
    err = _error(info.value)
    assert isinstance(err, ConfigError), err
    assert "stream.rot13/1" in str(err) and "_extension_registry=" in str(err)
    assert err.rank == 0 and err.key is not None and err.key.endswith(".distcp")


def test_checksum_covers_the_stored_bytes_and_verify_reads_them() -> None:
    """verify passes on a transformed checkpoint (CRC32C over what is stored, no zip
    framing to look for); a byte flipped inside a compressed item fails verify and the
    load with the checksum error, not a decompression error."""
    store = MemoryStore("bkt")
    sd = {"w": torch.randn(64, 64, generator=torch.Generator().manual_seed(1)), "step": 7}
    save(store, sd, _extensions=[ZStandard()])
    assert verify_checkpoint(URL, store=store).ok
    (item,) = [i for i in _items(store).items if i.fqn == "w"]
    obj = store.objects[PREFIX + item.object]
    at = item.start + item.length // 2
    obj.data = obj.data[:at] + bytes([obj.data[at] ^ 0x10]) + obj.data[at + 1 :]
    result = verify_checkpoint(URL, store=store)
    assert not result.ok and result.bad_items == ["w"]
    with pytest.raises(CheckpointException) as info:
        load(store, {"w": torch.zeros(64, 64), "step": 0})
    assert isinstance(_error(info.value), ChecksumMismatchError)


def test_writer_refuses_what_no_reader_could_load() -> None:
    """Two transforms: torch's readers undo them in the order applied (not the reverse),
    so stock torch writes such a checkpoint and then cannot load it; s3ckpt refuses at
    construction. Anything that is not a stream transform is refused too."""
    store = MemoryStore("bkt")
    with pytest.raises(ConfigError, match="at most one"):
        S3StorageWriter(URL, store=store, _extensions=[Rot13Example(), ZStandard()])
    with pytest.raises(ConfigError, match="not a stream transform"):
        S3StorageWriter(URL, store=store, _extensions=["zstd"])  # type: ignore[list-item]
    assert not store.objects


# -- torch's stock FileSystemWriter / FileSystemReader on a local folder -------------------


def test_stock_filesystem_writer_zstandard_loads_with_s3ckpt_reader(tmp_path: Path) -> None:
    sd = make_state()
    dcp.save(sd, storage_writer=FileSystemWriter(tmp_path, _extensions=[ZStandard()]))
    out = zeros(sd)
    dcp.load(out, storage_reader=S3StorageReader(tmp_path, transfer_config=CONFIG))
    assert_same(sd, out)


def test_s3ckpt_writer_zstandard_loads_with_stock_filesystem_reader(tmp_path: Path) -> None:
    store = MemoryStore("bkt")
    sd = make_state()
    save(store, sd, _extensions=[ZStandard()])
    for key, obj in store.objects.items():  # the checkpoint's objects as a local folder
        if key.startswith(PREFIX) and "/" not in key[len(PREFIX) :]:
            (tmp_path / key[len(PREFIX) :]).write_bytes(bytes(obj.data))
    out = zeros(sd)
    dcp.load(out, storage_reader=FileSystemReader(tmp_path))
    assert_same(sd, out)


def test_an_empty_registry_is_the_readers_own() -> None:
    """``_extension_registry`` replaces torch's default registry (as FileSystemReader's
    does): a registry without ZStandard cannot undo it."""
    store = MemoryStore("bkt")
    save(store, {"w": torch.ones(2)}, _extensions=[ZStandard()])
    empty = ExtensionRegistry()
    empty.extensions.clear()
    with pytest.raises(CheckpointException) as info:
        load(store, {"w": torch.zeros(2)}, _extension_registry=empty)
    assert isinstance(_error(info.value), ConfigError)
    out = {"w": torch.zeros(2)}
    load(store, out)
    assert torch.equal(out["w"], torch.ones(2))


class _PassThrough(Rot13Example):
    """A transform that hands the bytes on unchanged (the same buffers): the sink then sees
    the tensor's own memory, as without a transform."""

    @staticmethod
    def registry_name() -> str:
        return "test.pass"

    @staticmethod
    def from_descriptor(version: str) -> _PassThrough:
        return _PassThrough()

    def transform_to(self, output: Any) -> Any:
        return output

    def transform_from(self, input: Any) -> Any:
        return input


def test_a_transformed_tensor_is_never_uploaded_from_its_memory_nor_streamed_into() -> None:
    """Even a transform whose bytes are the tensor's own: the item records no tensor offset
    (so no load streams it into a destination, no verify looks for its framing), and its
    parts go through the part buffers."""
    store = MemoryStore("bkt")
    sd = make_state()
    save(store, sd, _extensions=[_PassThrough()])
    (big,) = [i for i in _items(store).items if i.fqn == "big"]
    assert big.data_offset is None
    registry = ExtensionRegistry()
    registry.register(_PassThrough)
    out = zeros(sd)
    load(store, out, _extension_registry=registry)
    assert_same(sd, out)
