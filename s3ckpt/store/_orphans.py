"""Multipart uploads orphaned by a lost reply to a retried CreateMultipartUpload, aborted
by :meth:`~s3ckpt.store.s3.S3Store.create_multipart`."""

from __future__ import annotations

import logging

from s3ckpt.errors import StoreError
from s3ckpt.store.base import ObjectStore

__all__ = ["abort_orphan_uploads"]

log = logging.getLogger(__name__)


def abort_orphan_uploads(store: ObjectStore, key: str, keep: str) -> None:
    """Abort uploads of exactly ``key`` other than ``keep`` (best effort).

    A retried CreateMultipartUpload may have been applied by an attempt whose reply was
    lost: that upload's id never reached us and its parts would be billed until a
    lifecycle rule removes them. s3ckpt's keys are unique per save (see
    :mod:`s3ckpt.format`), so any other upload of this very key is such an orphan.
    """
    try:
        orphans = [
            u.upload_id
            for u in store.list_multipart_uploads(key)
            if u.key == key and u.upload_id != keep
        ]
        for upload_id in orphans:
            store.abort_multipart(key, upload_id)
    except StoreError as exc:  # the save itself is fine; only cleanup is left behind
        log.warning(
            "could not abort orphaned multipart uploads of s3://%s/%s: %s",
            store.bucket,
            key,
            exc,
        )
        return
    if orphans:
        log.info(
            "aborted %d orphaned multipart upload(s) of s3://%s/%s left by a lost reply",
            len(orphans),
            store.bucket,
            key,
        )
