"""The format's clock: how often a writing rank proves it is alive, and the shortest grace
retention accepts before it takes a save for dead."""

from __future__ import annotations

__all__ = ["HEARTBEAT_INTERVAL", "MIN_GRACE_SECONDS"]

HEARTBEAT_INTERVAL = 15.0
"""Seconds between a writing rank's heartbeats (``s3ckpt.alive.{tag}.{rank}``)."""
MIN_GRACE_SECONDS = 4 * HEARTBEAT_INTERVAL
"""The shortest grace period prune and gc accept: four missed heartbeats. A shorter one
could take a live save (one rank uploading a single large object) for a dead one."""
