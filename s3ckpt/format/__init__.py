"""The format on the bucket: the commit marker ``s3ckpt.json`` and every name s3ckpt writes.

A checkpoint is a prefix holding torch's DCP layout (``__{rank}_{i}.<tag>.distcp`` data
objects and the pickled ``.metadata``) plus the marker, written last with a conditional
PUT. A prefix is *committed* iff the marker exists. The marker names the metadata object it
commits and its CRC32C, lists every data object with its size, and records a CRC32C for
every item, so a reader can verify every byte without trusting anything else.

This face re-exports the names of its modules, one concept each:

- ``_names.py``: the names on the bucket (per-save names and their tag, the run's control
  objects, :func:`checkpoint_name`), the table of them, and :func:`owned_tag`;
- ``_hashed.py``: :class:`HashedPrefixes` (opt-in data placement in the run's shard folder
  :data:`SHARDS_DIR`), shard names, :func:`shard_owner`, the prefix checks;
- ``_manifest.py``: :class:`Manifest` and its records, canonical JSON and its digest;
- ``_metrics.py``, ``_values.py``: metric values; checks on every value a marker carries;
- ``_framing.py``: the zip-framing check around a tensor's bytes;
- ``_timing.py``: the heartbeat interval and the shortest grace retention accepts.

Steps read from checkpoint names (``step-4``, ``epoch=0-step=4.ckpt``, a run's own pattern)
are ``s3ckpt._step_names``, not part of the format.

This package needs neither torch nor boto3 (the retention cron imports it).
"""

from __future__ import annotations

from s3ckpt.format._framing import FRAMING_HEAD, FRAMING_TAIL, tensor_framing_error
from s3ckpt.format._hashed import (
    SHARD_SUFFIX,
    SHARDS_DIR,
    HashedPrefixes,
    ShardOwner,
    check_checkpoint_prefix,
    check_prefix_strategy,
    in_shard_tree,
    object_key,
    shard_name,
    shard_owner,
    shard_tag,
)
from s3ckpt.format._manifest import (
    FORMAT_NAME,
    FORMAT_VERSION,
    LAYOUT_FORMAT_VERSION,
    MAX_FORMAT_VERSION,
    MAX_MANIFEST_BYTES,
    ItemRecord,
    Manifest,
    ObjectRecord,
    manifest_digest,
)
from s3ckpt.format._metrics import check_metrics
from s3ckpt.format._names import (
    CHECK_NAME,
    FAILED_PREFIX,
    HEARTBEAT_PREFIX,
    LATEST_NAME,
    LEASE_NAME,
    MANIFEST_NAME,
    METADATA_NAME,
    PIN_NAME,
    checkpoint_name,
    data_name,
    failure_name,
    heartbeat_name,
    metadata_name,
    owned_tag,
    save_tag,
)
from s3ckpt.format._timing import HEARTBEAT_INTERVAL, MIN_GRACE_SECONDS
from s3ckpt.format._values import MAX_INT

__all__ = [
    # names on the bucket
    "CHECK_NAME",
    "FAILED_PREFIX",
    "HEARTBEAT_PREFIX",
    "LATEST_NAME",
    "LEASE_NAME",
    "MANIFEST_NAME",
    "METADATA_NAME",
    "PIN_NAME",
    "checkpoint_name",
    "data_name",
    "failure_name",
    "heartbeat_name",
    "metadata_name",
    "owned_tag",
    "save_tag",
    # the commit marker
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "LAYOUT_FORMAT_VERSION",
    "MAX_FORMAT_VERSION",
    "MAX_INT",
    "MAX_MANIFEST_BYTES",
    "ItemRecord",
    "Manifest",
    "ObjectRecord",
    "check_metrics",
    "manifest_digest",
    # hashed prefixes
    "SHARDS_DIR",
    "SHARD_SUFFIX",
    "HashedPrefixes",
    "ShardOwner",
    "check_checkpoint_prefix",
    "check_prefix_strategy",
    "in_shard_tree",
    "object_key",
    "shard_name",
    "shard_owner",
    "shard_tag",
    # zip framing; timing
    "FRAMING_HEAD",
    "FRAMING_TAIL",
    "tensor_framing_error",
    "HEARTBEAT_INTERVAL",
    "MIN_GRACE_SECONDS",
]
