"""Hashed key prefixes (``HashedPrefixes``): the layout and its manifest, saves on one and two
ranks, loads, the commit's object check, retention over the run's shard folder, and the
tools. MemoryStore, in process."""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from hypothesis import given
from hypothesis import strategies as st
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

from s3ckpt import (
    Checkpointer,
    CheckpointNotFoundError,
    ConfigError,
    CorruptCheckpointError,
    HashedPrefixes,
    S3StorageReader,
    S3StorageWriter,
)
from s3ckpt._tombstone import Tombstone
from s3ckpt.errors import UncommittedCheckpointError
from s3ckpt.format._manifest import FORMAT_VERSION, LAYOUT_FORMAT_VERSION, Manifest, ObjectRecord
from s3ckpt.format._names import (
    ITEMS_PREFIX,
    LATEST_NAME,
    LEASE_NAME,
    MANIFEST_NAME,
    METADATA_NAME,
    SHARDS_DIR,
    data_name,
    heartbeat_name,
    items_name,
    owned_tag,
    shard_name,
    shard_owner,
)
from s3ckpt.retention import (
    KeepLast,
    RetentionOptions,
    delete_checkpoint,
    gc,
    list_checkpoints,
    list_runs,
    prune,
)
from s3ckpt.retention._catalog import CheckpointState
from s3ckpt.retention._listing import ckpt_dir as _ckpt_dir
from s3ckpt.store import Location, MemoryStore
from s3ckpt.tools import export_checkpoint, verify_checkpoint
from s3ckpt.uri import parse_url
from tests._helpers import assert_same, zeros_like_state
from tests._retention_util import Clock, clock_and_store_fixtures
from tests.unit._memory_dcp import CONFIG, make_state

T0 = datetime.fromtimestamp(time.time() - 30 * 86400, UTC)
RUN = parse_url("s3://bkt/runs/a")
HOUR = 3600.0
SHARD_KEY = re.compile(
    r"runs/a/s3ckpt-shards/([0-9a-f]+)/(step_\d+)/__(\d+)_(\d+)\.([0-9a-f]{8})\.shard"
)

clock, store = clock_and_store_fixtures(T0)


def at(clock: Clock, ahead: float = 0.0) -> datetime:
    return datetime.fromtimestamp(clock.t + ahead, UTC)


def small_state(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(64, 32, generator=g), "b": torch.randn(7, generator=g), "n": seed}


def save(
    store: MemoryStore,
    step: int,
    sd: dict[str, Any] | None = None,
    fanout: int | None = 4,
    **kw: Any,
) -> S3StorageWriter:
    writer = S3StorageWriter(
        RUN.child(f"step_{step:09d}"),
        store=store,
        transfer_config=CONFIG,
        step=step,
        prefix_strategy=HashedPrefixes(fanout) if fanout else None,
        **kw,
    )
    dcp.save(small_state(step) if sd is None else sd, storage_writer=writer)
    return writer


def shard_keys(store: MemoryStore) -> list[str]:
    return sorted(k for k in store.objects if SHARDS_DIR in k)


def doc(store: MemoryStore, step: int) -> dict[str, Any]:
    return json.loads(store.get(RUN.child(f"step_{step:09d}").key(MANIFEST_NAME)))


# -- the value and its layout ----------------------------------------------------------------------
@pytest.mark.parametrize("fanout", [0, 1, 3, 12, 8192, -16, True, 16.0, "16", None])
def test_fanout_must_be_a_power_of_two_from_2_to_4096(fanout: Any) -> None:
    with pytest.raises(ConfigError, match="power of two from 2 to 4096"):
        HashedPrefixes(fanout)


@pytest.mark.parametrize(
    ("fanout", "width"), [(2, 1), (16, 1), (32, 2), (256, 2), (512, 3), (4096, 3)]
)
def test_shard_folders_are_fixed_width_hex_and_stable_across_saves(fanout: int, width: int) -> None:
    layout = HashedPrefixes(fanout)
    shards = {layout.shard(shard_name(r, i, "0badcafe")) for r in range(300) for i in range(2)}
    assert all(len(h) == width and int(h, 16) < fanout for h in shards)
    if fanout <= 32:
        assert len(shards) == fanout  # 600 names reach every folder of a small fanout
    # The tag is not hashed: a rank's object lands in the same folder every save.
    assert layout.shard(shard_name(7, 1, "00000000")) == layout.shard(shard_name(7, 1, "ffffffff"))
    assert layout.key("step_1/", "__0_0.0badcafe.shard").startswith(f"{SHARDS_DIR}/")
    with pytest.raises(ConfigError, match="under a run"):
        layout.key("", "__0_0.0badcafe.shard")


def test_shard_names_are_names_older_s3ckpt_never_takes_for_its_own() -> None:
    # s3ckpt before format 3 (0.1.0) declares a checkpoint at the folder of any ``*.distcp``
    # and gc deletes ``__{r}_{i}.{tag}.distcp`` of tags idle past the grace period: with
    # such names in the shard folders, its gc would delete committed data of hashed saves.
    name = shard_name(3, 1, "0badcafe")
    assert not name.endswith(".distcp") and owned_tag(name) is None
    assert _ckpt_dir(f"runs/a/step_1/{name}") is None  # and outside a shard folder: nothing


# -- save and load ---------------------------------------------------------------------------------
def test_round_trip_on_one_rank_puts_every_data_object_in_a_shard_folder(
    store: MemoryStore,
) -> None:
    sd = make_state()
    writer = save(store, 1, sd)
    ckpt = RUN.child("step_000000001")
    tag = writer.save_id[:8]
    data = shard_keys(store)
    assert len(data) >= 3  # CONFIG packs make_state into several objects
    for key in data:
        m = SHARD_KEY.fullmatch(key)
        assert m is not None and m.group(2) == "step_000000001" and m.group(5) == tag, key
        assert m.group(1) == HashedPrefixes(4).shard(key.rpartition("/")[2])
    assert {k for k in store.objects if k not in data} == {
        ckpt.key(n)
        for n in (MANIFEST_NAME, METADATA_NAME, f"{METADATA_NAME}.{tag}", items_name(tag))
    }
    d = doc(store, 1)
    assert d["format_version"] == FORMAT_VERSION == 4 > LAYOUT_FORMAT_VERSION
    assert d["layout"] == {
        "prefix_strategy": "hashed",
        "fanout": 4,
        "dir": SHARDS_DIR,
        "hash": "crc32c",
    }
    # .metadata names the objects by their plain names; the manifest lists the same names.
    reader = S3StorageReader(ckpt, store=store, transfer_config=CONFIG)
    names = {i.relative_path for i in reader.metadata.storage_data.values()}
    assert names == {o[0] for o in d["objects"]} == {k.rpartition("/")[2] for k in data}
    out = zeros_like_state(sd)
    dcp.load(out, storage_reader=reader)
    assert_same(sd, out)
    assert reader.bytes_read > 0


def test_the_default_layout_is_unchanged(store: MemoryStore) -> None:
    writer = save(store, 1, fanout=None)
    tag = writer.save_id[:8]
    ckpt = RUN.child("step_000000001")
    assert shard_keys(store) == []
    assert all(k.startswith(ckpt.prefix) for k in store.objects)
    assert store.objects.keys() >= {ckpt.key(data_name(0, 0, tag))}
    raw = store.get(ckpt.key(MANIFEST_NAME))
    d = json.loads(raw)
    assert d["format_version"] == FORMAT_VERSION == 4 and "layout" not in d
    m = Manifest.from_json(raw)
    assert m.layout is None and m.to_json() == raw  # nothing new in a default manifest


def _save_two_ranks(store: MemoryStore, url: str, sds: list[dict[str, Any]]) -> None:
    """torch's save sequence (state_dict_saver._save_state_dict) for two ranks in one process.

    Rank 1's writer is built without a prefix strategy: the coordinator's choice reaches it
    through the plan.
    """
    writers = [
        S3StorageWriter(
            url, store=store, transfer_config=CONFIG, prefix_strategy=HashedPrefixes(2)
        ),
        S3StorageWriter(url, store=store, transfer_config=CONFIG),
    ]
    planners = [DefaultSavePlanner(), DefaultSavePlanner()]
    local = []
    for rank, (w, p) in enumerate(zip(writers, planners, strict=True)):
        p.set_up_planner(
            state_dict=sds[rank], storage_meta=w.storage_meta(), is_coordinator=rank == 0
        )
        w.set_up_storage_writer(rank == 0, rank=rank, use_collectives=True)
        local.append(w.prepare_local_plan(p.create_local_plan()))
    plans, metadata = planners[0].create_global_plan(local)
    plans = writers[0].prepare_global_plan(plans)
    results = []
    for rank, (w, p) in enumerate(zip(writers, planners, strict=True)):
        fut = w.write_data(p.finish_plan(plans[rank]), p)
        results.append(fut.value())
    writers[0].finish(metadata, results)


def test_two_ranks_follow_the_coordinators_layout_and_load_on_one(store: MemoryStore) -> None:
    g = torch.Generator().manual_seed(3)
    shared = torch.randn(100, generator=g)
    sds = [
        {"shared": shared, f"rank{r}": torch.randn(300, 40, generator=g), "step": 5}
        for r in range(2)
    ]
    url = "s3://bkt/runs/a/step_000000005"
    _save_two_ranks(store, url, sds)
    ranks = {int(SHARD_KEY.fullmatch(k).group(3)) for k in shard_keys(store)}  # type: ignore[union-attr]
    assert ranks == {0, 1}
    assert doc(store, 5)["layout"]["fanout"] == 2
    out = {"shared": torch.zeros(100), "rank0": torch.zeros(300, 40), "rank1": torch.zeros(300, 40)}
    out["step"] = 0
    dcp.load(out, storage_reader=S3StorageReader(url, store=store))
    assert torch.equal(out["shared"], shared) and out["step"] == 5
    assert torch.equal(out["rank0"], sds[0]["rank0"]) and torch.equal(out["rank1"], sds[1]["rank1"])
    assert verify_checkpoint(url, store=store).ok


def test_a_hashed_save_without_its_marker_cannot_be_loaded(store: MemoryStore) -> None:
    save(store, 1)
    ckpt = RUN.child("step_000000001")
    store.delete([ckpt.key(MANIFEST_NAME)])
    for allow in (False, True):
        with pytest.raises(UncommittedCheckpointError) as err:
            S3StorageReader(ckpt, store=store, allow_uncommitted=allow)
        assert err.value.key == ckpt.key(MANIFEST_NAME)
    assert "s3ckpt-shards/ folder" in str(err.value) and "cannot be loaded" in str(err.value)
    # Without any per-save name left (a person deleted them), the same: never a wrong read.
    own = (ckpt.key(METADATA_NAME + "."), ckpt.key(ITEMS_PREFIX))
    store.delete([k for k in store.objects if k.startswith(own)])
    with pytest.raises(UncommittedCheckpointError, match="hashed prefixes"):
        S3StorageReader(ckpt, store=store)


def test_writer_and_checkpointer_refuse_what_is_not_a_layout_or_a_reserved_folder() -> None:
    st_ = MemoryStore("b")
    with pytest.raises(ConfigError, match="prefix_strategy must be None"):
        S3StorageWriter("s3://bkt/run/step_1", store=st_, prefix_strategy=16)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="prefix_strategy must be None"):
        Checkpointer("s3://bkt/run", store=st_, prefix_strategy="hashed")  # type: ignore[arg-type]
    for url in (
        "s3://bkt/run/s3ckpt-shards/step_1",
        "s3://bkt/s3ckpt-shards",
        "s3://bkt/run/s3ckpt-shards/0/x",
    ):
        with pytest.raises(ConfigError, match="reserves"):
            S3StorageWriter(url, store=st_)
    with pytest.raises(ConfigError, match="under a run"):
        S3StorageWriter("s3://bkt", store=st_, prefix_strategy=HashedPrefixes())
    assert st_.objects == {}


# -- the manifest ----------------------------------------------------------------------------------
def _manifest(**kw: Any) -> Manifest:
    return Manifest(
        save_id="0badcafe" + "0" * 24,
        created=1.0,
        world_size=1,
        metadata_key=".metadata.0badcafe",
        metadata_crc32c=0,
        metadata_size=4,
        objects=(ObjectRecord(shard_name(0, 0, "0badcafe"), 10, 0),),
        items=(),
        **{"format_version": 2, **kw},
    )


def _resealed(raw: bytes, **changes: Any) -> bytes:
    from s3ckpt.format._manifest import manifest_digest

    d = json.loads(raw)
    d.update(changes)
    d["digest"] = manifest_digest(d)
    return json.dumps(d).encode()


def test_the_manifest_records_the_layout_and_refuses_what_it_does_not_know() -> None:
    m = _manifest(format_version=3, layout=HashedPrefixes(64))
    raw = m.to_json()
    assert Manifest.from_json(raw) == m
    assert m.object_key("r/step_1/", "__0_0.0badcafe.shard") == HashedPrefixes(64).key(
        "r/step_1/", "__0_0.0badcafe.shard"
    )
    with pytest.raises(ValueError, match="a layout needs format_version 3"):
        _manifest(layout=HashedPrefixes(64))  # format_version 2 cannot carry a layout
    with pytest.raises(ValueError, match="format 3 needs one"):
        _manifest(format_version=3)
    layout = dict(json.loads(raw)["layout"])
    for field, value in (("prefix_strategy", "ranged"), ("hash", "xxh3"), ("dir", "shards")):
        bad = _resealed(raw, layout={**layout, field: value})
        with pytest.raises(CorruptCheckpointError, match=f"layout {field} .* upgrade s3ckpt"):
            Manifest.from_json(bad)
    with pytest.raises(CorruptCheckpointError, match="power of two"):
        Manifest.from_json(_resealed(raw, layout={**layout, "fanout": 10}))
    newer = r"written by a newer s3ckpt: format_version 5 is newer .* upgrade s3ckpt to read"
    with pytest.raises(CorruptCheckpointError, match=newer):
        Manifest.from_json(_resealed(raw, format_version=5))
    with pytest.raises(CorruptCheckpointError, match="no hashed-prefix data name"):
        Manifest.from_json(_resealed(raw, objects=[["__0_0.0badcafe.distcp", 10, 0]]))
    with pytest.raises(CorruptCheckpointError, match="needs format_version 3"):
        Manifest.from_json(_resealed(_manifest().to_json(), layout=layout))


# -- the commit ------------------------------------------------------------------------------------
def test_the_commit_lists_only_the_shard_folders_it_used_and_a_vanished_shard_stops_it() -> None:
    store = MemoryStore("b")
    save(store, 1, make_state(), fanout=4096)
    used = {k.rpartition("/")[0] for k in shard_keys(store)}
    assert store.calls.get("list", 0) == len(used) < 4096  # no listing of the prefix itself
    assert store.calls.get("head", 0) >= 1  # .metadata.{tag}

    class Vanishing(MemoryStore):
        def put(self, key: str, data: Any, **kw: Any) -> str:
            if re.search(r"\.metadata\.[0-9a-f]{8}$", key):  # the commit has begun
                self.delete([shard_keys(self)[0]])
            return super().put(key, data, **kw)

    bad = Vanishing("b")
    with pytest.raises(CheckpointException, match="missing or changed before the commit"):
        save(bad, 2)
    assert not any(k.endswith(MANIFEST_NAME) for k in bad.objects)
    assert shard_keys(bad) == []  # the failed save removed its own objects


def test_overwrites_between_layouts_remove_the_replaced_objects(store: MemoryStore) -> None:
    ckpt = RUN.child("step_000000001")
    save(store, 1, small_state(1), fanout=None)
    save(store, 1, small_state(2), overwrite=True)
    assert shard_keys(store) and not any(k.endswith(".distcp") for k in store.objects)
    out = zeros_like_state(small_state(0))
    dcp.load(out, storage_reader=S3StorageReader(ckpt, store=store))
    assert_same(out, small_state(2))
    save(store, 1, small_state(3), fanout=None, overwrite=True)
    assert shard_keys(store) == []
    dcp.load(out, storage_reader=S3StorageReader(ckpt, store=store))
    assert_same(out, small_state(3))


def test_checkpointer_saves_with_the_layout_and_loads_without_being_told() -> None:
    store = MemoryStore("b")
    model = torch.nn.Linear(8, 4)
    with Checkpointer(RUN, store=store, prefix_strategy=HashedPrefixes(8)) as ckpt:
        ckpt.save(3, model)
        (info,) = ckpt.list()
    assert shard_keys(store)
    latest = RUN.key(LATEST_NAME)
    assert info.size == sum(len(o.data) for k, o in store.objects.items() if k != latest)
    fresh = torch.nn.Linear(8, 4)
    with Checkpointer(RUN, store=store) as ckpt:
        assert ckpt.load(fresh) == 3
    assert torch.equal(fresh.weight, model.weight)


# -- retention -------------------------------------------------------------------------------------
def test_scan_attributes_shards_to_their_checkpoint_and_never_takes_the_folder_for_a_run(
    store: MemoryStore, clock: Clock
) -> None:
    save(store, 1)
    save(store, 2)
    foreign = [f"runs/a/{SHARDS_DIR}/0/step_000000001/notes.txt", f"runs/a/{SHARDS_DIR}/.metadata"]
    foreign.append(f"runs/a/{SHARDS_DIR}/0/step_000000009/__0_0.distcp")
    for k in foreign:
        store.put(k, b"x")
    cat = list_checkpoints(Location.of(RUN, store=store), options=RetentionOptions(now=at(clock)))
    assert [c.name for c in cat] == ["step_000000001", "step_000000002"]
    for c in cat:
        own = {k for k in store.objects if c.name in k and k not in foreign}
        assert set(c.keys) == own
        assert c.size == sum(len(store.objects[k].data) for k in own)
        assert c.num_objects == len(own) and c.state is CheckpointState.COMMITTED
        assert {k for k in c.committed_keys if SHARDS_DIR in k} == {
            k for k in own if SHARDS_DIR in k
        }
    assert list_runs(Location.of(parse_url("s3://bkt/"), store=store)) == [RUN]


def test_prune_and_rm_delete_the_shards_after_the_marker(store: MemoryStore, clock: Clock) -> None:
    for step in (1, 2, 3):
        save(store, step)
        clock.t += HOUR
    foreign = f"runs/a/{SHARDS_DIR}/0/step_000000001/notes.txt"
    store.put(foreign, b"x")
    events: list[tuple[str, dict[str, Any]]] = []
    r = prune(
        Location.of(RUN, store=store),
        KeepLast(1),
        apply=True,
        options=RetentionOptions(now=at(clock), on_progress=lambda e, d: events.append((e, d))),
    )
    assert r.ok and r.deleted == ("step_000000001", "step_000000002")
    phases = [d["phase"] for e, d in events if e == "delete"]
    # Each marker is first fenced by its own conditional PUT (a tombstone replacing only the
    # marker planned on), before any metadata or data goes: a kill never leaves a committed
    # marker over missing shards. Each fence is lifted only after everything else is gone.
    middle = phases[2:-2]
    assert (
        phases == ["marker"] * 2 + sorted(middle, key=["metadata", "data"].index) + ["marker"] * 2
    )
    assert set(middle) == {"metadata", "data"}
    assert {SHARD_KEY.fullmatch(k).group(2) for k in shard_keys(store) if k != foreign} == {  # type: ignore[union-attr]
        "step_000000003"
    }
    res = delete_checkpoint(
        Location.of(RUN.child("step_000000003"), store=store),
        allow_newest=True,
        options=RetentionOptions(now=at(clock)),
    )
    assert res.deleted and any(SHARDS_DIR in k for k in res.keys)
    assert set(store.objects) - {RUN.key(LEASE_NAME)} == {foreign}


def test_gc_removes_an_abandoned_hashed_save_after_grace_and_never_committed_shards(
    store: MemoryStore, clock: Clock
) -> None:
    save(store, 1)
    committed = set(store.objects)
    # A save of step 2 killed after its first shards, before anything under step_000000002/.
    dead = HashedPrefixes(4)
    ckpt = RUN.child("step_000000002")
    keys = [dead.key(ckpt.prefix, shard_name(r, 0, "dead0001")) for r in range(3)]
    for k in keys:
        store.put(k, b"data")
    up = store.create_multipart(dead.key(ckpt.prefix, shard_name(3, 0, "dead0001")))
    # In the committed step 1: a dead overwrite's shard, and one of the committed tag that
    # the marker does not list (kept: committed shards go only with their checkpoint).
    tag1 = doc(store, 1)["save_id"][:8]
    one = RUN.child("step_000000001").prefix
    overwrite = dead.key(one, shard_name(5, 0, "dead0002"))
    unlisted = dead.key(one, shard_name(9, 9, tag1))
    store.put(overwrite, b"x")
    store.put(unlisted, b"x")
    clock.t += 10 * 60
    (_, c2) = list_checkpoints(
        Location.of(RUN, store=store), options=RetentionOptions(now=at(clock))
    )
    assert c2.name == "step_000000002" and c2.state is CheckpointState.IN_PROGRESS
    assert c2.live_tags == ("dead0001",) and len(c2.uploads) == 1
    r = gc(Location.of(RUN, store=store), apply=True, options=RetentionOptions(now=at(clock)))
    assert r.removed == () and all(k in store.objects for k in keys) and up in store.uploads
    clock.t += 3 * HOUR
    (_, c2) = list_checkpoints(
        Location.of(RUN, store=store), options=RetentionOptions(now=at(clock))
    )
    assert c2.state is CheckpointState.ABANDONED
    r = gc(Location.of(RUN, store=store), apply=True, options=RetentionOptions(now=at(clock)))
    assert r.ok and r.removed == (str(ckpt),) and r.aborted == 1 and up not in store.uploads
    # dead0001 was only past its grace period, not proven gone (it may be paused): its
    # finished tombstone stays as the fence until a new save of step 2 replaces it.
    fence = ckpt.key(MANIFEST_NAME)
    assert set(store.objects) - {RUN.key(LEASE_NAME)} == committed | {unlisted, fence}
    tomb = Tombstone.parse(store.objects[fence].data)
    assert tomb is not None and tomb.done and tomb.keep and tomb.reaped == ("dead0001",)
    assert doc(store, 1)["reaped"] == ["dead0002"]  # step 1's marker fenced the overwrite
    assert [
        c.name
        for c in list_checkpoints(
            Location.of(RUN, store=store), options=RetentionOptions(now=at(clock))
        )
    ] == ["step_000000001"]
    with pytest.raises(CheckpointNotFoundError, match="no checkpoint"):
        delete_checkpoint(Location.of(ckpt, store=store), options=RetentionOptions(now=at(clock)))
    assert verify_checkpoint(RUN.child("step_000000001"), store=store).ok


def test_rm_refuses_a_shard_folder_for_a_checkpoint(store: MemoryStore, clock: Clock) -> None:
    save(store, 1)
    (key,) = shard_keys(store)[:1]
    folder = parse_url("s3://bkt/" + key.rpartition("/")[0])
    with pytest.raises(CheckpointNotFoundError, match="no checkpoint"):
        delete_checkpoint(
            Location.of(folder, store=store),
            allow_newest=True,
            options=RetentionOptions(now=at(clock)),
        )
    assert key in store.objects


# -- tools -----------------------------------------------------------------------------------------
def test_verify_and_export_find_the_shards(store: MemoryStore) -> None:
    sd = {"model": {"w": torch.randn(40, 30), "b": torch.randn(30)}}
    save(store, 1, sd)
    url = RUN.child("step_000000001")
    assert verify_checkpoint(url, store=store).ok
    dst = MemoryStore("out")
    export_checkpoint(url, "s3://out/hf", store=store, dest_store=dst, only="model")
    assert any(k.endswith(".safetensors") for k in dst.objects)
    victim = shard_keys(store)[0]
    store.delete([victim])
    res = verify_checkpoint(url, store=store)
    assert [p.kind for p in res.problems if p.item is None] == ["missing_object"]
    assert res.bad_objects == [victim.rpartition("/")[2]]


# -- the key mapping -------------------------------------------------------------------------------
_SEG = st.text(alphabet="abcz09_-.=", min_size=1, max_size=8).filter(
    lambda s: s not in (".", "..", SHARDS_DIR)
)


@given(
    run=st.lists(_SEG, max_size=3),
    ckpt=_SEG,
    rank=st.integers(0, 100_000),
    index=st.integers(0, 99),
    tag=st.text(alphabet="0123456789abcdef", min_size=8, max_size=8),
    bits=st.integers(1, 12),
)
def test_name_to_key_to_owner_round_trips(
    run: list[str], ckpt: str, rank: int, index: int, tag: str, bits: int
) -> None:
    prefix = "".join(s + "/" for s in run) + ckpt + "/"
    name = shard_name(rank, index, tag)
    key = HashedPrefixes(2**bits).key(prefix, name)
    assert key.startswith("".join(s + "/" for s in run) + SHARDS_DIR + "/")
    owner = shard_owner(key)
    assert owner is not None and (owner.checkpoint, owner.name, owner.tag) == (prefix, name, tag)
    assert _ckpt_dir(key) == prefix
    # Nothing else in a shard folder is anybody's: not the default layout's names, not
    # a shard name one folder too deep or too shallow, nor a heartbeat.
    folder = key.rpartition("/")[0]
    for other in (data_name(rank, index, tag), heartbeat_name(tag, rank), METADATA_NAME):
        assert shard_owner(f"{folder}/{other}") is None and _ckpt_dir(f"{folder}/{other}") is None
    assert shard_owner(f"{folder}/x/{name}") is None and _ckpt_dir(f"{folder}/x/{name}") is None
    assert shard_owner(f"{folder.rpartition('/')[0]}/{name}") is None


def test_a_prefix_ending_in_an_empty_segment_names_no_checkpoint_folder() -> None:
    # "run/step_1//" would put shards where shard_owner maps them to "run/step_1/", not to
    # the checkpoint saved: refused like the bucket's root.
    layout = HashedPrefixes(16)
    with pytest.raises(ConfigError, match="names no checkpoint folder"):
        layout.key("run/step_1//", shard_name(0, 0, "0123abcd"))
    assert shard_owner(layout.key("run/step_1/", shard_name(0, 0, "0123abcd"))) is not None
