"""Conditional-write capabilities (issue 27 items 4, 5, 11) against MemoryStore: the probe,
refusals and single-writer mode, marker deletes that never delete a marker they did not
plan to, and stores without ListMultipartUploads."""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import torch

from s3ckpt._tombstone import Tombstone
from s3ckpt.config import S3Config
from s3ckpt.errors import CheckpointError, ConditionalWritesError, find_s3ckpt_error
from s3ckpt.format._names import MANIFEST_NAME
from s3ckpt.retention import RetentionOptions, delete_checkpoint, gc, list_checkpoints
from s3ckpt.retention._lease import Lease
from s3ckpt.store import Location, MemoryStore
from s3ckpt.store._capabilities import (
    clear_capabilities_cache,
    probe_capabilities,
    require_conditional_writes,
)
from s3ckpt.uri import StoreURL
from tests._retention_util import ckpt_name, keys_under, write_checkpoint
from tests.unit._memory_dcp import load, save

T0 = datetime(2025, 1, 1, tzinfo=UTC)
RUN = StoreURL("memory", "b", "runs/a/")


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    clear_capabilities_cache()
    yield
    clear_capabilities_cache()


def _fill(store: MemoryStore, steps: Sequence[int]) -> None:
    for s in steps:
        write_checkpoint(store, RUN, s, created=T0.timestamp() + s * 60)


def _later() -> datetime:
    return datetime.now(UTC) + timedelta(hours=3)


def test_an_honest_store_passes_and_the_answer_is_cached() -> None:
    store = MemoryStore("b")
    caps = probe_capabilities(store, "run/hb", body=b"x", probe_delete=True)
    assert caps.conditional_writes and caps.conditional_delete and caps.list_uploads is True
    assert store.get("run/hb") == b"x", "the probe leaves the caller's object as it was"
    before = dict(store.calls)
    assert probe_capabilities(store, "run/hb") == caps and store.calls == before


def test_a_store_ignoring_conditions_is_found_out_and_refused() -> None:
    store = MemoryStore("b", ignore_conditions=True, list_uploads=False)
    caps = probe_capabilities(store, "run/hb", body=b"x", probe_delete=True)
    assert not caps.conditional_create and not caps.conditional_replace
    assert not caps.conditional_delete and caps.list_uploads is False
    assert store.get("run/hb") == b"x", "a delete the store wrongly applied is put back"
    with pytest.raises(ConditionalWritesError, match="If-None-Match and If-Match") as err:
        require_conditional_writes(store, "run/hb", what="a test")
    assert err.value.endpoint == "memory://" and "single-writer" in str(err.value)


def test_a_save_is_refused_before_any_data_is_written() -> None:
    store = MemoryStore("bkt", ignore_conditions=True)
    with pytest.raises(BaseException) as err:  # DCP wraps what a storage layer raises
        save(store, {"t": torch.ones(4)})
    assert isinstance(find_s3ckpt_error(err.value), ConditionalWritesError)
    assert not any(k.endswith(".distcp") or MANIFEST_NAME in k for k in store.objects)


def test_single_writer_mode_saves_and_warns_once() -> None:
    store = MemoryStore("bkt", ignore_conditions=True)
    cfg = S3Config(single_writer=True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        save(store, {"t": torch.ones(4)}, s3_config=cfg)
        save(store, {"t": torch.ones(4) * 2}, s3_config=cfg, overwrite=True)
    ours = [w for w in seen if "conditional writes" in str(w.message)]
    assert len(ours) == 1 and "single-writer" in str(ours[0].message)
    sd = {"t": torch.zeros(4)}
    load(store, sd)
    assert torch.equal(sd["t"], torch.ones(4) * 2)


def test_the_lease_is_refused_on_a_store_ignoring_conditions() -> None:
    store = MemoryStore("b", ignore_conditions=True)
    with pytest.raises(ConditionalWritesError, match="lease"):
        Lease(store, RUN).acquire()


def _rm_racing_an_overwrite(store: MemoryStore) -> Any:
    """rm step 1 while an overwrite commits a new marker between the scan and the delete."""
    _fill(store, [1, 2])
    marker = RUN.child(ckpt_name(1)).key(MANIFEST_NAME)

    def overwrite(event: str, details: dict[str, Any]) -> None:
        if event == "intent":  # planned and logged: the marker's ETag is fixed now
            store.put(marker, store.get(marker) + b" ")  # a new commit, another ETag

    return delete_checkpoint(
        Location.of(RUN.child(ckpt_name(1)), store=store),
        options=RetentionOptions(now=_later(), on_progress=overwrite, sleep=lambda s: None),
    )


@pytest.mark.parametrize("conditional_deletes", [True, False], ids=["if-match", "tombstone"])
def test_rm_never_deletes_a_marker_that_changed_after_the_scan(conditional_deletes: bool) -> None:
    store = MemoryStore("b", conditional_deletes=conditional_deletes)
    before = keys_under(store, RUN.child(ckpt_name(1)).prefix)
    r = _rm_racing_an_overwrite(store)
    assert not r.deleted and r.ok, "a changed checkpoint is skipped, not an error"
    assert any("changed after it was planned" in n for n in r.notes)
    assert keys_under(store, RUN.child(ckpt_name(1)).prefix) == before or not before
    marker = RUN.child(ckpt_name(1)).key(MANIFEST_NAME)
    assert Tombstone.parse(store.get(marker)) is None
    names = {
        c.name
        for c in list_checkpoints(
            Location.of(RUN, store=store), options=RetentionOptions(now=_later())
        )
    }
    assert ckpt_name(1) in names


@pytest.mark.parametrize("conditional_deletes", [True, False], ids=["if-match", "tombstone"])
def test_rm_deletes_an_unchanged_checkpoint_either_way(conditional_deletes: bool) -> None:
    store = MemoryStore("b", conditional_deletes=conditional_deletes)
    _fill(store, [1, 2])
    r = delete_checkpoint(
        Location.of(RUN.child(ckpt_name(1)), store=store),
        options=RetentionOptions(now=_later(), sleep=lambda s: None),
    )
    assert r.deleted and r.ok
    assert keys_under(store, RUN.child(ckpt_name(1)).prefix) == set()
    assert store.calls.get("delete_if_match", 0) >= 1  # probed (and used where supported)


def test_a_lost_reply_of_a_conditional_delete_is_decided_by_reading_back() -> None:
    store = MemoryStore("b")
    _fill(store, [1, 2])
    real = store.delete_if_match

    def applied_then_404(key: str, etag: str) -> None:
        real(key, etag)
        if key.endswith(MANIFEST_NAME):
            real(key, etag)  # the retry of an applied delete: 404

    store.delete_if_match = applied_then_404  # type: ignore[method-assign]
    r = delete_checkpoint(
        Location.of(RUN.child(ckpt_name(1)), store=store),
        options=RetentionOptions(now=_later(), sleep=lambda s: None),
    )
    assert r.deleted and r.ok and keys_under(store, RUN.child(ckpt_name(1)).prefix) == set()


def test_an_overwrite_never_replaces_a_tombstone() -> None:
    store = MemoryStore("bkt")
    save(store, {"t": torch.ones(4)})
    store.put("run/step_1/" + MANIFEST_NAME, Tombstone("a-deleter", names=(".metadata",)).to_json())
    with pytest.raises(BaseException) as err:  # DCP wraps what a storage layer raises
        save(store, {"t": torch.ones(4)}, overwrite=True)
    found = find_s3ckpt_error(err.value)
    assert isinstance(found, CheckpointError) and "being deleted" in str(found)
    assert Tombstone.parse(store.get("run/step_1/" + MANIFEST_NAME)) is not None


def test_no_list_multipart_uploads_scans_with_one_warning_and_gc_says_so() -> None:
    store = MemoryStore("b", list_uploads=False)
    _fill(store, [1, 2])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert (
            len(
                list_checkpoints(
                    Location.of(RUN, store=store), options=RetentionOptions(now=_later())
                )
            )
            == 2
        )
        assert (
            len(
                list_checkpoints(
                    Location.of(RUN, store=store), options=RetentionOptions(now=_later())
                )
            )
            == 2
        )
        r = gc(
            Location.of(RUN, store=store),
            apply=True,
            options=RetentionOptions(now=_later(), sleep=lambda s: None),
        )
    ours = [w for w in seen if "ListMultipartUploads" in str(w.message)]
    assert len(ours) == 1
    assert r.ok and r.aborted == 0
    assert any("ListMultipartUploads" in n for n in r.notes)
