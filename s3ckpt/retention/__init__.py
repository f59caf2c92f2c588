"""Retention: which checkpoints to keep, and deleting the rest safely.

Needs no torch (the retention cron image has none) and imports boto3 only through the
store a caller passes in. Layers, each a pure function of the one before::

    catalog  list_checkpoints / list_runs / scan     what is there (paged listing)
    policy   KeepLast | KeepEvery | KeepBest | ...   which to keep and why (pure)
    plan     plan(catalog, policy, now) -> Plan      decisions + invariants (pure)
    apply    prune / prune_runs / gc / pin / unpin   lease, ordered batched deletes,
                                                     storage-tier moves (Tier)
             delete_checkpoint                       one checkpoint, by request (s3ckpt rm)

A retention run's settings are one value, :class:`RetentionOptions` (grace, now, the step
pattern, limits); a policy file is its rules and the settings it names, a
:class:`PolicyFile`. Every entry point takes a :class:`~s3ckpt.store.Location` (or a URL)
first and its settings as ``options=``.

Modules: ``_catalog`` (the records and states), ``_liveness`` (grace, dead writers),
``_listing`` / ``_scan`` (the listing: ``scan``, ``probe_checkpoint``), ``_options`` (the
run's settings), ``_policy`` /
``_calendar`` / ``_toml`` / ``_duration`` (rules and policy files), ``_plan``, ``_lease``
(the run's lease), ``_intent`` (a dead pruner's intent log), ``_deleter`` (which keys may
go, batched deletes), ``_prune`` (one run), ``_runs`` (every run under a prefix),
``_abandoned`` (gc), ``_pins``, ``_delete_checkpoint`` (one checkpoint, by request),
``_tiers`` / ``_transition`` (storage tiers: the plan, then the copies) and ``_results``
(what prune, gc and delete_checkpoint report).

Example::

    from s3ckpt.retention import KeepBest, KeepLast, RetentionOptions, prune

    result = prune(
        "s3://bucket/runs/llama-8b/",
        KeepLast(3) | KeepBest(2, "val_loss"),
        apply=True,
        options=RetentionOptions(max_delete=10),
    )
    print(result.plan.keep, result.deleted, result.failures)

Layout conventions, states and invariants: see :mod:`s3ckpt.retention._scan`,
:mod:`s3ckpt.retention._catalog`, :mod:`s3ckpt.retention._plan` and ``docs/retention.md``.
"""

from __future__ import annotations

from s3ckpt.retention._abandoned import gc
from s3ckpt.retention._calendar import KeepCalendar
from s3ckpt.retention._catalog import CheckpointInfo
from s3ckpt.retention._delete_checkpoint import delete_checkpoint
from s3ckpt.retention._options import RetentionOptions
from s3ckpt.retention._pins import pin, unpin
from s3ckpt.retention._plan import plan
from s3ckpt.retention._policy import (
    AllOf,
    AnyOf,
    KeepBest,
    KeepEvery,
    KeepLast,
    KeepPinned,
    KeepWithin,
    Policy,
)
from s3ckpt.retention._prune import prune, prune_runs
from s3ckpt.retention._results import GcResult, PruneResult
from s3ckpt.retention._scan import list_checkpoints, list_runs
from s3ckpt.retention._tiers import Tier
from s3ckpt.retention._toml import PolicyFile, builtin_policies, load_policy, parse_policy
from s3ckpt.retention._transition import survey_plan

__all__ = [
    # rules and policy files
    "Policy",
    "KeepLast",
    "KeepEvery",
    "KeepBest",
    "KeepWithin",
    "KeepCalendar",
    "KeepPinned",
    "AllOf",
    "AnyOf",
    "Tier",
    "PolicyFile",
    "load_policy",
    "parse_policy",
    "builtin_policies",
    # a run's settings; what is there
    "RetentionOptions",
    "list_checkpoints",
    "list_runs",
    "CheckpointInfo",
    # deciding and applying
    "plan",
    "survey_plan",
    "prune",
    "prune_runs",
    "gc",
    "delete_checkpoint",
    "pin",
    "unpin",
    "PruneResult",
    "GcResult",
]
