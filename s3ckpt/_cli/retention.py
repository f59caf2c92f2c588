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
    Command,
    CommandError,
    error,
    exit_code_for,
)
from s3ckpt._cli import _retention_output as output
from s3ckpt._cli._args import STEP_PATTERN_HELP, add_options, commands, duration, retention_options
from s3ckpt._cli._output import ProgressCounter, add_output_options, print_json, warn_damaged
from s3ckpt._units import plural
from s3ckpt.errors import LeaseHeldError, S3CkptError
from s3ckpt.metrics import capture
from s3ckpt.retention import (
    PolicyFile,
    RetentionOptions,
    delete_checkpoint,
    gc,
    pin,
    prune_runs,
    unpin,
)
from s3ckpt.retention._abandoned import DEFAULT_GC_AGE
from s3ckpt.retention._duration import format_duration
from s3ckpt.retention._liveness import MIN_GRACE
from s3ckpt.retention._scan import scan
from s3ckpt.store._versions import noncurrent_versions

__all__ = ["register"]


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add ls, prune, pin, unpin, gc and rm."""
    add = commands(sub, common)
    p = add(
        "ls",
        _ls,
        "list the checkpoints of a run, or of every run under a prefix",
        "List checkpoints with step, state, commit time, size, objects, metrics and pins. PATH "
        "is a run (s3://bucket/runs/llama/) or a prefix holding many runs.",
    )
    p.add_argument("path", metavar="PATH")
    add_output_options(p)
    add_options(p, "--grace", "--step-pattern")
    add_options(p, "--scan", default="deep")

    p = add(
        "prune",
        _prune,
        "plan (default) or apply a retention policy to a run or to every run under a prefix",
        "Plan which checkpoints a policy keeps, with the reasons, and the bytes freed. A dry "
        "run unless --apply is given.",
    )
    p.add_argument("path", metavar="PATH")
    h = "a policy TOML file, or the name of a ready-made one (e.g. pretraining)"
    p.add_argument("--policy", required=True, metavar="POLICY", help=h)
    p.add_argument("--apply", action="store_true", help="delete (default: dry run)")
    add_options(p, "--scan", default="shallow")  # the cron: markers, not every key
    add_output_options(p)
    add_options(p, "--max-delete", help="delete at most N checkpoints per run (the oldest first)")
    add_options(p, "--grace")
    add_options(p, "--include-foreign", help=_FOREIGN_HELP)
    add_options(p, "--lease-ttl")
    add_options(p, "--now", help="plan as of this ISO time (what-if dry runs; default: now)")
    add_options(p, "--step-pattern", help=STEP_PATTERN_HELP + _POLICY_PATTERN)
    add_options(p, "--metrics-file")

    p = add("pin", _pin, "pin a checkpoint so that no policy deletes it")
    p.add_argument("checkpoint", metavar="CKPT")
    p.add_argument("--reason", required=True, help="why it is pinned (shown by ls and prune)")
    add_output_options(p, progress=False)

    p = add("unpin", _unpin, "remove a checkpoint's pin")
    p.add_argument("checkpoint", metavar="CKPT")
    add_output_options(p, progress=False)

    p = add(
        "gc",
        _gc,
        "reclaim what dead saves left: their uploads, objects and heartbeats; restore missing "
        ".metadata copies (dry run by default)",
        "Deletes only names s3ckpt wrote (__R_I.TAG.distcp, .metadata.TAG, s3ckpt.alive.TAG.R) "
        "of saves that are dead: no object, heartbeat or upload of their tag younger than "
        "--grace. Never a commit marker's objects, a plain .metadata, stock DCP files or "
        "foreign files. Also finishes deletions a killed prune recorded in its lease, and "
        "rewrites a committed checkpoint's missing or stale plain .metadata.",
    )
    p.add_argument("path", metavar="PATH")
    h = (
        "an extra margin: abort an open upload of a dead save (see --grace) only once it "
        "started this long ago; an upload of a live save is never aborted, however old "
        f"(default {format_duration(DEFAULT_GC_AGE)}: a dead save's uploads go at once)"
    )
    p.add_argument(
        "--older-than", type=duration, default=DEFAULT_GC_AGE, metavar="DURATION", help=h
    )
    add_options(p, "--grace")
    p.add_argument("--apply", action="store_true", help="abort and delete (default: dry run)")
    add_output_options(p)
    add_options(p, "--lease-ttl", help=argparse.SUPPRESS)
    add_options(p, "--metrics-file")

    p = add(
        "rm",
        _rm,
        "delete checkpoints safely (marker first, only what s3ckpt wrote); refuses a pinned, "
        "in-progress or newest one",
        "Delete each CKPT under its run's lease: the commit marker first, then the .metadata "
        "and the data s3ckpt wrote (files it did not write stay). Refuses, with exit 2 and "
        "nothing deleted, a pinned checkpoint, a save in progress, a dead save's leftovers "
        "(s3ckpt gc removes those), a stock-DCP checkpoint without --include-foreign, and the "
        "run's newest committed checkpoint without --allow-newest. Deletes unless --dry-run is "
        "given. With several CKPTs every one is tried; the exit code is the first failure's.",
    )
    h = (
        "a checkpoint: an s3:// (or other fsspec) URL or a local folder, e.g. "
        "s3://bucket/runs/llama/step-400"
    )
    p.add_argument("checkpoints", nargs="+", metavar="CKPT", help=h)
    h = "check and list what would go; change nothing"
    p.add_argument("--dry-run", action="store_true", help=h)
    h = "also delete the run's newest committed checkpoint (the one a resume loads)"
    p.add_argument("--allow-newest", action="store_true", help=h)
    h = (
        "delete a stock-DCP checkpoint (.metadata but no s3ckpt.json): its .metadata and "
        "__R_I.distcp only"
    )
    add_options(p, "--include-foreign", help=h)
    add_output_options(p, progress=False)
    add_options(p, "--grace", "--lease-ttl")
    add_options(
        p, "--step-pattern", help=STEP_PATTERN_HELP + " (tells which checkpoint is the newest)"
    )


_FOREIGN_HELP = "treat stock-DCP checkpoints (.metadata but no s3ckpt.json) as committed"
_POLICY_PATTERN = " (default: the policy file's step_pattern)"


def _warn(notes: Iterable[str], counter: ProgressCounter) -> None:
    """Notes about the whole command (this host's clock far from the store's) on stderr."""
    for note in notes:
        counter.clear()
        print(f"s3ckpt: warning: {note}", file=sys.stderr)


# -- ls ----------------------------------------------------------------------------------------
def _ls(args: argparse.Namespace) -> int:
    cmd = Command(args, args.path)
    with cmd.working():
        # The store's time; this host's clock is judged against the grace period prune and
        # gc would use (its floor), and only warned about.
        judged, notes = RetentionOptions(grace=max(args.grace, MIN_GRACE)).resolve(cmd.location)
        _warn(notes, cmd.counter)
        # The catalog: each checkpoint's state, what s3ckpt check found included; a note
        # per run whose s3ckpt.check.json could not be read (what a check found is unknown).
        catalogs = scan(cmd.location, options=retention_options(args).replace(now=judged.now))
        _warn((c.check_error for c in catalogs if c.check_error is not None), cmd.counter)
        # What a versioned bucket keeps as noncurrent versions under each run.
        versions = noncurrent_versions(cmd.location.store, [cat.run.prefix for cat in catalogs])
    if args.json:
        print_json(output.ls_json(cmd.location.url, catalogs, versions), strict=True)
    else:
        output.print_ls(cmd.location.url, catalogs, versions)
        sys.stdout.flush()  # the table before the warnings on stderr
    return cmd.finish(EXIT_OK, damaged=[c for cat in catalogs for c in cat.checkpoints])


# -- prune -------------------------------------------------------------------------------------
def _prune(args: argparse.Namespace) -> int:
    source = PolicyFile.load(args.policy)  # bad file -> PolicyError -> exit 2, no request
    options = retention_options(args)
    cmd = Command(args, args.path)
    code = EXIT_OK
    docs: list[dict[str, Any]] = []
    with cmd.working():
        runs = prune_runs(cmd.location, source, apply=args.apply, options=options)
        _warn(runs.notes, cmd.counter)
        if not runs.runs and not args.json:
            print(f"no runs under {cmd.location.url}")
        for i, outcome in enumerate(runs):
            if cmd.metrics is not None:
                cmd.metrics.add(outcome.run_metrics())  # type: ignore[union-attr]
            cmd.counter.clear()
            if outcome.result is None:
                code = code or EXIT_BUSY
                docs.append({"run": str(outcome.run), "busy": str(outcome.busy)})
                if not args.json:
                    print(f"{outcome.run}  skipped: {outcome.busy}", file=sys.stderr)
                continue
            result = outcome.result
            # A damaged checkpoint is listed and skipped, the rest pruned: done in part.
            damaged = warn_damaged("prune", (d.checkpoint for d in result.plan.decisions))
            if damaged or not result.ok:
                code = EXIT_PARTIAL
            # What the deletes left as noncurrent versions (a versioned bucket keeps the bytes).
            versions = noncurrent_versions(cmd.location.store, [result.run.prefix])
            docs.append({**result.to_dict(), **output.versions_json(versions, result.run)})
            if not args.json:
                cmd.counter.clear()
                if i:
                    print()
                output.print_prune(result, versions)
                sys.stdout.flush()  # before the progress line is drawn again on stderr
            cmd.counter.add(f"of {plural(len(runs.runs), 'run')} done")
        if args.json:
            doc = {"root": str(cmd.location.url), "applied": args.apply, "exit_code": code}
            print_json({**doc, "runs": docs}, strict=True)
    # Pruned, but a metrics file asked for and not written: exit 2 (--json printed the
    # runs' code already; stderr says why this one differs).
    return cmd.finish(code)


# -- pin / unpin -------------------------------------------------------------------------------
def _pin(args: argparse.Namespace) -> int:
    location = Command(args, args.checkpoint, counted=False).location
    pin(location.store, location.url, args.reason)  # nothing there, or a run: exit 2
    reason = args.reason.strip()
    if args.json:
        print_json({"checkpoint": str(location.url), "pinned": True, "reason": reason})
    else:
        print(f"pinned {location.url}: {reason}")
    return EXIT_OK


def _unpin(args: argparse.Namespace) -> int:
    location = Command(args, args.checkpoint, counted=False).location
    was_pinned, ckpt = unpin(location.store, location.url), location.url
    if args.json:
        print_json({"checkpoint": str(ckpt), "pinned": False, "was_pinned": was_pinned})
    else:
        print(f"unpinned {ckpt}" if was_pinned else f"{ckpt} was not pinned")
    return EXIT_OK


# -- gc ----------------------------------------------------------------------------------------
def _gc(args: argparse.Namespace) -> int:
    cmd = Command(args, args.path)
    options = retention_options(args)
    with cmd.working(), capture() as events:
        result = gc(cmd.location, older_than=args.older_than, apply=args.apply, options=options)
    code = EXIT_PARTIAL if result.failures else EXIT_BUSY if result.busy_runs else EXIT_OK
    if cmd.metrics is not None:
        cmd.metrics.add(result.run_metrics(events))  # type: ignore[union-attr]
    # A damaged checkpoint: nothing of its deleted, the rest collected: done in part.
    code = cmd.finish(code, damaged=result.damaged)
    if args.json:
        print_json({**result.to_dict(), "exit_code": code}, strict=True)
    else:
        output.print_gc(result)
    return code


# -- rm ----------------------------------------------------------------------------------------
def _rm(args: argparse.Namespace) -> int:
    code = EXIT_OK
    docs: list[dict[str, Any]] = []
    options = retention_options(args)
    for target in args.checkpoints:
        try:
            location = Command(args, target, counted=False).location
            result = delete_checkpoint(
                location, allow_newest=args.allow_newest, dry_run=args.dry_run, options=options
            )
        except (S3CkptError, CommandError) as exc:
            rc = EXIT_BUSY if isinstance(exc, LeaseHeldError) else exit_code_for(exc)
            docs.append({"checkpoint": target, "error": str(exc), "exit_code": rc})
            error(str(exc))
        else:
            rc = EXIT_OK if result.ok else EXIT_PARTIAL
            docs.append({**result.to_dict(), "exit_code": rc})
            if not args.json:
                output.print_rm(result)
                sys.stdout.flush()
        code = code or rc  # the first failure's
    if args.json:
        print_json({"dry_run": args.dry_run, "exit_code": code, "checkpoints": docs}, strict=True)
    return code
