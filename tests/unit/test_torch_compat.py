"""The private torch APIs behind s3ckpt.dcp._torch: each probe finds torch's on the pinned
torch, and each fallback, taken for real by removing the private name, gives the same
results on real data."""

from __future__ import annotations

import functools
import io
import itertools
import pickle
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import filesystem
from torch.distributed.checkpoint._extension import StreamTransformExtension
from torch.distributed.checkpoint._nested_dict import flatten_state_dict as torch_flatten
from torch.distributed.checkpoint.filesystem import (
    FileSystemReader,
    FileSystemWriter,
    _StorageInfo,
    _StorageReaderTransforms,
)
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex
from torch.distributed.checkpoint.planner import LoadItemType, ReadItem
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset
from torch.distributed.tensor.placement_types import _StridedShard

from s3ckpt.dcp import _torch
from s3ckpt.dcp._safe import load_metadata
from s3ckpt.errors import S3CkptError

_V = re.escape(torch.__version__)


def test_every_probe_finds_torchs_private_api_on_the_pinned_torch() -> None:
    assert _torch.StorageInfo is _StorageInfo
    assert _torch._flatten is torch_flatten
    assert callable(getattr(DTensor, "__create_chunk_list__", None))
    assert isinstance(_torch._reader_transforms(), _StorageReaderTransforms)


# --- StorageInfo ------------------------------------------------------------------------


def _saved_metadata(tmp_path: Path) -> bytes:
    """A stock torch ``.metadata`` (tensors, bytes, a nested dict)."""
    state = {"w": torch.randn(4, 3), "step": 7, "opt": {"m": torch.zeros(5)}}
    dcp.save(state, storage_writer=FileSystemWriter(tmp_path), no_dist=True)
    return (tmp_path / ".metadata").read_bytes()


def test_storage_info_fallback_pickles_byte_for_byte_as_torchs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = _saved_metadata(tmp_path)
    stock = load_metadata(raw)
    expected = pickle.dumps(stock, protocol=pickle.HIGHEST_PROTOCOL)
    assert all(type(v) is _StorageInfo for v in stock.storage_data.values())

    monkeypatch.delattr(filesystem, "_StorageInfo")  # a torch that moved it
    own = _torch._storage_info()
    assert own is not _StorageInfo and filesystem._StorageInfo is own
    # The restricted unpickler admits it under the name every .metadata uses ...
    ours = load_metadata(raw)
    infos = list(ours.storage_data.values())
    assert infos and all(type(v) is own for v in infos)
    assert [vars(v) for v in infos] == [vars(v) for v in stock.storage_data.values()]
    # ... and what s3ckpt writes with it is what torch's class writes, descriptors included.
    assert pickle.dumps(ours, protocol=pickle.HIGHEST_PROTOCOL) == expected
    # As the writer builds them: descriptors None (left out of the pickle) or a list.
    args = [("__0_0.distcp", 10, 20, None), ("__0_0.distcp", 10, 20, ["zstd/1"])]
    raws = [pickle.dumps(own(*a), protocol=pickle.HIGHEST_PROTOCOL) for a in args]
    monkeypatch.undo()
    for a, raw_own in zip(args, raws, strict=True):
        assert raw_own == pickle.dumps(_StorageInfo(*a), protocol=pickle.HIGHEST_PROTOCOL)
        assert pickle.loads(raw_own) == _StorageInfo(*a)  # stock torch reads it


def test_storage_info_fallback_takes_the_writers_extra_fields(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(filesystem, "_StorageInfo")
    own: Any = _torch._storage_info()

    @dataclass
    class Extended(own):  # as dcp/writer.py extends StorageInfo
        crc32c: int = 0

    e = Extended("a", 1, 2, None, crc32c=9)
    assert (e.relative_path, e.offset, e.length, e.transform_descriptors, e.crc32c) == (
        "a", 1, 2, None, 9,
    )  # fmt: skip


def test_storage_info_with_other_fields_is_refused_naming_the_torch_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    @dataclass
    class Changed:
        path: str
        offset: int

    monkeypatch.setattr(filesystem, "_StorageInfo", Changed)
    with pytest.raises(ImportError, match=rf"torch {_V}.*has fields"):
        _torch._storage_info()


# --- flatten_state_dict -----------------------------------------------------------------


def _nested_state() -> dict[str, Any]:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    t = torch.ones(2)
    return {
        "model": model.state_dict(),
        "optim": opt.state_dict(),  # int keys, param_groups: a list of dicts of lists
        "step": 3,
        "pair": (t, 1),  # tuples are leaves
        "ints": [1, 2, 3],  # a list without tensors is a leaf
        "tensors": [t, t],
        "deep": [[t], [1, 2], {"x": [1]}],
        "empty": {},
    }


def test_flatten_fallback_matches_torch_on_a_model_and_optimizer_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = _nested_state()
    monkeypatch.setitem(sys.modules, "torch.distributed.checkpoint._nested_dict", None)
    assert _torch._flatten_impl() is _torch._own_flatten
    monkeypatch.setattr(_torch, "_flatten", _torch._flatten_impl())
    flat, mapping = _torch.flatten_state_dict(state)
    theirs_flat, theirs_mapping = torch_flatten(state)
    assert list(flat) == list(theirs_flat)
    assert all(flat[k] is theirs_flat[k] for k in flat)
    assert mapping == theirs_mapping
    assert "optim.state.0.exp_avg" in flat and "deep.2.x" in flat


def test_flatten_fallback_refuses_duplicated_keys_as_torch_does() -> None:
    state = {"a.b": 1, "a": {"b": 2}}
    for flatten in (torch_flatten, _torch._own_flatten):
        with pytest.raises(ValueError, match=r"duplicated flatten key a\.b"):
            flatten(state)


def test_flatten_probe_rejects_a_changed_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed.checkpoint._nested_dict as nested

    monkeypatch.setattr(nested, "flatten_state_dict", lambda sd: dict(sd))  # one value back
    assert _torch._flatten_impl() is _torch._own_flatten


# --- local_chunks -----------------------------------------------------------------------


@pytest.fixture
def one_rank_group() -> Iterator[DeviceMesh]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield DeviceMesh("cpu", [0])
    finally:
        dist.destroy_process_group()


def test_local_chunks_of_a_plain_tensor_is_the_whole_tensor() -> None:
    t = torch.zeros(2, 3)
    assert _torch.local_chunks(t) == [
        ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([2, 3]))
    ]
    assert _torch.local_chunks(torch.tensor(1.0)) == [
        ChunkStorageMetadata(offsets=torch.Size([]), sizes=torch.Size([]))
    ]


@pytest.mark.parametrize("placement", [Shard(0), Shard(1), Replicate()], ids=str)
def test_local_chunks_fallback_matches_create_chunk_list_on_a_dtensor(
    one_rank_group: DeviceMesh, placement: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    dt = DTensor.from_local(torch.arange(12.0).reshape(4, 3), one_rank_group, [placement])
    stock = dt.__create_chunk_list__()
    assert _torch.local_chunks(dt) == stock
    monkeypatch.delattr(DTensor, "__create_chunk_list__")
    assert not hasattr(dt, "__create_chunk_list__")
    assert _torch.local_chunks(dt) == stock


_SHAPES = [(10,), (3,), (1,), (0,), (7, 5)]
_LAYOUTS = [
    ((4,), [Shard(0)]),
    ((2, 2), [Shard(0), Shard(0)]),  # a dimension sharded twice (FSDP x TP)
    ((3, 2), [Shard(0), Replicate()]),
    ((2, 3), [Replicate(), Shard(0)]),
    ((2, 3), [Shard(0), Shard(1)]),
    ((3, 4), [Shard(0), Shard(0)]),  # more ranks than rows: empty shards
]


@pytest.mark.parametrize(
    "shape,mesh_shape,placements",
    [
        (shape, mesh_shape, placements)
        for shape in _SHAPES
        for mesh_shape, placements in _LAYOUTS
        if all(not isinstance(p, Shard) or p.dim < len(shape) for p in placements)
    ],
    ids=str,
)
def test_own_shard_math_matches_dtensors_at_every_mesh_coordinate(
    shape: tuple[int, ...], mesh_shape: tuple[int, ...], placements: list[Any]
) -> None:
    for coord in itertools.product(*(range(n) for n in mesh_shape)):
        expected = _compute_local_shape_and_global_offset(
            shape, mesh_shape, list(coord), placements
        )
        assert _torch._shard_chunk(shape, mesh_shape, coord, placements) == expected, coord


@pytest.mark.parametrize("placement", [Partial(), _StridedShard(0, split_factor=2)], ids=str)
def test_own_shard_math_refuses_placements_it_cannot_place(placement: Any) -> None:
    with pytest.raises(S3CkptError, match=rf"torch {_V}.*cannot place"):
        _torch._shard_chunk((8,), (2,), (0,), [placement])


# --- transform_load_stream --------------------------------------------------------------


class _Xor(StreamTransformExtension):
    """A stream transform (XOR 0x5A) that needs no optional package."""

    @staticmethod
    def registry_name() -> str:
        return "test-xor"

    @staticmethod
    def from_descriptor(version: str) -> _Xor:
        return _Xor()

    def get_descriptor(self) -> str:
        return "test-xor/1"

    @staticmethod
    def _xor(data: bytes) -> bytes:
        return bytes(b ^ 0x5A for b in data)

    def transform_to(self, output: IO[bytes]) -> IO[bytes]:
        xor = self._xor

        class W(io.RawIOBase):
            def writable(self) -> bool:
                return True

            def write(self, b: Any) -> int:
                return output.write(xor(bytes(b)))

        return W()  # type: ignore[return-value]

    def transform_from(self, input: IO[bytes]) -> IO[bytes]:
        return io.BytesIO(self._xor(input.read()))


def _read_item(fqn: str) -> ReadItem:
    idx = MetadataIndex(fqn, torch.Size([0]))
    z = torch.Size([0])
    return ReadItem(LoadItemType.TENSOR, idx, z, idx, z, torch.Size([5]))


def test_transforms_undo_a_saved_items_stream_transform(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = torch.arange(5.0)
    dcp.save(
        {"t": t}, storage_writer=FileSystemWriter(tmp_path, _extensions=[_Xor()]), no_dist=True
    )
    md = FileSystemReader(tmp_path).read_metadata()
    (info,) = [v for k, v in md.storage_data.items() if k.fqn == "t"]
    assert info.transform_descriptors == ["test-xor/1"]
    with open(tmp_path / info.relative_path, "rb") as f:
        f.seek(info.offset)
        raw = io.BytesIO(f.read(info.length))
    registry = _torch._reader_transforms().extension_registry
    monkeypatch.setitem(registry.extensions, "test-xor", _Xor)
    out = _torch.transform_load_stream(_read_item("t"), info.transform_descriptors, raw)
    assert torch.equal(torch.load(io.BytesIO(out.read()), weights_only=True), t)


def test_without_the_private_api_items_without_transforms_still_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "torch.distributed.checkpoint._extension", None)
    # A fresh probe, without the private module (the process's own stays cached).
    fresh = functools.cache(_torch._reader_transforms.__wrapped__)
    monkeypatch.setattr(_torch, "_reader_transforms", fresh)
    stream = io.BytesIO(b"item bytes")
    assert _torch.transform_load_stream(_read_item("w"), None, stream) is stream
    assert _torch.transform_load_stream(_read_item("w"), [], stream) is stream
    assert _torch._reader_transforms.cache_info().currsize == 0  # not even probed
    with pytest.raises(S3CkptError, match=rf"w: saved with stream transforms \['zstd/1'\], "
                       rf"and torch {_V} lacks") as info:  # fmt: skip
        _torch.transform_load_stream(_read_item("w"), ["zstd/1"], stream)
    assert isinstance(info.value.__cause__, ImportError)
