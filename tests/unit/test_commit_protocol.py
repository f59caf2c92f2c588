"""The commit protocol on MemoryStore: races, objects vanishing before the marker, unknown
outcomes, uncommitted prefixes, forged manifests, stale pointers, interrupted overwrites.

Each test names the defect it guards against (docs/dcp.md, "The commit protocol").
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from s3ckpt import (
    Checkpointer,
    CheckpointError,
    ConfigError,
    CorruptCheckpointError,
    S3StorageReader,
    S3StorageWriter,
)
from s3ckpt._crc import crc32c
from s3ckpt.errors import (
    CheckpointExistsError,
    TransientStoreError,
    UncommittedCheckpointError,
    find_s3ckpt_error,
)
from s3ckpt.format._manifest import Manifest, manifest_digest
from s3ckpt.format._names import MANIFEST_NAME, METADATA_NAME, data_name, owned_tag
from s3ckpt.store import Location, MemoryStore
from s3ckpt.tools import verify_checkpoint
from tests._helpers import assert_same, edit_items
from tests._helpers import zeros_like_state as zeros
from tests.unit._memory_dcp import (
    CONFIG,
    OVERLAPPING,
    URL,
    load,
    make_state,
    read_overlapping_spans,
    save,
)

PREFIX = "run/step_1/"


def _marker(store: MemoryStore, prefix: str = PREFIX) -> Manifest:
    return Manifest.from_json(store.objects[prefix + MANIFEST_NAME].data)


def _error(exc: BaseException) -> BaseException:
    return find_s3ckpt_error(exc) or exc


class HookStore(MemoryStore):
    """A MemoryStore that calls ``on_put(key, store)`` before each PUT."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.on_put: Any = None

    def put(self, key: str, data: Any, **kw: Any) -> str:
        if self.on_put is not None:
            self.on_put(key, self, kw)
        return super().put(key, data, **kw)


def test_concurrent_commit_loser_removes_only_its_own_objects() -> None:
    """G: the loser of a race on one step never deletes the winner's .metadata or data."""
    winner_state = make_state()
    source = MemoryStore("bkt")
    save(source, winner_state)
    store = HookStore("bkt")

    def winner_commits_first(key: str, st: HookStore, kw: dict[str, Any]) -> None:
        if key.endswith(MANIFEST_NAME) and st.on_put is not None:
            st.on_put = None
            for k, obj in source.objects.items():
                MemoryStore.put(st, k, obj.data)

    store.on_put = winner_commits_first
    loser = make_state()
    loser["big"] += 1
    with pytest.raises(CheckpointException) as info:
        save(store, loser)
    assert isinstance(_error(info.value), CheckpointExistsError)
    # Exactly the winner's objects are left, .metadata included.
    assert set(store.objects) == set(source.objects)
    assert all(store.objects[k].data == o.data for k, o in source.objects.items())
    out = zeros(winner_state)
    load(store, out)
    assert_same(winner_state, out)


def test_objects_deleted_before_the_commit_are_not_committed() -> None:
    """B: a save whose objects vanished (a gc) must not commit a marker pointing at nothing."""
    store = HookStore("bkt")

    def gc_strikes(key: str, st: HookStore, kw: dict[str, Any]) -> None:
        if key.rpartition("/")[2].startswith(METADATA_NAME + "."):
            victim = next(k for k in st.objects if k.endswith(".distcp"))
            st.delete([victim])

    store.on_put = gc_strikes
    with pytest.raises(CheckpointException) as info:
        save(store, make_state())
    err = _error(info.value)
    assert isinstance(err, CheckpointError) and "missing" in str(err)
    assert PREFIX + MANIFEST_NAME not in store.objects
    assert not [k for k in store.objects if owned_tag(k.rpartition("/")[2])]


def test_marker_put_with_unknown_outcome_keeps_the_objects_and_is_not_loadable() -> None:
    """A marker PUT whose outcome stays unknown (retries exhausted, nothing readable) keeps
    the save's objects (the PUT may yet land) and the prefix is refused as uncommitted."""
    store = MemoryStore("bkt")
    store.inject(
        "put",
        key_glob="*s3ckpt.json",
        error=lambda k: TransientStoreError("timed out", bucket="bkt", key=k),
    )
    sd = make_state()
    with pytest.raises(CheckpointException) as info:
        save(store, sd)
    assert isinstance(_error(info.value), TransientStoreError)
    assert any(k.endswith(".distcp") for k in store.objects)
    with pytest.raises(UncommittedCheckpointError, match="never committed"):
        S3StorageReader(URL, store=store)
    out = zeros(sd)
    load(store, out, allow_uncommitted=True)
    assert_same(sd, out)


class LostMarkerReply(MemoryStore):
    """The first marker PUT is applied, then its "retry" runs too (as S3Store retries after
    a lost reply) and meets our own marker: 412."""

    fired = False

    def put(self, key: str, data: Any, **kw: Any) -> str:
        etag = super().put(key, data, **kw)
        if key.endswith(MANIFEST_NAME) and not self.fired:
            self.fired = True
            return super().put(key, data, **kw)
        return etag


def test_lost_marker_reply_is_a_commit_when_the_marker_is_ours() -> None:
    """A: the marker PUT reached the store, its reply was lost, the retry got 412 from our
    own marker: the save committed, nothing is discarded."""
    store = LostMarkerReply("bkt")
    sd = make_state()
    writer = save(store, sd)
    assert store.fired
    assert _marker(store).save_id == writer.save_id
    out = zeros(sd)
    load(store, out)
    assert_same(sd, out)


def test_uncommitted_s3ckpt_prefix_is_refused_but_stock_dcp_loads() -> None:
    """D: a save killed after .metadata.<tag> and before the marker never loads silently."""
    store = MemoryStore("bkt")
    sd = make_state()
    save(store, sd)
    del store.objects[PREFIX + MANIFEST_NAME]
    del store.objects[PREFIX + METADATA_NAME]
    with pytest.raises(UncommittedCheckpointError, match="allow_uncommitted"):
        S3StorageReader(URL, store=store)
    # Stock DCP names only (no s3ckpt objects): loads, as any DCP checkpoint.
    stock = MemoryStore("bkt")
    for k, obj in store.objects.items():
        name = k.rpartition("/")[2]
        if name.startswith(METADATA_NAME):
            stock.put(PREFIX + METADATA_NAME, obj.data)
    assert S3StorageReader(URL, store=stock).manifest is None


@pytest.mark.parametrize("shift", [1, 7, 64])
def test_shifted_data_offset_is_refused_by_load_and_verify(shift: int) -> None:
    """C: item records edited in place (data_offset moved) are refused, never read as wrong
    tensors, and verify fails: the marker commits their object by size and CRC32C."""
    store = MemoryStore("bkt")
    save(store, make_state())

    def shift_offset(rows: list[list[Any]]) -> None:
        next(r for r in rows if r[6] is not None)[6] += shift

    edit_items(store, PREFIX, shift_offset, reseal=False)
    with pytest.raises(CorruptCheckpointError, match=r"s3ckpt\.items\..* does not match"):
        load(store, zeros(make_state()))
    with pytest.raises(CorruptCheckpointError, match="does not match"):
        verify_checkpoint(URL, store=store)


def test_forged_marker_cannot_name_objects_outside_the_prefix() -> None:
    """H: a marker (even with a valid digest) naming ``../x`` is refused, and an overwrite
    of it deletes nothing outside the checkpoint."""
    store = MemoryStore("bkt")
    save(store, make_state())
    store.put("run/victim", b"keep me")
    doc = json.loads(store.objects[PREFIX + MANIFEST_NAME].data)
    doc["objects"].append(["../victim", 7, 0])
    doc["metadata"]["key"] = "../victim"
    doc["digest"] = manifest_digest(doc)
    store.objects[PREFIX + MANIFEST_NAME].data = json.dumps(doc).encode()
    with pytest.raises(CorruptCheckpointError, match="not a plain name"):
        S3StorageReader(URL, store=store)
    sd = make_state()
    save(store, sd, overwrite=True)
    assert store.objects["run/victim"].data == b"keep me"
    out = zeros(sd)
    load(store, out)
    assert_same(sd, out)


def test_killed_overwrite_after_its_marker_is_rolled_forward_by_the_next_load() -> None:
    """F: an overwrite killed between its marker and the .metadata copy: s3ckpt loads the
    new state and puts the copy back, so stock readers read the committed save too."""
    store = HookStore("bkt")
    save(store, make_state())
    old_id = _marker(store).save_id
    new = make_state()
    new["big"] *= 2

    def die_after_marker(key: str, st: HookStore, kw: dict[str, Any]) -> None:
        if key == PREFIX + METADATA_NAME and _marker(st).save_id != old_id:
            raise SystemExit("killed")

    store.on_put = die_after_marker
    with pytest.raises(BaseException):  # noqa: B017 - the "kill"
        save(store, new, overwrite=True)
    store.on_put = None
    manifest = _marker(store)
    committed = store.objects[PREFIX + manifest.metadata_key].data
    # Stock readers fail loudly (an empty .metadata) rather than load the replaced state.
    assert store.objects[PREFIX + METADATA_NAME].data == b""
    out = zeros(new)
    load(store, out)
    assert_same(new, out)
    assert store.objects[PREFIX + METADATA_NAME].data == committed


class _TS:
    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.step = sd["step"]


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(3)
    m = torch.nn.Linear(4, 3)
    return m, torch.optim.SGD(m.parameters(), lr=0.1)


def test_latest_is_never_older_than_the_newest_commit() -> None:
    """E: a kill between a marker and the pointer update leaves the pointer behind;
    latest() checks it with one listing, and the next save does not collide."""
    store = MemoryStore("bkt")
    model, opt = _model()
    with Checkpointer("s3://bkt/run", store=store, transfer_config=CONFIG) as ckpt:
        for step in (1, 2, 3):
            ckpt.save(step, model, opt)
    store.put("run/s3ckpt.latest.json", json.dumps({"step": 1}).encode())
    with Checkpointer("s3://bkt/run", store=store, transfer_config=CONFIG) as ckpt:
        assert ckpt.latest() == 3
        assert ckpt.load(*_model()) == 3
        ckpt.save(4, model, opt)
        assert ckpt.latest() == 4
    # A pointer naming an uncommitted step falls back to listing.
    store.put("run/s3ckpt.latest.json", json.dumps({"step": 9}).encode())
    with Checkpointer("s3://bkt/run", store=store, transfer_config=CONFIG) as ckpt:
        assert ckpt.latest() == 4


def test_nan_and_inf_metrics_are_saved_and_bad_ones_named() -> None:
    """K2: a diverging run's checkpoint is saved with its NaN loss; a non-number is a
    ConfigError naming the metric."""
    store = MemoryStore("bkt")
    model, opt = _model()
    with Checkpointer("s3://bkt/run", store=store, transfer_config=CONFIG) as ckpt:
        ckpt.save(1, model, opt, metrics={"loss": float("nan"), "gnorm": float("inf")})
        ckpt.attach_metrics(1, {"eval": float("-inf")})
        with pytest.raises(ConfigError, match="'eval'"):
            ckpt.attach_metrics(1, {"eval": "high"})  # type: ignore[dict-item]
        with pytest.raises(ConfigError, match="'loss'"):
            ckpt.save(2, model, opt, metrics={"loss": object()})  # type: ignore[dict-item]
    m = _marker(store, "run/step_000000001/").metrics
    assert math.isnan(m["loss"]) and m["gnorm"] == math.inf and m["eval"] == -math.inf


def test_failed_write_on_a_rank_removes_its_heartbeat() -> None:
    store = MemoryStore("bkt")
    store.inject("upload_part")
    with pytest.raises(CheckpointException):
        dcp.save(
            make_state(), storage_writer=S3StorageWriter(URL, store=store, transfer_config=CONFIG)
        )
    assert not [k for k in store.objects if "s3ckpt.alive." in k]


def test_overlapping_spans_in_one_request_each_read_their_own_bytes() -> None:
    """Two stored items that share bytes (a damaged or unusual .metadata) coalesce into
    one request; the second must be read from its own offset, never from where the
    stream happens to be."""
    store = MemoryStore("bkt")
    save(store, make_state())
    payload = bytes(range(256)) * 4
    store.put(PREFIX + "blob", payload)
    seen, _ = read_overlapping_spans(store, "blob", transfer_config=CONFIG)
    assert seen == {start: payload[start:end] for start, end in OVERLAPPING}


@pytest.mark.parametrize("meanwhile", ["pruned", "metrics_attached"])
def test_overwrite_commits_when_the_replaced_marker_changed_meanwhile(meanwhile: str) -> None:
    """An overwrite whose replaced marker was deleted (a prune) or rewritten in place by
    the same save (attach_metrics) while it uploaded still commits: its If-Match fails,
    reading back shows no other save, and it swaps against what is there."""
    store = HookStore("bkt")
    save(store, make_state())
    old = _marker(store)

    def change_marker(key: str, st: HookStore, kw: dict[str, Any]) -> None:
        if key.rpartition("/")[2].startswith(METADATA_NAME + "."):
            st.on_put = None
            if meanwhile == "pruned":
                st.delete([PREFIX + MANIFEST_NAME])
            else:
                doc = json.loads(st.objects[PREFIX + MANIFEST_NAME].data)
                doc["metrics"] = {"eval": 1.0}
                doc["digest"] = manifest_digest(doc)
                MemoryStore.put(st, PREFIX + MANIFEST_NAME, json.dumps(doc).encode())

    store.on_put = change_marker
    new = make_state()
    new["big"] -= 3
    writer = save(store, new, overwrite=True)
    assert _marker(store).save_id == writer.save_id != old.save_id
    out = zeros(new)
    load(store, out)
    assert_same(new, out)


def test_gc_reclaims_a_killed_writers_save_at_once_on_the_same_host() -> None:
    """A heartbeat names its writer's host, PID namespace and pid: on the same host a
    vanished pid proves the save dead before its grace period ends; a live writer, or one
    on another host, keeps its save however short the grace."""
    import socket
    import subprocess
    import sys

    from s3ckpt._commit import boot_id, pid_namespace
    from s3ckpt.format._names import heartbeat_name
    from s3ckpt.retention import gc
    from s3ckpt.uri import parse_url

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    writers = {
        "step_1": (socket.gethostname(), child.pid),  # killed: gone
        "step_2": (socket.gethostname(), os.getppid()),  # alive
        "step_3": ("another-host", child.pid),  # nothing provable from here
    }
    store = MemoryStore("bkt")
    for name, (host, pid) in writers.items():
        store.put(f"run/{name}/{data_name(0, 0, 'abcd0123')}", b"x" * 10)
        body = {"host": host, "boot": boot_id(), "pidns": pid_namespace(), "pid": pid}
        store.put(f"run/{name}/{heartbeat_name('abcd0123', 0)}", json.dumps(body).encode())
    result = gc(Location.of(parse_url("s3://bkt/run/"), store=store), apply=True)
    assert result.ok
    left = {k.split("/")[1] for k in store.objects if "/step_" in k}
    assert left == {"step_2", "step_3"}


def test_overwrite_that_loses_a_race_puts_the_winners_stock_metadata_back() -> None:
    """An overwrite retracts the stock .metadata copy before its marker; when it then loses
    the race, the copy of whatever is committed is put back (no stock reader left broken)."""
    winner_state = make_state()
    winner_state["big"] += 5
    source = MemoryStore("bkt")
    save(source, make_state())
    save(source, winner_state, overwrite=True)
    store = HookStore("bkt")
    save(store, make_state())

    def winner_commits_first(key: str, st: HookStore, kw: dict[str, Any]) -> None:
        if key.endswith(MANIFEST_NAME) and st.on_put is not None:
            st.on_put = None
            for k, obj in source.objects.items():
                if not k.endswith(METADATA_NAME):
                    MemoryStore.put(st, k, obj.data)

    store.on_put = winner_commits_first
    with pytest.raises(CheckpointException) as info:
        save(store, make_state(), overwrite=True)
    assert isinstance(_error(info.value), CheckpointExistsError)
    assert store.objects[PREFIX + METADATA_NAME].data == source.objects[PREFIX + METADATA_NAME].data
    out = zeros(winner_state)
    load(store, out)
    assert_same(winner_state, out)


@pytest.mark.parametrize(
    ("field", "shift"),
    [("data_offset", s) for s in (-64, -1, 1, 8, 64)]
    + [("start", s) for s in (1, 64)]
    + [("length", s) for s in (-1, 64)],
)
def test_resealed_manifest_cannot_move_a_tensor(field: str, shift: int) -> None:
    """C, against a forger who knows the digest: a manifest edited and re-sealed (digest
    recomputed, CRCs untouched or moved with it) still cannot make a load, streamed or
    buffered, take other bytes for a tensor; verify names the tensor."""
    store = MemoryStore("bkt")
    sd = make_state()
    save(store, sd)
    col = {"data_offset": 6, "start": 3, "length": 4}[field]

    def move(rows: list[list[Any]]) -> None:
        row = next(r for r in rows if r[0] == "big")
        row[col] += shift
        if field in ("start", "length"):
            # Move the item's window and re-seal its CRC too: the bytes in the new window.
            data = store.objects[PREFIX + row[2]].data
            row[5] = f"{crc32c(data[row[3] : row[3] + row[4]]):08x}"

    edit_items(store, PREFIX, move, reseal=True)
    for direct in (True, False):
        out = zeros(sd)
        if not direct:  # a destination the bytes cannot stream into: buffered decode
            out["big"] = torch.zeros(2048, 1024).t()
        with pytest.raises((CheckpointException, CorruptCheckpointError)) as info:
            load(store, out)
        err = _error(info.value)
        assert isinstance(err, CorruptCheckpointError), err
        assert "big" in str(err)
    try:
        result = verify_checkpoint(URL, store=store)
    except CorruptCheckpointError as exc:  # refused while opening: the records disagree
        assert "big" in str(exc)
    else:
        assert not result.ok and "big" in result.bad_items


@pytest.mark.parametrize("copy", ["plain", "tagged"])
@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_verify_reports_a_damaged_metadata_copy_and_load_still_works(
    copy: str, damage: str
) -> None:
    """Either copy of .metadata damaged: the load reads the intact one (bit-exact), verify
    names the damaged one and fails (without repairing it behind the user's back)."""
    store = MemoryStore("bkt")
    sd = make_state()
    save(store, sd)
    name = METADATA_NAME if copy == "plain" else _marker(store).metadata_key
    key = PREFIX + name
    data = store.objects[key].data
    if damage == "flip":
        store.objects[key].data = data[:10] + bytes([data[10] ^ 0x40]) + data[11:]
    elif damage == "truncate":
        store.objects[key].data = data[: len(data) // 2]
    else:
        del store.objects[key]
    result = verify_checkpoint(URL, store=store)
    assert not result.ok
    assert [(p.kind, p.object) for p in result.problems] == [("metadata", name)]
    out = zeros(sd)
    load(store, out)
    assert_same(sd, out)


def test_commit_steps_run_together_report_the_earlier_steps_failure() -> None:
    # Two commit steps run at once; where both fail, the error is the one the first step
    # raised when they ran in order (a missing object before a marker read's refusal).
    from s3ckpt._commit import at_once as _together

    def first() -> None:
        raise ValueError("first")

    def second() -> int:
        raise KeyError("second")

    with pytest.raises(ValueError, match="first"):
        _together(first, second)
    with pytest.raises(KeyError):
        _together(lambda: None, second)
    assert _together(lambda: None, lambda: 7) == (None, 7)
