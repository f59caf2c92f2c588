"""Retention: which checkpoints to keep, and deleting the rest safely.

Needs no torch (the retention cron image has none) and imports boto3 only through the
store a caller passes in. Layers, each a pure function of the one before::

    catalog  list_checkpoints / list_runs / scan     what is there (paged listing)
    policy   KeepLast | KeepEvery | KeepBest | ...   which to keep and why (pure)
    plan     plan(catalog, policy, now) -> Plan      decisions + invariants (pure)
    apply    prune / gc / pin / unpin                lease, ordered batched deletes

Example::

    from s3ckpt.retention import KeepBest, KeepLast, prune
    from s3ckpt.store import open_store

    store, run = open_store("s3://bucket/runs/llama-8b/")
    result = prune(store, run, KeepLast(3) | KeepBest(2, "val_loss"), apply=True)
    print(result.plan.keep, result.deleted, result.failures)

Layout conventions, states and invariants: see :mod:`s3ckpt.retention._catalog`,
:mod:`s3ckpt.retention._plan` and ``docs/retention.md``.
"""

from __future__ import annotations

from s3ckpt.errors import LeaseHeldError, LeaseLostError, PolicyError
from s3ckpt.retention._apply import (
    DEFAULT_GC_AGE,
    GcResult,
    ProgressCallback,
    PruneResult,
    gc,
    pin,
    prune,
    unpin,
)
from s3ckpt.retention._catalog import (
    DEFAULT_GRACE,
    LATEST_NAME,
    LEASE_NAME,
    MIN_GRACE,
    PIN_NAME,
    CheckpointInfo,
    CheckpointState,
    RunCatalog,
    list_checkpoints,
    list_runs,
    scan,
)
from s3ckpt.retention._duration import format_duration, parse_duration
from s3ckpt.retention._lease import DEFAULT_LEASE_TTL, Lease, LeaseRecord
from s3ckpt.retention._plan import Decision, Plan, check_policy, plan
from s3ckpt.retention._policy import (
    AllOf,
    AnyOf,
    KeepBest,
    KeepCalendar,
    KeepEvery,
    KeepLast,
    KeepPinned,
    KeepWithin,
    Policy,
)
from s3ckpt.retention._toml import load_policy, parse_policy

__all__ = [
    "DEFAULT_GC_AGE",
    "DEFAULT_GRACE",
    "DEFAULT_LEASE_TTL",
    "LATEST_NAME",
    "LEASE_NAME",
    "MIN_GRACE",
    "PIN_NAME",
    "AllOf",
    "AnyOf",
    "CheckpointInfo",
    "CheckpointState",
    "Decision",
    "GcResult",
    "KeepBest",
    "KeepCalendar",
    "KeepEvery",
    "KeepLast",
    "KeepPinned",
    "KeepWithin",
    "Lease",
    "LeaseHeldError",
    "LeaseLostError",
    "LeaseRecord",
    "Plan",
    "Policy",
    "PolicyError",
    "ProgressCallback",
    "PruneResult",
    "RunCatalog",
    "check_policy",
    "format_duration",
    "gc",
    "list_checkpoints",
    "list_runs",
    "load_policy",
    "parse_duration",
    "parse_policy",
    "pin",
    "plan",
    "prune",
    "scan",
    "unpin",
]
