"""Confirming a plan made from a shallow scan before anything is deleted.

A shallow catalog (:mod:`s3ckpt.retention._shallow`) knows a committed checkpoint from its
marker alone: its step and metrics exactly, but not its pin, an overwrite in progress, its
stray keys, nor its exact commit time (it has the marker's LastModified, which is never
earlier than the commit and later when ``attach_metrics`` rewrote the marker). So a
deletion never rests on the shallow view alone: :func:`confirm` takes the plan made from
it and

1. lists every checkpoint it would delete, deeply (its keys, pin, heartbeats, uploads,
   failure records, the commit time of its ``.metadata.{tag}``), as a deep scan would;
2. makes exact the commit times that other checkpoints' decisions depend on: the newest
   commit (``newest``'s "most recently committed" and ``KeepWithin``'s window: HEADs in
   order of the marker times, until no later marker remains; usually one), checkpoints that
   share a step (their order), and every one when a ``KeepCalendar`` rule is in the policy
   (its periods); one HEAD of ``.metadata.{tag}`` each;
3. plans again from that catalog and deletes only what both plans delete; anything the
   second plan would delete that the first did not is deferred to the next run.

Why this is enough: pins and overwrites only ever keep the checkpoint that has them
(:mod:`s3ckpt.retention._plan`); once the newest commit time is exact, a marker's
LastModified can only make a rule keep *more* (``KeepWithin``), and the step-based rules
(``KeepLast``, ``KeepEvery``, ``KeepBest``) read what the marker records exactly. A policy
with a rule outside that list is planned from a deep catalog of the run instead.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

from s3ckpt._time import utc
from s3ckpt.format._names import METADATA_NAME, in_shard_tree
from s3ckpt.retention._calendar import KeepCalendar
from s3ckpt.retention._catalog import CheckpointInfo
from s3ckpt.retention._deleter import direct_name
from s3ckpt.retention._options import RetentionOptions
from s3ckpt.retention._plan import Plan, decide, hold
from s3ckpt.retention._policy import KeepBest, KeepEvery, KeepLast, KeepPinned, KeepWithin, Policy
from s3ckpt.retention._scan import catalogs, run_catalog
from s3ckpt.store.base import ObjectStore
from s3ckpt.uri import StoreURL

__all__ = ["DEFERRED", "confirm", "deep"]

DEFERRED = "deferred: seen only by the shallow scan; re-checked on the next run"

_SAFE: tuple[type[Policy], ...] = (
    KeepLast,
    KeepEvery,
    KeepBest,
    KeepWithin,
    KeepPinned,
    KeepCalendar,
)


def confirm(
    store: ObjectStore, run: StoreURL, options: RetentionOptions, rules: Policy, first: Plan
) -> Plan:
    """The plan to carry out, from ``first`` (planned from a shallow catalog with
    ``rules``; planned again the same way). A plan that deletes nothing, or was made from a
    deep catalog, is returned as it is.

    Request cost: per checkpoint to delete, its deep listing (``ceil(keys / 1000)`` LISTs,
    one LIST of its uploads, one GET of its marker and one of its pin); one HEAD per commit
    time made exact (see the module docstring).
    """

    def replan(catalog: Sequence[CheckpointInfo]) -> Plan:
        return decide(catalog, rules, first.now, options, run, first.policy)

    catalog = [d.checkpoint for d in first.decisions]
    if not first.delete or not any(c.shallow for c in catalog):
        return first
    if not all(isinstance(r, _SAFE) for r in rules.rules()):
        cat = run_catalog(store, run, options)  # an unknown rule: all deep
        return replan(cat.checkpoints if cat is not None else [])
    listed = {c.name: deep(store, options, c) for c in first.delete if c.shallow}
    merged = [m for c in catalog if (m := listed.get(c.name, c)) is not None]
    exact = _exact_times(store, merged, any(isinstance(r, KeepCalendar) for r in rules.rules()))
    return hold(replan(exact), (DEFERRED,), {c.name for c in first.delete})


def deep(store: ObjectStore, options: RetentionOptions, c: CheckpointInfo) -> CheckpointInfo | None:
    """``c`` as a deep scan of its own prefix sees it (None: gone since). A root inside a
    checkpoint does not see the run's shard folder: the marker's shard keys are added; the
    run's check record was read by the first scan (its verdict is carried)."""
    for cat in catalogs(store, c.url, options, check_record=False):
        for found in cat.checkpoints:
            if found.name == c.name:
                shards = tuple(k for k in c.keys if in_shard_tree(k) and k not in found.keys)
                check = c.check if c.marker_etag == found.marker_etag else None
                return dataclasses.replace(
                    found, keys=found.keys + shards, size=max(found.size, c.size), check=check
                )
    return None


def _exact_times(
    store: ObjectStore, catalog: list[CheckpointInfo], every: bool
) -> list[CheckpointInfo]:
    """``catalog`` with the commit times that matter made exact (see the module docstring)."""
    out = {c.name: c for c in catalog}
    want = {c.name for c in catalog if c.shallow} if every else set()
    stepped = [c for c in catalog if c.is_committed and c.step is not None]
    steps = Counter(c.step for c in stepped)
    want |= {c.name for c in stepped if steps[c.step] > 1}
    for name in want:
        out[name] = _resolve(store, out[name])
    # The newest commit: a marker time is an upper bound, so stop at the first one below
    # the newest exact time found.
    timed = [c for c in out.values() if c.is_committed and not c.damaged and c.committed_at]
    timed.sort(key=lambda c: c.committed_at, reverse=True)  # type: ignore[arg-type,return-value]
    best = None
    for c in timed:  # fixed.committed_at is never None: c's is not, _resolve only refines it
        assert c.committed_at is not None
        if best is not None and c.committed_at < best:
            break
        out[c.name] = fixed = c if c.name in want else _resolve(store, c)
        best = max(filter(None, (best, fixed.committed_at)))
    return [out[c.name] for c in catalog]


def _resolve(store: ObjectStore, c: CheckpointInfo) -> CheckpointInfo:
    """``c`` with its commit time exact: the LastModified of its ``.metadata.{tag}`` (one
    HEAD), as a deep scan reads it from its listing; the marker's when it has none."""
    saved = [
        k for k in c.committed_keys if (direct_name(c, k) or "").startswith(METADATA_NAME + ".")
    ]
    if not c.shallow or c.committed_at is None or not saved:
        return c  # exact already, or format 1: the marker's own time is the commit time
    info = store.head(saved[0])  # None when missing (ObjectStore.head)
    if info is None or info.last_modified is None:
        return c
    return dataclasses.replace(c, committed_at=utc(info.last_modified))
