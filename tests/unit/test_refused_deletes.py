"""Deletes refused during a prune, minutes after the saves (their objects still younger than
the grace period), then allowed: the next prune finishes the deletion. The tombstone names
the saves it covers, so their young objects never make the prefix look like a live save
(issue 37, item 6; chaos class 17 found it on moto)."""

from __future__ import annotations

import torch

from s3ckpt import Checkpointer
from s3ckpt._tombstone import Tombstone
from s3ckpt.errors import StoreError
from s3ckpt.format._names import MANIFEST_NAME
from s3ckpt.retention import KeepLast, RetentionOptions, list_checkpoints, prune
from s3ckpt.retention._catalog import CheckpointState
from s3ckpt.store import Location, MemoryStore
from s3ckpt.uri import parse_url

URL = "s3://bkt/run"
RUN = parse_url(URL + "/")


def _keys(store: MemoryStore, step: int) -> set[str]:
    prefix = RUN.child(f"step_{step:09d}").prefix
    return {k for k in store.objects if k.startswith(prefix)}


def test_a_prune_whose_deletes_were_refused_is_finished_by_the_next_one_at_once() -> None:
    store = MemoryStore("bkt")
    with Checkpointer(URL, store=store) as ckpt:
        for step in (1, 2, 3):
            ckpt.save(step, torch.nn.Linear(2, 2))

    def denied(key: str) -> BaseException:
        return StoreError("Access Denied", key=key, code="AccessDenied", operation="delete")

    fault = store.inject("delete_key", denied, key_glob="*.distcp", times=10**6)
    r = prune(
        Location.of(RUN, store=store),
        KeepLast(1),
        apply=True,
        options=RetentionOptions(sleep=lambda s: None),
    )
    assert not r.ok and r.deleted == ()
    tomb = Tombstone.parse(store.objects[RUN.child("step_000000001").key(MANIFEST_NAME)].data)
    assert tomb is not None and not tomb.done and tomb.tag is not None  # the committed save's
    by = {c.step: c for c in list_checkpoints(Location.of(RUN, store=store))}
    assert by[1].state is CheckpointState.BEING_DELETED and by[1].live_saves == 0
    store.faults.remove(fault)  # the denial is lifted, minutes (not hours) later
    again = prune(Location.of(RUN, store=store), KeepLast(1), apply=True)
    assert again.ok
    assert _keys(store, 1) == _keys(store, 2) == set()
    assert [(c.step, c.state) for c in list_checkpoints(Location.of(RUN, store=store))] == [
        (3, CheckpointState.COMMITTED)
    ]
