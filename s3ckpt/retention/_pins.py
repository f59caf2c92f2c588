"""Pins: ``{checkpoint}/s3ckpt.pin.json`` keeps a checkpoint from every prune and gc."""

from __future__ import annotations

import json
import socket
from datetime import datetime

from s3ckpt._time import aware_now, iso_z
from s3ckpt.errors import CheckpointNotFoundError, ConfigError, StoreError
from s3ckpt.format import PIN_NAME
from s3ckpt.store.base import ObjectStore
from s3ckpt.uri import StoreURL

__all__ = ["pin", "unpin"]


def pin(
    store: ObjectStore,
    checkpoint: StoreURL,
    reason: str,
    *,
    by: str | None = None,
    now: datetime | None = None,
) -> None:
    """Pin a checkpoint: ``{checkpoint}/s3ckpt.pin.json`` with the reason. A pinned
    checkpoint is never deleted by prune or gc. Pinning again replaces the reason.

    Raises:
        CheckpointNotFoundError: Nothing is stored under ``checkpoint``.
        ConfigError: The reason is empty.

    Request cost: one LIST (of at most 1000 keys, the first page) and one PUT.
    """
    reason = (reason or "").strip()
    if not reason:
        raise ConfigError("a pin needs a reason (--reason TEXT), e.g. 'release v1.2'")
    if not _exists(store, checkpoint):
        raise CheckpointNotFoundError(
            f"no checkpoint at {checkpoint}: nothing is stored under that prefix",
            bucket=checkpoint.bucket or None,
            key=checkpoint.prefix,
        )
    doc = {
        "reason": reason,
        "pinned_at": iso_z(aware_now(now)),
        "by": by or socket.gethostname(),
    }
    store.put(checkpoint.key(PIN_NAME), json.dumps(doc).encode("utf-8"))


def unpin(store: ObjectStore, checkpoint: StoreURL) -> bool:
    """Remove a checkpoint's pin; return whether there was one.

    Request cost: one HEAD and, if pinned, one DeleteObjects.
    """
    key = checkpoint.key(PIN_NAME)
    if store.head(key) is None:
        return False
    failures = store.delete([key])
    if failures:
        f = failures[0]
        raise StoreError(
            f"could not remove the pin: {f.code}: {f.message}",
            bucket=checkpoint.bucket or None,
            key=key,
            operation="delete",
            code=f.code,
        )
    return True


def _exists(store: ObjectStore, prefix: StoreURL) -> bool:
    for _ in store.list(prefix.prefix):
        return True
    return False
