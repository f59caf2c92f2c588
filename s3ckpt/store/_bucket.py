"""Creating a bucket: the one request s3ckpt makes above a bucket's keys.

Only ``s3ckpt demo`` (and the examples, through it) creates a bucket: its own, on the
embedded server or on an S3-compatible endpoint that ``AWS_ENDPOINT_URL`` names. The request
is one of the store's own (``S3Store._call``): retried, counted and mapped to s3ckpt's
errors like every other, on the store's shared client.
"""

from __future__ import annotations

from typing import Any

from s3ckpt.errors import ConfigError, StoreError
from s3ckpt.store.base import ObjectStore

__all__ = ["create_bucket"]


def create_bucket(store: ObjectStore) -> None:
    """Create ``store``'s bucket, in the region its client signs for (us-east-1 takes no
    location constraint). A retry that finds the bucket already ours (the first attempt
    created it and its reply was lost) is a success.

    Raises:
        ConfigError: ``store`` is not an S3 store.
        StoreError: the store refused (a name another account owns, no permission, ...).
    """
    from s3ckpt.store.s3 import S3Store

    if not isinstance(store, S3Store):
        raise ConfigError(f"only an S3 store creates buckets, not {store!r}")
    client = store.client
    region = client.meta.region_name or "us-east-1"
    args: dict[str, Any] = {"Bucket": store.bucket}
    if region != "us-east-1":
        args["CreateBucketConfiguration"] = {"LocationConstraint": region}
    try:
        store._call("create_bucket", None, lambda: client.create_bucket(**args))
    except StoreError as exc:
        if exc.code != "BucketAlreadyOwnedByYou":
            raise
