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

from s3ckpt._cli import EXIT_OK, EXIT_PARTIAL, EXIT_STORE, Command, error
from s3ckpt._cli._args import add_options, commands, nonneg_int, refusing, retention_options
from s3ckpt._cli._output import add_output_options, print_json, printable
from s3ckpt._units import format_bytes, plural
from s3ckpt.errors import ConfigError
from s3ckpt.metrics._prometheus import CheckValues
from s3ckpt.retention._duration import format_duration
from s3ckpt.retention._liveness import DEFAULT_GRACE
from s3ckpt.tools import check
from s3ckpt.tools._check import parse_read_data
from s3ckpt.tools._check_result import CheckpointCheck, CheckResult, SkippedCheckpoint

__all__ = ["register"]


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add check."""
    add = commands(sub, common)
    p = add(
        "check",
        _check,
        "prove the committed checkpoints under a prefix still load: marker digests, "
        "objects and sizes, .metadata, and a sample of the data re-read against its CRC32C",
        "Check every committed checkpoint under PATH (a bucket prefix, a run or "
        "one checkpoint): the commit marker's digest, every object it names (exists, recorded "
        "size), both .metadata copies against the marker, and with --read-data a random "
        "sample of items re-read against their CRC32C. Saves in progress, uncommitted and "
        "stock-DCP checkpoints and checkpoints in GLACIER or DEEP_ARCHIVE are skipped and "
        "counted. Findings are recorded in each run's s3ckpt.check.json, which s3ckpt ls "
        "reads to mark damaged checkpoints.",
    )
    p.add_argument("path", metavar="PATH")
    h = (
        "how much of each checkpoint's item bytes to read back: 0 (the default: none, as "
        "restic's check), a percentage such as 5%%, or all"
    )
    share = refusing(lambda text: parse_read_data(text)[1], ConfigError)
    p.add_argument("--read-data", type=share, default="0", metavar="SHARE", help=h)
    h = (
        "draw the samples from this seed (the same seed reads the same items of a "
        "checkpoint again; default: a new one, printed)"
    )
    p.add_argument("--seed", type=nonneg_int, metavar="N", help=h)
    h = "read only: do not write the runs' s3ckpt.check.json (ls then marks nothing new)"
    p.add_argument("--no-record", action="store_true", help=h)
    h = (
        "a save without a commit marker counts as in progress while any of its objects "
        f"is younger than this (default {format_duration(DEFAULT_GRACE)})"
    )
    add_options(p, "--grace", help=h)
    add_output_options(p)
    add_options(p, "--metrics-file")


def _check(args: argparse.Namespace) -> int:
    cmd = Command(args, args.path)

    def seen(outcome: CheckpointCheck | SkippedCheckpoint) -> None:
        skipped = isinstance(outcome, SkippedCheckpoint)
        cmd.counter.add("skipped" if skipped else "checkpoints checked")
        if getattr(outcome, "damaged", False):
            cmd.counter.add("damaged")

    with cmd.working():
        result = check(
            cmd.location,
            read_data=args.read_data,
            seed=args.seed,
            record=not args.no_record,
            options=retention_options(args),
            on_checkpoint=seen,
        )
    # Damage is bad data (1); only read failures is "could not read" (3): retry, or fix access.
    code = EXIT_OK if result.ok else EXIT_PARTIAL if result.damaged else EXIT_STORE
    values = CheckValues(
        **{k: len(getattr(result, k)) for k in ("checked", "damaged", "incomplete")},
        skipped=result.skipped_by_reason(),
        bytes_read=result.bytes_read,
        items_read=result.items_read,
        read_fraction=parse_read_data(result.read_data)[0],
    )
    code = cmd.finish(code, values)  # 2: checked, but the monitoring asked for is missing
    if args.json:
        print_json({**result.to_dict(), "exit_code": code}, strict=True)
    else:
        print_result(result)
    if code == EXIT_STORE:
        error(
            f"could not read {plural(len(result.incomplete), 'checkpoint')} in full (no damage "
            "found in what was read): check access to the store and run the check again"
        )
    return code


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
        parts = [
            r.damaged and f"{len(r.damaged)} of {len(r.checked)} checkpoints damaged",
            r.incomplete and f"{len(r.incomplete)} not checked in full",
            r.record_failures and f"{plural(len(r.record_failures), 'record')} not written",
        ]
        print("FAILED: " + "; ".join(p for p in parts if p))
