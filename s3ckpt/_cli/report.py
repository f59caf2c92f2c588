"""``s3ckpt report``: one self-contained HTML page about the checkpoints under a prefix.

A dry run: it lists (like ``ls``) and, with ``--policy``, plans (like ``prune`` without
``--apply``); it takes no lease and deletes nothing. Needs no torch. Exit codes are those of
:mod:`s3ckpt._cli`: 0 written, 1 written with damaged checkpoints (a marker that cannot be
read: its own row, a warning on stderr), 2 bad input (policy, prices, a storage class without
a price, an output file that cannot be written), 3 store error.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from s3ckpt._cli import EXIT_OK, EXIT_PARTIAL, CommandError
from s3ckpt._cli._args import STEP_PATTERN_HELP, open_counted
from s3ckpt._cli._args import duration as _duration
from s3ckpt._cli._args import iso_time as _time
from s3ckpt._cli._args import nonneg_int as _nonneg_int
from s3ckpt._cli._args import step_pattern as _step_pattern
from s3ckpt._cli._damaged import warn_damaged
from s3ckpt._cli._output import add_output_options, print_json
from s3ckpt._units import format_bytes
from s3ckpt.errors import ConfigError
from s3ckpt.retention import (
    DEFAULT_GRACE,
    MIN_GRACE,
    PolicyFile,
    RetentionOptions,
    format_duration,
)
from s3ckpt.tools.report import (
    PriceTable,
    Report,
    collect_report,
    format_usd,
    parse_price,
    render_html,
)

__all__ = ["register"]


def _price(text: str) -> tuple[str, float]:
    try:
        return parse_price(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add report."""
    p = sub.add_parser(
        "report",
        parents=[common],
        help="write one self-contained HTML page: every checkpoint per run on a step/time "
        "chart, sizes, storage cost, and (with --policy) what a plan keeps or deletes and why",
        description="Scan PATH (a run, or a prefix holding runs) as ls does and write an HTML "
        "report that opens from disk (no network, no server). With --policy, overlay a dry-run "
        "plan as prune makes it (no lease taken, nothing deleted). Costs use S3 list prices "
        "(us-east-1, USD per GB-month, GB = 2^30 bytes) by storage class unless --prices or "
        "--price says otherwise. Prints a one-line summary.",
    )
    p.add_argument("path", metavar="PATH")
    p.add_argument(
        "--html",
        required=True,
        metavar="FILE",
        help="the page to write (replaced atomically); - writes it to stdout and the summary "
        "to stderr",
    )
    p.add_argument(
        "--policy",
        default=None,
        metavar="POLICY",
        help="overlay this policy's plan: a policy TOML file, or the name of a ready-made one "
        "(e.g. pretraining)",
    )
    p.add_argument(
        "--prices",
        default=None,
        metavar="FILE",
        help="a TOML file of storage prices, CLASS = USD per GB-month under [prices] "
        "(classes it does not name keep the defaults)",
    )
    p.add_argument(
        "--price",
        action="append",
        type=_price,
        default=[],
        metavar="CLASS=USD",
        help="the price of one storage class in USD per GB-month, e.g. STANDARD=0.021 "
        "(repeatable; wins over --prices)",
    )
    p.add_argument("--title", default=None, help="the page's title (default: s3ckpt report: PATH)")
    p.add_argument(
        "--grace",
        type=_duration,
        default=DEFAULT_GRACE,
        help="a save is in progress while any of its objects, heartbeats or open uploads is "
        "younger than this; with --policy raised to at least "
        f"{format_duration(MIN_GRACE)}, as prune does (default {format_duration(DEFAULT_GRACE)})",
    )
    p.add_argument(
        "--now",
        type=_time,
        default=None,
        metavar="TIME",
        help="report (and plan) as of this ISO time (default: now)",
    )
    p.add_argument(
        "--include-foreign",
        action="store_true",
        help="let the plan treat stock-DCP checkpoints (.metadata but no s3ckpt.json) as committed",
    )
    p.add_argument(
        "--max-delete",
        type=_nonneg_int,
        default=None,
        metavar="N",
        help="plan at most N deletions per run (the oldest first), as prune --max-delete",
    )
    p.add_argument(
        "--step-pattern",
        type=_step_pattern,
        default=None,
        metavar="REGEX",
        help=STEP_PATTERN_HELP + " (default: the policy file's step_pattern)",
    )
    add_output_options(p)
    p.set_defaults(func=_report)


def _prices(args: argparse.Namespace) -> PriceTable:
    table = PriceTable.load(args.prices) if args.prices else PriceTable()
    if args.price:
        table = table.with_prices(dict(args.price), f"{table.source}; --price")
    return table


def _check_target(path: str) -> None:
    """Refuse an output path that cannot be written, before any request."""
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise CommandError(f"{path}: is a directory: name the HTML file to write")
    if not folder.is_dir():
        raise CommandError(f"{path}: cannot write the report: directory {folder} does not exist")


def _write(path: str, page: str) -> None:
    """Write ``page`` to ``path`` atomically (a reader never sees half a page)."""
    target = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(
            prefix=f".{target.name}.", suffix=".tmp", dir=target.parent or Path(".")
        )
    except OSError as exc:
        raise CommandError(f"{path}: cannot write the report: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(page)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise CommandError(f"{path}: cannot write the report: {exc.strerror or exc}") from None


def _summary_line(report: Report, where: str) -> str:
    doc = report.summary()
    runs = int(doc["runs"])  # type: ignore[call-overload]
    n = int(doc["checkpoints"])  # type: ignore[call-overload]
    size = int(doc["total_size"])  # type: ignore[call-overload]
    cost = float(doc["cost_month"])  # type: ignore[arg-type]
    line = (
        f"wrote {where}: {runs} run{'s' if runs != 1 else ''}, {n} checkpoint"
        f"{'s' if n != 1 else ''}, {format_bytes(size)}, {format_usd(cost)}/month"
    )
    if report.policy is not None:
        freed = int(doc["bytes_freed"])  # type: ignore[call-overload]
        after = float(doc["cost_month_after"])  # type: ignore[arg-type]
        line += (
            f"; the plan deletes {doc['delete']} ({format_bytes(freed)} freed), "
            f"{format_usd(after)}/month after"
        )
    return line


def _report(args: argparse.Namespace) -> int:
    to_stdout = args.html == "-"
    if to_stdout and args.json:
        raise CommandError("--json prints on stdout: write the page to a file (--html FILE)")
    policy = PolicyFile.load(args.policy) if args.policy else None  # bad: exit 2, no request
    prices = _prices(args)
    options = RetentionOptions(
        grace=args.grace,
        now=args.now,
        step_pattern=args.step_pattern,
        include_foreign=args.include_foreign,
        max_delete=args.max_delete,
    )
    if not to_stdout:
        _check_target(args.html)  # before the scan, which may take minutes on a big bucket
    location, counter = open_counted(args, args.path, "report")
    try:
        report = collect_report(
            location, policy=policy, options=options, prices=prices, title=args.title
        )
    finally:
        counter.close()
    page = render_html(report)
    if to_stdout:
        sys.stdout.write(page)
        sys.stdout.flush()
        print(_summary_line(report, "the page to stdout"), file=sys.stderr)
        return _damaged_code(report)
    _write(args.html, page)
    if args.json:
        print_json({"html": str(args.html), **report.to_dict()}, allow_nan=False)
    else:
        print(_summary_line(report, args.html))
    sys.stdout.flush()
    return _damaged_code(report)


def _damaged_code(report: Report) -> int:
    """A warning on stderr per damaged checkpoint (on the page as its own row): exit 1."""
    damaged = warn_damaged("report", (row.info for run in report.runs for row in run.rows))
    return EXIT_PARTIAL if damaged else EXIT_OK
