"""Pins: ``{checkpoint}/s3ckpt.pin.json`` keeps a checkpoint from every prune and gc."""

from __future__ import annotations

import json
import socket
from datetime import datetime
from itertools import islice

from s3ckpt._time import aware_now, iso_z
from s3ckpt.errors import CheckpointNotFoundError, ConfigError, StoreError
from s3ckpt.format._names import MANIFEST_NAME, METADATA_NAME, PIN_NAME
from s3ckpt.retention._listing import ckpt_dir
from s3ckpt.store.base import ObjectInfo, ObjectStore
from s3ckpt.uri import StoreURL

__all__ = ["pin", "unpin"]

_PAGE = 1000  # keys in the first page of a listing: all pin reads to decide


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
        CheckpointNotFoundError: Nothing is stored under ``checkpoint``, or nothing stored
            there is a checkpoint's (a folder of runs, a foreign folder).
        ConfigError: The reason is empty, or ``checkpoint`` is a run (a prefix holding
            checkpoints) rather than one checkpoint.

    Request cost: one LIST (of at most 1000 keys, the first page) and one PUT.
    """
    reason = (reason or "").strip()
    if not reason:
        raise ConfigError("a pin needs a reason (--reason TEXT), e.g. 'release v1.2'")
    _check_checkpoint(store, checkpoint)
    doc = {"reason": reason, "pinned_at": iso_z(aware_now(now)), "by": by or socket.gethostname()}
    store.put(checkpoint.key(PIN_NAME), json.dumps(doc).encode("utf-8"))


def unpin(store: ObjectStore, checkpoint: StoreURL) -> bool:
    """Remove a checkpoint's pin; return whether there was one.

    Request cost: one HEAD and, if pinned, one DeleteObjects.
    """
    key = checkpoint.key(PIN_NAME)
    if store.head(key) is None:
        return False
    for f in store.delete([key]):  # the one key's failure, if any
        raise StoreError(
            f"could not remove the pin: {f.code}: {f.message}",
            bucket=checkpoint.bucket,
            key=key,
            operation="delete",
            code=f.code,
        )
    return True


def _check_checkpoint(store: ObjectStore, checkpoint: StoreURL) -> None:
    """Refuse anything but a checkpoint: a prefix with nothing under it, a run (checkpoints
    one level down but no checkpoint file at the prefix itself), and a prefix whose first
    page holds no checkpoint file of its own (a folder of runs, a foreign folder). Reads at
    most the first page of the listing, and stops as soon as it knows."""
    children: list[str] = []
    info: ObjectInfo | None = None  # stays None when nothing is listed
    for info in islice(store.list(checkpoint.prefix), _PAGE):
        child, sep, name = info.key[len(checkpoint.prefix) :].partition("/")
        if not sep and ckpt_dir(info.key) == checkpoint.prefix:  # a checkpoint's own name
            return
        if sep and name in (MANIFEST_NAME, METADATA_NAME) and child not in children:
            children.append(child)
    if children:
        some = ", ".join(children[:3]) + (", ..." if len(children) > 3 else "")
        raise ConfigError(
            f"{checkpoint} is a run holding checkpoints ({some}), not a checkpoint: pin one "
            f"of them, e.g. {checkpoint.child(children[-1])}"
        )
    # Nothing at all, or objects none of which a checkpoint holds at its own level with no
    # checkpoint one level down (a folder of runs, a foreign folder): a pin there would keep
    # nothing (prune and gc read pins per checkpoint), so it is refused, not written.
    why = (
        "nothing is stored under that prefix; check the URL (s3ckpt ls RUN lists a run's "
        "checkpoints)"
        if info is None
        else f"the objects under it are not a checkpoint's (no {MANIFEST_NAME}, "
        f"{METADATA_NAME} or .distcp directly under it); if it is a folder of runs, pin one "
        "checkpoint (s3ckpt ls URL lists them)"
    )
    raise CheckpointNotFoundError(
        f"no checkpoint at {checkpoint}: {why}", bucket=checkpoint.bucket, key=checkpoint.prefix
    )
