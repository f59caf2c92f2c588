"""``s3ckpt ls | prune | pin | unpin | gc | rm``: the retention commands (no torch needed).

``prune`` and ``gc`` are dry runs unless ``--apply`` is given; ``rm`` deletes (like ``rm``)
unless ``--dry-run`` is given, and refuses what could lose a checkpoint. Exit codes are those
of :mod:`s3ckpt._cli`: 0 done, 1 some deletes failed or a checkpoint is damaged (its marker
cannot be read: its own row, a warning on stderr, never deleted by prune or gc), 2 bad input
(or a refused ``rm``), 3 store error, 4 a run's lease is held by another pruner (the other
runs were still pruned).

``prune`` and ``gc`` take ``--metrics-file PATH``: the invocation's metrics for node_exporter's
textfile collector (:class:`s3ckpt.metrics.MetricsFile`), written atomically once the store
is open, even when the run fails (``s3ckpt_prune_success 0``); a usage error before any
request writes nothing.

PATH and CKPT are ``s3://`` URLs, other fsspec URLs or local paths. On a terminal, ``ls``,
``prune`` and ``gc`` count the objects they list, read and delete on stderr as they go
(:class:`~s3ckpt.store.CountingStore` wraps the store); ``--json`` and ``--no-progress`` turn
that off.

The commands hold no logic: each turns its flags into one
:class:`~s3ckpt.retention.RetentionOptions` and calls the library (``scan``, ``prune_runs``,
``gc``, ``delete_checkpoint``, ``pin``, ``unpin``); argument types live in
:mod:`s3ckpt._cli._args`, the printing in :mod:`s3ckpt._cli._retention_output`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from typing import Any

from s3ckpt._cli import (
    EXIT_BUSY,
    EXIT_OK,
    EXIT_PARTIAL,
    EXIT_USAGE,
    CommandError,
    error,
    exit_code_for,
    open_location,
)
from s3ckpt._cli._args import (
    add_lease_ttl,
    add_metrics_file,
    add_scan,
    add_step_pattern,
    counted,
    duration,
    iso_time,
    nonneg_int,
)
from s3ckpt._cli._damaged import warn_damaged
from s3ckpt._cli._output import ProgressCounter, add_output_options
from s3ckpt._cli._retention_output import (
    damaged_code,
    dump,
    ls_json,
    print_gc,
    print_ls,
    print_prune,
    print_rm,
    versions_json,
)
from s3ckpt._units import plural
from s3ckpt.errors import LeaseHeldError, S3CkptError
from s3ckpt.metrics import MetricsFile, capture
from s3ckpt.retention import (
    DEFAULT_GC_AGE,
    DEFAULT_GRACE,
    DEFAULT_LEASE_TTL,
    MIN_GRACE,
    PolicyFile,
    RetentionOptions,
    RunCatalog,
    delete_checkpoint,
    format_duration,
    gc,
    pin,
    prune_runs,
    scan,
    unpin,
)
from s3ckpt.store import Location, noncurrent_versions

__all__ = ["register"]


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add ls, prune, pin, unpin, gc and rm."""
    grace_help = (
        "a save is in progress (never deleted, its uploads never aborted) while any of its "
        "objects, heartbeats or open uploads is younger than this; prune and gc raise "
        f"it to at least {format_duration(MIN_GRACE)} (default {format_duration(DEFAULT_GRACE)})"
    )

    p = sub.add_parser(
        "ls",
        parents=[common],
        help="list the checkpoints of a run, or of every run under a prefix",
        description="List checkpoints with step, state, commit time, size, objects, metrics "
        "and pins. PATH is a run (s3://bucket/runs/llama/) or a prefix holding many runs.",
    )
    p.add_argument("path", metavar="PATH")
    add_output_options(p)
    p.add_argument("--grace", type=duration, default=DEFAULT_GRACE, help=grace_help)
    add_step_pattern(p)
    add_scan(p, "deep")
    p.set_defaults(func=_ls)

    p = sub.add_parser(
        "prune",
        parents=[common],
        help="plan (default) or apply a retention policy to a run or to every run under a prefix",
        description="Plan which checkpoints a policy keeps, with the reasons, and the bytes "
        "freed. A dry run unless --apply is given.",
    )
    p.add_argument("path", metavar="PATH")
    p.add_argument(
        "--policy",
        required=True,
        metavar="POLICY",
        help="a policy TOML file, or the name of a ready-made one (e.g. pretraining)",
    )
    p.add_argument("--apply", action="store_true", help="delete (default: dry run)")
    add_scan(p, "shallow")  # the cron: markers, not every key (docs/scale.md)
    add_output_options(p)
    p.add_argument(
        "--max-delete",
        type=nonneg_int,
        default=None,
        metavar="N",
        help="delete at most N checkpoints per run (the oldest first)",
    )
    p.add_argument("--grace", type=duration, default=DEFAULT_GRACE, help=grace_help)
    p.add_argument(
        "--include-foreign",
        action="store_true",
        help="treat stock-DCP checkpoints (.metadata but no s3ckpt.json) as committed",
    )
    add_lease_ttl(p)
    p.add_argument(
        "--now",
        type=iso_time,
        default=None,
        metavar="TIME",
        help="plan as of this ISO time (what-if dry runs; default: now)",
    )
    add_step_pattern(p, " (default: the policy file's step_pattern)")
    add_metrics_file(p, "prune")
    p.set_defaults(func=_prune)

    p = sub.add_parser(
        "pin",
        parents=[common],
        help="pin a checkpoint so that no policy deletes it",
    )
    p.add_argument("checkpoint", metavar="CKPT")
    p.add_argument("--reason", required=True, help="why it is pinned (shown by ls and prune)")
    add_output_options(p, progress=False)
    p.set_defaults(func=_pin)

    p = sub.add_parser("unpin", parents=[common], help="remove a checkpoint's pin")
    p.add_argument("checkpoint", metavar="CKPT")
    add_output_options(p, progress=False)
    p.set_defaults(func=_unpin)

    p = sub.add_parser(
        "gc",
        parents=[common],
        help="reclaim what dead saves left: their uploads, objects and heartbeats; restore "
        "missing .metadata copies (dry run by default)",
        description="Deletes only names s3ckpt wrote (__R_I.TAG.distcp, .metadata.TAG, "
        "s3ckpt.alive.TAG.R) of saves that are dead: no object, heartbeat or upload of their "
        "tag younger than --grace. Never a commit marker's objects, a plain .metadata, stock "
        "DCP files or foreign files. Also finishes deletions a killed prune recorded in its "
        "lease, and rewrites a committed checkpoint's missing or stale plain .metadata.",
    )
    p.add_argument("path", metavar="PATH")
    p.add_argument(
        "--older-than",
        type=duration,
        default=DEFAULT_GC_AGE,
        metavar="DURATION",
        help="an extra margin: abort an open upload of a dead save (see --grace) only once "
        "it started this long ago; an upload of a live save is never aborted, however old "
        f"(default {format_duration(DEFAULT_GC_AGE)}: a dead save's uploads go at once)",
    )
    p.add_argument("--grace", type=duration, default=DEFAULT_GRACE, help=grace_help)
    p.add_argument("--apply", action="store_true", help="abort and delete (default: dry run)")
    add_output_options(p)
    p.add_argument("--lease-ttl", type=duration, default=DEFAULT_LEASE_TTL, help=argparse.SUPPRESS)
    add_metrics_file(p, "gc")
    p.set_defaults(func=_gc)

    p = sub.add_parser(
        "rm",
        parents=[common],
        help="delete checkpoints safely (marker first, only what s3ckpt wrote); refuses a "
        "pinned, in-progress or newest one",
        description="Delete each CKPT under its run's lease: the commit marker first, then the "
        ".metadata and the data s3ckpt wrote (files it did not write stay). Refuses, with exit "
        "2 and nothing deleted, a pinned checkpoint, a save in progress, a dead save's "
        "leftovers (s3ckpt gc removes those), a stock-DCP checkpoint without "
        "--include-foreign, and the run's newest committed checkpoint without --allow-newest. "
        "Deletes unless --dry-run is given. With several CKPTs every one is tried; the exit "
        "code is the first failure's.",
    )
    p.add_argument(
        "checkpoints",
        nargs="+",
        metavar="CKPT",
        help="a checkpoint: an s3:// (or other fsspec) URL or a local folder, e.g. "
        "s3://bucket/runs/llama/step-400",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="check and list what would go; change nothing"
    )
    p.add_argument(
        "--allow-newest",
        action="store_true",
        help="also delete the run's newest committed checkpoint (the one a resume loads)",
    )
    p.add_argument(
        "--include-foreign",
        action="store_true",
        help="delete a stock-DCP checkpoint (.metadata but no s3ckpt.json): its .metadata and "
        "__R_I.distcp only",
    )
    add_output_options(p, progress=False)
    p.add_argument("--grace", type=duration, default=DEFAULT_GRACE, help=grace_help)
    add_lease_ttl(p)
    add_step_pattern(p, " (tells which checkpoint is the newest)")
    p.set_defaults(func=_rm)


def _open(args: argparse.Namespace, target: str) -> Location:
    """PATH or CKPT opened once (a local path must be a folder); the one place the
    commands open a location."""
    return open_location(args, target, folder=True)


def _warn(notes: Iterable[str], counter: ProgressCounter) -> None:
    """Notes about the whole command (this host's clock far from the store's) on stderr."""
    for note in notes:
        counter.clear()
        print(f"s3ckpt: warning: {note}", file=sys.stderr)


def _write_metrics(report: MetricsFile, *, success: bool) -> bool:
    """Write ``--metrics-file``; on failure say why on stderr and return False (what the
    command did stands: its own output and exit code still tell it)."""
    try:
        report.write(success=success)
    except OSError as exc:
        print(
            f"s3ckpt {report.command}: cannot write the metrics file {report.path}: "
            f"{exc.strerror or exc}",
            file=sys.stderr,
        )
        return False
    return True


# -- ls ----------------------------------------------------------------------------------------
def _ls(args: argparse.Namespace) -> int:
    location, counter = counted(args, _open(args, args.path), "ls")
    options = RetentionOptions(grace=args.grace, step_pattern=args.step_pattern, scan=args.scan)
    try:
        # The store's time; this host's clock is judged against the grace period prune and
        # gc would use (its floor), and only warned about.
        judged, notes = RetentionOptions(grace=max(args.grace, MIN_GRACE)).resolve(location)
        _warn(notes, counter)
        # The catalog: each checkpoint's state, what s3ckpt check found included.
        catalogs = scan(location, options=options.replace(now=judged.now))
        _warn(check_notes(catalogs), counter)
        # What a versioned bucket keeps as noncurrent versions under each run.
        versions = noncurrent_versions(location.store, [cat.run.prefix for cat in catalogs])
    finally:
        counter.close()
    checkpoints = [c for cat in catalogs for c in cat.checkpoints]
    if args.json:
        dump(ls_json(location.url, catalogs, versions))
    else:
        print_ls(location.url, catalogs, versions)
        sys.stdout.flush()  # the table before the warnings on stderr
    return damaged_code("ls", checkpoints)


def check_notes(catalogs: Iterable[RunCatalog]) -> list[str]:
    """A note per run whose ``s3ckpt.check.json`` could not be read: what a check found
    there is unknown."""
    return [cat.check_error for cat in catalogs if cat.check_error is not None]


# -- prune -------------------------------------------------------------------------------------
def _prune(args: argparse.Namespace) -> int:
    source = PolicyFile.load(args.policy)  # bad file -> PolicyError -> exit 2, no request
    options = RetentionOptions(
        grace=args.grace,
        now=args.now,
        step_pattern=args.step_pattern,
        include_foreign=args.include_foreign,
        max_delete=args.max_delete,
        lease_ttl=args.lease_ttl,
        scan=args.scan,
    )
    location, counter = counted(args, _open(args, args.path), "prune")
    report = (
        MetricsFile(args.metrics_file, "prune", dry_run=not args.apply)
        if args.metrics_file
        else None
    )
    try:
        code = _prune_runs(args, source, options, location, counter, report)
    except BaseException:
        if report is not None:
            _write_metrics(report, success=False)
        raise
    finally:
        counter.close()
    if report is not None and not _write_metrics(report, success=code == EXIT_OK):
        # Pruned, but the monitoring it was asked for is missing (--json printed the
        # runs' code already; stderr says why this one differs).
        code = EXIT_USAGE if code == EXIT_OK else code
    return code


def _prune_runs(
    args: argparse.Namespace,
    source: PolicyFile,
    options: RetentionOptions,
    location: Location,
    counter: ProgressCounter,
    report: MetricsFile | None,
) -> int:
    runs = prune_runs(location, source, apply=args.apply, options=options)
    _warn(runs.notes, counter)
    code = EXIT_OK
    docs: list[dict[str, Any]] = []
    if not runs.runs and not args.json:
        print(f"no runs under {location.url}")
    for i, outcome in enumerate(runs):
        if report is not None:
            report.add(outcome.run_metrics())
        if outcome.result is None:
            code = EXIT_BUSY if code == EXIT_OK else code
            docs.append({"run": str(outcome.run), "busy": str(outcome.busy)})
            if not args.json:
                counter.clear()
                print(f"{outcome.run}  skipped: {outcome.busy}", file=sys.stderr)
            continue
        result = outcome.result
        counter.add(f"of {plural(len(runs.runs), 'run')} done")
        if not result.ok:
            code = EXIT_PARTIAL
        if warn_damaged("prune", (d.checkpoint for d in result.plan.decisions)):
            code = EXIT_PARTIAL  # listed and skipped, the rest pruned: done in part
        # What the deletes left as noncurrent versions (a versioned bucket keeps the bytes).
        versions = noncurrent_versions(location.store, [result.run.prefix])
        docs.append({**result.to_dict(), **versions_json(versions, result.run)})
        if not args.json:
            counter.clear()
            if i:
                print()
            print_prune(result, versions)
            sys.stdout.flush()  # before the progress line is drawn again on stderr
    if args.json:
        dump({"root": str(location.url), "applied": args.apply, "exit_code": code, "runs": docs})
    return code


# -- pin / unpin -------------------------------------------------------------------------------
def _pin(args: argparse.Namespace) -> int:
    location = _open(args, args.checkpoint)
    ckpt = location.url
    pin(location.store, ckpt, args.reason)  # nothing there, or a run: exit 2 (exit_code_for)
    reason = args.reason.strip()
    if args.json:
        dump({"checkpoint": str(ckpt), "pinned": True, "reason": reason})
    else:
        print(f"pinned {ckpt}: {reason}")
    return EXIT_OK


def _unpin(args: argparse.Namespace) -> int:
    location = _open(args, args.checkpoint)
    ckpt = location.url
    was_pinned = unpin(location.store, ckpt)
    if args.json:
        dump({"checkpoint": str(ckpt), "pinned": False, "was_pinned": was_pinned})
    elif was_pinned:
        print(f"unpinned {ckpt}")
    else:
        print(f"{ckpt} was not pinned")
    return EXIT_OK


# -- gc ----------------------------------------------------------------------------------------
def _gc(args: argparse.Namespace) -> int:
    location, counter = counted(args, _open(args, args.path), "gc")
    report = (
        MetricsFile(args.metrics_file, "gc", dry_run=not args.apply) if args.metrics_file else None
    )
    options = RetentionOptions(grace=args.grace, lease_ttl=args.lease_ttl)
    try:
        with capture() as events:
            result = gc(location, older_than=args.older_than, apply=args.apply, options=options)
    except BaseException:
        if report is not None:
            _write_metrics(report, success=False)  # failed: success 0, no per-prefix values
        raise
    finally:
        counter.close()
    code = EXIT_PARTIAL if result.failures else EXIT_BUSY if result.busy_runs else EXIT_OK
    if warn_damaged("gc", result.damaged):
        code = EXIT_PARTIAL  # nothing of theirs deleted, the rest collected: done in part
    if report is not None:
        report.add(result.run_metrics(events))
        if not _write_metrics(report, success=code == EXIT_OK) and code == EXIT_OK:
            code = EXIT_USAGE  # collected, but the monitoring it was asked for is missing
    if args.json:
        dump({**result.to_dict(), "exit_code": code})
    else:
        print_gc(result)
    return code


# -- rm ----------------------------------------------------------------------------------------
def _rm(args: argparse.Namespace) -> int:
    code = EXIT_OK
    docs: list[dict[str, Any]] = []
    options = RetentionOptions(
        grace=args.grace,
        lease_ttl=args.lease_ttl,
        step_pattern=args.step_pattern,
        include_foreign=args.include_foreign,
    )
    for target in args.checkpoints:
        try:
            location = _open(args, target)
            result = delete_checkpoint(
                location, allow_newest=args.allow_newest, dry_run=args.dry_run, options=options
            )
        except (S3CkptError, CommandError) as exc:
            if isinstance(exc, LeaseHeldError):
                rc = EXIT_BUSY
            elif isinstance(exc, CommandError):
                rc = exc.code
            else:
                rc = exit_code_for(exc)
            code = code or rc
            docs.append({"checkpoint": target, "error": str(exc), "exit_code": rc})
            error(str(exc))
            continue
        rc = EXIT_OK if result.ok else EXIT_PARTIAL
        code = code or rc
        docs.append({**result.to_dict(), "exit_code": rc})
        if not args.json:
            print_rm(result)
            sys.stdout.flush()
    if args.json:
        dump({"dry_run": args.dry_run, "exit_code": code, "checkpoints": docs})
    return code
