"""Helpers for the retention tests: write checkpoints in the s3ckpt layout to any store, and a
settable clock with a MemoryStore on it."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import pytest

from s3ckpt._crc import crc32c
from s3ckpt.format._manifest import Manifest, ObjectRecord
from s3ckpt.format._names import (
    MANIFEST_NAME,
    METADATA_NAME,
    data_name,
    heartbeat_name,
    items_name,
    metadata_name,
)
from s3ckpt.format._names import checkpoint_name as ckpt_name
from s3ckpt.store import MemoryStore
from s3ckpt.store.base import ObjectStore
from s3ckpt.uri import StoreURL

__all__ = [
    "Clock",
    "ckpt_name",
    "clock_and_store_fixtures",
    "keys_under",
    "new_tag",
    "write_checkpoint",
]

DATA_SIZE = 64
META = b"meta"


def new_tag() -> str:
    return uuid.uuid4().hex[:8]


def write_checkpoint(
    store: ObjectStore,
    run: StoreURL,
    step: int,
    *,
    created: float,
    metrics: Mapping[str, float] | None = None,
    data_objects: int = 3,
    commit: bool = True,
    metadata: bool = True,
    name: str | None = None,
    tag: str | None = None,
    per_save_metadata: bool = False,
    heartbeats: int = 0,
    record_step: bool = True,
) -> StoreURL:
    """Data objects, then ``.metadata``, then (``commit``) the marker — the save order.

    Every object carries the save's ``tag``. ``per_save_metadata`` writes the commit
    protocol's layout: ``.metadata.{tag}`` (what the marker commits), and after the marker
    the plain ``.metadata`` copy. ``heartbeats`` writes that many ranks' heartbeats first.
    ``record_step=False`` leaves the marker's ``step`` empty (the name must give it).
    """
    tag = tag or new_tag()
    ckpt = run.child(name or ckpt_name(step))
    for rank in range(heartbeats):
        store.put(ckpt.key(heartbeat_name(tag, rank)), b"")
    objects = []
    for i in range(data_objects):
        obj = data_name(i, 0, tag)
        store.put(ckpt.key(obj), bytes([i % 256]) * DATA_SIZE)
        objects.append(ObjectRecord(obj, DATA_SIZE, i))
    meta_key = metadata_name(tag) if per_save_metadata else METADATA_NAME
    if metadata:
        store.put(ckpt.key(meta_key), META)
    if commit:
        m = Manifest(
            save_id=tag + uuid.uuid4().hex[8:],
            created=created,
            world_size=data_objects,
            metadata_key=meta_key,
            metadata_crc32c=crc32c(META),
            metadata_size=len(META),
            objects=tuple(objects),
            items=(),
            step=step if record_step else None,
            metrics=dict(metrics or {}),
        )
        m, records = m.split_items(items_name(tag))
        store.put(ckpt.key(items_name(tag)), records)
        store.put(ckpt.key(MANIFEST_NAME), m.to_json(), if_none_match=True)
        if per_save_metadata and metadata:
            store.put(ckpt.key(METADATA_NAME), META)
    return ckpt


def keys_under(store: ObjectStore, prefix: str) -> set[str]:
    return {o.key for o in store.list(prefix)}


class Clock:
    """A clock the test sets: ``clock()`` is ``clock.t``, seconds since the epoch."""

    def __init__(self, start: datetime) -> None:
        self.t = start.timestamp()

    def __call__(self) -> float:
        return self.t


def clock_and_store_fixtures(start: datetime) -> tuple[Any, Any]:
    """The fixtures ``clock`` (a :class:`Clock` at ``start``) and ``store`` (a MemoryStore of
    bucket ``b`` whose object times come from that clock), for a test module to bind::

        clock, store = clock_and_store_fixtures(T0)
    """

    @pytest.fixture
    def clock() -> Clock:
        return Clock(start)

    @pytest.fixture
    def store(clock: Clock) -> MemoryStore:
        return MemoryStore("b", clock=clock)

    return clock, store
