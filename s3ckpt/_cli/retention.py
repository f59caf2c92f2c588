"""``s3ckpt ls | prune | pin | unpin | gc | rm``: the retention commands (no torch needed).

``prune`` and ``gc`` are dry runs unless ``--apply`` is given; ``rm`` deletes (like ``rm``)
unless ``--dry-run`` is given, and refuses what could lose a checkpoint. Exit codes are those
of :mod:`s3ckpt._cli`: 0 done, 1 some deletes failed or a checkpoint is damaged (its marker
cannot be read: its own row, a warning on stderr, never deleted by prune or gc), 2 bad input
(or a refused ``rm``), 3 store error, 4 a run's lease is held by another pruner (the other
runs were still pruned).

``prune`` and ``gc`` take ``--metrics-file PATH``: the invocation's metrics for node_exporter's
textfile collector (:func:`s3ckpt.metrics.write_textfile`), written atomically once the store
is open, even when the run fails (``s3ckpt_prune_success 0``); a usage error before any
request writes nothing.

PATH and CKPT are ``s3://`` URLs, other fsspec URLs or local paths. On a terminal, ``ls``,
``prune`` and ``gc`` count the objects they list, read and delete on stderr as they go
(:class:`_Counted` wraps the store); ``--json`` and ``--no-progress`` turn that off.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from s3ckpt._cli import (
    EXIT_BUSY,
    EXIT_OK,
    EXIT_PARTIAL,
    EXIT_USAGE,
    CommandError,
    error,
    exit_code_for,
    s3_config_from_args,
    transfer_config_from_args,
)
from s3ckpt._cli._damaged import printable, state_label, warn_damaged
from s3ckpt._cli._output import (
    ProgressCounter,
    add_output_options,
    print_json,
    print_table,
    progress_enabled,
)
from s3ckpt._time import aware_now, parse_iso
from s3ckpt._units import format_bytes, plural
from s3ckpt.errors import ConfigError, LeaseHeldError, S3CkptError
from s3ckpt.format import compile_step_pattern
from s3ckpt.metrics import OperationMetrics, RunMetrics, Totals, capture, totals, write_textfile
from s3ckpt.retention import (
    DEFAULT_GC_AGE,
    DEFAULT_GRACE,
    DEFAULT_LEASE_TTL,
    MIN_GRACE,
    CheckpointInfo,
    DeleteResult,
    GcResult,
    Policy,
    PruneResult,
    RunCatalog,
    delete_checkpoint,
    format_duration,
    gc,
    list_runs,
    load_policy,
    parse_duration,
    pin,
    prune,
    scan,
    unpin,
)
from s3ckpt.store import ObjectStore, check_skew, open_store, skew_note, store_time
from s3ckpt.store.base import (
    Buffer,
    CompletedPart,
    DeleteFailure,
    DeleteFailures,
    ObjectInfo,
    RangeReader,
    UploadInfo,
)
from s3ckpt.uri import StoreURL, parse_location

__all__ = ["register"]


def _add_lease_ttl(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--lease-ttl",
        type=_duration,
        default=DEFAULT_LEASE_TTL,
        metavar="DURATION",
        help=f"lease lifetime without renewal (default {format_duration(DEFAULT_LEASE_TTL)})",
    )


def _add_step_pattern(p: argparse.ArgumentParser, note: str = "") -> None:
    p.add_argument(
        "--step-pattern",
        type=_step_pattern,
        default=None,
        metavar="REGEX",
        help=STEP_PATTERN_HELP + note,
    )


def _metrics_path(text: str) -> str:
    """``--metrics-file``: refused before any request when its directory cannot take it
    (the file is written as a temporary file there, then renamed over PATH)."""
    folder = os.path.dirname(os.path.abspath(text))
    if not text or text.endswith(os.sep) or os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a directory: name the file to write")
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"directory {folder} does not exist (create it first)")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"directory {folder} is not writable by this user")
    return text


def _add_metrics_file(p: argparse.ArgumentParser, command: str) -> None:
    p.add_argument(
        "--metrics-file",
        default=None,
        type=_metrics_path,
        metavar="PATH",
        help=f"write this {command}'s metrics in the Prometheus text format to PATH, atomically "
        "(for node_exporter's textfile collector, e.g. "
        f"/var/lib/node_exporter/textfile/s3ckpt-{command}.prom), also when it fails",
    )


def _duration(text: str) -> timedelta:
    try:
        value = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _nonneg_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def _step_pattern(text: str) -> str:
    try:
        compile_step_pattern(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    return text


STEP_PATTERN_HELP = (
    "a regular expression with one capture group around the step's digits, matched against "
    "the whole checkpoint name, for names s3ckpt does not read by itself (it reads step_100, "
    "step-100, epoch=1-step=100.ckpt, global_step100, checkpoint-100); a step recorded in "
    "s3ckpt.json wins"
)


def _time(text: str) -> datetime:
    try:
        value = parse_iso(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO time such as 2025-03-01T12:00:00Z, got {text!r}"
        ) from None
    if not 1970 <= value.year < 3000:  # ``now - grace`` must stay inside datetime's range
        raise argparse.ArgumentTypeError(f"expected a time from 1970 to 2999, got {text!r}")
    return value


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
    p.add_argument("--grace", type=_duration, default=DEFAULT_GRACE, help=grace_help)
    _add_step_pattern(p)
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
    add_output_options(p)
    p.add_argument(
        "--max-delete",
        type=_nonneg_int,
        default=None,
        metavar="N",
        help="delete at most N checkpoints per run (the oldest first)",
    )
    p.add_argument("--grace", type=_duration, default=DEFAULT_GRACE, help=grace_help)
    p.add_argument(
        "--include-foreign",
        action="store_true",
        help="treat stock-DCP checkpoints (.metadata but no s3ckpt.json) as committed",
    )
    _add_lease_ttl(p)
    p.add_argument(
        "--now",
        type=_time,
        default=None,
        metavar="TIME",
        help="plan as of this ISO time (what-if dry runs; default: now)",
    )
    _add_step_pattern(p, " (default: the policy file's step_pattern)")
    _add_metrics_file(p, "prune")
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
        type=_duration,
        default=DEFAULT_GC_AGE,
        metavar="DURATION",
        help="an extra margin: abort an open upload of a dead save (see --grace) only once "
        "it started this long ago; an upload of a live save is never aborted, however old "
        f"(default {format_duration(DEFAULT_GC_AGE)}: a dead save's uploads go at once)",
    )
    p.add_argument("--grace", type=_duration, default=DEFAULT_GRACE, help=grace_help)
    p.add_argument("--apply", action="store_true", help="abort and delete (default: dry run)")
    add_output_options(p)
    p.add_argument("--lease-ttl", type=_duration, default=DEFAULT_LEASE_TTL, help=argparse.SUPPRESS)
    _add_metrics_file(p, "gc")
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
    p.add_argument("--grace", type=_duration, default=DEFAULT_GRACE, help=grace_help)
    _add_lease_ttl(p)
    _add_step_pattern(p, " (tells which checkpoint is the newest)")
    p.set_defaults(func=_rm)


def _open(args: argparse.Namespace, location: str) -> tuple[ObjectStore, StoreURL]:
    """The store and URL of a command's PATH / CKPT: a URL or a local path (which must be
    a folder: a typo is an error here, where a prefix on a bucket would only be empty)."""
    url = parse_location(location)
    if url.scheme == "file" and not os.path.isdir("/" + url.prefix):
        raise CommandError(f"{location}: no such folder (PATH is a URL or a local folder)")
    return open_store(
        url,
        s3_config=s3_config_from_args(args),
        transfer_config=transfer_config_from_args(args),
    )


class _Counted:
    """An :class:`ObjectStore` that counts, on a :class:`ProgressCounter`, the objects it
    lists, reads and deletes and the uploads it aborts; everything else passes through."""

    def __init__(self, store: ObjectStore, counter: ProgressCounter) -> None:
        self._store = store
        self._counter = counter

    @property
    def bucket(self) -> str:
        return self._store.bucket

    @property
    def url_scheme(self) -> str:
        return self._store.url_scheme

    def put(
        self,
        key: str,
        data: Buffer,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
        crc32c: int | None = None,
    ) -> str:
        return self._store.put(
            key, data, if_none_match=if_none_match, if_match=if_match, crc32c=crc32c
        )

    def create_multipart(self, key: str) -> str:
        return self._store.create_multipart(key)

    def upload_part(
        self, key: str, upload_id: str, part_number: int, data: Buffer, *, crc32c: int | None = None
    ) -> CompletedPart:
        return self._store.upload_part(key, upload_id, part_number, data, crc32c=crc32c)

    def complete_multipart(
        self,
        key: str,
        upload_id: str,
        parts: Sequence[CompletedPart],
        *,
        if_none_match: bool = False,
    ) -> str:
        return self._store.complete_multipart(key, upload_id, parts, if_none_match=if_none_match)

    def abort_multipart(self, key: str, upload_id: str) -> None:
        self._store.abort_multipart(key, upload_id)
        self._counter.add("uploads aborted")

    def open_range(self, key: str, start: int = 0, length: int | None = None) -> RangeReader:
        reader = self._store.open_range(key, start, length)
        self._counter.add("read")  # the scan reads commit markers as one bounded range
        return reader

    def get(self, key: str) -> bytes:
        data = self._store.get(key)
        self._counter.add("read")
        return data

    def head(self, key: str) -> ObjectInfo | None:
        return self._store.head(key)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        for info in self._store.list(prefix):
            self._counter.add("objects listed")
            yield info

    def list_prefixes(
        self, prefix: str, delimiter: str = "/", *, start_after: str | None = None
    ) -> Iterator[str]:
        return self._store.list_prefixes(prefix, delimiter, start_after=start_after)

    def delete(self, keys: Sequence[str]) -> DeleteFailures:
        failures = self._store.delete(keys)
        self._counter.add("deleted", len(keys) - len(failures))
        return failures

    def delete_if_match(self, key: str, etag: str) -> None:
        self._store.delete_if_match(key, etag)
        self._counter.add("deleted")

    @property
    def endpoint_url(self) -> str | None:  # the capability probe's cache key
        return getattr(self._store, "endpoint_url", None)

    @property
    def s3_config(self) -> Any:  # S3Config.single_writer, for the capability probe
        return getattr(self._store, "s3_config", None)

    @property
    def dated_list(self) -> Any:  # the store's time (s3ckpt.store._clock.store_time)
        return getattr(self._store, "dated_list", None)

    @property
    def now(self) -> Any:  # a MemoryStore's clock, for the same
        return getattr(self._store, "now", None)

    def list_multipart_uploads(self, prefix: str) -> Iterator[UploadInfo]:
        for upload in self._store.list_multipart_uploads(prefix):
            self._counter.add("uploads listed")
            yield upload


def _open_counted(
    args: argparse.Namespace, location: str, label: str
) -> tuple[ObjectStore, StoreURL, ProgressCounter]:
    """:func:`_open`, with the store counted on a progress line (drawn only on a terminal
    without ``--json`` / ``--no-progress``)."""
    store, url = _open(args, location)
    counter = ProgressCounter(label, enabled=progress_enabled(args))
    return (_Counted(store, counter) if counter.enabled else store), url, counter


# -- formatting ------------------------------------------------------------------------------
def _when(t: datetime | None) -> str:
    return "-" if t is None else t.astimezone(UTC).strftime("%Y-%m-%d %H:%MZ")


def _metrics(m: Mapping[str, float]) -> str:
    if not m:
        return "-"
    return " ".join(f"{k}={v:.4g}" if math.isfinite(v) else f"{k}={v}" for k, v in m.items())


def _columns(c: CheckpointInfo) -> list[str]:
    """NAME, STEP, STATE, COMMITTED and SIZE: the columns ls and prune share."""
    step = "-" if c.step is None else str(c.step)
    state = "failed" if c.failed else state_label(c)  # abandoned, by a save that said so
    return [c.name, step, state, _when(c.committed_at), format_bytes(c.size)]


def _dump(doc: Any) -> None:
    print_json(doc, allow_nan=False, default=str)


def _section(title: str, items: Sequence[str], state: str, unit: str = "") -> None:
    """``title: N{unit} (state)`` and one indented line per item."""
    print(f"{title}: {len(items)}{unit} ({state})")
    for item in items:
        print(f"  {item}")


def _print_failures(failures: Iterable[DeleteFailure]) -> None:
    for f in failures:
        print(f"  FAILED {f.key}: {f.code}: {f.message}")


def _store_now(
    store: ObjectStore, root: StoreURL, grace: timedelta, refuse: bool | None
) -> datetime:
    """The store's time now. This host's clock further from it than the grace period in use
    is a ClockSkewError when ``refuse`` (applying: exit 5), else a warning on stderr."""
    t = store_time(store, root.prefix)
    limit = max(grace, MIN_GRACE)  # the floor prune and gc raise it to
    if refuse:
        check_skew(t, limit, action=f"prune {root}")
    note = skew_note(t, limit)
    if note is not None:
        print(f"s3ckpt: warning: {note}; fix this host's clock (NTP)", file=sys.stderr)
    return t.store


# -- ls ----------------------------------------------------------------------------------------
def _ls(args: argparse.Namespace) -> int:
    store, root, counter = _open_counted(args, args.path, "ls")
    try:
        now = _store_now(store, root, args.grace, None)
        catalogs = scan(store, root, grace=args.grace, now=now, step_pattern=args.step_pattern)
    finally:
        counter.close()
    if args.json:
        _dump(
            {
                "root": str(root),
                "runs": [
                    {"run": str(cat.run), "checkpoints": [c.to_dict() for c in cat.checkpoints]}
                    for cat in catalogs
                ],
            }
        )
        return _damaged_code("ls", catalogs)
    if not catalogs:
        print(f"no checkpoints under {root}")
        return EXIT_OK
    for i, cat in enumerate(catalogs):
        if i:
            print()
        ck = cat.checkpoints
        committed = sum(1 for c in ck if c.is_committed)
        total = sum(c.size for c in ck)
        count = plural(len(ck), "checkpoint")
        print(f"{cat.run}  ({count}, {committed} committed, {format_bytes(total)})")
        if not ck:
            continue
        rows = [["NAME", "STEP", "STATE", "COMMITTED", "SIZE", "OBJECTS", "METRICS", "PINNED"]]
        for c in ck:
            rows.append([*_columns(c), str(c.num_objects), _metrics(c.metrics), c.pinned or "-"])
        print_table(rows, right=(1, 4, 5), indent="  ")
        for c in ck:
            saves = _saves(c)
            if saves:
                print(f"  {c.name}: {saves}")
    sys.stdout.flush()  # the table before the warnings on stderr
    return _damaged_code("ls", catalogs)


def _damaged_code(command: str, catalogs: Iterable[RunCatalog]) -> int:
    """Warn about each damaged checkpoint on stderr: exit 1 (done in part) when any is."""
    damaged = warn_damaged(command, (c for cat in catalogs for c in cat.checkpoints))
    return EXIT_PARTIAL if damaged else EXIT_OK


def _saves(c: CheckpointInfo) -> str:
    """``ls``'s line about saves in progress or failed in one checkpoint prefix, or ""."""
    if c.damaged:
        return ""  # its committed save is unknown: its warning on stderr says the rest
    failed = ""
    if c.failed_at is not None:
        failed = f"a save failed at {_when(c.failed_at)}: {printable(c.failure or '?')}"
        failed += " (s3ckpt gc removes what it left)"
    if not c.live_saves and not (c.uploads and not c.is_committed):
        return failed
    n = c.live_saves
    what = f"{n} save{'s' if n != 1 else ''} in progress" if n else "no live save"
    if c.overwrite_in_progress:
        what = f"overwrite in progress ({what})"
    extra = []
    if c.uploads:
        extra.append(f"{len(c.uploads)} open upload{'s' if len(c.uploads) != 1 else ''}")
    if not c.num_objects:
        extra.append("no objects yet")
    return what + (f", {', '.join(extra)}" if extra else "") + (f"; {failed}" if failed else "")


# -- prune -------------------------------------------------------------------------------------
def _print_prune(result: PruneResult) -> None:
    p = result.plan
    print(f"{result.run}  policy: {p.policy}")
    if p.decisions:
        rows = [["NAME", "STEP", "STATE", "COMMITTED", "SIZE", "ACTION", "REASONS"]]
        for d in p.decisions:
            rows.append([*_columns(d.checkpoint), d.action, "; ".join(d.reasons)])
        print_table(rows, right=(1, 4), indent="  ")
    freed = f"{format_bytes(p.bytes_freed)}, {plural(p.objects_deleted, 'object')}"
    counts = f"keep {len(p.keep)}, skip {len(p.skipped)}"
    deferred = f", {p.deferred} deferred by --max-delete" if p.deferred else ""
    for note in result.notes:
        print(f"  note: {note}")
    if not result.applied:
        print(
            f"  dry run: would delete {len(p.delete)} ({freed}), {counts}{deferred}; "
            "pass --apply to delete"
        )
        return
    if result.resumed:
        freed = (
            f"{format_bytes(p.bytes_freed + result.resumed_bytes)}, "
            f"{plural(p.objects_deleted + result.resumed_objects, 'object')}"
        )
        resumed = (
            f"; {len(result.resumed)} of them finished for an interrupted prune "
            f"({', '.join(result.resumed)})"
        )
    else:
        resumed = ""
    print(
        f"  deleted {len(result.deleted)} of {result.targets} ({freed}) in "
        f"{plural(result.delete_requests, 'DeleteObjects request')}, {counts}{deferred}{resumed}"
    )
    _print_failures(result.failures)


class _MetricsFile:
    """``--metrics-file``: what one ``prune`` or ``gc`` invocation did, gathered as it goes
    and written once at the end (success or not)."""

    def __init__(self, path: str, command: Literal["prune", "gc"], dry_run: bool) -> None:
        self.path = path
        self.command: Literal["prune", "gc"] = command
        self.dry_run = dry_run
        self.runs: list[RunMetrics] = []
        self.success = False
        self._before = totals()
        self._t0 = time.monotonic()

    def write(self) -> bool:
        """Write the file; on failure say why on stderr and return False (what the command
        did stands: its own output and exit code still tell it)."""
        after = totals()
        try:
            self._write(after)
        except OSError as exc:
            print(
                f"s3ckpt {self.command}: cannot write the metrics file {self.path}: "
                f"{exc.strerror or exc}",
                file=sys.stderr,
            )
            return False
        return True

    def _write(self, after: Totals) -> None:
        write_textfile(
            self.path,
            self.command,
            self.runs,
            success=self.success,
            finished_at=time.time(),
            duration_s=time.monotonic() - self._t0,
            requests=after.requests - self._before.requests,
            retries=after.retries - self._before.retries,
            throttled=after.throttled - self._before.throttled,
            dry_run=self.dry_run,
            failed=after.failed - self._before.failed,
            not_found=after.not_found - self._before.not_found,
            precondition_failed=after.precondition_failed - self._before.precondition_failed,
        )


def _run_metrics(result: PruneResult, event: OperationMetrics | None) -> RunMetrics:
    """A pruned run's values for the metrics file: its checkpoints as the prune left them."""
    gone = set(result.deleted)
    counts: dict[str, int] = {}
    sizes: dict[str, int] = {}
    committed: list[tuple[datetime, CheckpointInfo]] = []
    for d in result.plan.decisions:
        c = d.checkpoint
        if c.name in gone:
            continue
        counts[c.state.value] = counts.get(c.state.value, 0) + 1
        sizes[c.state.value] = sizes.get(c.state.value, 0) + c.size
        if c.state.value == "committed" and c.committed_at is not None:
            committed.append((c.committed_at, c))
    # Newest by the store's commit time; saves within the same second of the store's clock
    # are told apart by the catalog's order (step, then name).
    newest = max(committed, key=lambda t: (t[0], t[1].sort_key()))[1] if committed else None
    return RunMetrics(
        run=str(result.run),
        checkpoints=counts,
        bytes=sizes,
        latest_committed_at=None if newest is None else _epoch(newest.committed_at),
        latest_committed_step=None if newest is None else newest.step,
        deleted=len(result.deleted),
        bytes_freed=event.bytes_freed if event is not None else 0,
        failures=len(result.failures),
        lease_wait_s=event.lease_wait_s if event is not None else 0.0,
    )


def _epoch(t: datetime | None) -> float | None:
    return None if t is None else t.timestamp()


def _prune(args: argparse.Namespace) -> int:
    policy = load_policy(args.policy)  # bad file -> PolicyError -> exit 2, before any request
    store, root, counter = _open_counted(args, args.path, "prune")
    report = (
        _MetricsFile(args.metrics_file, "prune", dry_run=not args.apply)
        if args.metrics_file
        else None
    )
    try:
        code = _prune_runs(args, policy, store, root, counter, report)
    except BaseException:
        if report is not None:
            report.write()  # failed: success 0
        raise
    finally:
        counter.close()
    if report is not None:
        report.success = code == EXIT_OK
        if not report.write() and code == EXIT_OK:
            # Pruned, but the monitoring it was asked for is missing (--json printed the
            # runs' code already; stderr says why this one differs).
            code = EXIT_USAGE
    return code


def _prune_runs(
    args: argparse.Namespace,
    policy: Policy,
    store: ObjectStore,
    root: StoreURL,
    counter: ProgressCounter,
    report: _MetricsFile | None = None,
) -> int:
    now = aware_now(args.now) if args.now else _store_now(store, root, args.grace, args.apply)
    runs = list_runs(store, root, grace=args.grace, now=now)
    code = EXIT_OK
    docs: list[dict[str, Any]] = []
    if not runs and not args.json:
        print(f"no runs under {root}")
    for i, run in enumerate(runs):
        try:
            with capture() as events:
                result = prune(
                    store,
                    run,
                    policy,
                    apply=args.apply,
                    now=now,
                    max_delete=args.max_delete,
                    grace=args.grace,
                    lease_ttl=args.lease_ttl,
                    include_foreign=args.include_foreign,
                    step_pattern=args.step_pattern,
                )
        except LeaseHeldError as exc:
            if code == EXIT_OK:
                code = EXIT_BUSY
            if report is not None:
                report.runs.append(RunMetrics(run=str(run), lease_busy=1))
            docs.append({"run": str(run), "busy": str(exc)})
            if not args.json:
                counter.clear()
                print(f"{run}  skipped: {exc}", file=sys.stderr)
            continue
        counter.add(f"of {plural(len(runs), 'run')} done")
        if report is not None:
            mine = [e for e in events if e.kind == "prune" and e.url == str(run)]
            report.runs.append(_run_metrics(result, mine[-1] if mine else None))
        if not result.ok:
            code = EXIT_PARTIAL
        if warn_damaged("prune", (d.checkpoint for d in result.plan.decisions)):
            code = EXIT_PARTIAL  # listed and skipped, the rest pruned: done in part
        docs.append(result.to_dict())
        if not args.json:
            counter.clear()
            if i:
                print()
            _print_prune(result)
            sys.stdout.flush()  # before the progress line is drawn again on stderr
    if args.json:
        _dump({"root": str(root), "applied": args.apply, "exit_code": code, "runs": docs})
    return code


# -- pin / unpin -------------------------------------------------------------------------------
def _pin(args: argparse.Namespace) -> int:
    store, ckpt = _open(args, args.checkpoint)
    pin(store, ckpt, args.reason)  # nothing there, or a run: exit 2 (exit_code_for)
    reason = args.reason.strip()
    if args.json:
        _dump({"checkpoint": str(ckpt), "pinned": True, "reason": reason})
    else:
        print(f"pinned {ckpt}: {reason}")
    return EXIT_OK


def _unpin(args: argparse.Namespace) -> int:
    store, ckpt = _open(args, args.checkpoint)
    was_pinned = unpin(store, ckpt)
    if args.json:
        _dump({"checkpoint": str(ckpt), "pinned": False, "was_pinned": was_pinned})
    elif was_pinned:
        print(f"unpinned {ckpt}")
    else:
        print(f"{ckpt} was not pinned")
    return EXIT_OK


# -- gc ----------------------------------------------------------------------------------------
def _print_gc(r: GcResult) -> None:
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
        rest = len(r.abandoned) - len(r.removed) - len(r.skipped)
        if rest > 0:
            state += f", {rest} not (fully) removed"
    else:
        state = "would remove"
    print(f"abandoned saves: {len(r.abandoned)} ({state})")
    removed, skipped = set(r.removed), set(r.skipped)
    for c in r.abandoned:
        mark = ""
        if done:
            url = str(c.url)
            mark = "  removed" if url in removed else "  SKIPPED" if url in skipped else "  LEFT"
        print(
            f"  {c.url}  {format_bytes(c.size)}, {plural(c.num_objects, 'object')}, "
            f"last activity {_when(c.last_activity)}{mark}"
        )
    if r.leftovers:
        _section(
            "leftovers of dead saves in live or committed prefixes",
            r.leftovers,
            f"deleted {r.leftovers_deleted}" if done else "would delete",
        )
    if r.stale_metadata:
        _section(
            "committed checkpoints missing a current .metadata",
            r.stale_metadata,
            f"restored {len(r.restored)}" if done else "would restore",
        )
    if r.resumed:
        _section(
            "interrupted prunes",
            r.resumed,
            "finished" if done else "would finish",
            unit=" checkpoints",
        )
    for run in r.busy_runs:
        print(f"  skipped {run}: another pruner holds its lease", file=sys.stderr)
    _print_failures(r.failures)
    for note in r.notes:
        print(f"note: {note}")
    if not done and (r.uploads or r.abandoned or r.leftovers or r.stale_metadata or r.resumed):
        print("dry run: pass --apply to abort, delete and restore")


def _gc(args: argparse.Namespace) -> int:
    store, root, counter = _open_counted(args, args.path, "gc")
    report = _MetricsFile(args.metrics_file, "gc", not args.apply) if args.metrics_file else None
    try:
        with capture() as events:
            result = gc(
                store,
                root,
                older_than=args.older_than,
                grace=args.grace,
                apply=args.apply,
                lease_ttl=args.lease_ttl,
            )
    except BaseException:
        if report is not None:
            report.write()  # failed: success 0, no per-prefix values
        raise
    finally:
        counter.close()
    code = EXIT_PARTIAL if result.failures else EXIT_BUSY if result.busy_runs else EXIT_OK
    if warn_damaged("gc", result.damaged):
        code = EXIT_PARTIAL  # nothing of theirs deleted, the rest collected: done in part
    if report is not None:
        mine = [e for e in events if e.kind == "gc" and e.url == str(root)]
        report.runs.append(
            RunMetrics(
                run=str(root),
                deleted=len(result.removed) + len(result.resumed),
                bytes_freed=mine[-1].bytes_freed if mine else 0,
                lease_busy=len(result.busy_runs),
                failures=len(result.failures),
                lease_wait_s=mine[-1].lease_wait_s if mine else 0.0,
            )
        )
        report.success = code == EXIT_OK
        if not report.write() and code == EXIT_OK:
            code = EXIT_USAGE  # collected, but the monitoring it was asked for is missing
    if args.json:
        _dump({**result.to_dict(), "exit_code": code})
    else:
        _print_gc(result)
    return code


# -- rm ----------------------------------------------------------------------------------------
def _print_rm(r: DeleteResult) -> None:
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
        n = len(r.kept)
        print(f"  kept {n} object{'s' if n != 1 else ''} s3ckpt did not write:")
        for key in r.kept:
            print(f"    {key[len(r.checkpoint.prefix) :]}")
    if r.resumed:
        print(f"  also finished for an interrupted prune: {', '.join(r.resumed)}")
    _print_failures(r.failures)
    for note in r.notes:
        print(f"  note: {note}")


def _rm(args: argparse.Namespace) -> int:
    code = EXIT_OK
    docs: list[dict[str, Any]] = []
    for location in args.checkpoints:
        try:
            store, ckpt = _open(args, location)
            result = delete_checkpoint(
                store,
                ckpt,
                allow_newest=args.allow_newest,
                include_foreign=args.include_foreign,
                dry_run=args.dry_run,
                grace=args.grace,
                lease_ttl=args.lease_ttl,
                step_pattern=args.step_pattern,
            )
        except (S3CkptError, CommandError) as exc:
            if isinstance(exc, LeaseHeldError):
                rc = EXIT_BUSY
            elif isinstance(exc, CommandError):
                rc = exc.code
            else:
                rc = exit_code_for(exc)
            code = code or rc
            docs.append({"checkpoint": location, "error": str(exc), "exit_code": rc})
            error(str(exc))
            continue
        rc = EXIT_OK if result.ok else EXIT_PARTIAL
        code = code or rc
        docs.append({**result.to_dict(), "exit_code": rc})
        if not args.json:
            _print_rm(result)
            sys.stdout.flush()
    if args.json:
        _dump({"dry_run": args.dry_run, "exit_code": code, "checkpoints": docs})
    return code
