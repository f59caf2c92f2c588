"""One committed checkpoint judged without listing its run: what ``Checkpointer.latest()``
and ``load(step="latest")`` read for each candidate step.

The catalog's own decision (:func:`s3ckpt.retention._scan._info`, the shallow record of
:func:`~s3ckpt.retention._scan._shallow_info` and the check record's verdict) applied to a
one-checkpoint "listing" made of its commit marker: one GET of the marker (its bytes, size,
ETag and LastModified), so a checkpoint is damaged here exactly when a scan would call it
damaged.
"""

from __future__ import annotations

from s3ckpt.retention._catalog import CheckpointInfo
from s3ckpt.retention._check_record import CheckRecord
from s3ckpt.retention._listing import Group
from s3ckpt.retention._scan import _info, _shallow_info
from s3ckpt.retention._shallow import _probe
from s3ckpt.store.base import ObjectStore
from s3ckpt.uri import StoreURL

__all__ = ["probe_checkpoint"]


def probe_checkpoint(
    store: ObjectStore, run: StoreURL, name: str, record: CheckRecord | None
) -> CheckpointInfo | None:
    """The checkpoint ``name`` of ``run`` as a shallow catalog records it, damaged when its
    marker cannot be read or ``record`` (the run's ``s3ckpt.check.json``,
    :func:`~s3ckpt.retention.read_check_record`) found it damaged; None when it has no
    commit marker.

    Request cost: one GET (the marker).
    """
    prefix = run.child(name).prefix
    marker = _probe(store, prefix)
    if marker is None:
        return None
    group = Group(marker=marker.info)
    group.touch(marker.info.last_modified)
    info = _info(run, run.prefix, prefix, group, marker.manifest, None, 0.0, None)
    info = _shallow_info(info, prefix, marker)
    return info.checked(record)
