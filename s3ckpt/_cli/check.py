"""``s3ckpt check PATH``: the scrub, a thin layer over :func:`s3ckpt.tools.check` (no torch).

Prints what was checked, each damaged checkpoint with what is wrong (object, item, expected
and found), what was skipped and why, and a summary; ``--json`` prints
:meth:`~s3ckpt.tools.CheckResult.to_dict` instead. Exit codes (:mod:`s3ckpt._cli`): 0 clean,
1 a checkpoint is damaged or could not be checked in full, or a run's record could not be
written (done in part), 2 bad input (a bad ``--read-data``, a metrics file that cannot be
written), 3 the store refused or could not be reached.

``--metrics-file PATH``: the check's values for node_exporter's textfile collector
(:class:`s3ckpt.metrics.CheckMetricsFile`), written atomically at the end, also when the
check fails. On a terminal the objects listed and read and the checkpoints checked are
counted on stderr as the check goes.
"""

from __future__ import annotations

import argparse
import sys

from s3ckpt._cli import EXIT_OK, EXIT_PARTIAL, EXIT_STORE, EXIT_USAGE, error, open_location
from s3ckpt._cli._args import add_metrics_file, counted, duration, nonneg_int
from s3ckpt._cli._damaged import printable
from s3ckpt._cli._output import add_output_options, print_json
from s3ckpt._units import format_bytes, plural
from s3ckpt.errors import ConfigError
from s3ckpt.metrics import CheckMetricsFile, CheckValues
from s3ckpt.retention import DEFAULT_GRACE, RetentionOptions, format_duration
from s3ckpt.tools import (
    CheckpointCheck,
    CheckResult,
    SkippedCheckpoint,
    check,
    parse_read_data,
)

__all__ = ["register"]


def _read_data(text: str) -> str:
    """``--read-data``: ``0``, ``N%`` or ``all`` (checked before any request)."""
    try:
        return parse_read_data(text)[1]
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add check."""
    p = sub.add_parser(
        "check",
        parents=[common],
        help="prove the committed checkpoints under a prefix still load: marker digests, "
        "objects and sizes, .metadata, and a sample of the data re-read against its CRC32C",
        description="Check every committed checkpoint under PATH (a bucket prefix, a run or "
        "one checkpoint): the commit marker's digest, every object it names (exists, recorded "
        "size), both .metadata copies against the marker, and with --read-data a random "
        "sample of items re-read against their CRC32C. Saves in progress, uncommitted and "
        "stock-DCP checkpoints and checkpoints in GLACIER or DEEP_ARCHIVE are skipped and "
        "counted. Findings are recorded in each run's s3ckpt.check.json, which s3ckpt ls "
        "reads to mark damaged checkpoints.",
    )
    p.add_argument("path", metavar="PATH")
    p.add_argument(
        "--read-data",
        type=_read_data,
        default="0",
        metavar="SHARE",
        help="how much of each checkpoint's item bytes to read back: 0 (the default: none, "
        "as restic's check), a percentage such as 5%%, or all",
    )
    p.add_argument(
        "--seed",
        type=nonneg_int,
        default=None,
        metavar="N",
        help="draw the samples from this seed (the same seed reads the same items of a "
        "checkpoint again; default: a new one, printed)",
    )
    p.add_argument(
        "--no-record",
        action="store_true",
        help="read only: do not write the runs' s3ckpt.check.json (ls then marks nothing new)",
    )
    p.add_argument(
        "--grace",
        type=duration,
        default=DEFAULT_GRACE,
        help="a save without a commit marker counts as in progress while any of its objects "
        f"is younger than this (default {format_duration(DEFAULT_GRACE)})",
    )
    add_output_options(p)
    add_metrics_file(p, "check")
    p.set_defaults(func=_check)


def _check(args: argparse.Namespace) -> int:
    location, counter = counted(args, open_location(args, args.path, folder=True), "check")
    report = CheckMetricsFile(args.metrics_file) if args.metrics_file else None

    def seen(outcome: CheckpointCheck | SkippedCheckpoint) -> None:
        if isinstance(outcome, SkippedCheckpoint):
            counter.add("skipped")
        else:
            counter.add("checkpoints checked")
            if outcome.damaged:
                counter.add("damaged")

    try:
        result = check(
            location,
            read_data=args.read_data,
            seed=args.seed,
            record=not args.no_record,
            options=RetentionOptions(grace=args.grace),
            on_checkpoint=seen,
        )
    except BaseException:
        if report is not None:
            _write_metrics(report, CheckValues(), success=False)
        raise
    finally:
        counter.close()
    # Damage is bad data (1); only read failures is "could not read" (3): retry, or fix access.
    code = EXIT_OK if result.ok else EXIT_PARTIAL if result.damaged else EXIT_STORE
    if report is not None:
        fraction = parse_read_data(result.read_data)[0]
        values = CheckValues(
            checked=len(result.checked),
            damaged=len(result.damaged),
            incomplete=len(result.incomplete),
            skipped=result.skipped_by_reason(),
            bytes_read=result.bytes_read,
            items_read=result.items_read,
            read_fraction=fraction,
        )
        if not _write_metrics(report, values, success=result.ok) and code == EXIT_OK:
            code = EXIT_USAGE  # checked, but the monitoring it was asked for is missing
    if args.json:
        print_json({**result.to_dict(), "exit_code": code}, allow_nan=False, default=str)
    else:
        print_result(result)
    if code == EXIT_STORE:
        error(
            f"could not read {plural(len(result.incomplete), 'checkpoint')} in full (no damage "
            "found in what was read): check access to the store and run the check again"
        )
    return code


def _write_metrics(report: CheckMetricsFile, values: CheckValues, *, success: bool) -> bool:
    """Write ``--metrics-file``; on failure say why on stderr and return False."""
    try:
        report.write(values, success=success)
    except OSError as exc:
        print(
            f"s3ckpt check: cannot write the metrics file {report.path}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return False
    return True


def print_result(r: CheckResult) -> None:
    """The human summary: damaged and incomplete checkpoints, what was skipped, the verdict."""
    share = "no data" if r.read_data == "0" else f"{r.read_data} of their data"
    print(
        f"{printable(r.url)}  checked {plural(len(r.checked), 'committed checkpoint')}, read "
        f"{share} ({format_bytes(r.bytes_read)} in all, {plural(r.items_read, 'item')} "
        f"compared; seed {r.seed}) in {r.seconds:.1f} s"
    )
    for c in r.damaged + r.incomplete:
        label = "DAMAGED" if c.damaged else "NOT CHECKED IN FULL"
        print(f"  {label} {printable(c.url)}")
        for f in c.findings:
            print(f"    {f.kind}: {printable(f.message)}")
    if r.skipped:
        counts = ", ".join(f"{n} {k}" for k, n in r.skipped_by_reason().items() if n)
        print(f"  skipped {len(r.skipped)} ({counts}):")
        for s in r.skipped:
            print(f"    {printable(s.url)}: {s.reason}: {printable(s.detail)}")
    if r.records:
        print(f"  findings recorded in {plural(len(r.records), 'run')} (s3ckpt.check.json)")
    for failure in r.record_failures:
        print(f"  {printable(failure)}")
    if r.ok:
        print("OK: nothing damaged")
    else:
        parts = []
        if r.damaged:
            parts.append(f"{len(r.damaged)} of {len(r.checked)} checkpoints damaged")
        if r.incomplete:
            parts.append(f"{len(r.incomplete)} not checked in full")
        if r.record_failures:
            parts.append(f"{plural(len(r.record_failures), 'record')} not written")
        print("FAILED: " + "; ".join(parts))
