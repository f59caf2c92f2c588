"""Issue 37 items 1 and 6 on MemoryStore: every transition that ends a writer's claim is
fenced on the marker key, and every interrupted or refused deletion converges.

(a) A writer "paused" right before its marker PUT (a store hook runs gc, prune or rm first,
    in the writer's own thread: deterministic, no SIGSTOP) fails its conditional PUT, reads
    the marker back and raises :class:`SaveFencedError`; nothing is committed over deleted
    data, the previous checkpoint still loads.
(b) prune killed after its intent, after its fence, mid-deletes: the next run (shallow
    scan, as the CLI) leaves exactly what an uninterrupted run leaves: no lone .metadata.
(c) deletes refused (403) then allowed: converges; meanwhile the catalog shows the
    checkpoint being deleted (never damaged, never a live save), and rm finishes it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import torch

from s3ckpt._tombstone import Tombstone
from s3ckpt.errors import SaveFencedError, StoreError, find_s3ckpt_error
from s3ckpt.format._manifest import Manifest
from s3ckpt.format._names import MANIFEST_NAME
from s3ckpt.retention import (
    KeepLast,
    RetentionOptions,
    delete_checkpoint,
    gc,
    list_checkpoints,
    prune,
)
from s3ckpt.retention._catalog import CheckpointState
from s3ckpt.store import Location, MemoryStore
from s3ckpt.uri import StoreURL
from tests._retention_util import Clock, ckpt_name, keys_under, write_checkpoint
from tests.unit._memory_dcp import load, save

RUN = StoreURL("s3", "bkt", "run/")
STEP = RUN.child("step_1")
LATER = datetime.now(UTC) + timedelta(hours=3)  # every grace period past


def _pause_before_marker(store: MemoryStore, action: Callable[[], object]) -> list[object]:
    """Run ``action`` once, just before the writer's marker PUT reaches the store."""
    real = store.put
    ran: list[object] = []

    def put(key: str, data: Any, **kw: Any) -> str:
        if key == STEP.key(MANIFEST_NAME) and not ran and Tombstone.parse(bytes(data)) is None:
            try:
                Manifest.from_json(bytes(data))
            except Exception:
                return real(key, data, **kw)
            ran.append(action())  # the writer is paused here; the deleter runs
        return real(key, data, **kw)

    store.put = put  # type: ignore[method-assign]
    return ran


def _fenced(err: pytest.ExceptionInfo[BaseException], by: str) -> SaveFencedError:
    found = find_s3ckpt_error(err.value)
    assert isinstance(found, SaveFencedError), err.value
    text = str(found)
    assert f"`s3ckpt {by}`" in text and "Nothing was committed" in text, text
    assert "previous checkpoint is still the latest" in text
    return found


def test_a_fresh_save_paused_past_gcs_grace_is_fenced_and_the_step_can_be_saved_again() -> None:
    store = MemoryStore("bkt")
    ran = _pause_before_marker(
        store,
        lambda: gc(Location.of(RUN, store=store), apply=True, options=RetentionOptions(now=LATER)),
    )
    with pytest.raises(BaseException) as err:  # DCP wraps what a storage layer raises
        save(store, {"t": torch.ones(4)}, url=str(STEP))
    assert ran and ran[0].removed == (str(STEP),)  # type: ignore[attr-defined]
    _fenced(err, "gc")
    tomb = Tombstone.parse(store.get(STEP.key(MANIFEST_NAME)))
    assert tomb is not None and tomb.done and tomb.keep and tomb.by == "gc"
    assert keys_under(store, STEP.prefix) == {STEP.key(MANIFEST_NAME)}
    assert (
        list_checkpoints(Location.of(RUN, store=store), options=RetentionOptions(now=LATER)) == []
    )  # gone: not listed
    # A new save of the step replaces the finished fence (If-Match its ETag) and loads.
    save(store, {"t": torch.full((4,), 2.0)}, url=str(STEP))
    out = {"t": torch.zeros(4)}
    load(store, out, url=str(STEP))
    assert torch.equal(out["t"], torch.full((4,), 2.0))


@pytest.mark.parametrize("deleter", ["gc", "prune", "rm"])
def test_an_overwrite_paused_past_a_deleter_is_fenced_and_the_previous_commit_stays(
    deleter: str,
) -> None:
    store = MemoryStore("bkt")
    save(store, {"t": torch.ones(4)}, url=str(STEP))
    newer = RUN.child("step_2")
    if deleter != "gc":  # prune and rm keep the newest: a step 2 makes step 1 deletable
        save(store, {"t": torch.ones(4)}, url=str(newer))
    act: dict[str, Callable[[], object]] = {
        "gc": lambda: gc(
            Location.of(RUN, store=store), apply=True, options=RetentionOptions(now=LATER)
        ),
        "prune": lambda: prune(
            Location.of(RUN, store=store),
            KeepLast(1),
            apply=True,
            options=RetentionOptions(now=LATER),
        ),
        "rm": lambda: delete_checkpoint(
            Location.of(STEP, store=store), options=RetentionOptions(now=LATER)
        ),
    }
    _pause_before_marker(store, act[deleter])
    with pytest.raises(BaseException) as err:
        save(store, {"t": torch.full((4,), 9.0)}, url=str(STEP), overwrite=True)
    _fenced(err, deleter)
    if deleter == "gc":  # gc reaped the overwrite only: step 1 is still committed, unchanged
        out = {"t": torch.zeros(4)}
        load(store, out, url=str(STEP))
        assert torch.equal(out["t"], torch.ones(4))
        (c,) = list_checkpoints(Location.of(RUN, store=store), options=RetentionOptions(now=LATER))
        assert c.is_committed and not c.damaged and c.live_saves == 0
    else:  # deleted as asked; the fence of the reaped overwrite stays (gone)
        tomb = Tombstone.parse(store.get(STEP.key(MANIFEST_NAME)))
        assert tomb is not None and tomb.done and tomb.keep and tomb.reaped
        assert [
            c.name
            for c in list_checkpoints(
                Location.of(RUN, store=store), options=RetentionOptions(now=LATER)
            )
        ] == ["step_2"]


# -- (b) a prune killed at each point converges ----------------------------------------------
T0 = datetime(2025, 1, 1, tzinfo=UTC)
NOW = T0 + timedelta(days=1)


class Killed(BaseException):
    """The pruner dies (raised from its progress hook, like a SIGKILL: no cleanup runs)."""


def _run() -> MemoryStore:
    """Steps 1-5 committed at T0 (store time), each save with a fixed tag."""
    clock = Clock(T0)
    store = MemoryStore("bkt", clock=clock)
    for s in range(1, 6):
        clock.t = T0.timestamp() + s
        tag = f"{s:08d}"
        write_checkpoint(store, RUN, s, created=clock.t, per_save_metadata=True, tag=tag)
    clock.t = NOW.timestamp()
    return store


def _kill_at(event: str, phase: str | None) -> Callable[[str, dict[str, Any]], None]:
    def hook(e: str, details: dict[str, Any]) -> None:
        if e == event and (phase is None or details.get("phase") == phase):
            raise Killed

    return hook


def _objects(store: MemoryStore) -> set[str]:
    return {k for k in store.objects if not k.endswith("s3ckpt.lease")}


@pytest.mark.parametrize(
    ("event", "phase"),
    [("intent", None), ("delete", "metadata"), ("delete", "data")],
    ids=["after-intent", "after-fence", "mid-deletes"],
)
def test_a_prune_killed_at_any_point_converges_on_the_next_shallow_run(
    event: str, phase: str | None
) -> None:
    clean = _run()
    prune(Location.of(RUN, store=clean), KeepLast(2), apply=True, options=RetentionOptions(now=NOW))
    store = _run()
    with pytest.raises(Killed):
        prune(
            Location.of(RUN, store=store),
            KeepLast(2),
            apply=True,
            options=RetentionOptions(now=NOW, on_progress=_kill_at(event, phase)),
        )
    # the lease of the dead pruner is stale by now; the re-run is the CLI's (shallow scan)
    again = NOW + timedelta(hours=1)
    prune(
        Location.of(RUN, store=store),
        KeepLast(2),
        apply=True,
        options=RetentionOptions(scan="shallow", now=again),
    )
    assert _objects(store) == _objects(clean)
    for s in (1, 2, 3):  # no lone .metadata a stock DCP reader would take for a checkpoint
        assert keys_under(store, RUN.child(ckpt_name(s)).prefix) == set()


# -- (c) deletes refused, then allowed ---------------------------------------------------------
def test_refused_deletes_then_allowed_converge_and_never_show_damage_or_a_live_save() -> None:
    clean = _run()
    prune(Location.of(RUN, store=clean), KeepLast(2), apply=True, options=RetentionOptions(now=NOW))
    store = _run()

    def denied(key: str) -> BaseException:
        return StoreError("Access Denied", key=key, code="AccessDenied", operation="delete")

    fault = store.inject("delete_key", denied, key_glob="*.distcp", times=10**6)
    r = prune(
        Location.of(RUN, store=store),
        KeepLast(2),
        apply=True,
        options=RetentionOptions(now=NOW, sleep=lambda s: None),
    )
    assert not r.ok and r.deleted == ()
    cat = {
        c.name: c
        for c in list_checkpoints(Location.of(RUN, store=store), options=RetentionOptions(now=NOW))
    }
    for s in (1, 2, 3):
        c = cat[ckpt_name(s)]
        assert c.state is CheckpointState.BEING_DELETED
        assert not c.damaged and not c.overwrite_in_progress and c.live_saves == 0
        assert c.life.value == "being_deleted"
    assert gc(Location.of(RUN, store=store), options=RetentionOptions(now=NOW)).damaged == ()
    store.faults.remove(fault)  # the denial is lifted
    done = delete_checkpoint(
        Location.of(RUN.child(ckpt_name(1)), store=store),
        options=RetentionOptions(now=NOW + timedelta(hours=1)),
    )
    assert done.deleted  # rm of a checkpoint being deleted finishes it (and the others)
    assert _objects(store) == _objects(clean)
    for s in (1, 2, 3):
        assert keys_under(store, RUN.child(ckpt_name(s)).prefix) == set()
