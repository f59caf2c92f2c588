"""s3ckpt.tools against the in-memory store: inspect, verify, diff, export, import, restore."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import safetensors.torch as st
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    TensorProperties,
    TensorStorageMetadata,
)

from s3ckpt import ConfigError, S3StorageReader, S3StorageWriter
from s3ckpt.config import MiB
from s3ckpt.dcp.restore import find_unrestored
from s3ckpt.errors import CheckpointExistsError, IncompleteRestoreError
from s3ckpt.store import Location, MemoryStore
from s3ckpt.tools import (
    check_restored,
    diff_checkpoints,
    export_checkpoint,
    fill_nan,
    import_safetensors,
    inspect_checkpoint,
    load_verified,
    verify_checkpoint,
)
from s3ckpt.tools._common import parse_size
from s3ckpt.tools._export import INDEX_NAME
from tests import _helpers
from tests._helpers import committed_manifest

SMALL = dataclasses.replace(_helpers.SMALL, read_request_size=4 * MiB)
URL = "s3://bkt/run/step_1"


def make_state(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "model": {
            "embed.weight": torch.randn(512, 256, generator=g),  # 512 KiB
            "layers.0.w": torch.randn(256, 1024, generator=g),  # 1 MiB
            "layers.0.b": torch.randn(1024, generator=g).to(torch.bfloat16),
            "layers.1.w": torch.randn(1024, 256, generator=g),
            "mask": torch.rand(33, generator=g) > 0.5,
            "pos": torch.arange(77, dtype=torch.int64),
            "scale": torch.tensor(2.5),
        },
        "optim": {
            "state": {"layers.0.w": {"exp_avg": torch.randn(256, 1024, generator=g)}},
            "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.95), "params": ["layers.0.w"]}],
        },
        "train_state": {"step": 1, "tokens": 12345},
    }


def save(sd: dict, store: MemoryStore, url: str = URL, **kw: object) -> None:
    dcp.save(
        sd,
        storage_writer=S3StorageWriter(url, store=store, transfer_config=SMALL, **kw),  # type: ignore[arg-type]
        no_dist=True,
    )


def data_keys(store: MemoryStore, url: str = URL) -> list[str]:
    prefix = url.split("/", 3)[3] + "/"
    return sorted(k for k in store.objects if k.startswith(prefix) and k.endswith(".distcp"))


def key_of(store: MemoryStore, fqn: str, url: str = URL) -> tuple[str, int, int]:
    prefix = url.split("/", 3)[3] + "/"
    rec = next(i for i in committed_manifest(store.get, prefix).records if i.fqn == fqn)
    return prefix + rec.object, rec.start, rec.length


@pytest.fixture
def store() -> MemoryStore:
    s = MemoryStore()
    save(make_state(), s, step=1, metrics={"loss": 2.0})
    return s


# -- inspect --------------------------------------------------------------------------------------
def test_inspect_reads_only_marker_and_metadata(store: MemoryStore) -> None:
    store.calls.clear()
    info = inspect_checkpoint(URL, store=store)
    # The run's check record, s3ckpt.json judged (a HEAD and a GET here, one GET on S3) and
    # read, its item records, .metadata; no data.
    assert store.calls == {"get": 5, "head": 1}
    assert info.life == "committed" and info.damage is None
    assert info.format == "s3ckpt" and info.checksums
    assert info.step == 1 and info.metrics == {"loss": 2.0} and info.world_size == 1
    by_name = {t.name: t for t in info.tensors}
    w = by_name["model.layers.0.w"]
    assert (w.dtype, w.shape, w.nbytes, w.chunks) == ("float32", (256, 1024), 1 << 20, 1)
    assert by_name["model.layers.0.b"].dtype == "bfloat16"
    assert by_name["train_state.step"].kind == "bytes"
    assert info.tensor_count == 8 and info.other_count == 5
    assert len(info.objects) == len(data_keys(store)) >= 2
    assert json.loads(json.dumps(info.to_dict()))["tensors"][0]["name"] == "model.embed.weight"
    only = inspect_checkpoint(URL, store=store, include="model.layers.*", exclude="*.b")
    assert [t.name for t in only.tensors] == ["model.layers.0.w", "model.layers.1.w"]


def test_every_tool_takes_a_location(store: MemoryStore) -> None:
    at = Location.of(URL, store=store)
    assert inspect_checkpoint(at).to_dict() == inspect_checkpoint(URL, store=store).to_dict()
    assert verify_checkpoint(at).ok
    assert diff_checkpoints(at, at).identical
    # A URL beside a Location is opened in the Location's store (its bucket).
    res = export_checkpoint(at, "s3://bkt/hf/model", only="model")
    assert res.dest == "s3://bkt/hf/model/" and f"hf/model/{INDEX_NAME}" in store.objects
    back = import_safetensors(at.parent.parent.child("hf/model"), "s3://bkt/run/step_0")
    assert back.dest == "s3://bkt/run/step_0/" and "run/step_0/s3ckpt.json" in store.objects
    # A tool of one location refuses settings given beside a Location (they would be ignored).
    with pytest.raises(ConfigError, match="already a Location"):
        inspect_checkpoint(at, transfer_config=SMALL)


def test_inspect_and_verify_a_stock_dcp_checkpoint(tmp_path: Path) -> None:
    sd = make_state()
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(str(tmp_path / "ck")), no_dist=True)
    info = inspect_checkpoint(tmp_path / "ck")
    assert info.format == "dcp" and not info.checksums and info.world_size == 1
    assert info.tensor_count == 8
    res = verify_checkpoint(tmp_path / "ck")
    assert res.ok and res.format == "dcp" and res.items_read == 0
    assert verify_checkpoint(tmp_path / "ck", read_data=True).items_read == res.items
    # Truncate the data file: every byte range past the end is reported.
    data = next((tmp_path / "ck").glob("*.distcp"))
    data.write_bytes(data.read_bytes()[:1000])
    bad = verify_checkpoint(tmp_path / "ck")
    assert not bad.ok and {p.kind for p in bad.problems} == {"truncated"}
    assert "model.layers.1.w" in bad.bad_items and bad.bad_objects == [data.name]


# -- verify ---------------------------------------------------------------------------------------
def test_verify_clean_checkpoint_reads_every_byte(store: MemoryStore) -> None:
    seen: list[tuple[int, int]] = []
    res = verify_checkpoint(
        URL, store=store, transfer_config=SMALL, progress=lambda d, t: seen.append((d, t))
    )
    assert res.ok and res.checksums and res.items == res.items_read == 13
    assert res.bytes_read == sum(len(store.objects[k].data) for k in data_keys(store))
    assert seen and seen[-1][0] == seen[-1][1] == res.bytes_read


def test_verify_names_a_flipped_byte(store: MemoryStore) -> None:
    key, start, length = key_of(store, "model.layers.1.w")
    data = bytearray(store.get(key))
    data[start + length - 10] ^= 0x01
    store.put(key, bytes(data))
    res = verify_checkpoint(URL, store=store, transfer_config=SMALL)
    assert not res.ok
    assert res.bad_items == ["model.layers.1.w"]
    assert res.bad_objects == [key.rsplit("/", 1)[1]]
    assert [p.kind for p in res.problems] == ["checksum"]
    assert "model.layers.1.w" in res.problems[0].message


def test_verify_names_a_truncated_and_a_missing_object(store: MemoryStore) -> None:
    key, start, _ = key_of(store, "model.layers.0.w")
    store.put(key, store.get(key)[: start + 100])
    lost = next(k for k in data_keys(store) if k != key)
    lost_items = {
        i.fqn
        for i in committed_manifest(store.get, "run/step_1/").records
        if i.object == lost.rsplit("/", 1)[1]
    }
    store.delete([lost])
    res = verify_checkpoint(URL, store=store, transfer_config=SMALL)
    kinds = {(p.kind, p.item) for p in res.problems}
    assert ("object_size", None) in kinds
    assert ("truncated", "model.layers.0.w") in kinds
    assert ("missing_object", None) in kinds
    assert lost_items <= set(res.bad_items)
    assert set(res.bad_objects) == {key.rsplit("/", 1)[1], lost.rsplit("/", 1)[1]}


# -- diff -----------------------------------------------------------------------------------------
def test_diff_finds_exactly_the_changed_tensors(store: MemoryStore) -> None:
    sd = make_state()
    sd["model"]["layers.1.w"][3, 4] += 0.25
    sd["model"]["pos"][0] = 100
    sd["optim"]["param_groups"][0]["lr"] = 5e-4
    del sd["model"]["scale"]
    sd["model"]["new"] = torch.zeros(3)
    sd["model"]["embed.weight"] = sd["model"]["embed.weight"][:256].clone()
    sd["model"]["layers.0.b"] = sd["model"]["layers.0.b"].float()
    save(sd, store, "s3://bkt/run/step_2")
    res = diff_checkpoints(URL, "s3://bkt/run/step_2", store_a=store, store_b=store)
    status = {e.name: e for e in res.entries if e.status != "identical"}
    assert {k: e.status for k, e in status.items()} == {
        "model.layers.1.w": "changed",
        "model.pos": "changed",
        "optim.param_groups.0.lr": "changed",
        "model.scale": "only_in_a",
        "model.new": "only_in_b",
        "model.embed.weight": "shape_changed",
        "model.layers.0.b": "dtype_changed",
    }
    w = status["model.layers.1.w"]
    assert w.changed_elements == 1 and w.max_abs_diff == pytest.approx(0.25, rel=1e-5)
    assert w.mean_abs_diff == pytest.approx(0.25 / (1024 * 256), rel=1e-4)
    # Unchanged tensors were decided by checksum, without downloading them.
    same = [e for e in res.entries if e.status == "identical"]
    assert same and all(e.method == "checksum" for e in same)
    assert res.counts["identical"] == len(same)
    filtered = diff_checkpoints(
        URL, "s3://bkt/run/step_2", store_a=store, store_b=store, include="model.*", exclude="*.w"
    )
    assert {e.name for e in filtered.differences} == {
        "model.pos",
        "model.scale",
        "model.new",
        "model.embed.weight",
        "model.layers.0.b",
    }


def test_diff_by_value_when_layouts_differ(store: MemoryStore, tmp_path: Path) -> None:
    sd = make_state()
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(str(tmp_path / "ck")), no_dist=True)
    res = diff_checkpoints(URL, tmp_path / "ck", store_a=store)
    assert res.identical
    assert {e.method for e in res.entries} == {"values"}  # the stock checkpoint has no CRCs


# -- export ---------------------------------------------------------------------------------------
def _load_export(dst: MemoryStore, prefix: str = "hf/") -> tuple[dict, dict]:
    index = json.loads(dst.get(prefix + INDEX_NAME))
    out: dict = {}
    for name in sorted(set(index["weight_map"].values())):
        out.update(st.load(dst.get(prefix + name)))
    return out, index


def test_export_safetensors_shards_equal_the_original(store: MemoryStore) -> None:
    dst = MemoryStore()
    res = export_checkpoint(
        URL, "s3://out/hf", store=store, dest_store=dst, only="model", max_shard_size="1.2MB"
    )
    out, index = _load_export(dst)
    model = make_state()["model"]
    assert out.keys() == model.keys()
    for k, v in model.items():
        assert out[k].dtype == v.dtype and torch.equal(out[k], v), k
    n = len(res.files) - 1
    assert n >= 3 and res.files[0].name == f"model-00001-of-{n:05d}.safetensors"
    assert index["metadata"]["total_size"] == sum(
        v.numel() * v.element_size() for v in model.values()
    )
    assert set(index["weight_map"]) == set(model)
    assert all(f.size <= 1.2e6 + 4096 for f in res.files[:-1] if f.tensors > 1)
    with pytest.raises(CheckpointExistsError):
        export_checkpoint(URL, "s3://out/hf", store=store, dest_store=dst, only="model")
    # Overwrite with one shard removes the earlier shards.
    export_checkpoint(URL, "s3://out/hf", store=store, dest_store=dst, only="model", overwrite=True)
    assert sorted(dst.objects) == ["hf/model-00001-of-00001.safetensors", "hf/" + INDEX_NAME]


def test_export_all_keys_skips_non_tensors_and_casts(store: MemoryStore) -> None:
    dst = MemoryStore()
    res = export_checkpoint(URL, "s3://out/hf", store=store, dest_store=dst, dtype="bf16")
    out, _ = _load_export(dst)
    assert "optim.state.layers.0.w.exp_avg" in out and "model.pos" in out
    assert out["model.layers.0.w"].dtype == torch.bfloat16
    assert out["model.pos"].dtype == torch.int64 and out["model.mask"].dtype == torch.bool
    ref = make_state()["model"]["layers.0.w"].to(torch.bfloat16)
    assert torch.equal(out["model.layers.0.w"], ref)
    assert {s.name for s in res.skipped} == {
        "optim.param_groups.0.lr",
        "optim.param_groups.0.betas",
        "optim.param_groups.0.params",
        "train_state.step",
        "train_state.tokens",
    }


def split_qkv(name: str, t: torch.Tensor):  # type: ignore[no-untyped-def]
    """Test converter: rename, split one tensor in two, drop another."""
    if name == "layers.0.w":
        a, b = t.chunk(2, dim=1)
        return [("model.layers.0.up_proj.weight", a.t()), ("model.layers.0.gate.weight", b.t())]
    if name == "mask":
        return []
    return [("model." + name, t)]


def test_export_with_a_converter(store: MemoryStore) -> None:
    dst = MemoryStore()
    res = export_checkpoint(
        URL,
        "s3://out/hf",
        store=store,
        dest_store=dst,
        only="model",
        converter="tests.unit.test_tools:split_qkv",
    )
    out, _ = _load_export(dst)
    w = make_state()["model"]["layers.0.w"]
    assert torch.equal(out["model.layers.0.up_proj.weight"], w[:, :512].t())
    assert torch.equal(out["model.layers.0.gate.weight"], w[:, 512:].t())
    assert "model.mask" not in out and "mask" not in out and "model.pos" in out
    assert not res.notes  # planned on meta tensors


def test_export_converter_that_needs_values_is_planned_on_values(store: MemoryStore) -> None:
    def numpy_rename(name: str, t: torch.Tensor):  # type: ignore[no-untyped-def]
        t.numpy()  # fails on meta tensors
        return [("x." + name, t)]

    dst = MemoryStore()
    res = export_checkpoint(
        URL,
        "s3://out/hf",
        store=store,
        dest_store=dst,
        only="model",
        converter=numpy_rename,
        exclude="*.b",  # bf16 has no numpy
    )
    out, _ = _load_export(dst)
    assert "x.layers.0.w" in out and res.notes and "read twice" in res.notes[0]


def test_export_rejects_a_converter_whose_outputs_depend_on_values(store: MemoryStore) -> None:
    def sneaky(name: str, t: torch.Tensor):  # type: ignore[no-untyped-def]
        if t.device.type == "meta" or name != "pos":
            return [(name, t)]
        return [(name, t[:10])]

    dst = MemoryStore()
    with pytest.raises(ConfigError, match="planning"):
        export_checkpoint(
            URL, "s3://out/hf", store=store, dest_store=dst, only="model", converter=sneaky
        )
    assert not dst.objects and not dst.uploads  # nothing left behind


def test_export_torch_format(store: MemoryStore) -> None:
    dst = MemoryStore()
    res = export_checkpoint(
        URL, "s3://out/full/model.pt", store=store, dest_store=dst, format="torch"
    )
    import io

    loaded = torch.load(io.BytesIO(dst.get("full/model.pt")), weights_only=True)
    sd = make_state()
    assert torch.equal(loaded["model.layers.1.w"], sd["model"]["layers.1.w"])
    assert loaded["train_state.tokens"] == 12345 and loaded["optim.param_groups.0.betas"] == (
        0.9,
        0.95,
    )
    assert res.files[0].name == "model.pt"


def test_parse_size() -> None:
    assert parse_size("5GB") == 5 * 10**9 and parse_size("500MiB") == 500 * 2**20
    assert parse_size(123) == 123 and parse_size("1.5kb") == 1500
    with pytest.raises(ConfigError):
        parse_size("five")


# -- import ---------------------------------------------------------------------------------------
def test_import_local_folder_then_load(tmp_path: Path) -> None:
    model = make_state()["model"]
    names = sorted(model)
    st.save_file({k: model[k] for k in names[:3]}, tmp_path / "a.safetensors")
    st.save_file({k: model[k] for k in names[3:]}, tmp_path / "b.safetensors")
    store = MemoryStore()
    res = import_safetensors(tmp_path, "s3://bkt/imported", store=store, step=0)
    assert res.tensors == len(model) and res.prefix == "model"
    out = {"model": {k: torch.zeros_like(v) for k, v in model.items()}}
    dcp.load(out, storage_reader=S3StorageReader("s3://bkt/imported", store=store), no_dist=True)
    for k, v in model.items():
        assert torch.equal(out["model"][k], v), k
    assert verify_checkpoint("s3://bkt/imported", store=store).ok


def test_import_remote_index_without_prefix(store: MemoryStore) -> None:
    dst = MemoryStore()
    export_checkpoint(
        URL, "s3://out/hf", store=store, dest_store=dst, only="model", max_shard_size="1MB"
    )
    target = MemoryStore()
    res = import_safetensors(
        "s3://out/hf", "s3://bkt/flat", src_store=dst, store=target, prefix=None
    )
    assert res.prefix is None and len(res.files) > 1
    model = make_state()["model"]
    out = {k: torch.zeros_like(v) for k, v in model.items()}
    dcp.load(out, storage_reader=S3StorageReader("s3://bkt/flat", store=target), no_dist=True)
    assert all(torch.equal(out[k], v) for k, v in model.items())


# -- restore check --------------------------------------------------------------------------------
def test_load_verified_names_every_missing_key(store: MemoryStore) -> None:
    dest = make_state(seed=1)
    dest["model"]["extra.weight"] = torch.zeros(4)
    dest["train_state"]["epoch"] = 0
    with pytest.raises(IncompleteRestoreError) as info:
        load_verified(dest, URL, store=store)
    assert info.value.items == ["model.extra.weight", "train_state.epoch"]
    assert "model.extra.weight" in str(info.value) and "train_state.epoch" in str(info.value)
    # Everything else was restored.
    assert torch.equal(dest["model"]["layers.0.w"], make_state()["model"]["layers.0.w"])
    assert torch.isnan(dest["model"]["extra.weight"]).all()
    import pickle

    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is IncompleteRestoreError and again.items == info.value.items


def test_saved_nan_is_not_flagged() -> None:
    store = MemoryStore()
    sd = {"w": torch.tensor([1.0, float("nan"), 3.0]), "i": torch.arange(3)}
    save(sd, store)
    dest = {"w": torch.zeros(3), "i": torch.zeros(3, dtype=torch.int64)}
    meta = load_verified(dest, URL, store=store)
    assert torch.isnan(dest["w"][1]) and dest["w"][0] == 1.0
    assert "w" in meta.state_dict_metadata


def test_nan_in_a_region_no_chunk_covers_is_flagged() -> None:
    props = TensorProperties(dtype=torch.float32)
    md = Metadata(
        state_dict_metadata={
            "w": TensorStorageMetadata(
                props,
                torch.Size([4, 2]),
                [ChunkStorageMetadata(torch.Size([0, 0]), torch.Size([2, 2]))],
            ),
            "i": TensorStorageMetadata(
                TensorProperties(dtype=torch.int64),
                torch.Size([4]),
                [ChunkStorageMetadata(torch.Size([0]), torch.Size([3]))],
            ),
        }
    )
    sd = {"w": torch.zeros(4, 2), "i": torch.zeros(4, dtype=torch.int64)}
    assert fill_nan(sd) == 1
    sd["w"][:2] = 1.0  # what a load of the one chunk writes
    missing = find_unrestored(sd, md)
    assert missing == {
        "w": "NaN left in 4 element(s) no saved chunk covers",
        "i": "1 element(s) not covered by any saved chunk",
    }
    with pytest.raises(IncompleteRestoreError, match="2 entries were not restored"):
        check_restored(sd, md)
