"""Helpers for the retention tests: write checkpoints in the s3ckpt layout to any store."""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from s3ckpt.format import MANIFEST_NAME, METADATA_NAME, Manifest, ObjectRecord
from s3ckpt.store.base import ObjectStore
from s3ckpt.uri import StoreURL

DATA_SIZE = 64


def ckpt_name(step: int) -> str:
    return f"step_{step:09d}"


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
) -> StoreURL:
    """Data objects, then ``.metadata``, then (``commit``) the marker — the save order."""
    ckpt = run.child(name or ckpt_name(step))
    objects = []
    for i in range(data_objects):
        obj = f"__{i}_0.{uuid.uuid4().hex[:8]}.distcp"
        store.put(ckpt.key(obj), bytes([i % 256]) * DATA_SIZE)
        objects.append(ObjectRecord(obj, DATA_SIZE, i))
    if metadata:
        store.put(ckpt.key(METADATA_NAME), b"meta")
    if commit:
        m = Manifest(
            save_id=uuid.uuid4().hex,
            created=created,
            world_size=data_objects,
            metadata_key=METADATA_NAME,
            metadata_crc32c=0,
            metadata_size=4,
            objects=tuple(objects),
            items=(),
            step=step,
            metrics=dict(metrics or {}),
        )
        store.put(ckpt.key(MANIFEST_NAME), m.to_json(), if_none_match=True)
    return ckpt


def keys_under(store: ObjectStore, prefix: str) -> set[str]:
    return {o.key for o in store.list(prefix)}
