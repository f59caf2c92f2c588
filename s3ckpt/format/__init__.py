"""The format on the bucket: the commit marker ``s3ckpt.json`` and every name s3ckpt writes.

A checkpoint is a prefix holding torch's DCP layout (``__{rank}_{i}.<tag>.distcp`` data
objects and the pickled ``.metadata``) plus the marker, written last with a conditional
PUT. A prefix is *committed* iff the marker exists. The marker names the metadata object it
commits and its CRC32C, lists every data object with its size, and records a CRC32C for
every item, so a reader can verify every byte without trusting anything else.

Its one public name is :class:`HashedPrefixes` (what a user constructs); everything else is
private to s3ckpt, in modules of one concept each:

- ``_names.py``: the names on the bucket (per-save names and their tag, the run's control
  objects, :func:`checkpoint_name`), the table of them, and :func:`owned_tag`; the
  heartbeat interval and the shortest grace retention accepts; checks on every value a
  marker carries;
- ``_hashed.py``: :class:`HashedPrefixes` (opt-in data placement in the run's shard folder
  :data:`SHARDS_DIR`), shard names, :func:`shard_owner`, the prefix checks;
- ``_manifest.py``: :class:`Manifest` and its records, canonical JSON and its digest; metric
  values; the zip-framing check around a tensor's bytes.

Steps read from checkpoint names (``step-4``, ``epoch=0-step=4.ckpt``, a run's own pattern)
are ``s3ckpt._step_names``, not part of the format.

This package needs neither torch nor boto3 (the retention cron imports it).
"""

from __future__ import annotations

from s3ckpt.format._names import HashedPrefixes

__all__ = ["HashedPrefixes"]
