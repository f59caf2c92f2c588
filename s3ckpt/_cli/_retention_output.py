"""How the retention commands print (``ls``, ``prune``, ``gc``, ``rm``): their tables, lines
and notes on stdout, and what a damaged checkpoint does to the exit code.

Pure presentation of retention's values (:class:`~s3ckpt.retention.RunCatalog`,
:class:`~s3ckpt.retention.PruneResult`, :class:`~s3ckpt.retention.GcResult`,
:class:`~s3ckpt.retention.DeleteResult`); the commands (:mod:`s3ckpt._cli.retention`) decide
nothing here. Times print in UTC to the minute, sizes as :func:`s3ckpt._units.format_bytes`.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from s3ckpt._cli._output import print_table, printable, state_label
from s3ckpt._units import format_bytes, plural
from s3ckpt.retention import CheckpointInfo, GcResult, PruneResult
from s3ckpt.retention._catalog import RunCatalog
from s3ckpt.retention._results import DeleteResult
from s3ckpt.store._versions import Versions
from s3ckpt.store.base import DeleteFailure
from s3ckpt.uri import StoreURL

__all__ = [
    "class_label",
    "ls_json",
    "print_gc",
    "print_ls",
    "print_prune",
    "print_rm",
    "versions_json",
]


def when(t: datetime | None) -> str:
    """A time as ``2025-03-01 12:00Z`` (``-`` for none)."""
    return "-" if t is None else t.astimezone(UTC).strftime("%Y-%m-%d %H:%MZ")


def metric_values(m: Mapping[str, float]) -> str:
    """``ls``'s METRICS column: ``name=value`` pairs (``-`` for none)."""
    return " ".join(f"{k}={v:.4g}" if math.isfinite(v) else f"{k}={v}" for k, v in m.items()) or "-"


def columns(c: CheckpointInfo) -> list[str]:
    """NAME, STEP, STATE, COMMITTED and SIZE: the columns ls and prune share."""
    state = "failed" if c.failed else state_label(c)  # abandoned, by a save that said so
    step = "-" if c.step is None else str(c.step)
    return [c.name, step, state, when(c.committed_at), format_bytes(c.size)]


def print_failures(failures: Iterable[DeleteFailure]) -> None:
    """One ``FAILED key: code: message`` line per failure."""
    for f in failures:
        print(f"  FAILED {f.key}: {f.code}: {f.message}")


def saves(c: CheckpointInfo) -> str:
    """``ls``'s line about saves in progress or failed in one checkpoint prefix, or ""."""
    if c.damaged:
        return ""  # its committed save is unknown: its warning on stderr says the rest
    failed = c.failed_at and (
        f"a save failed at {when(c.failed_at)}: {printable(c.failure or '?')} "
        "(s3ckpt gc removes what it left)"
    )
    if not c.live_saves and not (c.uploads and not c.is_committed):
        return failed or ""
    what = f"{plural(c.live_saves, 'save')} in progress" if c.live_saves else "no live save"
    if c.overwrite_in_progress:
        what = f"overwrite in progress ({what})"
    extra = [plural(len(c.uploads), "open upload")] if c.uploads else []
    extra += [] if c.num_objects else ["no objects yet"]
    return ", ".join([what, *extra]) + (f"; {failed}" if failed else "")


MIXED_SHARE = 0.02
"""Bytes outside a checkpoint's data class above this share make ``ls`` say ``mixed``."""


def class_label(c: CheckpointInfo) -> str:
    """``ls``'s CLASS column: the storage class of a checkpoint's data (``STANDARD``,
    ``GLACIER_IR`` ...), ``mixed`` when its bytes are split (a transition in progress), or
    ``-`` when the listing gave no classes. A tier leaves the commit marker and the
    per-save ``.metadata.{tag}`` in STANDARD by design, so STANDARD bytes up to
    :data:`MIXED_SHARE` of the size do not make a moved checkpoint ``mixed``."""
    by = {k: v for k, v in c.bytes_by_class.items() if v}
    other = [k for k in by if k != "STANDARD"]
    if len(other) > 1 or (other and by.get("STANDARD", 0) > MIXED_SHARE * max(c.size, 1)):
        return "mixed"
    return other[0] if other else "STANDARD" if by else "-"


def print_transitions(result: PruneResult) -> None:
    """The plan's storage-tier transitions: one line each (classes, objects, bytes, why)."""
    if result.plan.transitions:
        print("  transitions:")
    for t in result.plan.transitions:
        src = ", ".join(f"{k} {format_bytes(v)}" for k, v in sorted(t.from_classes.items()))
        what = f"{plural(t.objects or 0, 'object')}, {format_bytes(t.bytes or 0)}"
        if t.skipped is not None:
            line = t.skipped
        elif not t.objects:
            line = f"already in {t.storage_class}"
        else:
            verb = "tag for" if t.method == "tag" else "->"
            line = f"{src or '-'} {verb} {t.storage_class} ({what})"
        print(f"    {t.name}: tier {t.tier}: {line}: {'; '.join(t.reasons)}")


_LS_HEAD = ["NAME", "STEP", "STATE", "COMMITTED", "SIZE", "CLASS", "OBJECTS", "METRICS", "PINNED"]


def print_ls(root: StoreURL, catalogs: Sequence[RunCatalog], versions: Versions) -> None:
    """``ls``: each run's line and table of checkpoints, and its saves in progress; a
    damaged checkpoint (its marker unreadable, or ``s3ckpt check`` found it damaged: the
    catalog's :attr:`~s3ckpt.retention.CheckpointInfo.damaged`) shows as ``damaged``;
    the bytes a versioned bucket keeps as noncurrent versions (``versions``) under each run."""
    if not catalogs:
        print(f"no checkpoints under {root}")
        return
    for i, cat in enumerate(catalogs):
        if i:
            print()
        ck = cat.checkpoints
        committed, total = sum(c.is_committed for c in ck), format_bytes(sum(c.size for c in ck))
        print(f"{cat.run}  ({plural(len(ck), 'checkpoint')}, {committed} committed, {total})")
        if versions.counted:
            _versions_line(versions, cat.run)
        if not ck:
            continue
        rows = [_LS_HEAD]
        for c in ck:
            extra = [class_label(c), str(c.num_objects), metric_values(c.metrics), c.pinned or "-"]
            rows.append([*columns(c), *extra])
        print_table(rows, right=(1, 4, 6), indent="  ")
        for c in ck:
            if line := saves(c):
                print(f"  {c.name}: {line}")
            if c.check is not None:  # what s3ckpt check found
                when_, why = printable(c.check.checked_at), printable(c.check.reason)
                print(f"  {c.name}: damaged (s3ckpt check at {when_}: {why})")
    if not versions.counted and versions.sentence():
        print(versions.sentence())  # once: the same for every run


def _versions_line(versions: Versions, run: StoreURL) -> None:
    """What a versioned bucket keeps under ``run`` as noncurrent versions, or why it could
    not be counted (nothing where nothing stays behind)."""
    if line := versions.sentence(run.prefix):
        print(f"  {line}")


def versions_json(versions: Versions, run: StoreURL) -> dict[str, Any]:
    """A run's noncurrent-version fields (:meth:`~s3ckpt.store.Versions.to_dict`)."""
    return versions.to_dict(run.prefix)


def ls_json(root: StoreURL, catalogs: Sequence[RunCatalog], versions: Versions) -> dict[str, Any]:
    """``ls --json``'s document: each checkpoint's record (a damaged one has ``"damaged":
    true``, ``"life": "damaged"``, ``"damage"`` and, when ``s3ckpt check`` found it,
    ``"check"``: the check's entry with its problems); each run its noncurrent-version
    fields (``versions``: ``noncurrent_bytes`` ...)."""

    return {
        "root": str(root),
        "runs": [
            {
                "run": str(cat.run),
                **versions_json(versions, cat.run),
                "checkpoints": [c.to_dict() for c in cat.checkpoints],
            }
            for cat in catalogs
        ],
    }


def print_prune(result: PruneResult, versions: Versions) -> None:
    """One run's plan (and with ``--apply`` what was deleted), as a table; what a versioned
    bucket keeps of it as noncurrent versions (``versions``)."""
    p = result.plan
    print(f"{result.run}  policy: {p.policy}")
    if p.decisions:
        rows = [["NAME", "STEP", "STATE", "COMMITTED", "SIZE", "ACTION", "REASONS"]]
        rows += [[*columns(d.checkpoint), d.action, "; ".join(d.reasons)] for d in p.decisions]
        print_table(rows, right=(1, 4), indent="  ")
    freed = f"{format_bytes(p.bytes_freed)}, {plural(p.objects_deleted, 'object')}"
    counts = f"keep {len(p.keep)}, skip {len(p.skipped)}"
    deferred = f", {p.deferred} deferred by --max-delete" if p.deferred else ""
    for note in result.notes:
        print(f"  note: {note}")
    print_transitions(result)
    move = f"{plural(p.objects_to_move, 'object')}, {format_bytes(p.bytes_to_move)}"
    if not result.applied:
        print(
            f"  dry run: would delete {len(p.delete)} ({freed}), {counts}{deferred}; "
            "pass --apply to delete"
            + (f"; would move {move} to their tiers' classes" if p.transitions else "")
        )
        _versions_line(versions, result.run)
        return
    names, objects = result.resumed, p.objects_deleted + result.resumed_objects
    freed = f"{format_bytes(p.bytes_freed + result.resumed_bytes)}, {plural(objects, 'object')}"
    resumed = f"; {len(names)} of them finished for an interrupted prune ({', '.join(names)})"
    print(
        f"  deleted {len(result.deleted)} of {result.targets} ({freed}) in "
        f"{plural(result.delete_requests, 'DeleteObjects request')}, {counts}{deferred}"
        + (resumed if names else "")
    )
    _versions_line(versions, result.run)
    print_failures(result.failures)
    if p.transitions or result.resumed_moves:
        n = len(result.resumed_moves)
        resumed = f" ({n} for an interrupted prune)" if n else ""
        print(
            f"  moved {plural(len(result.transitioned), 'checkpoint')}{resumed}: "
            f"{plural(result.objects_moved, 'object')}, {format_bytes(result.bytes_moved)} in "
            f"{plural(result.transition_requests, 'request')}"
        )
        print_failures(result.transition_failures)


def print_gc(r: GcResult) -> None:
    """What gc found under its prefix and (with ``--apply``) did."""
    done = r.applied
    print(
        f"{r.root}  open uploads of dead saves older than the cutoff: {len(r.uploads)} "
        + (f"(aborted {r.aborted})" if done else "(would abort)")
    )
    for u in r.uploads:
        print(f"  upload {u.key} ({u.upload_id[:16]}...)")
    if done:
        state = f"removed {len(r.removed)}"
        if r.skipped:
            state += f", skipped {len(r.skipped)}: lease held by another pruner"
        if (rest := len(r.abandoned) - len(r.removed) - len(r.skipped)) > 0:
            state += f", {rest} not (fully) removed"
    else:
        state = "would remove"
    print(f"abandoned saves: {len(r.abandoned)} ({state})")
    marks = {**dict.fromkeys(r.skipped, "  SKIPPED"), **dict.fromkeys(r.removed, "  removed")}
    for c in r.abandoned:
        mark = marks.get(str(c.url), "  LEFT") if done else ""
        print(
            f"  {c.url}  {format_bytes(c.size)}, {plural(c.num_objects, 'object')}, "
            f"last activity {when(c.last_activity)}{mark}"
        )
    sections = (
        ("leftovers of dead saves in live or committed prefixes", r.leftovers, "", "delete"),
        ("committed checkpoints missing a current .metadata", r.stale_metadata, "", "restore"),
        ("interrupted prunes", r.resumed, " checkpoints", "finish"),
    )
    did = {"delete": f"deleted {r.leftovers_deleted}", "restore": f"restored {len(r.restored)}"}
    for title, items, unit, verb in sections:
        if items:
            state = did.get(verb, "finished") if done else f"would {verb}"
            print(f"{title}: {len(items)}{unit} ({state})")
            for item in items:
                print(f"  {item}")
    for run in r.busy_runs:
        print(f"  skipped {run}: another pruner holds its lease", file=sys.stderr)
    print_failures(r.failures)
    for note in r.notes:
        print(f"note: {note}")
    if not done and (r.uploads or r.abandoned or r.leftovers or r.stale_metadata or r.resumed):
        print("dry run: pass --apply to abort, delete and restore")


def print_rm(r: DeleteResult) -> None:
    """One checkpoint's deletion (or, with ``--dry-run``, what would go)."""
    step = "" if r.step is None else f"step {r.step}, "
    what = f"{step}{r.state.value}, {plural(len(r.keys), 'key')}, {format_bytes(r.size)}"
    if not r.applied:
        print(f"would delete {r.checkpoint} ({what}); without --dry-run it is deleted")
    elif r.deleted:
        requests = plural(r.delete_requests, "DeleteObjects request")
        print(f"deleted {r.checkpoint} ({what}) in {requests}")
    else:
        print(
            f"NOT deleted {r.checkpoint} ({what}): {plural(len(r.failures), 'failure')}; its name "
            "stays in the run's lease, and the next prune, gc or rm finishes it"
        )
    if r.kept:
        print(f"  kept {plural(len(r.kept), 'object')} s3ckpt did not write:")
    for key in r.kept:
        print(f"    {key[len(r.checkpoint.prefix) :]}")
    if r.resumed:
        print(f"  also finished for an interrupted prune: {', '.join(r.resumed)}")
    print_failures(r.failures)
    for note in r.notes:
        print(f"  note: {note}")
