"""``Checkpointer.attach_metrics``: merge metrics into a committed marker by a
compare-and-swap (If-Match on its ETag), refused on a store without conditional writes."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import SupportsFloat

from s3ckpt.errors import (
    CheckpointNotFoundError,
    PreconditionFailedError,
    S3CkptError,
    TransientStoreError,
)
from s3ckpt.format import Manifest, check_metrics
from s3ckpt.store import require_conditional_writes
from s3ckpt.store.base import ObjectStore

__all__ = ["attach_to_marker"]


def attach_to_marker(
    store: ObjectStore,
    key: str,
    metrics: Mapping[str, SupportsFloat],
    *,
    what: str,
    single_writer: bool | None,
) -> None:
    """Merge ``metrics`` into the marker at ``key`` (``what`` names it in errors).

    Raises:
        CheckpointNotFoundError: No marker at ``key``.
        ConditionalWritesError: The store ignores If-Match (and single-writer mode is off).
        PreconditionFailedError: The marker changed meanwhile (an overwrite, a pruner).

    Request cost: HEAD + GET + PUT (and the capability probe, once per process).
    """
    info = store.head(key)
    if info is None:
        raise CheckpointNotFoundError(
            f"no committed checkpoint for {what}: cannot attach metrics; save it first",
            bucket=store.bucket,
            key=key,
        )
    require_conditional_writes(
        store, key, what=f"attach_metrics to {what}", single_writer=single_writer
    )
    manifest = Manifest.from_json(store.get(key))
    merged = {**dict(manifest.metrics), **check_metrics(metrics)}
    body = dataclasses.replace(manifest, metrics=merged).to_json()
    try:
        store.put(key, body, if_match=info.etag)
    except (PreconditionFailedError, TransientStoreError):
        # The reply may have been lost after S3 applied the PUT (a retry then sees a 412
        # from our own write): the marker holding exactly our body means it did.
        try:
            if store.get(key) == body:
                return
        except S3CkptError:
            pass
        raise
